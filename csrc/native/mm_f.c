/* Matmul of float weights (F32, F16, BF16 matrices, packed as they are) against the float activations (act.f: the
 * values the int8 quantization starts from; llama.cpp multiplies these formats in float too). A 32-wide block holds
 * 32 vectors of the group's 16 rows (element (t, r) at t * 16 + r). Each output is four chains, block b feeding
 * chain b % 4 with fused steps in element order, then (c0 + c1) + (c2 + c3):
 *     c[b % 4] = fma(w[r][32 b + t], x[32 b + t], c[b % 4])  for b, then t, in order
 * so the SIMD paths (lanes = rows, the four chains in registers; NEON's in mm_f_neon.c) compute the portable C's
 * bits. */
#include <math.h>
#include <string.h>

#include "se.h"

static inline float weight(const se_mat *w, const uint8_t *blk, int t, int r) {
    int e = t * SE_GROUP + r;
    if (w->kern == SE_KERN_F32) {
        float v;
        memcpy(&v, blk + 4 * e, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, blk + 2 * e, 2);
    if (w->kern == SE_KERN_F16) return se_f16_to_f32(h);
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

float se_f_weight(const se_mat *w, const uint8_t *blk, int t, int r) { return weight(w, blk, t, r); }

void se_mm_f_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        int lanes = w->n - g * SE_GROUP < SE_GROUP ? w->n - g * SE_GROUP : SE_GROUP;
        for (int i = 0; i < rows; i++) {
            const float *xf = x->f + (size_t)i * x->k;
            for (int r = 0; r < lanes; r++) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int b = 0; b < w->nb; b++) {
                    const uint8_t *blk = group + (size_t)b * w->block_bytes;
                    for (int t = 0; t < SE_BLOCK; t++) c[b % 4] = fmaf(weight(w, blk, t, r), xf[b * SE_BLOCK + t], c[b % 4]);
                }
                out[(size_t)i * ldo + g * SE_GROUP + r] = (c[0] + c[1]) + (c[2] + c[3]);
            }
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "avx2.h"

#define SE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
#define INL __attribute__((always_inline))
#define PASS 4

static inline SE_AVX512 INL __m512 load16(int kern, const uint8_t *p) {
    if (kern == SE_KERN_F32) return _mm512_loadu_ps(p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (kern == SE_KERN_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline SE_AVX512 INL void pass512(const se_mat *w, const uint8_t *group, const se_act *x, int i0, const int R,
                                          float *out, int ldo, int col, int lanes) {
    const int es = w->kern == SE_KERN_F32 ? 4 : 2;
    __m512 c[PASS][4];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < 4; j++) c[i][j] = _mm512_setzero_ps();
    for (int b0 = 0; b0 < w->nb; b0 += 4)
        for (int j = 0; j < 4 && b0 + j < w->nb; j++) {
            int b = b0 + j;
            const uint8_t *blk = group + (size_t)b * w->block_bytes;
            _mm_prefetch((const char *)blk + 4096, _MM_HINT_T0);
            for (int t = 0; t < SE_BLOCK; t++) {
                __m512 wv = load16(w->kern, blk + (size_t)t * SE_GROUP * es);
                for (int i = 0; i < R; i++)
                    c[i][j] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x->f[(size_t)(i0 + i) * x->k + b * SE_BLOCK + t]),
                                              c[i][j]);
            }
        }
    __mmask16 mask = lanes >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << lanes) - 1);
    for (int i = 0; i < R; i++) {
        __m512 s = _mm512_add_ps(_mm512_add_ps(c[i][0], c[i][1]), _mm512_add_ps(c[i][2], c[i][3]));
        _mm512_mask_storeu_ps(out + (size_t)(i0 + i) * ldo + col, mask, s);
    }
}

SE_AVX512 void se_mm_f_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        for (int i0 = 0; i0 < rows; i0 += PASS) {
            switch (rows - i0 < PASS ? rows - i0 : PASS) { /* constant row counts keep the chains in registers */
            case 1: pass512(w, group, x, i0, 1, out, ldo, g * SE_GROUP, w->n - g * SE_GROUP); break;
            case 2: pass512(w, group, x, i0, 2, out, ldo, g * SE_GROUP, w->n - g * SE_GROUP); break;
            case 3: pass512(w, group, x, i0, 3, out, ldo, g * SE_GROUP, w->n - g * SE_GROUP); break;
            default: pass512(w, group, x, i0, 4, out, ldo, g * SE_GROUP, w->n - g * SE_GROUP); break;
            }
        }
    }
}

/* AVX2: lanes 8h .. 8h + 7 of the group */
static inline SE_AVX2 INL __m256 load8(int kern, const uint8_t *p) {
    if (kern == SE_KERN_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (kern == SE_KERN_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline SE_AVX2 INL void pass256(const se_mat *w, const uint8_t *group, const se_act *x, int i0, const int R,
                                       float *out, int ldo, int col, int lanes, int h) {
    const int es = w->kern == SE_KERN_F32 ? 4 : 2;
    __m256 c[2][4];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < 4; j++) c[i][j] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < w->nb; b0 += 4)
        for (int j = 0; j < 4 && b0 + j < w->nb; j++) {
            int b = b0 + j;
            const uint8_t *blk = group + (size_t)b * w->block_bytes + (size_t)8 * h * es;
            for (int t = 0; t < SE_BLOCK; t++) {
                __m256 wv = load8(w->kern, blk + (size_t)t * SE_GROUP * es);
                for (int i = 0; i < R; i++)
                    c[i][j] = _mm256_fmadd_ps(wv, _mm256_set1_ps(x->f[(size_t)(i0 + i) * x->k + b * SE_BLOCK + t]),
                                              c[i][j]);
            }
        }
    int valid = lanes - 8 * h;
    for (int i = 0; i < R; i++) {
        float tmp[8], *dst = out + (size_t)(i0 + i) * ldo + col + 8 * h;
        _mm256_storeu_ps(tmp, _mm256_add_ps(_mm256_add_ps(c[i][0], c[i][1]), _mm256_add_ps(c[i][2], c[i][3])));
        for (int r = 0; r < 8 && r < valid; r++) dst[r] = tmp[r];
    }
}

SE_AVX2 void se_mm_f_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        for (int h = 0; h < 2; h++)
            for (int i0 = 0; i0 < rows; i0 += 2) {
                if (rows - i0 >= 2) pass256(w, group, x, i0, 2, out, ldo, g * SE_GROUP, w->n - g * SE_GROUP, h);
                else pass256(w, group, x, i0, 1, out, ldo, g * SE_GROUP, w->n - g * SE_GROUP, h);
            }
    }
}
#endif
