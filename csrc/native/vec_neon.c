/* NEON float primitives (se_vec_ops, se_row_ops) in the order vec.c and vec_rows.c define: the 16 partial sums of
 * a dot, a sum or a sum of squares sit in 4 registers (lanes 0-3, 4-7, 8-11, 12-15), so the tree's first step
 * (p[l] + p[l+8]) adds registers 0+2 and 1+3, the second adds those two, then lanes (0+2, 1+3), then the pair.
 * exp is se_expf lane by lane; fp16 conversions are the exact IEEE ones (round to nearest even). Scores keep one
 * fused chain over d per key (a lane each, vec.c's order); the weighted sums loop over keys with axpy.
 * Quantize stays the portable C (act.c: exact or element-wise steps). Only base AArch64 ASIMD is needed. */
#include "se.h"
#include "vec_common.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#include <math.h>
#include <string.h>


static inline float32x4_t f16x4(const uint16_t *k) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(k))); }

/* (p0 + p2) + (p1 + p3), then lanes (0 + 2, 1 + 3), then the pair: reduce16's additions */
static inline float reduce4x4(float32x4_t p0, float32x4_t p1, float32x4_t p2, float32x4_t p3) {
    float32x4_t s = vaddq_f32(vaddq_f32(p0, p2), vaddq_f32(p1, p3));
    float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

static void axpy_f16_neon(float *y, float a, const uint16_t *x, int n) {
    float32x4_t va = vdupq_n_f32(a);
    for (int d = 0; d < n; d += 4) vst1q_f32(y + d, vfmaq_f32(vld1q_f32(y + d), va, f16x4(x + d)));
}

static void exp_neon(float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        float32x4_t c = vminq_f32(vmaxq_f32(v, vdupq_n_f32(EXP_LO)), vdupq_n_f32(EXP_HI));
        float32x4_t m = vdupq_n_f32(MAGIC);
        float32x4_t nn = vsubq_f32(vaddq_f32(vmulq_f32(c, vdupq_n_f32(LOG2E)), m), m);
        float32x4_t r = vfmaq_f32(c, nn, vdupq_n_f32(-LN2_HI));
        r = vfmaq_f32(r, nn, vdupq_n_f32(-LN2_LO));
        float32x4_t p = vfmaq_f32(vdupq_n_f32(P1), vdupq_n_f32(P0), r);
        p = vfmaq_f32(vdupq_n_f32(P2), p, r);
        p = vfmaq_f32(vdupq_n_f32(P3), p, r);
        p = vfmaq_f32(vdupq_n_f32(P4), p, r);
        p = vfmaq_f32(vdupq_n_f32(P5), p, r);
        float32x4_t y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
        int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(nn), vdupq_n_s32(127)), 23);
        float32x4_t out = vmulq_f32(y, vreinterpretq_f32_s32(bits));
        uint32x4_t under = vcltq_f32(v, vdupq_n_f32(EXP_LO));
        vst1q_f32(x + i, vbslq_f32(under, vdupq_n_f32(0.0f), out));
    }
    for (; i < n; i++) x[i] = se_expf(x[i]);
}

static void to_f16_neon(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = se_f32_to_f16(x[i]);
}

/* a block's 16 keys in 4 registers; one block at a time for up to 4 queries, each lane one key's chain over d */
static void scores_neon(const float *const *q, int nq, const uint16_t *K, int b0, int nb, int hd, float scale,
                        float *const *out) {
    for (int j0 = 0; j0 < nq; j0 += 4)
        for (int b = 0; b < nb; b++) {
            const uint16_t *blk = K + (size_t)(b0 + b) * hd * SE_KBLOCK;
            int m = nq - j0 < 4 ? nq - j0 : 4;
            float32x4_t acc[4][4];
            for (int j = 0; j < m; j++)
                for (int t = 0; t < 4; t++) acc[j][t] = vdupq_n_f32(0.0f);
            for (int d = 0; d < hd; d++)
                for (int t = 0; t < 4; t++) {
                    float32x4_t k = f16x4(blk + d * SE_KBLOCK + 4 * t);
                    for (int j = 0; j < m; j++) acc[j][t] = vfmaq_f32(acc[j][t], vdupq_n_f32(q[j0 + j][d]), k);
                }
            for (int j = 0; j < m; j++)
                for (int t = 0; t < 4; t++)
                    vst1q_f32(out[j0 + j] + SE_KBLOCK * b + 4 * t, vmulq_f32(acc[j][t], vdupq_n_f32(scale)));
        }
}

static void wsum_neon(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out) {
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int i = 0; i < cnt; i++) axpy_f16_neon(out, w[i], V + (size_t)idx[i] * hd, hd);
}

static void wsum_q_neon(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                        float *const *out) {
    for (int j = 0; j < nq; j++) wsum_neon(w[j], V, idx, cnt, hd, out[j]);
}

static const se_vec_ops vec_neon = {axpy_f16_neon, exp_neon, to_f16_neon, scores_neon, wsum_neon, wsum_q_neon};

const se_vec_ops *se_vec_neon(void) { return &vec_neon; }

/* the tail (n % 16) into lanes 0.. of the partial sums, in order, then the tree */
static float finish4x4(const float32x4_t *acc, const float *tail, int rest, int square) {
    float p[16];
    for (int i = 0; i < 4; i++) vst1q_f32(p + 4 * i, acc[i]);
    for (int l = 0; l < rest; l++) p[l] = square ? fmaf(tail[l], tail[l], p[l]) : p[l] + tail[l];
    return reduce4x4(vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12));
}

static float sum_neon(const float *x, int n) {
    float32x4_t p[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int c = 0;
    for (; c + 16 <= n; c += 16)
        for (int i = 0; i < 4; i++) p[i] = vaddq_f32(p[i], vld1q_f32(x + c + 4 * i));
    return finish4x4(p, x + c, n - c, 0);
}

static float sumsq_neon(const float *x, int n) {
    float32x4_t p[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int c = 0;
    for (; c + 16 <= n; c += 16)
        for (int i = 0; i < 4; i++) {
            float32x4_t v = vld1q_f32(x + c + 4 * i);
            p[i] = vfmaq_f32(p[i], v, v);
        }
    return finish4x4(p, x + c, n - c, 1);
}

/* maxnm ignores a NaN as the portable x > m ? x : m does */
static float max_neon(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(-INFINITY);
    int i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxnmq_f32(m, vld1q_f32(x + i));
    float r = vmaxnmvq_f32(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static void silu_mul_neon(const float *g, const float *u, float *y, int n) {
    int j = 0;
    for (; j + 4 <= n; j += 4) vst1q_f32(y + j, vnegq_f32(vld1q_f32(g + j)));
    for (; j < n; j++) y[j] = -g[j];
    exp_neon(y, n);
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (j = 0; j + 4 <= n; j += 4) {
        float32x4_t t = vdivq_f32(vld1q_f32(g + j), vaddq_f32(one, vld1q_f32(y + j)));
        vst1q_f32(y + j, vmulq_f32(t, vld1q_f32(u + j)));
    }
    for (; j < n; j++) y[j] = g[j] / (1.0f + y[j]) * u[j];
}

static void quantize_rows_c(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h,
                            float *m) {
    se_quantize_blocks(x, nblocks, span, q, d, s, h, m);
}

static const se_row_ops rows_neon = {sum_neon, sumsq_neon, max_neon, se_exp_sum_steps, silu_mul_neon,
                                     quantize_rows_c};

const se_row_ops *se_rows_neon(void) { return &rows_neon; }
#endif
