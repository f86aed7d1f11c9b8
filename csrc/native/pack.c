/* GGUF blocks -> the engine's packed layout (se.h), without changing any weight's value. */
#include "se.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* Weights stream once per token, so they live on 2 MB-aligned memory the kernel may back with huge pages
 * (madvise): fewer TLB misses, and the hardware prefetchers, which stop at 4 KB page ends, run on. A matrix of 8 MB
 * or more gets its own run; smaller ones share 32 MB slabs (a model's 0.2-0.5 MB layer matrices had each been on 4
 * KB pages: SmolLM2-135M T(1) -5%, T(5) -10% once on huge pages). A slab is freed when its last matrix is. Each
 * block starts 64 bytes after a header naming its slab (NULL: its own run). */
#define HUGE (1u << 21)
#define OWN_RUN (8u << 20)
#define SLAB (32u << 20)
typedef struct slab { uint8_t *base; size_t used; int live; } slab;
typedef struct { slab *from; size_t run; } weight_head; /* run: an own run's bytes (from NULL) */
static pthread_mutex_t slab_mu = PTHREAD_MUTEX_INITIALIZER;
static slab *slab_now; /* the slab small matrices are cut from */

/* 2 MB-aligned, advised before any page is touched. On Linux a fresh mapping: posix_memalign may hand back heap
 * memory already faulted in on 4 KB pages (glibc's mmap threshold grows to 32 MB once large blocks are freed, as
 * loading a file does), and the advice does not change pages that exist: gemma3-270m's slabs had stayed on 4 KB
 * pages, only its 178 MB LM head on huge ones. */
static void *huge_run(size_t bytes) {
    size_t len = (bytes + HUGE - 1) / HUGE * HUGE;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uint8_t *m = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    size_t lead = (HUGE - (uintptr_t)m % HUGE) % HUGE; /* below HUGE, so the tail always has HUGE - lead bytes */
    if (lead) munmap(m, lead);
    munmap(m + lead + len, HUGE - lead);
    madvise(m + lead, len, MADV_HUGEPAGE);
    return m + lead;
#else
    void *p = NULL;
    return posix_memalign(&p, HUGE, len) ? NULL : p;
#endif
}

static void huge_free(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    munmap(p, (bytes + HUGE - 1) / HUGE * HUGE);
#else
    (void)bytes;
    free(p);
#endif
}

static uint8_t *alloc_weights(size_t bytes) {
    size_t need = 64 + (bytes + 63) / 64 * 64;
    if (need >= OWN_RUN) {
        uint8_t *p = huge_run(need);
        if (!p) return NULL;
        *(weight_head *)p = (weight_head){NULL, need};
        return p + 64;
    }
    pthread_mutex_lock(&slab_mu);
    if (!slab_now || slab_now->used + need > SLAB) {
        slab *s = malloc(sizeof *s);
        uint8_t *base = s ? huge_run(SLAB) : NULL;
        if (!base) {
            free(s);
            pthread_mutex_unlock(&slab_mu);
            return NULL;
        }
        *s = (slab){base, 0, 0};
        if (slab_now && slab_now->live == 0) { /* every matrix of the old one is gone already */
            huge_free(slab_now->base, SLAB);
            free(slab_now);
        }
        slab_now = s;
    }
    uint8_t *p = slab_now->base + slab_now->used;
    slab_now->used += need;
    slab_now->live++;
    *(weight_head *)p = (weight_head){slab_now, 0};
    pthread_mutex_unlock(&slab_mu);
    return p + 64;
}

static void free_weights(uint8_t *data) {
    if (!data) return;
    uint8_t *p = data - 64;
    slab *s = ((weight_head *)p)->from;
    if (!s) {
        huge_free(p, ((weight_head *)p)->run);
        return;
    }
    pthread_mutex_lock(&slab_mu);
    if (--s->live == 0 && s != slab_now) {
        huge_free(s->base, SLAB);
        free(s);
    }
    pthread_mutex_unlock(&slab_mu);
}

size_t se_type_row_bytes(int type, int k) {
    if (k <= 0 || k % SE_BLOCK) return 0;
    switch (type) {
    case SE_F32: return (size_t)k * 4;
    case SE_F16:
    case SE_BF16: return (size_t)k * 2;
    case SE_Q4_0: return (size_t)(k / 32) * 18;
    case SE_Q4_1: return (size_t)(k / 32) * 20;
    case SE_Q5_0: return (size_t)(k / 32) * 22;
    case SE_Q8_0: return (size_t)(k / 32) * 34;
    case SE_Q4_K: return k % 256 ? 0 : (size_t)(k / 256) * 144;
    case SE_Q5_K: return k % 256 ? 0 : (size_t)(k / 256) * 176;
    case SE_Q6_K: return k % 256 ? 0 : (size_t)(k / 256) * 210;
    default: return 0;
    }
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* One GGUF block of row r -> its place in the packed block `dst` (lane r). */
static void pack_block(const se_mat *m, int type, const uint8_t *src, uint8_t *dst, int r) {
    if (se_is_float(m->kern)) { /* element t of the 32 -> vector t, lane r */
        size_t es = m->kern == SE_KERN_F32 ? 4 : 2;
        for (int t = 0; t < SE_BLOCK; t++) memcpy(dst + ((size_t)t * SE_GROUP + r) * es, src + t * es, es);
        return;
    }
    uint16_t *d = (uint16_t *)(dst + se_scale_at(m->kern));
    d[r] = rd16(src);
    if (type == SE_Q8_0) {
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) dst[j * 64 + r * 4 + i] = (uint8_t)(src[2 + 4 * j + i] ^ 0x80);
        return;
    }
    const uint8_t *qs = src + (type == SE_Q4_1 ? 4 : type == SE_Q5_0 ? 6 : 2);
    if (type == SE_Q4_1) d[16 + r] = rd16(src + 2);
    /* GGUF: weight j < 16 is qs[j] & 15, weight 16 + j is qs[j] >> 4: byte 4t+i already holds the pair the packed
     * vector t wants in lane r. */
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) dst[t * 64 + r * 4 + i] = qs[4 * t + i];
    if (type == SE_Q5_0) { /* qh: bit j is bit 4 of weight j -> bit (r*4 + i) of mask j / 4 */
        uint32_t qh = (uint32_t)src[2] | (uint32_t)src[3] << 8 | (uint32_t)src[4] << 16 | (uint32_t)src[5] << 24;
        for (int j = 0; j < SE_BLOCK; j++)
            if (qh >> j & 1) dst[256 + (j / 4) * 8 + (r * 4 + j % 4) / 8] |= (uint8_t)(1u << ((r * 4 + j % 4) % 8));
    }
}

int se_pack(se_mat *m, int type, const uint8_t *raw, size_t row_bytes, int n, int k) {
    memset(m, 0, sizeof *m);
    size_t want = se_type_row_bytes(type, k);
    if (!want || want != row_bytes || n <= 0) return -1;
    m->kern = type == SE_Q8_0 ? SE_KERN_Q8 : type == SE_Q5_0 ? SE_KERN_Q5 : type == SE_Q4_K ? SE_KERN_Q4K
            : type == SE_Q5_K ? SE_KERN_Q5K : type == SE_Q6_K ? SE_KERN_Q6K : type == SE_F32 ? SE_KERN_F32
            : type == SE_F16 ? SE_KERN_F16 : type == SE_BF16 ? SE_KERN_BF16 : SE_KERN_Q4;
    m->has_min = type == SE_Q4_1 || type == SE_Q4_K || type == SE_Q5_K;
    m->offset = type == SE_Q4_0 ? 8 : type == SE_Q5_0 ? 16 : type == SE_Q6_K ? 32 : type == SE_Q8_0 ? 128 : 0;
    int super = m->kern == SE_KERN_Q4K || m->kern == SE_KERN_Q5K || m->kern == SE_KERN_Q6K;
    m->n = n;
    m->k = k;
    m->nb = k / SE_BLOCK;
    m->ngroups = (n + SE_GROUP - 1) / SE_GROUP;
    m->block_bytes = m->kern == SE_KERN_Q4K ? SE_Q4K_BYTES : m->kern == SE_KERN_Q5K ? SE_Q5K_BYTES
                   : m->kern == SE_KERN_Q6K ? SE_Q6K_BYTES
                   : se_is_float(m->kern) ? (size_t)SE_BLOCK * SE_GROUP * (m->kern == SE_KERN_F32 ? 4 : 2)
                   : se_scale_at(m->kern) + 32 + (m->has_min ? 32 : 0);
    int blocks = super ? m->nb / SE_SUPER : m->nb; /* packed blocks per row */
    m->group_bytes = m->block_bytes * (size_t)blocks;
    size_t total = m->group_bytes * (size_t)m->ngroups;
    m->data = alloc_weights(total);
    if (!m->data) return -2;
    memset(m->data, 0, total);
    size_t src_block = row_bytes / (size_t)blocks;
    for (int row = 0; row < n; row++) {
        uint8_t *group = m->data + (size_t)(row / SE_GROUP) * m->group_bytes;
        for (int b = 0; b < blocks; b++) {
            const uint8_t *src = raw + (size_t)row * row_bytes + (size_t)b * src_block;
            uint8_t *dst = group + (size_t)b * m->block_bytes;
            if (super) se_pack_superblock(type, src, dst, row % SE_GROUP);
            else pack_block(m, type, src, dst, row % SE_GROUP);
        }
    }
    return 0;
}

void se_mat_free(se_mat *m) {
    free_weights(m->data);
    m->data = NULL;
}

void se_dequant_row(const se_mat *m, int row, float *out) {
    const uint8_t *group = m->data + (size_t)(row / SE_GROUP) * m->group_bytes;
    int r = row % SE_GROUP;
    if (m->kern == SE_KERN_Q4K || m->kern == SE_KERN_Q5K || m->kern == SE_KERN_Q6K) {
        for (int b = 0; b < m->nb / SE_SUPER; b++)
            se_dequant_superblock(m, group + (size_t)b * m->block_bytes, r, out + b * SE_SUPER * SE_BLOCK);
        return;
    }
    if (se_is_float(m->kern)) {
        for (int b = 0; b < m->nb; b++)
            for (int t = 0; t < SE_BLOCK; t++)
                out[b * SE_BLOCK + t] = se_f_weight(m, group + (size_t)b * m->block_bytes, t, r);
        return;
    }
    for (int b = 0; b < m->nb; b++) {
        const uint8_t *blk = group + (size_t)b * m->block_bytes;
        const uint16_t *d = (const uint16_t *)(blk + se_scale_at(m->kern));
        float scale = se_f16_to_f32(d[r]), min = m->has_min ? se_f16_to_f32(d[16 + r]) : 0.0f;
        for (int j = 0; j < SE_BLOCK; j++) {
            float v = scale * (float)(se_unpacked(m->kern, blk, r, j) - m->offset);
            out[b * SE_BLOCK + j] = m->has_min ? v + min : v;
        }
    }
}
