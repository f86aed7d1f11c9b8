/* Activations -> int8 per 32-wide block with a float scale (as llama.cpp's q8_0/q8_1) and the block's integer sum
 * (the min and offset terms of the weight formats need it), and the sum of its first 16 (Q6_K's scales change every
 * 16 weights). The scale is shared by `span` blocks: 1, or 8 (a 256-wide superblock, llama.cpp's q8_K) for the
 * activations a K-quant matrix reads, whose kernels then fold it in once per superblock (mm_q4k.c, mm_q6k.c); every
 * block still carries the scale, so a 32-wide kernel reading the same activations needs nothing else. One
 * implementation for every ISA: the rounding trick below is exact IEEE arithmetic, so the compiler may vectorise it
 * without changing a bit. */
#include <stdlib.h>

#include "se.h"

#include <math.h>

float se_amax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

void se_quantize_scaled(const float *x, float amax, int8_t *q, float *d, int32_t *s, int32_t *h, float *m) {
    float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < SE_BLOCK; j++) {
        /* round half to even: adding 1.5 * 2^23 leaves no fraction bits (|v| <= 127 here) */
        float v = x[j] * inv;
        float r = (v + 12582912.0f) - 12582912.0f;
        int qi = (int)r;
        qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
        q[j] = (int8_t)qi;
    }
    int32_t half = 0, rest = 0;
    for (int j = 0; j < SE_BLOCK / 2; j++) half += q[j];
    for (int j = SE_BLOCK / 2; j < SE_BLOCK; j++) rest += q[j];
    *d = scale;
    *s = half + rest;
    *h = half;
    *m = scale * (float)(half + rest);
}

void se_quantize_blocks(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h, float *m) {
    for (int b0 = 0; b0 < nblocks; b0 += span) {
        float amax = se_amax(x + b0 * SE_BLOCK, span * SE_BLOCK);
        for (int b = b0; b < b0 + span; b++)
            se_quantize_scaled(x + b * SE_BLOCK, amax, q + b * SE_BLOCK, d + b, s + b, h + b, m + b);
    }
}

/* the int16 pairs of a row's blocks b0 .. b0 + nblocks - 1 (se.h: se_sum_pairs, se_half_pairs) */
void se_act_pairs(se_act *a, int row, int b0, int nblocks) {
    const int32_t *s = a->s + (size_t)row * a->nb, *h = a->h + (size_t)row * a->nb;
    int32_t *p = (int32_t *)se_sum_pairs(a, row), *hp = (int32_t *)se_half_pairs(a, row);
    for (int b = b0; b < b0 + nblocks; b += 2)
        p[b / 2] = (int32_t)((uint32_t)(uint16_t)s[b] | (uint32_t)s[b + 1] << 16);
    for (int b = b0; b < b0 + nblocks; b++) hp[b] = (int32_t)((uint32_t)(uint16_t)h[b] | (uint32_t)(s[b] - h[b]) << 16);
}

/* x [rows, k] quantized (span blocks a scale) into freshly allocated blocks (a->f = x, for float-weight matrices);
 * se_act_free releases them. Returns 0, or -2 when memory runs out (nothing left allocated). */
int se_act_quantized(const float *x, int rows, int k, int span, se_act *a) {
    size_t blocks = (size_t)rows * (k / SE_BLOCK);
    se_act n = {.q = malloc((size_t)rows * k), .d = malloc(blocks * sizeof(float)),
                .s = malloc(blocks * sizeof(int32_t)), .h = malloc(blocks * sizeof(int32_t)), .k = k,
                .nb = k / SE_BLOCK, .f = (float *)x, .m = malloc(blocks * sizeof(float)), .span = span,
                .p = malloc(blocks / 2 * 3 * sizeof(int32_t) + 4)};
    *a = n;
    if (!a->q || !a->d || !a->s || !a->h || !a->m || !a->p) {
        se_act_free(a);
        return -2;
    }
    se_quantize_rows(x, rows, k, a);
    return 0;
}

void se_act_free(se_act *a) {
    free(a->q); free(a->d); free(a->s); free(a->h); free(a->m); free(a->p);
    a->q = NULL; a->d = NULL; a->s = NULL; a->h = NULL; a->m = NULL; a->p = NULL;
}

void se_quantize_rows(const float *x, int rows, int ldx, se_act *a) {
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)r * a->nb;
        se_quantize_blocks(x + (size_t)r * ldx, a->nb, a->span, a->q + (size_t)r * a->k, a->d + at, a->s + at,
                           a->h + at, a->m + at);
        if (a->span > 1 && a->p) se_act_pairs(a, r, 0, a->nb);
    }
}
