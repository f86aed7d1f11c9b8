/* NEON matmul of float weights (F32, F16, BF16; mm_f.c's portable C, mirrored): quarter h of a 16-row group is one
 * q-register of 4 rows, and each activation row keeps the four chains in four registers:
 *     c[b % 4] = fma(w[r][32 b + t], x[32 b + t], c[b % 4])  for b, then t, in order;  out = (c0 + c1) + (c2 + c3).
 * Base AArch64 NEON (no dot product needed). Each block quarter is converted once per pass of up to PASS rows. */
#include "se.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>

#define INL __attribute__((always_inline))
#define PASS 4

/* elements (t, 4h .. 4h+3) of a block as floats: exact for every format */
static inline INL float32x4_t load4(int kern, const uint8_t *blk, int e) {
    if (kern == SE_KERN_F32) return vld1q_f32((const float *)(const void *)(blk + 4 * e));
    uint16x4_t v = vld1_u16((const uint16_t *)(const void *)(blk + 2 * e));
    if (kern == SE_KERN_F16) return vcvt_f32_f16(vreinterpret_f16_u16(v));
    return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(v), 16));
}

static inline INL void pass_rows(const se_mat *w, const uint8_t *group, const se_act *x, int i0, const int R,
                                 float *out, int ldo, int col, int lanes, int h) {
    float32x4_t c[PASS][4];
    for (int i = 0; i < R; i++)
        for (int q = 0; q < 4; q++) c[i][q] = vdupq_n_f32(0.0f);
    for (int b0 = 0; b0 < w->nb; b0 += 4)
        for (int q = 0; q < 4 && b0 + q < w->nb; q++) { /* block b0 + q feeds chain q: constant register indices */
            const uint8_t *blk = group + (size_t)(b0 + q) * w->block_bytes;
            const float *xf = x->f + (size_t)i0 * x->k + (b0 + q) * SE_BLOCK;
            for (int t = 0; t < SE_BLOCK; t++) {
                float32x4_t wv = load4(w->kern, blk, t * SE_GROUP + 4 * h);
                for (int i = 0; i < R; i++) c[i][q] = vfmaq_f32(c[i][q], wv, vdupq_n_f32(xf[(size_t)i * x->k + t]));
            }
        }
    int valid = lanes - 4 * h;
    for (int i = 0; i < R; i++) {
        float32x4_t sum = vaddq_f32(vaddq_f32(c[i][0], c[i][1]), vaddq_f32(c[i][2], c[i][3]));
        float *dst = out + (size_t)(i0 + i) * ldo + col + 4 * h, tmp[4];
        if (valid >= 4) {
            vst1q_f32(dst, sum);
        } else {
            vst1q_f32(tmp, sum);
            for (int r = 0; r < valid; r++) dst[r] = tmp[r];
        }
    }
}

void se_mm_f_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        int lanes = w->n - g * SE_GROUP;
        for (int h = 0; h < 4 && 4 * h < lanes; h++)
            for (int i0 = 0; i0 < rows; i0 += PASS) {
                switch (rows - i0 < PASS ? rows - i0 : PASS) { /* constant row counts keep the chains in registers */
                case 1: pass_rows(w, group, x, i0, 1, out, ldo, g * SE_GROUP, lanes, h); break;
                case 2: pass_rows(w, group, x, i0, 2, out, ldo, g * SE_GROUP, lanes, h); break;
                case 3: pass_rows(w, group, x, i0, 3, out, ldo, g * SE_GROUP, lanes, h); break;
                default: pass_rows(w, group, x, i0, 4, out, ldo, g * SE_GROUP, lanes, h); break;
                }
            }
    }
}
#endif
