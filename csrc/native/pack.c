/* GGUF blocks -> the engine's packed layout (se.h), without changing any weight's value. */
#include "se.h"

#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* Weights stream once per token: large matrices go on 2 MB-aligned memory the kernel may back with huge pages
 * (fewer TLB misses on the stream), small ones on 64-byte lines. */
static uint8_t *alloc_weights(size_t bytes) {
    size_t align = bytes >= (1u << 21) ? (1u << 21) : 64;
    void *p = NULL;
    if (posix_memalign(&p, align, (bytes + align - 1) / align * align)) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align > 64) madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
#endif
    return p;
}

size_t se_type_row_bytes(int type, int k) {
    if (k <= 0 || k % SE_BLOCK) return 0;
    switch (type) {
    case SE_Q4_0: return (size_t)(k / 32) * 18;
    case SE_Q4_1: return (size_t)(k / 32) * 20;
    case SE_Q8_0: return (size_t)(k / 32) * 34;
    default: return 0;
    }
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* One GGUF block of row r -> its place in the packed block `dst` (lane r). */
static void pack_block(const se_mat *m, int type, const uint8_t *src, uint8_t *dst, int r) {
    uint16_t *d = (uint16_t *)(dst + (m->kern == SE_KERN_Q4 ? 256 : 512));
    if (type == SE_Q8_0) {
        d[r] = rd16(src);
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) dst[j * 64 + r * 4 + i] = (uint8_t)(src[2 + 4 * j + i] ^ 0x80);
        return;
    }
    const uint8_t *qs = src + (type == SE_Q4_1 ? 4 : 2);
    d[r] = rd16(src);
    if (type == SE_Q4_1) d[16 + r] = rd16(src + 2);
    /* GGUF: weight j < 16 is qs[j] & 15, weight 16 + j is qs[j] >> 4: byte 4t+i already holds the pair the packed
     * vector t wants in lane r. */
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) dst[t * 64 + r * 4 + i] = qs[4 * t + i];
}

int se_pack(se_mat *m, int type, const uint8_t *raw, size_t row_bytes, int n, int k) {
    memset(m, 0, sizeof *m);
    size_t want = se_type_row_bytes(type, k);
    if (!want || want != row_bytes || n <= 0) return -1;
    m->kern = type == SE_Q8_0 ? SE_KERN_Q8 : SE_KERN_Q4;
    m->has_min = type == SE_Q4_1;
    m->offset = type == SE_Q4_0 ? 8 : type == SE_Q8_0 ? 128 : 0;
    m->n = n;
    m->k = k;
    m->nb = k / SE_BLOCK;
    m->ngroups = (n + SE_GROUP - 1) / SE_GROUP;
    m->block_bytes = m->kern == SE_KERN_Q8 ? 512 + 32 : 256 + 32 + (m->has_min ? 32 : 0);
    m->group_bytes = m->block_bytes * (size_t)m->nb;
    size_t total = m->group_bytes * (size_t)m->ngroups;
    m->data = alloc_weights(total);
    if (!m->data) return -2;
    memset(m->data, 0, total);
    size_t src_block = row_bytes / (size_t)m->nb;
    for (int row = 0; row < n; row++) {
        uint8_t *group = m->data + (size_t)(row / SE_GROUP) * m->group_bytes;
        for (int b = 0; b < m->nb; b++)
            pack_block(m, type, raw + (size_t)row * row_bytes + (size_t)b * src_block, group + (size_t)b * m->block_bytes,
                       row % SE_GROUP);
    }
    return 0;
}

void se_mat_free(se_mat *m) {
    free(m->data);
    m->data = NULL;
}

void se_dequant_row(const se_mat *m, int row, float *out) {
    const uint8_t *group = m->data + (size_t)(row / SE_GROUP) * m->group_bytes;
    int r = row % SE_GROUP;
    for (int b = 0; b < m->nb; b++) {
        const uint8_t *blk = group + (size_t)b * m->block_bytes;
        const uint16_t *d = (const uint16_t *)(blk + (m->kern == SE_KERN_Q4 ? 256 : 512));
        float scale = se_f16_to_f32(d[r]), min = m->has_min ? se_f16_to_f32(d[16 + r]) : 0.0f;
        for (int j = 0; j < SE_BLOCK; j++) {
            int u;
            if (m->kern == SE_KERN_Q8) {
                u = blk[(j / 4) * 64 + r * 4 + j % 4];
            } else {
                uint8_t byte = blk[((j % 16) / 4) * 64 + r * 4 + j % 4];
                u = j < 16 ? byte & 15 : byte >> 4;
            }
            float v = scale * (float)(u - m->offset);
            out[b * SE_BLOCK + j] = m->has_min ? v + min : v;
        }
    }
}
