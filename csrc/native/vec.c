/* Float primitives of attention and activations, one fixed operation order in every ISA (NEON's in vec_neon.c):
 *   dot:  16 partial sums p[l] += q[16c + l] * k[16c + l] (fused), then (p[l] + p[l+8]) -> (+4) -> (+2) -> (+1);
 *   axpy: y[d] = fma(a, x[d], y[d]) lane by lane;
 *   exp:  n = round(x * log2 e), r = x - n * ln2 (two fused steps), a degree-5 polynomial (fused), times 2^n.
 * The AVX2 path keeps the 16 partial sums in two 8-lane registers (dims 0-7 and 8-15 of each chunk), so its first
 * reduction step is the same addition. */
#include "se.h"

#include <math.h>
#include <string.h>

#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f
#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define MAGIC 12582912.0f

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

static float dot_f16_portable(const float *q, const uint16_t *k, int n) {
    float p[16] = {0};
    for (int c = 0; c < n; c += 16)
        for (int l = 0; l < 16; l++) p[l] = fmaf(q[c + l], se_f16_to_f32(k[c + l]), p[l]);
    for (int l = 0; l < 8; l++) p[l] = p[l] + p[l + 8];
    for (int l = 0; l < 4; l++) p[l] = p[l] + p[l + 4];
    for (int l = 0; l < 2; l++) p[l] = p[l] + p[l + 2];
    return p[0] + p[1];
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

static void scores_portable(const float *q, const uint16_t *K, const int32_t *idx, int cnt, int hd, float scale,
                            float *out) {
    for (int i = 0; i < cnt; i++) out[i] = dot_f16_portable(q, K + (size_t)idx[i] * hd, hd) * scale;
}

static void wsum_portable(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out) {
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int i = 0; i < cnt; i++) axpy_f16_portable(out, w[i], V + (size_t)idx[i] * hd, hd);
}

static void scores_q_portable(const float *const *q, int nq, const uint16_t *K, const int32_t *idx, int cnt, int hd,
                              float scale, float *const *out) {
    for (int j = 0; j < nq; j++) scores_portable(q[j], K, idx, cnt, hd, scale, out[j]);
}

static void wsum_q_portable(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                            float *const *out) {
    for (int j = 0; j < nq; j++) wsum_portable(w[j], V, idx, cnt, hd, out[j]);
}

static const se_vec_ops portable = {dot_f16_portable, axpy_f16_portable, exp_portable, to_f16_portable,
                                    scores_portable, wsum_portable, scores_q_portable, wsum_q_portable};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define T512 __attribute__((target("avx512f,avx512dq,avx512vl,f16c,fma")))
#define T256 __attribute__((target("avx2,fma,f16c")))

static inline T256 float hsum8_then(__m256 r8) { /* lanes l + (l+4), then (+2), then (+1) */
    __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
}

static T512 float dot_f16_avx512(const float *q, const uint16_t *k, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + c))), acc);
    __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1)));
}

static T512 void axpy_f16_avx512(float *y, float a, const uint16_t *x, int n) {
    __m512 va = _mm512_set1_ps(a);
    for (int d = 0; d < n; d += 16)
        _mm512_storeu_ps(y + d, _mm512_fmadd_ps(va, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + d))),
                                                 _mm512_loadu_ps(y + d)));
}

static T512 void exp_avx512(float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 c = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
        __m512 m = _mm512_set1_ps(MAGIC);
        __m512 nn = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(c, _mm512_set1_ps(LOG2E)), m), m);
        __m512 r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LN2_HI), c);
        r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LN2_LO), r);
        __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(P0), r, _mm512_set1_ps(P1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
        __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
        __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(nn), _mm512_set1_epi32(127)), 23);
        __m512 out = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
        __mmask16 under = _mm512_cmp_ps_mask(v, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
        _mm512_storeu_ps(x + i, _mm512_mask_mov_ps(out, under, _mm512_setzero_ps()));
    }
    for (; i < n; i++) x[i] = se_expf(x[i]);
}

static T256 float dot_f16_avx2(const float *q, const uint16_t *k, int n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int c = 0; c < n; c += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + c))), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + c + 8))),
                             hi);
    }
    return hsum8_then(_mm256_add_ps(lo, hi));
}

static T256 void axpy_f16_avx2(float *y, float a, const uint16_t *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    for (int d = 0; d < n; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + d))),
                                                 _mm256_loadu_ps(y + d)));
}

static T256 void exp_avx2(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
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
        _mm256_storeu_ps(x + i, _mm256_blendv_ps(out, _mm256_setzero_ps(), under));
    }
    for (; i < n; i++) x[i] = se_expf(x[i]);
}

static T512 void to_f16_avx512(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = se_f32_to_f16(x[i]);
}

static T256 void to_f16_avx2(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = se_f32_to_f16(x[i]);
}

/* 16 keys at once: a[j] holds key j's 16 partial sums; the reduction tree below adds, for every key, exactly the
 * pairs dot_f16 adds (lanes l and l+8, then +4, +2, +1), two, four, then eight keys per register; the result's
 * lane 4L + p holds key L + 4p. */
static T512 void scores16_avx512(const float *q, const uint16_t *K, const int32_t *idx, int hd, float scale,
                                 float *out) {
    __m512 a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm512_setzero_ps();
    for (int c = 0; c < hd; c += 16) {
        __m512 qc = _mm512_loadu_ps(q + c);
        for (int j = 0; j < 16; j++)
            a[j] = _mm512_fmadd_ps(qc, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(K + (size_t)idx[j] * hd + c))),
                                   a[j]);
    }
    __m512 t[8], u[4], v[2];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int m = 0; m < 4; m++)
        u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int n = 0; n < 2; n++)
        v[n] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * n], u[2 * n + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * n], u[2 * n + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 w = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutexvar_ps(order, w), _mm512_set1_ps(scale)));
}

static T512 void scores_avx512(const float *q, const uint16_t *K, const int32_t *idx, int cnt, int hd, float scale,
                               float *out) {
    int i = 0;
    for (; i + 16 <= cnt; i += 16) scores16_avx512(q, K, idx + i, hd, scale, out + i);
    for (; i < cnt; i++) out[i] = dot_f16_avx512(q, K + (size_t)idx[i] * hd, hd) * scale;
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

/* 4 keys at once, each key's 16 partial sums in two 8-lane registers (dims 0-7 and 8-15 of each chunk). */
static T256 void scores4_avx2(const float *q, const uint16_t *K, const int32_t *idx, int hd, float scale,
                              float *out) {
    __m256 lo[4], hi[4];
    for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 16) {
        __m256 ql = _mm256_loadu_ps(q + c), qh = _mm256_loadu_ps(q + c + 8);
        for (int j = 0; j < 4; j++) {
            const uint16_t *k = K + (size_t)idx[j] * hd + c;
            lo[j] = _mm256_fmadd_ps(ql, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)k)), lo[j]);
            hi[j] = _mm256_fmadd_ps(qh, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + 8))), hi[j]);
        }
    }
    __m256 r8[4];
    for (int j = 0; j < 4; j++) r8[j] = _mm256_add_ps(lo[j], hi[j]);
    __m256 x1 = _mm256_add_ps(_mm256_permute2f128_ps(r8[0], r8[1], 0x20), _mm256_permute2f128_ps(r8[0], r8[1], 0x31));
    __m256 x2 = _mm256_add_ps(_mm256_permute2f128_ps(r8[2], r8[3], 0x20), _mm256_permute2f128_ps(r8[2], r8[3], 0x31));
    __m256 y = _mm256_add_ps(_mm256_shuffle_ps(x1, x2, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(x1, x2, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 z = _mm256_add_ps(_mm256_shuffle_ps(y, y, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(y, y, _MM_SHUFFLE(3, 1, 3, 1)));
    float r[8];
    _mm256_storeu_ps(r, z);  /* lane 0: key 0, 1: key 2, 4: key 1, 5: key 3 */
    out[0] = r[0] * scale;
    out[1] = r[4] * scale;
    out[2] = r[1] * scale;
    out[3] = r[5] * scale;
}

static T256 void scores_avx2(const float *q, const uint16_t *K, const int32_t *idx, int cnt, int hd, float scale,
                             float *out) {
    int i = 0;
    for (; i + 4 <= cnt; i += 4) scores4_avx2(q, K, idx + i, hd, scale, out + i);
    for (; i < cnt; i++) out[i] = dot_f16_avx2(q, K + (size_t)idx[i] * hd, hd) * scale;
}

static T256 void wsum_avx2(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out) {
    for (int c0 = 0; c0 < hd; c0 += 32) {
        int parts = hd - c0 >= 32 ? 4 : (hd - c0) / 8;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int i = 0; i < cnt; i++) {
            __m256 e = _mm256_set1_ps(w[i]);
            const uint16_t *row = V + (size_t)idx[i] * hd + c0;
            for (int t = 0; t < parts; t++)
                acc[t] = _mm256_fmadd_ps(e, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * t))), acc[t]);
        }
        for (int t = 0; t < parts; t++) _mm256_storeu_ps(out + c0 + 8 * t, acc[t]);
    }
}

/* 8 keys for up to 3 queries at once: each key's chunk is converted once and multiplied into every query's partial
 * sums; each query's 8 keys are then reduced by the same pairs as dot_f16 (lanes l + l+8, +4, +2, +1). After the
 * tree, lane 4L holds key L and lane 4L + 1 key 4 + L. */
static inline T512 __attribute__((always_inline)) void
scores8q_avx512(const float *const *q, const int nq, const uint16_t *K, const int32_t *idx, int hd, float scale,
                float *const *out, int at) {
    __m512 a[SE_QUERIES][8];
    for (int j = 0; j < nq; j++)
        for (int k = 0; k < 8; k++) a[j][k] = _mm512_setzero_ps();
    for (int c = 0; c < hd; c += 16) {
        __m512 qc[SE_QUERIES];
        for (int j = 0; j < nq; j++) qc[j] = _mm512_loadu_ps(q[j] + c);
        for (int k = 0; k < 8; k++) {
            __m512 kc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(K + (size_t)idx[k] * hd + c)));
            for (int j = 0; j < nq; j++) a[j][k] = _mm512_fmadd_ps(qc[j], kc, a[j][k]);
        }
    }
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int j = 0; j < nq; j++) {
        __m512 t[4], u[2];
        for (int i = 0; i < 4; i++)
            t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[j][2 * i], a[j][2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(a[j][2 * i], a[j][2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        for (int m = 0; m < 2; m++)
            u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
        __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
        __m512 w = _mm512_add_ps(_mm512_shuffle_ps(v, v, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(v, v, _MM_SHUFFLE(3, 1, 3, 1)));
        _mm512_mask_storeu_ps(out[j] + at, 0xff, _mm512_mul_ps(_mm512_permutexvar_ps(order, w), _mm512_set1_ps(scale)));
    }
}

static T512 void scores_q_avx512(const float *const *q, int nq, const uint16_t *K, const int32_t *idx, int cnt, int hd,
                                 float scale, float *const *out) {
    if (nq == 1) {
        scores_avx512(q[0], K, idx, cnt, hd, scale, out[0]);
        return;
    }
    int i = 0;
    for (; i + 8 <= cnt; i += 8) {
        if (nq == 2) scores8q_avx512(q, 2, K, idx + i, hd, scale, out, i);
        else scores8q_avx512(q, 3, K, idx + i, hd, scale, out, i);
    }
    for (; i < cnt; i++)
        for (int j = 0; j < nq; j++) out[j][i] = dot_f16_avx512(q[j], K + (size_t)idx[i] * hd, hd) * scale;
}

static T512 void wsum_q_avx512(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                               float *const *out) {
    for (int c0 = 0; c0 < hd; c0 += 64) {
        int parts = hd - c0 >= 64 ? 4 : (hd - c0) / 16;
        __m512 acc[SE_QUERIES][4];
        for (int j = 0; j < nq; j++)
            for (int t = 0; t < 4; t++) acc[j][t] = _mm512_setzero_ps();
        for (int i = 0; i < cnt; i++) {
            const uint16_t *row = V + (size_t)idx[i] * hd + c0;
            for (int t = 0; t < parts; t++) {
                __m512 vt = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 16 * t)));
                for (int j = 0; j < nq; j++) acc[j][t] = _mm512_fmadd_ps(_mm512_set1_ps(w[j][i]), vt, acc[j][t]);
            }
        }
        for (int j = 0; j < nq; j++)
            for (int t = 0; t < parts; t++) _mm512_storeu_ps(out[j] + c0 + 16 * t, acc[j][t]);
    }
}

static void scores_q_avx2(const float *const *q, int nq, const uint16_t *K, const int32_t *idx, int cnt, int hd,
                          float scale, float *const *out) {
    for (int j = 0; j < nq; j++) scores_avx2(q[j], K, idx, cnt, hd, scale, out[j]);
}

static void wsum_q_avx2(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                        float *const *out) {
    for (int j = 0; j < nq; j++) wsum_avx2(w[j], V, idx, cnt, hd, out[j]);
}

static const se_vec_ops avx512 = {dot_f16_avx512, axpy_f16_avx512, exp_avx512, to_f16_avx512, scores_avx512,
                                  wsum_avx512, scores_q_avx512, wsum_q_avx512};
static const se_vec_ops avx2 = {dot_f16_avx2, axpy_f16_avx2, exp_avx2, to_f16_avx2, scores_avx2, wsum_avx2,
                                scores_q_avx2, wsum_q_avx2};
#endif

const se_vec_ops *se_vec(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (se_isa()) {
    case SE_ISA_AVX512: return &avx512;
    case SE_ISA_AVX2: return &avx2;
    }
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    if (se_isa() == SE_ISA_NEON) return se_vec_neon();
#endif
    return &portable;
}
