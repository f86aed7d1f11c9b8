/* Float primitives of attention and activations, one fixed operation order in three ISAs:
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

static const se_vec_ops portable = {dot_f16_portable, axpy_f16_portable, exp_portable, to_f16_portable};

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

static const se_vec_ops avx512 = {dot_f16_avx512, axpy_f16_avx512, exp_avx512, to_f16_avx512};
static const se_vec_ops avx2 = {dot_f16_avx2, axpy_f16_avx2, exp_avx2, to_f16_avx2};
#endif

const se_vec_ops *se_vec(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (se_isa()) {
    case SE_ISA_AVX512: return &avx512;
    case SE_ISA_AVX2: return &avx2;
    }
#endif
    return &portable;
}
