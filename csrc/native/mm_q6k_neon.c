/* NEON matmul of Q6_K (mm_q6k.c's portable C, mirrored): quarter h of a 16-row group is one q-register of 4 rows;
 * each weight u = nibble | 2 high bits << 4 (0..63, signed-safe for sdot); per 32-block two exact integer dots (the
 * 16 weights of each int8 scale) folded in int32 as the portable C folds them,
 *     isum = sc_0 * (dot_0 - 32 * h) + sc_1 * (dot_1 - 32 * (s - h)),   isb += isum over the superblock's 8 blocks,
 *     acc = fma(d * xd, (float)isb, acc)   (xd: the superblock's one activation scale).
 * Each block quarter is unpacked once per pass of up to PASS activation rows. */
#include "se.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>

#define INL __attribute__((always_inline))
#define PASS 6 /* two dot accumulators a row: 6 rows keep them and the weights in the 32 registers */
#define PF_AHEAD 2048

static inline SE_DOTPROD INL int32x4_t sdot_row(int32x4_t acc, uint8x16_t w, const int8_t *xq) {
    int32_t xa;
    __builtin_memcpy(&xa, xq, 4);
    return vdotq_s32(acc, vreinterpretq_s8_u8(w), vreinterpretq_s8_s32(vdupq_n_s32(xa)));
}

/* bits 2c..2c+1 of each byte (the 2-bit part of dot vector 4p + c), moved to bits 4-5 */
static inline INL uint8x16_t hi2(uint8x16_t H, int c) {
    return vshlq_n_u8(vandq_u8(vshlq_u8(H, vdupq_n_s8((int8_t)(-2 * c))), vdupq_n_u8(3)), 4);
}

/* 4 lanes' int8 scales at p as int32 */
static inline INL int32x4_t s8x4(const uint8_t *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(v)))));
}

static inline SE_DOTPROD INL void pass_rows(const se_mat *w, int g, const se_act *x, int i0, const int R, float *out,
                                             int ldo, int lanes, int h) {
    const uint8x16_t nib = vdupq_n_u8(0x0f);
    float32x4_t acc[PASS];
    for (int i = 0; i < R; i++) acc[i] = vdupq_n_f32(0.0f);
    for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
        const uint8_t *s = w->data + (size_t)g * w->group_bytes + (size_t)sb * w->block_bytes;
        if (h == 0)
            for (size_t off = 0; off < w->block_bytes; off += 64) __builtin_prefetch(s + PF_AHEAD + off, 0, 3);
        float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(s + SE_Q6K_D) + 4 * h)));
        int32x4_t isb[PASS];
        for (int i = 0; i < R; i++) isb[i] = vdupq_n_s32(0);
        for (int j = 0; j < SE_SUPER; j++) {
            int b = sb * SE_SUPER + j;
            const uint8_t *blk = s + SE_Q6K_BLOCK * j;
            uint8x16_t h0 = vld1q_u8(blk + 256 + 16 * h), h1 = vld1q_u8(blk + 320 + 16 * h);
            int32x4_t dot0[PASS], dot1[PASS];
            for (int i = 0; i < R; i++) dot0[i] = dot1[i] = vdupq_n_s32(0);
            for (int t = 0; t < 4; t++) {
                uint8x16_t v = vld1q_u8(blk + 64 * t + 16 * h);
                uint8x16_t lo = vorrq_u8(vandq_u8(v, nib), hi2(h0, t)), hi = vorrq_u8(vshrq_n_u8(v, 4), hi2(h1, t));
                for (int i = 0; i < R; i++) {
                    const int8_t *xq = x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK;
                    dot0[i] = sdot_row(dot0[i], lo, xq + 4 * t);
                    dot1[i] = sdot_row(dot1[i], hi, xq + 16 + 4 * t);
                }
            }
            int32x4_t sc0 = s8x4(s + SE_Q6K_SC + 32 * j + 4 * h), sc1 = s8x4(s + SE_Q6K_SC + 32 * j + 16 + 4 * h);
            for (int i = 0; i < R; i++) {
                int32_t xs = x->s[(size_t)(i0 + i) * x->nb + b], xh = x->h[(size_t)(i0 + i) * x->nb + b];
                int32x4_t isum = vaddq_s32(vmulq_s32(sc0, vsubq_s32(dot0[i], vdupq_n_s32(32 * xh))),
                                           vmulq_s32(sc1, vsubq_s32(dot1[i], vdupq_n_s32(32 * (xs - xh)))));
                isb[i] = vaddq_s32(isb[i], isum);
                if (x->span == 1) /* a scale per block: folded in block by block */
                    acc[i] = vfmaq_f32(acc[i], vmulq_f32(d, vdupq_n_f32(x->d[(size_t)(i0 + i) * x->nb + b])),
                                       vcvtq_f32_s32(isum));
            }
        }
        for (int i = 0; x->span > 1 && i < R; i++) {
            float xd = x->d[(size_t)(i0 + i) * x->nb + sb * SE_SUPER];
            acc[i] = vfmaq_f32(acc[i], vmulq_f32(d, vdupq_n_f32(xd)), vcvtq_f32_s32(isb[i]));
        }
    }
    int valid = lanes - 4 * h;
    for (int i = 0; i < R; i++) {
        float *dst = out + (size_t)(i0 + i) * ldo + g * SE_GROUP + 4 * h, tmp[4];
        if (valid >= 4) {
            vst1q_f32(dst, acc[i]);
        } else {
            vst1q_f32(tmp, acc[i]);
            for (int r = 0; r < valid; r++) dst[r] = tmp[r];
        }
    }
}

SE_DOTPROD void se_mm_q6k_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP;
        for (int h = 0; h < 4 && 4 * h < lanes; h++)
            for (int i0 = 0; i0 < rows; i0 += PASS) {
                switch (rows - i0 < PASS ? rows - i0 : PASS) { /* constant row counts keep accumulators in registers */
                case 1: pass_rows(w, g, x, i0, 1, out, ldo, lanes, h); break;
                case 2: pass_rows(w, g, x, i0, 2, out, ldo, lanes, h); break;
                case 3: pass_rows(w, g, x, i0, 3, out, ldo, lanes, h); break;
                case 4: pass_rows(w, g, x, i0, 4, out, ldo, lanes, h); break;
                case 5: pass_rows(w, g, x, i0, 5, out, ldo, lanes, h); break;
                default: pass_rows(w, g, x, i0, 6, out, ldo, lanes, h); break;
                }
            }
    }
}
#endif
