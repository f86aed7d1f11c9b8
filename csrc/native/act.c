/* Activations -> int8 per 32-wide block with one float scale (as llama.cpp's q8_0/q8_1) and the block's integer sum
 * (the min and offset terms of the weight formats need it), and the sum of its first 16 (Q6_K's scales change every
 * 16 weights). One implementation for every ISA: the rounding trick
 * below is exact IEEE arithmetic, so the compiler may vectorise it without changing a bit. */
#include <stdlib.h>

#include "se.h"

#include <math.h>

void se_quantize_block(const float *x, int8_t *q, float *d, int32_t *s, int32_t *h, float *m) {
    float amax = 0.0f;
    for (int j = 0; j < SE_BLOCK; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
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

/* x [rows, k] quantized into freshly allocated blocks (a->f = x, for float-weight matrices); se_act_free releases
 * them. Returns 0, or -2 when memory runs out (nothing left allocated). */
int se_act_quantized(const float *x, int rows, int k, se_act *a) {
    size_t blocks = (size_t)rows * (k / SE_BLOCK);
    se_act n = {.q = malloc((size_t)rows * k), .d = malloc(blocks * sizeof(float)),
                .s = malloc(blocks * sizeof(int32_t)), .h = malloc(blocks * sizeof(int32_t)), .k = k,
                .nb = k / SE_BLOCK, .f = (float *)x, .m = malloc(blocks * sizeof(float))};
    *a = n;
    if (!a->q || !a->d || !a->s || !a->h || !a->m) {
        se_act_free(a);
        return -2;
    }
    se_quantize_rows(x, rows, k, a);
    return 0;
}

void se_act_free(se_act *a) {
    free(a->q); free(a->d); free(a->s); free(a->h); free(a->m);
    a->q = NULL; a->d = NULL; a->s = NULL; a->h = NULL; a->m = NULL;
}

void se_quantize_rows(const float *x, int rows, int ldx, se_act *a) {
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < a->nb; b++)
            se_quantize_block(x + (size_t)r * ldx + b * SE_BLOCK, a->q + (size_t)r * a->k + b * SE_BLOCK,
                              a->d + (size_t)r * a->nb + b, a->s + (size_t)r * a->nb + b, a->h + (size_t)r * a->nb + b,
                              a->m + (size_t)r * a->nb + b);
}
