/* NEON matmul of Q4_K and Q5_K (mm_q4k.c's portable C, mirrored): quarter h of a 16-row group is one q-register of
 * 4 rows, sdot adds 4 weights (nibbles, Q5_K's fifth bit ORed in: u <= 31, signed-safe) x 4 activations into each
 * row's lane, and in the portable order (the superblock's activation scale xd folded in once):
 *     a = fma(d * sc_j, (float)dot_j, a) for each sub-block j;  mi = sum_j m_j * xs_j (int32)
 *     a = fma(-dmin, (float)mi, a);  acc = fma(xd, a, acc)
 * with the scales and the mins' integers formed once per sub-block for the quarter's 4 rows. Each sub-block quarter
 * is unpacked once per pass of up to PASS activation rows. */
#include "se.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>

#define INL __attribute__((always_inline))
#define PASS 8
#define PF_AHEAD 2048

static inline const uint8_t *superblock(const se_mat *w, int g, int sb) {
    return w->data + (size_t)g * w->group_bytes + (size_t)sb * w->block_bytes;
}

static inline const uint8_t *sub_block(const se_mat *w, const uint8_t *s, int j) {
    return s + SE_Q4K_HEAD + (size_t)(w->kern == SE_KERN_Q5K ? SE_Q5K_SUB : 256) * j;
}

/* Q5_K: bit 4 of the 16 weights of quarter h of vector t (bits 16h .. 16h+15 of mask t), as 0x10 per byte */
static inline INL uint8x16_t high_bits(const uint8_t *blk, int t, int h) {
    const uint8_t *m = blk + 256 + 8 * t + 2 * h;
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8(m[0]), vdup_n_u8(m[1]));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* the 4 lanes' 6-bit integers (u8 at p .. p+3) */
static inline INL uint32x4_t u8x4i(const uint8_t *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(v)))));
}

static inline INL float32x4_t u8x4(const uint8_t *p) { return vcvtq_f32_u32(u8x4i(p)); }

static inline INL float32x4_t f16x4(const uint8_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
}

static inline SE_DOTPROD INL int32x4_t sdot_row(int32x4_t acc, uint8x16_t w, const int8_t *xq) {
    int32_t xa;
    __builtin_memcpy(&xa, xq, 4);
    return vdotq_s32(acc, vreinterpretq_s8_u8(w), vreinterpretq_s8_s32(vdupq_n_s32(xa)));
}

static inline SE_DOTPROD INL void pass_rows(const se_mat *w, int g, const se_act *x, int i0, const int R, float *out,
                                             int ldo, int lanes, int h, const int q5) {
    const uint8x16_t nib = vdupq_n_u8(0x0f); /* q5 and R are constants at every call: no test inside the loop */
    float32x4_t acc[PASS];
    for (int i = 0; i < R; i++) acc[i] = vdupq_n_f32(0.0f);
    for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
        const uint8_t *s = superblock(w, g, sb);
        if (h == 0)
            for (size_t off = 0; off < w->block_bytes; off += 64) __builtin_prefetch(s + PF_AHEAD + off, 0, 3);
        float32x4_t d = f16x4(s + 8 * h), dmin = f16x4(s + 32 + 8 * h), a[PASS];
        for (int i = 0; i < R; i++) a[i] = vdupq_n_f32(0.0f);
        for (int j = 0; j < SE_SUPER; j++) {
            int b = sb * SE_SUPER + j;
            const uint8_t *blk = sub_block(w, s, j);
            int32x4_t dot[PASS];
            for (int i = 0; i < R; i++) dot[i] = vdupq_n_s32(0);
            for (int t = 0; t < 4; t++) {
                uint8x16_t v = vld1q_u8(blk + 64 * t + 16 * h);
                uint8x16_t lo = vandq_u8(v, nib), hi = vshrq_n_u8(v, 4);
                if (q5) {
                    lo = vorrq_u8(lo, high_bits(blk, t, h));
                    hi = vorrq_u8(hi, high_bits(blk, 4 + t, h));
                }
                for (int i = 0; i < R; i++) {
                    const int8_t *xq = x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK;
                    dot[i] = sdot_row(dot[i], lo, xq + 4 * t);
                    dot[i] = sdot_row(dot[i], hi, xq + 16 + 4 * t);
                }
            }
            float32x4_t scale = vmulq_f32(d, u8x4(s + 64 + 16 * j + 4 * h));
            if (x->span == 1) { /* a scale per block: both terms every block (mm_q4k.c) */
                float32x4_t min = vmulq_f32(dmin, u8x4(s + 192 + 16 * j + 4 * h));
                for (int i = 0; i < R; i++) {
                    size_t at = (size_t)(i0 + i) * x->nb + b;
                    acc[i] = vfmaq_f32(acc[i], vmulq_f32(scale, vdupq_n_f32(x->d[at])), vcvtq_f32_s32(dot[i]));
                    acc[i] = vfmsq_f32(acc[i], min, vdupq_n_f32(x->m[at])); /* fma(-min, xm, acc) */
                }
                continue;
            }
            for (int i = 0; i < R; i++) a[i] = vfmaq_f32(a[i], scale, vcvtq_f32_s32(dot[i]));
        }
        if (x->span == 1) continue;
        int32x4_t mins[SE_SUPER];
        for (int j = 0; j < SE_SUPER; j++) mins[j] = vreinterpretq_s32_u32(u8x4i(s + 192 + 16 * j + 4 * h));
        for (int i = 0; i < R; i++) {
            const int32_t *xs = x->s + (size_t)(i0 + i) * x->nb + sb * SE_SUPER;
            int32x4_t mi = vdupq_n_s32(0);
            for (int j = 0; j < SE_SUPER; j++) mi = vmlaq_n_s32(mi, mins[j], xs[j]);
            float xd = x->d[(size_t)(i0 + i) * x->nb + sb * SE_SUPER];
            acc[i] = vfmaq_f32(acc[i], vdupq_n_f32(xd), vfmsq_f32(a[i], dmin, vcvtq_f32_s32(mi)));
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

#define PASSES(q5)                                                                                               \
    switch (rows - i0 < PASS ? rows - i0 : PASS) { /* constant row counts keep accumulators in registers */      \
    case 1: pass_rows(w, g, x, i0, 1, out, ldo, lanes, h, q5); break;                                            \
    case 2: pass_rows(w, g, x, i0, 2, out, ldo, lanes, h, q5); break;                                            \
    case 3: pass_rows(w, g, x, i0, 3, out, ldo, lanes, h, q5); break;                                            \
    case 4: pass_rows(w, g, x, i0, 4, out, ldo, lanes, h, q5); break;                                            \
    case 5: pass_rows(w, g, x, i0, 5, out, ldo, lanes, h, q5); break;                                            \
    case 6: pass_rows(w, g, x, i0, 6, out, ldo, lanes, h, q5); break;                                            \
    case 7: pass_rows(w, g, x, i0, 7, out, ldo, lanes, h, q5); break;                                            \
    default: pass_rows(w, g, x, i0, 8, out, ldo, lanes, h, q5); break;                                           \
    }

SE_DOTPROD void se_mm_q4k_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP;
        for (int h = 0; h < 4 && 4 * h < lanes; h++)
            for (int i0 = 0; i0 < rows; i0 += PASS) {
                if (w->kern == SE_KERN_Q5K) PASSES(1)
                else PASSES(0)
            }
    }
}
#endif
