/* The compute roof: how many 8-bit multiply-adds a second the pool's threads issue with the integer dot instruction
 * the kernels use (AVX-512 VNNI vpdpbusd: 64 a zmm; AVX2 vpmaddubsw + vpmaddwd + vpaddd: 32 a ymm; NEON sdot: 16;
 * portable C: one), over 8 independent chains, nothing else in the loop. perf/native_kernels.py reports the
 * kernels' multiply-adds against it beside the memory roof: a pass of many rows is bound by these vector pipes,
 * which the float steps of each block share (docs/native.md, "The compute roof"). */
#include "se.h"
#include "pool.h"

#define ITERS 4096 /* per item: 8 chains each */

typedef struct {
    uint64_t macs[64], sums[64];
} dot_job;

static uint64_t chains_portable(uint64_t *sum) {
    int32_t acc[8] = {0}, a = 3;
    for (int i = 0; i < ITERS; i++) {
        for (int c = 0; c < 8; c++) acc[c] += a * (5 + c);
        __asm__("" : "+r"(a)); /* not provably constant: the loop stays */
    }
    for (int c = 0; c < 8; c++) *sum += (uint64_t)(uint32_t)acc[c];
    return (uint64_t)ITERS * 8;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define CHAIN8(step) step(0) step(1) step(2) step(3) step(4) step(5) step(6) step(7)

static __attribute__((target("avx512f,avx512bw,avx512vnni"))) uint64_t chains_avx512(uint64_t *sum) {
    __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
#define INIT(c) __m512i a##c = _mm512_set1_epi32(c);
    CHAIN8(INIT)
    for (int i = 0; i < ITERS; i++) {
#define DOT(c) a##c = _mm512_dpbusd_epi32(a##c, w, x);
        CHAIN8(DOT)
        __asm__("" : "+v"(w)); /* each chain's operand is not provably the others': no chain is merged */
    }
#define FOLD(c) a0 = _mm512_add_epi32(a0, a##c);
    CHAIN8(FOLD)
    *sum += (uint64_t)(uint32_t)_mm512_reduce_add_epi32(a0);
    return (uint64_t)ITERS * 8 * 64;
}

static __attribute__((target("avx2"))) uint64_t chains_avx2(uint64_t *sum) {
    __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5), one = _mm256_set1_epi16(1);
#define INIT2(c) __m256i b##c = _mm256_set1_epi32(c);
    CHAIN8(INIT2)
    for (int i = 0; i < ITERS; i++) {
#define DOT2(c) b##c = _mm256_add_epi32(b##c, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), one));
        CHAIN8(DOT2)
        __asm__("" : "+v"(w));
    }
#define FOLD2(c) b0 = _mm256_add_epi32(b0, b##c);
    CHAIN8(FOLD2)
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, b0);
    *sum += (uint64_t)(uint32_t)v[0];
    return (uint64_t)ITERS * 8 * 32;
}
#endif

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>

static SE_DOTPROD uint64_t chains_neon(uint64_t *sum) {
    int8x16_t w = vdupq_n_s8(3), x = vdupq_n_s8(5);
    int32x4_t a[8];
    for (int c = 0; c < 8; c++) a[c] = vdupq_n_s32(c);
    for (int i = 0; i < ITERS; i++) {
        for (int c = 0; c < 8; c++) a[c] = vdotq_s32(a[c], w, x);
        __asm__("" : "+w"(w));
    }
    for (int c = 1; c < 8; c++) a[0] = vaddq_s32(a[0], a[c]);
    *sum += (uint64_t)(uint32_t)vaddvq_s32(a[0]);
    return (uint64_t)ITERS * 8 * 16;
}
#endif

static uint64_t chains(uint64_t *sum) {
    switch (se_isa()) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case SE_ISA_AVX512: return chains_avx512(sum);
    case SE_ISA_AVX2: return chains_avx2(sum);
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    case SE_ISA_NEON: return se_cpu_dotprod() ? chains_neon(sum) : chains_portable(sum);
#endif
    default: return chains_portable(sum);
    }
}

static void dot_run(void *p, int thread, int a, int b) {
    dot_job *j = p;
    for (int i = a; i < b; i++) j->macs[thread % 64] += chains(&j->sums[thread % 64]);
}

/* `items` items of 8 x ITERS dot instructions on the pool's threads; returns the multiply-adds done (the sums go to
 * *check, so no loop can be dropped). */
uint64_t se_dot_roof(se_pool *p, int items, uint64_t *check) {
    dot_job j = {{0}, {0}};
    se_pool_for(p, items, (items + 2 * se_pool_threads(p) - 1) / (2 * se_pool_threads(p)), dot_run, &j);
    uint64_t macs = 0;
    for (int i = 0; i < 64; i++) macs += j.macs[i], *check ^= j.sums[i];
    return macs;
}
