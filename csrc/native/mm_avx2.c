/* AVX2 + FMA matmul of the 32-wide formats: the AVX-512 kernel's arithmetic on two 8-lane halves of each 16-row
 * group. Without VNNI the u8 x s8 dot is vpmaddubsw (pairs to int16) + vpmaddwd (pairs of those to int32). 4-bit
 * weights (<= 15) keep a block's 8 vpmaddubsw results in int16 and widen once: a lane's sum is at most
 * 8 * 2 * 15 * 127 = 30480 < 2^15 (Q5_0's 5-bit weights: 4 of them, 31496), so the total is the same exact integer
 * and the widening, half of AVX2's integer work a row, runs once a block instead of 8 times. 8-bit weights go through
 * the sign trick (|q| x sign(x, q)), a pair up to 2 * 128 * 127, so each is widened at once; that yields
 * sum(q * x) = sum(u * x) - 128 * sum(x), the same integer the other paths form. */
#include "se.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "avx2.h"

#define PASS 5
#define PF_L1 2048
#define PF_L2 12288

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

/* A pass: R activation rows times H halves of the group from half h0 (H = 2: both, so each weight vector and
 * each broadcast activation is loaded once for both), slot j = (half h0 + j / R, row j % R). R, H and the format
 * are constants at every call (the switch below): no test inside the loop. */
static inline SE_AVX2 __attribute__((always_inline)) void
pass_rows(const se_mat *w, const uint8_t *group, const se_act *x, int i0, const int R, float *out, int ldo, int col,
          int lanes, int h0, const int H, const int q8, const int q5, const int has_min) {
    const size_t scale_at = se_scale_at(q8 ? SE_KERN_Q8 : q5 ? SE_KERN_Q5 : SE_KERN_Q4);
    const int offset = q8 ? 0 : w->offset; /* the sign trick already subtracted 128 * sum(x) */
    const int S = R * H;
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256 acc[PASS];
    for (int j = 0; j < S; j++) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < w->nb; b++) {
        const uint8_t *blk = group + (size_t)b * w->block_bytes;
        if (h0 == 0)
            for (size_t off = 0; off < w->block_bytes; off += 64) {
                _mm_prefetch((const char *)blk + PF_L1 + off, _MM_HINT_T0);
                _mm_prefetch((const char *)blk + PF_L2 + off, _MM_HINT_T1);
            }
        __m256i dot[PASS], sum16[PASS]; /* sum16: the int16 pair sums not yet widened (4-bit weights) */
        for (int j = 0; j < S; j++) dot[j] = sum16[j] = _mm256_setzero_si256();
        for (int t = 0; t < (q8 ? 8 : 4); t++) {
            __m256i lo[2], hi[2];
            for (int e = 0; e < H; e++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * t + 32 * (h0 + e)));
                lo[e] = q8 ? v : _mm256_and_si256(v, nib);
                hi[e] = q8 ? v : _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                if (q5) {
                    lo[e] = _mm256_or_si256(lo[e], high_bits(blk, t, h0 + e));
                    hi[e] = _mm256_or_si256(hi[e], high_bits(blk, 4 + t, h0 + e));
                }
            }
            for (int j = 0; j < S; j++) {
                int32_t xa;
                __builtin_memcpy(&xa, x->q + (size_t)(i0 + j % R) * x->k + b * SE_BLOCK + 4 * t, 4);
                if (q8) {
                    dot[j] = _mm256_add_epi32(dot[j], dot4_q8(lo[j / R], _mm256_set1_epi32(xa)));
                    SE_PIN(dot[j]);
                } else {
                    sum16[j] = _mm256_add_epi16(sum16[j], _mm256_maddubs_epi16(lo[j / R], _mm256_set1_epi32(xa)));
                    SE_PIN(sum16[j]);
                }
            }
            if (!q8) {
                for (int j = 0; j < S; j++) {
                    int32_t xa;
                    __builtin_memcpy(&xa, x->q + (size_t)(i0 + j % R) * x->k + b * SE_BLOCK + 16 + 4 * t, 4);
                    sum16[j] = _mm256_add_epi16(sum16[j], _mm256_maddubs_epi16(hi[j / R], _mm256_set1_epi32(xa)));
                    SE_PIN(sum16[j]);
                }
                if (t == 3 || (q5 && t == 1)) /* widened: once a block (Q5_0: twice) */
                    for (int j = 0; j < S; j++) {
                        dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(sum16[j], _mm256_set1_epi16(1)));
                        sum16[j] = _mm256_setzero_si256();
                    }
            }
        }
        for (int j = 0; j < S; j++) {
            size_t at = (size_t)(i0 + j % R) * x->nb + b;
            const uint8_t *sc = blk + scale_at + 16 * (h0 + j / R); /* the half's fp16 scales, then its mins */
            __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc)), _mm256_set1_ps(x->d[at]));
            if (has_min) {
                __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 32)));
                acc[j] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot[j]), acc[j]);
                acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(x->m[at]), acc[j]);
            } else {
                __m256i sumi = _mm256_sub_epi32(dot[j], _mm256_set1_epi32(offset * x->s[at]));
                acc[j] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi), acc[j]);
            }
        }
    }
    for (int j = 0; j < S; j++)
        se_store8(out + (size_t)(i0 + j % R) * ldo + col + 8 * (h0 + j / R), acc[j], lanes - 8 * (h0 + j / R));
}

#define ONE(R, H, ...) pass_rows(w, group, x, i0, R, out, ldo, g * SE_GROUP, lanes, h, H, __VA_ARGS__)
/* 1-2 rows (a call of 1-2: se_pass_rows gives 3 or more to every pass of a wider one): both halves in one pass;
 * more: a pass a half */
#define PASSES(...)                                                                                              \
    switch (r) { /* q8, q5, has_min */                                                                         \
    case 1: ONE(1, 2, __VA_ARGS__); break;                                                                      \
    case 2: ONE(2, 2, __VA_ARGS__); break;                                                                      \
    case 3: ONE(3, 1, __VA_ARGS__); break;                                                                      \
    case 4: ONE(4, 1, __VA_ARGS__); break;                                                                      \
    default: ONE(PASS, 1, __VA_ARGS__); break;                                                                  \
    }

SE_AVX2 void se_mm_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        int lanes = w->n - g * SE_GROUP;
        for (int h = 0; h < (rows <= 2 ? 1 : 2); h++) /* 1-2 rows: one pass does both halves */
            for (int i0 = 0, r; i0 < rows; i0 += r) {
                r = se_pass_rows(rows, PASS, i0);
                SE_BY_FORMAT(w, PASSES);
            }
    }
}
#endif
