/* NEON matmul of the 32-wide formats (Q4_0, Q4_1, Q5_0, Q8_0) with the ARMv8.2 dot product: a 16-row group is 4
 * q-registers of 4 rows each, and byte 4r+i of a packed vector (se.h) is exactly sdot's lane shape, so one sdot adds
 * 4 weights x 4 activations into each row's 32-bit lane. sdot is signed x signed: nibbles and Q5_0's 5 bits
 * (<= 31) go in as they are; Q8_0's stored u = w + 128 goes in as u ^ 0x80 = w, so its integer is sum(w * x) and
 * the offset term is dropped: the same exact integer as the portable C's dot - offset * xs. The float steps are the
 * portable C's, in its order (vfmaq_f32 is fmaf's fused step). Each quarter of a weight block (4 rows) is unpacked
 * once per pass of up to PASS activation rows, as the x86 kernels do with their halves. */
#include "se.h"

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>

#define PASS 8
#define PF_AHEAD 2048

/* Q5_0: bit 4 of the 16 weights of quarter h of vector j (bits 16h .. 16h+15 of mask j), as 0x10 per byte. */
static inline __attribute__((always_inline)) uint8x16_t high_bits(const uint8_t *blk, int j, int h) {
    const uint8_t *m = blk + 256 + 8 * j + 2 * h;
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8(m[0]), vdup_n_u8(m[1]));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

static inline SE_DOTPROD __attribute__((always_inline)) int32x4_t sdot_row(int32x4_t acc, uint8x16_t w,
                                                                             const int8_t *xq) {
    int32_t xa;
    __builtin_memcpy(&xa, xq, 4);
    return vdotq_s32(acc, vreinterpretq_s8_u8(w), vreinterpretq_s8_s32(vdupq_n_s32(xa)));
}

static inline SE_DOTPROD __attribute__((always_inline)) void
pass_rows(const se_mat *w, const uint8_t *group, const se_act *x, int i0, const int R, float *out, int ldo, int col,
          int lanes, int h, const int q8, const int q5, const int has_min) {
    /* R and the format are constants at every call (the switch below): no test inside the loop */
    const size_t scale_at = se_scale_at(q8 ? SE_KERN_Q8 : q5 ? SE_KERN_Q5 : SE_KERN_Q4);
    const int offset = q8 ? 0 : w->offset; /* u ^ 0x80 already subtracted 128 from each Q8 weight */
    const uint8x16_t nib = vdupq_n_u8(0x0f), flip = vdupq_n_u8(0x80);
    float32x4_t acc[PASS];
    for (int i = 0; i < R; i++) acc[i] = vdupq_n_f32(0.0f);
    for (int b = 0; b < w->nb; b++) {
        const uint8_t *blk = group + (size_t)b * w->block_bytes;
        if (h == 0)
            for (size_t off = 0; off < w->block_bytes; off += 64) __builtin_prefetch(blk + PF_AHEAD + off, 0, 3);
        int32x4_t dot[PASS];
        for (int i = 0; i < R; i++) dot[i] = vdupq_n_s32(0);
        for (int t = 0; t < (q8 ? 8 : 4); t++) {
            uint8x16_t v = vld1q_u8(blk + 64 * t + 16 * h);
            uint8x16_t lo = q8 ? veorq_u8(v, flip) : vandq_u8(v, nib);
            if (q5) lo = vorrq_u8(lo, high_bits(blk, t, h));
            for (int i = 0; i < R; i++)
                dot[i] = sdot_row(dot[i], lo, x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK + 4 * t);
            if (!q8) {
                uint8x16_t hi = vshrq_n_u8(v, 4);
                if (q5) hi = vorrq_u8(hi, high_bits(blk, 4 + t, h));
                for (int i = 0; i < R; i++)
                    dot[i] = sdot_row(dot[i], hi, x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK + 16 + 4 * t);
            }
        }
        float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(blk + scale_at) + 4 * h)));
        if (has_min) {
            const uint16_t *mins = (const uint16_t *)(blk + scale_at) + 16;
            float32x4_t m = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(mins + 4 * h)));
            for (int i = 0; i < R; i++) {
                float xd = x->d[(size_t)(i0 + i) * x->nb + b];
                float32x4_t dd = vmulq_f32(d, vdupq_n_f32(xd));
                acc[i] = vfmaq_f32(acc[i], dd, vcvtq_f32_s32(dot[i]));
                acc[i] = vfmaq_f32(acc[i], m, vdupq_n_f32(x->m[(size_t)(i0 + i) * x->nb + b]));
            }
        } else {
            for (int i = 0; i < R; i++) {
                float xd = x->d[(size_t)(i0 + i) * x->nb + b];
                int32_t xs = x->s[(size_t)(i0 + i) * x->nb + b];
                float32x4_t dd = vmulq_f32(d, vdupq_n_f32(xd));
                int32x4_t sumi = vsubq_s32(dot[i], vdupq_n_s32(offset * xs));
                acc[i] = vfmaq_f32(acc[i], dd, vcvtq_f32_s32(sumi));
            }
        }
    }
    int valid = lanes - 4 * h;
    for (int i = 0; i < R; i++) {
        float *dst = out + (size_t)(i0 + i) * ldo + col + 4 * h;
        if (valid >= 4) {
            vst1q_f32(dst, acc[i]);
        } else if (valid > 0) {
            float tmp[4];
            vst1q_f32(tmp, acc[i]);
            for (int r = 0; r < valid; r++) dst[r] = tmp[r];
        }
    }
}

#define ROWS_CASE(n, ...) \
    case n: pass_rows(w, group, x, i0, n, out, ldo, g * SE_GROUP, lanes, h, __VA_ARGS__); break;
#define PASSES(...)                                                                                              \
    switch (r) { /* constant row counts keep the accumulators in registers; q8, q5, has_min */                 \
        ROWS_CASE(1, __VA_ARGS__) ROWS_CASE(2, __VA_ARGS__) ROWS_CASE(3, __VA_ARGS__) ROWS_CASE(4, __VA_ARGS__)  \
        ROWS_CASE(5, __VA_ARGS__) ROWS_CASE(6, __VA_ARGS__) ROWS_CASE(7, __VA_ARGS__)                            \
        default: pass_rows(w, group, x, i0, 8, out, ldo, g * SE_GROUP, lanes, h, __VA_ARGS__); break;            \
    }

SE_DOTPROD void se_mm_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        int lanes = w->n - g * SE_GROUP;
        for (int h = 0; h < 4 && 4 * h < lanes; h++)
            for (int i0 = 0; i0 < rows; i0 += PASS) {
                int r = rows - i0 < PASS ? rows - i0 : PASS;
                SE_BY_FORMAT(w, PASSES);
            }
    }
}
#endif
