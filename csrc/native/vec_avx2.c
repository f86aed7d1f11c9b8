/* AVX2 + FMA + F16C float primitives of attention and activations (se_vec_ops) in vec.c's operation order, on 8
 * lanes: a block's 16 keys' score chains in two registers, the weighted sums' (query, 8 dims) chains one register
 * each, exp se_expf's polynomial step for step. */
#include "se.h"
#include "vec_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <math.h>

#define T256 __attribute__((target("avx2,fma,f16c")))

static T256 void axpy_f16_avx2(float *y, float a, const uint16_t *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    for (int d = 0; d < n; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + d))),
                                                 _mm256_loadu_ps(y + d)));
}

static inline T256 __attribute__((always_inline)) __m256 exp8(__m256 v) { /* as exp16 */
    __m256 c = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 m = _mm256_set1_ps(MAGIC);
    __m256 nn = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(c, _mm256_set1_ps(LOG2E)), m), m);
    __m256 r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-LN2_HI), c);
    r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(P0), r, _mm256_set1_ps(P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
    __m256 out = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    __m256 under = _mm256_cmp_ps(v, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ);
    return _mm256_blendv_ps(out, _mm256_setzero_ps(), under);
}

static T256 void exp_avx2(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) { /* the tail as exp_avx512's */
        float t[8] = {0};
        for (int j = 0; j < n - i; j++) t[j] = x[i + j];
        _mm256_storeu_ps(t, exp8(_mm256_loadu_ps(t)));
        for (int j = 0; j < n - i; j++) x[i + j] = t[j];
    }
}

static T256 void to_f16_avx2(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = se_f32_to_f16(x[i]);
}

static T256 void wsum_avx2(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out) {
    for (int c0 = 0; c0 < hd; c0 += 32) {
        int parts = hd - c0 >= 32 ? 4 : (hd - c0) / 8;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int i = 0; i < cnt; i++) {
            __m256 e = _mm256_set1_ps(w[i]);
            const uint16_t *row = V + (size_t)idx[i] * hd + c0;
            if (i + 32 < cnt) _mm_prefetch((const char *)(V + (size_t)idx[i + 32] * hd + c0), _MM_HINT_T0);
            for (int t = 0; t < parts; t++)
                acc[t] = _mm256_fmadd_ps(e, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * t))), acc[t]);
        }
        for (int t = 0; t < parts; t++) _mm256_storeu_ps(out + c0 + 8 * t, acc[t]);
    }
}

/* AVX2: a block's 16 keys in two registers (keys 0-7, 8-15), groups of g <= 2 blocks (nq * g <= 6), as
 * scores_group_avx512 */
static inline T256 __attribute__((always_inline)) void
scores_group_avx2(const float *const *q, const int nq, const int g, const uint16_t *K, int b0, int hd,
                  float scale, float *const *out) {
    int at = SE_KBLOCK * b0;
    K += (size_t)b0 * hd * SE_KBLOCK;
    __m256 acc[8][4];
    for (int j = 0; j < nq; j++)
        for (int h = 0; h < 2 * g; h++) acc[j][h] = _mm256_setzero_ps();
    const char *ahead = (const char *)(K + (size_t)2 * g * hd * SE_KBLOCK); /* as scores_group_avx512 */
    for (int d = 0; d < hd; d++) {
        _mm_prefetch(ahead + (size_t)d * g * 32, _MM_HINT_T0);
        for (int h = 0; h < 2 * g; h++) {
            const uint16_t *k = K + ((size_t)(h / 2) * hd + d) * SE_KBLOCK + 8 * (h % 2);
            __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)k));
            for (int j = 0; j < nq; j++) acc[j][h] = _mm256_fmadd_ps(_mm256_set1_ps(q[j][d]), kv, acc[j][h]);
        }
    }
    for (int j = 0; j < nq; j++)
        for (int h = 0; h < 2 * g; h++)
            _mm256_storeu_ps(out[j] + at + 8 * h, _mm256_mul_ps(acc[j][h], _mm256_set1_ps(scale)));
}

static T256 void scores_avx2(const float *const *q, int nq, const uint16_t *K, int b0, int nb, int hd, float scale,
                             float *const *out) {
    K += (size_t)b0 * hd * SE_KBLOCK;
    SCORES_BY_NQ(scores_group_avx2, 2, 6, 1);
}

/* dims c0 .. c0 + 8 P of nq queries' weighted sums, as wsum_slice_avx512 on 8 lanes: a V row's slice converted once
 * for every query, each (query, 8 dims) one register's chains over the keys in order (wsum_avx2's, so its bits) */
static inline T256 __attribute__((always_inline)) void
wsum_slice_avx2(const float *const *w, const int nq, const int P, const uint16_t *V, const int32_t *idx, int cnt,
                int hd, int c0, float *const *out) {
    __m256 acc[6][4];
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < P; t++) acc[j][t] = _mm256_setzero_ps();
    for (int i = 0; i < cnt; i++) {
        const uint16_t *row = V + (size_t)idx[i] * hd + c0;
        if (i + 32 < cnt) _mm_prefetch((const char *)(V + (size_t)idx[i + 32] * hd + c0), _MM_HINT_T0);
        for (int t = 0; t < P; t++) {
            __m256 vt = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * t)));
            for (int j = 0; j < nq; j++) acc[j][t] = _mm256_fmadd_ps(_mm256_set1_ps(w[j][i]), vt, acc[j][t]);
        }
    }
    for (int j = 0; j < nq; j++)
        for (int t = 0; t < P; t++) _mm256_storeu_ps(out[j] + c0 + 8 * t, acc[j][t]);
}

/* slices of 8 P dims, then of 8 */
#define WSUM_RUN2(NQ, P, ws, os)                                                                                    \
    do {                                                                                                            \
        int c0 = 0;                                                                                                 \
        for (; c0 + 8 * (P) <= hd; c0 += 8 * (P)) wsum_slice_avx2(ws, NQ, P, V, idx, cnt, hd, c0, os);              \
        for (; c0 < hd; c0 += 8) wsum_slice_avx2(ws, NQ, 1, V, idx, cnt, hd, c0, os);                               \
    } while (0)

/* up to 3 queries: slices of 32 dims; more: even chunks of up to 6 queries, slices of 16 */
static T256 void wsum_q_avx2(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                             float *const *out) {
    int chunks = (nq + 5) / 6, size = nq <= 3 ? nq : (nq + chunks - 1) / chunks;
    for (int j0 = 0; j0 < nq; j0 += size) {
        const float *const *wc = w + j0;
        float *const *oc = out + j0;
        switch (nq - j0 < size ? nq - j0 : size) {
        case 1: WSUM_RUN2(1, 4, wc, oc); break;
        case 2: WSUM_RUN2(2, 4, wc, oc); break;
        case 3: WSUM_RUN2(3, 4, wc, oc); break;
        case 4: WSUM_RUN2(4, 2, wc, oc); break;
        case 5: WSUM_RUN2(5, 2, wc, oc); break;
        default: WSUM_RUN2(6, 2, wc, oc); break;
        }
    }
}

static const se_vec_ops avx2 = {axpy_f16_avx2, exp_avx2, to_f16_avx2, scores_avx2, wsum_avx2, wsum_q_avx2};

const se_vec_ops *se_vec_avx2(void) { return &avx2; }
#endif
