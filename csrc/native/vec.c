/* Float primitives of attention and activations, one fixed operation order in every ISA (AVX2's in vec_avx2.c,
 * NEON's in vec_neon.c):
 *   scores: a key's dot with a query is one fused chain over the dims from 0, acc = fma(q[d], k[d], acc), then
 *           times the scale; the K cache is dims-major in blocks of SE_KBLOCK keys, so a register holds 16 (AVX-512),
 *           8 (AVX2) or 4 (NEON) keys' chains and no sum is ever reduced across lanes;
 *   axpy: y[d] = fma(a, x[d], y[d]) lane by lane;
 *   exp:  n = round(x * log2 e), r = x - n * ln2 (two fused steps), a degree-5 polynomial (fused), times 2^n.
 * A call runs its blocks in groups (4 on AVX-512, 2 on AVX2) for independent chains; each lane's chain is the same. */
#include "se.h"
#include "vec_common.h"

#include <math.h>
#include <string.h>

float se_expf(float x) {
    float c = x < EXP_LO ? EXP_LO : x > EXP_HI ? EXP_HI : x;
    float n = (c * LOG2E + MAGIC) - MAGIC;
    float r = fmaf(n, -LN2_HI, c);
    r = fmaf(n, -LN2_LO, r);
    float p = fmaf(P0, r, P1);
    p = fmaf(p, r, P2);
    p = fmaf(p, r, P3);
    p = fmaf(p, r, P4);
    p = fmaf(p, r, P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return x < EXP_LO ? 0.0f : y * s;
}

static void axpy_f16_portable(float *y, float a, const uint16_t *x, int n) {
    for (int d = 0; d < n; d++) y[d] = fmaf(a, se_f16_to_f32(x[d]), y[d]);
}

static void exp_portable(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = se_expf(x[i]);
}

static void to_f16_portable(const float *x, uint16_t *y, int n) {
    for (int i = 0; i < n; i++) y[i] = se_f32_to_f16(x[i]);
}

static void scores_portable(const float *const *q, int nq, const uint16_t *K, int b0, int nb, int hd, float scale,
                            float *const *out) {
    for (int b = 0; b < nb; b++) {
        const uint16_t *blk = K + (size_t)(b0 + b) * hd * SE_KBLOCK;
        for (int j = 0; j < nq; j++)
            for (int t = 0; t < SE_KBLOCK; t++) {
                float acc = 0.0f;
                for (int d = 0; d < hd; d++) acc = fmaf(q[j][d], se_f16_to_f32(blk[d * SE_KBLOCK + t]), acc);
                out[j][SE_KBLOCK * b + t] = acc * scale;
            }
    }
}

static void wsum_portable(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out) {
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int i = 0; i < cnt; i++) axpy_f16_portable(out, w[i], V + (size_t)idx[i] * hd, hd);
}

static void wsum_q_portable(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                            float *const *out) {
    for (int j = 0; j < nq; j++) wsum_portable(w[j], V, idx, cnt, hd, out[j]);
}

static const se_vec_ops portable = {axpy_f16_portable, exp_portable, to_f16_portable, scores_portable,
                                    wsum_portable, wsum_q_portable};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define T512 __attribute__((target("avx512f,avx512dq,avx512vl,f16c,fma")))

static T512 void axpy_f16_avx512(float *y, float a, const uint16_t *x, int n) {
    __m512 va = _mm512_set1_ps(a);
    for (int d = 0; d < n; d += 16)
        _mm512_storeu_ps(y + d, _mm512_fmadd_ps(va, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + d))),
                                                 _mm512_loadu_ps(y + d)));
}

/* the tail (n % 16) in one masked vector too: se_expf one by one there had cost a softmax more than its bulk (its
 * fmaf is a library call in the baseline x86-64 build) */
static T512 void exp_avx512(float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

static T512 void to_f16_avx512(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = se_f32_to_f16(x[i]);
}

static T512 void wsum_avx512(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out) {
    for (int c0 = 0; c0 < hd; c0 += 64) {
        int parts = hd - c0 >= 64 ? 4 : (hd - c0) / 16;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int i = 0; i < cnt; i++) {
            __m512 e = _mm512_set1_ps(w[i]);
            const uint16_t *row = V + (size_t)idx[i] * hd + c0;
            for (int t = 0; t < parts; t++)
                acc[t] = _mm512_fmadd_ps(e, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 16 * t))), acc[t]);
        }
        for (int t = 0; t < parts; t++) _mm512_storeu_ps(out + c0 + 16 * t, acc[t]);
    }
}

/* g <= 4 blocks for nq queries (nq * g <= 16): one register per (query, block) holds its 16 keys' chains; each
 * block's dim d is converted once for every query (the broadcast q[j][d] folds into the fma). */
static inline T512 __attribute__((always_inline)) void
scores_group_avx512(const float *const *q, const int nq, const int g, const uint16_t *K, int b0, int hd,
                    float scale, float *const *out) {
    int at = SE_KBLOCK * b0;
    K += (size_t)b0 * hd * SE_KBLOCK;
    __m512 acc[8][4];
    for (int j = 0; j < nq; j++)
        for (int b = 0; b < g; b++) acc[j][b] = _mm512_setzero_ps();
    /* the group after next, a slice per dim: keys stream from memory at one thread's pace otherwise */
    const char *ahead = (const char *)(K + (size_t)2 * g * hd * SE_KBLOCK);
    for (int d = 0; d < hd; d++) {
        for (int o = 0; o < g * 32; o += 64) _mm_prefetch(ahead + (size_t)d * g * 32 + o, _MM_HINT_T0);
        for (int b = 0; b < g; b++) {
            __m512 k = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(K + ((size_t)b * hd + d) * SE_KBLOCK)));
            for (int j = 0; j < nq; j++) acc[j][b] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][d]), k, acc[j][b]);
        }
    }
    for (int j = 0; j < nq; j++)
        for (int b = 0; b < g; b++)
            _mm512_storeu_ps(out[j] + at + SE_KBLOCK * b, _mm512_mul_ps(acc[j][b], _mm512_set1_ps(scale)));
}

static T512 void scores_avx512(const float *const *q, int nq, const uint16_t *K, int b0, int nb, int hd,
                               float scale, float *const *out) {
    K += (size_t)b0 * hd * SE_KBLOCK;
    SCORES_BY_NQ(scores_group_avx512, 4, 8, 2);
}

/* dims c0 .. c0 + 16 P of nq queries' weighted sums, each (query, 16 dims) one register's chains over the keys in
 * order: a V row's slice is converted once for every query */
static inline T512 __attribute__((always_inline)) void
wsum_slice_avx512(const float *const *w, const int nq, const int P, const uint16_t *V, const int32_t *idx, int cnt,
                  int hd, int c0, float *const *out) {
    __m512 acc[12][4];
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < P; t++) acc[j][t] = _mm512_setzero_ps();
    for (int i = 0; i < cnt; i++) {
        const uint16_t *row = V + (size_t)idx[i] * hd + c0;
        if (i + 32 < cnt) /* 32 rows ahead, as the keys */
            for (int t = 0; t < P; t += 2)
                _mm_prefetch((const char *)(V + (size_t)idx[i + 32] * hd + c0 + 16 * t), _MM_HINT_T0);
        for (int t = 0; t < P; t++) {
            __m512 vt = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 16 * t)));
            for (int j = 0; j < nq; j++) acc[j][t] = _mm512_fmadd_ps(_mm512_set1_ps(w[j][i]), vt, acc[j][t]);
        }
    }
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < P; t++) _mm512_storeu_ps(out[j] + c0 + 16 * t, acc[j][t]);
}

/* slices of 16 P dims, then of 16 */
#define WSUM_RUN(NQ, P, ws, os)                                                                                     \
    do {                                                                                                            \
        int c0 = 0;                                                                                                 \
        for (; c0 + 16 * (P) <= hd; c0 += 16 * (P)) wsum_slice_avx512(ws, NQ, P, V, idx, cnt, hd, c0, os);         \
        for (; c0 < hd; c0 += 16) wsum_slice_avx512(ws, NQ, 1, V, idx, cnt, hd, c0, os);                            \
    } while (0)

/* up to 6 queries: slices of 64 dims; more: even chunks of up to 12 queries, slices of 32 */
static T512 void wsum_q_avx512(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                               float *const *out) {
    int chunks = (nq + 11) / 12, size = nq <= 6 ? nq : (nq + chunks - 1) / chunks;
    for (int j0 = 0; j0 < nq; j0 += size) {
        const float *const *wc = w + j0;
        float *const *oc = out + j0;
        switch (nq - j0 < size ? nq - j0 : size) {
        case 1: WSUM_RUN(1, 4, wc, oc); break;
        case 2: WSUM_RUN(2, 4, wc, oc); break;
        case 3: WSUM_RUN(3, 4, wc, oc); break;
        case 4: WSUM_RUN(4, 4, wc, oc); break;
        case 5: WSUM_RUN(5, 4, wc, oc); break;
        case 6: WSUM_RUN(6, 4, wc, oc); break;
        case 7: WSUM_RUN(7, 2, wc, oc); break;
        case 8: WSUM_RUN(8, 2, wc, oc); break;
        case 9: WSUM_RUN(9, 2, wc, oc); break;
        case 10: WSUM_RUN(10, 2, wc, oc); break;
        case 11: WSUM_RUN(11, 2, wc, oc); break;
        default: WSUM_RUN(12, 2, wc, oc); break;
        }
    }
}

static const se_vec_ops avx512 = {axpy_f16_avx512, exp_avx512, to_f16_avx512, scores_avx512, wsum_avx512,
                                  wsum_q_avx512};
#endif

const se_vec_ops *se_vec(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (se_isa()) {
    case SE_ISA_AVX512: return &avx512;
    case SE_ISA_AVX2: return se_vec_avx2();
    }
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    if (se_isa() == SE_ISA_NEON) return se_vec_neon();
#endif
    return &portable;
}
