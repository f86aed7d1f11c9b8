/* AVX2 + FMA matmul of the 32-wide formats: the AVX-512 kernel's arithmetic on two 8-lane halves of each 16-row
 * group. Without VNNI the u8 x s8 dot is vpmaddubsw (pairs to int16) + vpmaddwd (pairs of those to int32). 4-bit
 * weights (<= 15) keep a block's 8 vpmaddubsw results in int16 and widen once: a lane's sum is at most
 * 8 * 2 * 15 * 127 = 30480 < 2^15 (Q5_0's 5-bit weights: 4 of them, 31496), so the total is the same exact integer
 * and the widening, half of AVX2's integer work a row, runs once a block instead of 8 times. 8-bit weights go through
 * the sign trick (|q| x sign(x, q)), a pair up to 2 * 128 * 127, so each is widened at once; that yields
 * sum(q * x) = sum(u * x) - 128 * sum(x), the same integer the other paths form. */
#include "se.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define SE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define PASS 5
#define PF_L1 2048
#define PF_L2 12288
/* A row's running sum stays in its register and in program order: without this GCC scheduled every row's 8
 * products of a block first and summed them as a tree, spilling them and the float accumulators to the stack
 * (SmolLM2-135M on this path: T(5) -14%, T(9) -15% with it; the integer sums are the same either way) */
#define PIN(v) __asm__("" : "+x"(v))

/* 8-bit weights (stored + 128): sum over each 4 of q * x, widened at once */
static inline SE_AVX2 __attribute__((always_inline)) __m256i dot4_q8(__m256i w, __m256i x) {
    __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)),
                             _mm256_set1_epi16(1));
}

/* Q5_0: 32 mask bits -> 32 bytes, byte k = 0x10 where bit k is set (bit 4 of the weight in that byte). */
static inline SE_AVX2 __attribute__((always_inline)) __m256i high_bits(const uint8_t *blk, int j, int h) {
    uint32_t m;
    __builtin_memcpy(&m, blk + 256 + 8 * j + 4 * h, 4);
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                         3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), idx);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
}

static inline SE_AVX2 __attribute__((always_inline)) void
pass_rows(const se_mat *w, const uint8_t *group, const se_act *x, int i0, const int R, float *out, int ldo, int col,
          int lanes, int h, const int q8, const int q5, const int has_min) {
    /* R and the format are constants at every call (the switch below): no test inside the loop */
    const size_t scale_at = se_scale_at(q8 ? SE_KERN_Q8 : q5 ? SE_KERN_Q5 : SE_KERN_Q4);
    const int offset = q8 ? 0 : w->offset; /* the sign trick already subtracted 128 * sum(x) */
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256 acc[PASS];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < w->nb; b++) {
        const uint8_t *blk = group + (size_t)b * w->block_bytes;
        if (h == 0)
            for (size_t off = 0; off < w->block_bytes; off += 64) {
                _mm_prefetch((const char *)blk + PF_L1 + off, _MM_HINT_T0);
                _mm_prefetch((const char *)blk + PF_L2 + off, _MM_HINT_T1);
            }
        __m256i dot[PASS], sum16[PASS]; /* sum16: the int16 pair sums not yet widened (4-bit weights) */
        for (int i = 0; i < R; i++) dot[i] = sum16[i] = _mm256_setzero_si256();
        for (int t = 0; t < (q8 ? 8 : 4); t++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * t + 32 * h));
            __m256i lo = q8 ? v : _mm256_and_si256(v, nib);
            if (q5) lo = _mm256_or_si256(lo, high_bits(blk, t, h));
            for (int i = 0; i < R; i++) {
                int32_t xa;
                __builtin_memcpy(&xa, x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK + 4 * t, 4);
                if (q8) {
                    dot[i] = _mm256_add_epi32(dot[i], dot4_q8(lo, _mm256_set1_epi32(xa)));
                    PIN(dot[i]);
                } else {
                    sum16[i] = _mm256_add_epi16(sum16[i], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xa)));
                    PIN(sum16[i]);
                }
            }
            if (!q8) {
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                if (q5) hi = _mm256_or_si256(hi, high_bits(blk, 4 + t, h));
                for (int i = 0; i < R; i++) {
                    int32_t xa;
                    __builtin_memcpy(&xa, x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK + 16 + 4 * t, 4);
                    sum16[i] = _mm256_add_epi16(sum16[i], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xa)));
                    PIN(sum16[i]);
                }
                if (t == 3 || (q5 && t == 1)) /* widened: once a block (Q5_0: twice) */
                    for (int i = 0; i < R; i++) {
                        dot[i] = _mm256_add_epi32(dot[i], _mm256_madd_epi16(sum16[i], _mm256_set1_epi16(1)));
                        sum16[i] = _mm256_setzero_si256();
                    }
            }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + scale_at + 16 * h)));
        if (has_min) {
            __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + scale_at + 32 + 16 * h)));
            for (int i = 0; i < R; i++) {
                float xd = x->d[(size_t)(i0 + i) * x->nb + b];
                __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(xd));
                acc[i] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot[i]), acc[i]);
                acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(x->m[(size_t)(i0 + i) * x->nb + b]), acc[i]);
            }
        } else {
            for (int i = 0; i < R; i++) {
                float xd = x->d[(size_t)(i0 + i) * x->nb + b];
                int32_t xs = x->s[(size_t)(i0 + i) * x->nb + b];
                __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(xd));
                __m256i sumi = _mm256_sub_epi32(dot[i], _mm256_set1_epi32(offset * xs));
                acc[i] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi), acc[i]);
            }
        }
    }
    int valid = lanes - 8 * h;
    for (int i = 0; i < R; i++) {
        float *dst = out + (size_t)(i0 + i) * ldo + col + 8 * h;
        if (valid >= 8) {
            _mm256_storeu_ps(dst, acc[i]);
        } else if (valid > 0) {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[i]);
            for (int r = 0; r < valid; r++) dst[r] = tmp[r];
        }
    }
}

#define PASSES(...)                                                                                              \
    switch (r) { /* q8, q5, has_min */                                                                         \
    case 1: pass_rows(w, group, x, i0, 1, out, ldo, g * SE_GROUP, lanes, h, __VA_ARGS__); break;                \
    case 2: pass_rows(w, group, x, i0, 2, out, ldo, g * SE_GROUP, lanes, h, __VA_ARGS__); break;                \
    case 3: pass_rows(w, group, x, i0, 3, out, ldo, g * SE_GROUP, lanes, h, __VA_ARGS__); break;                \
    case 4: pass_rows(w, group, x, i0, 4, out, ldo, g * SE_GROUP, lanes, h, __VA_ARGS__); break;                \
    default: pass_rows(w, group, x, i0, PASS, out, ldo, g * SE_GROUP, lanes, h, __VA_ARGS__); break;            \
    }

SE_AVX2 void se_mm_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        int lanes = w->n - g * SE_GROUP;
        for (int h = 0; h < 2; h++)
            for (int i0 = 0, r; i0 < rows; i0 += r) {
                r = se_pass_rows(rows, PASS, i0);
                SE_BY_FORMAT(w, PASSES);
            }
    }
}
#endif
