/* The reference matmul of the 32-wide formats (Q4_0, Q4_1, Q5_0, Q8_0; the K-quants' are in mm_q4k.c, mm_q6k.c):
 * out[i][o] = sum over blocks of (d_o * xd_i) * (integer dot - offset * xs_i)
 * (+ m_o * (xd_i * xs_i) for formats with a min), accumulated with fmaf in block order. Every SIMD path computes
 * exactly these operations in exactly this order, so its results equal these bit for bit. */
#include "se.h"

#include <math.h>

void se_mm_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    size_t scale_at = se_scale_at(w->kern);
    for (int g = g0; g < g1; g++) {
        const uint8_t *group = w->data + (size_t)g * w->group_bytes;
        int lanes = w->n - g * SE_GROUP < SE_GROUP ? w->n - g * SE_GROUP : SE_GROUP;
        for (int i = 0; i < rows; i++) {
            const int8_t *xq = x->q + (size_t)i * x->k;
            const float *xd = x->d + (size_t)i * x->nb;
            const int32_t *xs = x->s + (size_t)i * x->nb;
            const float *xm = x->m + (size_t)i * x->nb;
            for (int r = 0; r < lanes; r++) {
                float acc = 0.0f;
                for (int b = 0; b < w->nb; b++) {
                    const uint8_t *blk = group + (size_t)b * w->block_bytes;
                    const uint16_t *d = (const uint16_t *)(blk + scale_at);
                    int32_t dot = 0;
                    for (int j = 0; j < SE_BLOCK; j++) dot += se_unpacked(w->kern, blk, r, j) * xq[b * SE_BLOCK + j];
                    float dd = se_f16_to_f32(d[r]) * xd[b];
                    if (w->has_min) {
                        acc = fmaf(dd, (float)dot, acc);
                        acc = fmaf(se_f16_to_f32(d[16 + r]), xm[b], acc);
                    } else {
                        acc = fmaf(dd, (float)(dot - w->offset * xs[b]), acc);
                    }
                }
                out[(size_t)i * ldo + g * SE_GROUP + r] = acc;
            }
        }
    }
}
