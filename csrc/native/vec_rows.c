/* Per-row float steps of the norms, the softmax and the MLP, one fixed operation order in every ISA (NEON's in
 * vec_neon.c):
 *   sum, sumsq: 16 partial sums p[l] += x[16c + l] (sumsq: fused x * x + p), the n % 16 tail into lanes 0.. in
 *               order, then (p[l] + p[l+8]) -> (+4) -> (+2) -> (+1), as dot_f16 reduces;
 *   max:        exact in any order;
 *   silu_mul:   y = g / (1 + exp(-g)) * u, element by element (each a correctly rounded IEEE step);
 *   quantize:   se_quantize_blocks' arithmetic (act.c): a run's max |x| (exact in any order), then block by block
 *               steps that are exact or element-wise.
 * AVX2 keeps the 16 partial sums in two registers and runs max, silu_mul and quantize as AVX-512 does, on 8 lanes.
 * So every ISA gives the portable C's bits, and a row's result never depends on the rows beside it. */
#include "se.h"
#include "vec_common.h"

#include <math.h>
#include <string.h>

static float reduce16(float *p) {
    for (int l = 0; l < 8; l++) p[l] = p[l] + p[l + 8];
    for (int l = 0; l < 4; l++) p[l] = p[l] + p[l + 4];
    for (int l = 0; l < 2; l++) p[l] = p[l] + p[l + 2];
    return p[0] + p[1];
}

static float sum_portable(const float *x, int n) {
    float p[16] = {0};
    int c = 0;
    for (; c + 16 <= n; c += 16)
        for (int l = 0; l < 16; l++) p[l] = p[l] + x[c + l];
    for (int l = 0; c + l < n; l++) p[l] = p[l] + x[c + l];
    return reduce16(p);
}

static float sumsq_portable(const float *x, int n) {
    float p[16] = {0};
    int c = 0;
    for (; c + 16 <= n; c += 16)
        for (int l = 0; l < 16; l++) p[l] = fmaf(x[c + l], x[c + l], p[l]);
    for (int l = 0; c + l < n; l++) p[l] = fmaf(x[c + l], x[c + l], p[l]);
    return reduce16(p);
}

static float max_portable(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* the softmax's exp and sum: the subtraction, the ISA's exp, the ISA's sum */
float se_exp_sum_steps(float *x, int n, float m) {
    for (int i = 0; i < n; i++) x[i] = x[i] - m;
    se_vec()->exp_inplace(x, n);
    return se_rows()->sum(x, n);
}

static void silu_mul_portable(const float *g, const float *u, float *y, int n) {
    for (int j = 0; j < n; j++) y[j] = -g[j];
    se_vec()->exp_inplace(y, n);
    for (int j = 0; j < n; j++) y[j] = g[j] / (1.0f + y[j]) * u[j];
}

static void quantize_portable(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h,
                              float *m) {
    se_quantize_blocks(x, nblocks, span, q, d, s, h, m);
}

static const se_row_ops portable = {sum_portable, sumsq_portable, max_portable, se_exp_sum_steps, silu_mul_portable,
                                    quantize_portable};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define T512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))

/* the tail (n % 16) into lanes 0.. of the partial sums, then the portable tree on the 16 lanes */
static T512 float finish16(__m512 acc, const float *tail, int rest, int square) {
    float p[16];
    _mm512_storeu_ps(p, acc);
    for (int l = 0; l < rest; l++) p[l] = square ? fmaf(tail[l], tail[l], p[l]) : p[l] + tail[l];
    return reduce16(p);
}

static T512 float sum_avx512(const float *x, int n) {
    __m512 acc = _mm512_setzero_ps();
    int c = 0;
    for (; c + 16 <= n; c += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + c));
    return finish16(acc, x + c, n - c, 0);
}

static T512 float sumsq_avx512(const float *x, int n) {
    __m512 acc = _mm512_setzero_ps();
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        __m512 v = _mm512_loadu_ps(x + c);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    return finish16(acc, x + c, n - c, 1);
}

static T512 float max_avx512(const float *x, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    float r = _mm512_reduce_max_ps(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* se_exp_sum_steps in one pass: each vector's exp(x - m) stored and added into the 16 partial sums as sum_avx512
 * adds them (the tail's exps into lanes 0.. after), so the same bits with two passes fewer */
static T512 float exp_sum_avx512(float *x, int n, float m) {
    __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + c), vm));
        _mm512_storeu_ps(x + c, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (c < n) {
        __mmask16 k = (__mmask16)((1u << (n - c)) - 1);
        _mm512_mask_storeu_ps(x + c, k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + c), vm)));
    }
    return finish16(acc, x + c, n - c, 0);
}

static T512 void silu_mul_avx512(const float *g, const float *u, float *y, int n) {
    int j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(g + j)));
    for (; j < n; j++) y[j] = -g[j];
    se_vec()->exp_inplace(y, n);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 t = _mm512_div_ps(_mm512_loadu_ps(g + j), _mm512_add_ps(one, _mm512_loadu_ps(y + j)));
        _mm512_storeu_ps(y + j, _mm512_mul_ps(t, _mm512_loadu_ps(u + j)));
    }
    for (; j < n; j++) y[j] = g[j] / (1.0f + y[j]) * u[j];
}

static T512 void quantize_avx512(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h,
                                  float *m) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
    for (int b0 = 0; b0 < nblocks; b0 += span) {
        __m512 mx = _mm512_setzero_ps();
        for (int v = 0; v < 2 * span; v++)
            mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(x + b0 * SE_BLOCK + 16 * v)));
        float amax = _mm512_reduce_max_ps(mx);
        float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        __m512 vi = _mm512_set1_ps(inv);
        for (int b = b0; b < b0 + span; b++) {
            const float *xb = x + b * SE_BLOCK;
            __m512 rl = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(xb), vi), magic), magic);
            __m512 rh = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), vi), magic), magic);
            __m512i il = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvttps_epi32(rl), bottom), top);
            __m512i ih = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvttps_epi32(rh), bottom), top);
            _mm_storeu_si128((__m128i *)(q + b * SE_BLOCK), _mm512_cvtepi32_epi8(il));
            _mm_storeu_si128((__m128i *)(q + b * SE_BLOCK + 16), _mm512_cvtepi32_epi8(ih));
            int32_t half = _mm512_reduce_add_epi32(il), rest = _mm512_reduce_add_epi32(ih);
            d[b] = scale;
            s[b] = half + rest;
            h[b] = half;
            m[b] = scale * (float)(half + rest);
        }
    }
}

static const se_row_ops avx512 = {sum_avx512, sumsq_avx512, max_avx512, exp_sum_avx512, silu_mul_avx512,
                                  quantize_avx512};

#define T256 __attribute__((target("avx2,fma")))

/* lanes 0-7 and 8-15 of the 16 partial sums in two registers */
static T256 float finish8x2(__m256 lo, __m256 hi, const float *tail, int rest, int square) {
    float p[16];
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
    for (int l = 0; l < rest; l++) p[l] = square ? fmaf(tail[l], tail[l], p[l]) : p[l] + tail[l];
    return reduce16(p);
}

static T256 float sum_avx2(const float *x, int n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(x + c));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(x + c + 8));
    }
    return finish8x2(lo, hi, x + c, n - c, 0);
}

static T256 float sumsq_avx2(const float *x, int n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        __m256 a = _mm256_loadu_ps(x + c), b = _mm256_loadu_ps(x + c + 8);
        lo = _mm256_fmadd_ps(a, a, lo);
        hi = _mm256_fmadd_ps(b, b, hi);
    }
    return finish8x2(lo, hi, x + c, n - c, 1);
}

static T256 float max_avx2(const float *x, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float p[8], r = -INFINITY;
    _mm256_storeu_ps(p, m);
    for (int l = 0; l < 8; l++) r = p[l] > r ? p[l] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static T256 void silu_mul_avx2(const float *g, const float *u, float *y, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g + j)));
    for (; j < n; j++) y[j] = -g[j];
    se_vec()->exp_inplace(y, n);
    const __m256 one = _mm256_set1_ps(1.0f);
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 t = _mm256_div_ps(_mm256_loadu_ps(g + j), _mm256_add_ps(one, _mm256_loadu_ps(y + j)));
        _mm256_storeu_ps(y + j, _mm256_mul_ps(t, _mm256_loadu_ps(u + j)));
    }
    for (; j < n; j++) y[j] = g[j] / (1.0f + y[j]) * u[j];
}

static T256 int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

/* quantize_avx512's steps on 8 lanes; the 32 int32 packed to int8 in order (both packs keep |q| <= 127 as is) */
static T256 void quantize_avx2(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h,
                               float *m) {
    const __m256 magic = _mm256_set1_ps(12582912.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b0 = 0; b0 < nblocks; b0 += span) {
        __m256 mx = _mm256_setzero_ps();
        for (int v = 0; v < 4 * span; v++)
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + b0 * SE_BLOCK + 8 * v)));
        float p[8], amax = 0.0f;
        _mm256_storeu_ps(p, mx);
        for (int l = 0; l < 8; l++) amax = p[l] > amax ? p[l] : amax;
        float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        __m256 vi = _mm256_set1_ps(inv);
        for (int b = b0; b < b0 + span; b++) {
            __m256i iv[4];
            for (int v = 0; v < 4; v++) {
                __m256 r = _mm256_mul_ps(_mm256_loadu_ps(x + b * SE_BLOCK + 8 * v), vi);
                r = _mm256_sub_ps(_mm256_add_ps(r, magic), magic);
                iv[v] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(r), bottom), top);
            }
            __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
            _mm256_storeu_si256((__m256i *)(q + b * SE_BLOCK), _mm256_permutevar8x32_epi32(w, order));
            int32_t half = hsum8(_mm256_add_epi32(iv[0], iv[1])), rest = hsum8(_mm256_add_epi32(iv[2], iv[3]));
            d[b] = scale;
            s[b] = half + rest;
            h[b] = half;
            m[b] = scale * (float)(half + rest);
        }
    }
}

static const se_row_ops avx2 = {sum_avx2, sumsq_avx2, max_avx2, se_exp_sum_steps, silu_mul_avx2, quantize_avx2};
#endif

const se_row_ops *se_rows(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (se_isa()) {
    case SE_ISA_AVX512: return &avx512;
    case SE_ISA_AVX2: return &avx2;
    }
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    if (se_isa() == SE_ISA_NEON) return se_rows_neon();
#endif
    return &portable;
}
