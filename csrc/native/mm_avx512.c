/* AVX-512 VNNI matmul of the 32-wide formats (Q4_0, Q4_1, Q5_0, Q8_0): one zmm lane per output row of a 16-row
 * group, vpdpbusd over 4 weights at a time (Q5_0's fifth bit ORed in from a byte mask). Each
 * weight block is unpacked once and used for every activation row of the pass (up to PASS rows), and the weight
 * stream is prefetched ahead: that is what keeps 2-8 rows nearly as cheap as one (docs/native.md). */
#include "se.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "dpbusd.h"

#define SE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define PASS 12
#define PF_L1 2048
#define PF_L2 12288
/* A one-row pass leaves the stream to the hardware prefetchers: SmolLM2-135M (Q4_1 layers, Q8_0 head) T(1) -4.8%
 * without the software prefetches (their instructions cost more than they hid), gemma3-270m's Q8_0 head level; from
 * 2 rows up they are what keeps extra rows cheap (none at all: T(5) +20%). The K-quant kernels keep theirs at one
 * row (Qwen2.5-Coder-1.5B T(1) +2% without), and so does the AVX2 path (SmolLM2 T(1) +3.9% without). */
#define PF_MIN_ROWS 2
#define SPLIT_ROWS 2 /* rows up to which a block's integer sums run as two chains (pass_rows) */

/* Q5_0: bit 4 of the weights of vector j (one bit per byte, se.h). */
static inline __mmask64 high_bits(const uint8_t *blk, int j) {
    uint64_t m;
    __builtin_memcpy(&m, blk + 256 + 8 * j, 8);
    return (__mmask64)m;
}

/* R and the format (q8, q5, has_min) are constants at every call (the switch below): no test inside the loop. */
static inline SE_AVX512 __attribute__((always_inline)) void
pass_rows(const se_mat *w, const uint8_t *group, const se_act *x, int i0, const int R, float *out, int ldo, int col,
          int lanes, const int q8, const int q5, const int has_min) {
    const size_t scale_at = se_scale_at(q8 ? SE_KERN_Q8 : q5 ? SE_KERN_Q5 : SE_KERN_Q4);
    const __m512i nib = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    __m512 acc[PASS];
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < w->nb; b++) {
        const uint8_t *blk = group + (size_t)b * w->block_bytes;
        for (size_t off = 0; R >= PF_MIN_ROWS && off < w->block_bytes; off += 64) {
            _mm_prefetch((const char *)blk + PF_L1 + off, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + PF_L2 + off, _MM_HINT_T1);
        }
        /* two partial integer sums a row at up to SPLIT_ROWS rows (exact: their order cannot change the total): one
         * chain of 8 dependent vpdpbusd a block held the out-of-order window, and with it the loads ahead
         * (SmolLM2-135M T(1) -4%, gemma3-270m -1%; T(2) level) */
        __m512i dot[PASS], dot2[PASS];
        for (int i = 0; i < R; i++) dot[i] = dot2[i] = _mm512_setzero_si512();
        for (int t = 0; t < (q8 ? 8 : 4); t++) {
            __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * t));
            __m512i lo = q8 ? v : _mm512_and_si512(v, nib);
            if (q5) lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(high_bits(blk, t), bit4));
            for (int i = 0; i < R; i++) {
                const int8_t *xq = x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK + 4 * t;
                if (R <= SPLIT_ROWS && q8 && (t & 1)) dot2[i] = se_dpbusd_bcast(dot2[i], lo, xq);
                else dot[i] = se_dpbusd_bcast(dot[i], lo, xq);
            }
            if (!q8) {
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                if (q5) hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(high_bits(blk, 4 + t), bit4));
                for (int i = 0; i < R; i++) {
                    const int8_t *xq = x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK + 16 + 4 * t;
                    if (R <= SPLIT_ROWS) dot2[i] = se_dpbusd_bcast(dot2[i], hi, xq);
                    else dot[i] = se_dpbusd_bcast(dot[i], hi, xq);
                }
            }
        }
        if (R <= SPLIT_ROWS)
            for (int i = 0; i < R; i++) dot[i] = _mm512_add_epi32(dot[i], dot2[i]);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + scale_at)));
        if (has_min) {
            __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + scale_at + 32)));
            for (int i = 0; i < R; i++) {
                float xd = x->d[(size_t)(i0 + i) * x->nb + b];
                __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(xd));
                acc[i] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(dot[i]), acc[i]);
                acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(x->m[(size_t)(i0 + i) * x->nb + b]), acc[i]);
            }
        } else {
            for (int i = 0; i < R; i++) {
                float xd = x->d[(size_t)(i0 + i) * x->nb + b];
                int32_t xs = x->s[(size_t)(i0 + i) * x->nb + b];
                __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(xd));
                __m512i sumi = _mm512_sub_epi32(dot[i], _mm512_set1_epi32(w->offset * xs));
                acc[i] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sumi), acc[i]);
            }
        }
    }
    __mmask16 mask = lanes >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << lanes) - 1);
    for (int i = 0; i < R; i++) _mm512_mask_storeu_ps(out + (size_t)(i0 + i) * ldo + col, mask, acc[i]);
}

#define ROWS_CASE(n, ...) \
    case n: pass_rows(w, group, x, i0, n, out, ldo, g * SE_GROUP, lanes, __VA_ARGS__); break;
#define PASSES(...)                                                                                              \
    switch (r) { /* constant row counts: the compiler keeps every accumulator in a register */                 \
        ROWS_CASE(1, __VA_ARGS__) ROWS_CASE(2, __VA_ARGS__) ROWS_CASE(3, __VA_ARGS__)                            \
        ROWS_CASE(4, __VA_ARGS__) ROWS_CASE(5, __VA_ARGS__) ROWS_CASE(6, __VA_ARGS__)                            \
        ROWS_CASE(7, __VA_ARGS__) ROWS_CASE(8, __VA_ARGS__) ROWS_CASE(9, __VA_ARGS__)                            \
        ROWS_CASE(10, __VA_ARGS__) ROWS_CASE(11, __VA_ARGS__)                                                    \
        default: pass_rows(w, group, x, i0, PASS, out, ldo, g * SE_GROUP, lanes, __VA_ARGS__); break;           \
    }

SE_AVX512 void se_mm_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        int lanes = w->n - g * SE_GROUP;
        for (int i0 = 0; i0 < rows; i0 += PASS) {
            int r = rows - i0 < PASS ? rows - i0 : PASS;
            SE_BY_FORMAT(w, PASSES);
        }
    }
}
#endif
