/* GGUF K-quant superblocks (256 weights) -> the engine's packed superblocks (se.h), without changing any weight's
 * value; and back, for the embedding row and the tests. The bit layouts are ggml's (gguf-py quants.py Q4_K, Q5_K, Q6_K). */
#include "se.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Q4_K: d, dmin, 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4), qs[128]: sub-block j's weight e is
 * qs[32 * (j / 2) + e] >> (4 * (j % 2)) & 15. Q5_K (q5): the same with qh[32] before qs, bit 4 = qh[e] >> j & 1. */
static void pack_q4k(const uint8_t *src, uint8_t *dst, int r, int q5) {
    const uint8_t *s = src + 4, *qs = src + (q5 ? 48 : 16), *qh = src + 16;
    int sub = q5 ? SE_Q5K_SUB : 256;
    ((uint16_t *)dst)[r] = rd16(src);
    ((uint16_t *)(dst + 32))[r] = rd16(src + 2);
    for (int j = 0; j < SE_SUPER; j++) {
        int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        dst[64 + 16 * j + r] = (uint8_t)sc;
        dst[192 + 16 * j + r] = (uint8_t)m;
        uint8_t *blk = dst + SE_Q4K_HEAD + sub * j;
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 4; i++) {
                int lo = qs[32 * (j / 2) + 4 * t + i] >> (4 * (j % 2)) & 15;
                int hi = qs[32 * (j / 2) + 16 + 4 * t + i] >> (4 * (j % 2)) & 15;
                blk[64 * t + r * 4 + i] = (uint8_t)(lo | hi << 4);
            }
        if (q5) /* Q5_K: bit 4 of sub-block j's weight e is qh[e] >> j & 1 -> bit (r*4 + e%4) of mask e / 4 */
            for (int e = 0; e < SE_BLOCK; e++)
                if (qh[e] >> j & 1) blk[256 + (e / 4) * 8 + (r * 4 + e % 4) / 8] |= (uint8_t)(1u << ((r * 4 + e % 4) % 8));
    }
}

/* Q6_K: ql[128], qh[64], int8 scales[16], d. Weight w = 128 h + e (h = 0, 1): low 4 bits
 * ql[64 h + e % 64] >> (4 * (e / 64)), high 2 bits qh[32 h + e % 32] >> (2 * (e / 32)). */
static void pack_q6k(const uint8_t *src, uint8_t *dst, int r) {
    const uint8_t *ql = src, *qh = src + 128;
    for (int g = 0; g < 16; g++) dst[SE_Q6K_SC + 16 * g + r] = src[192 + g];
    ((uint16_t *)(dst + SE_Q6K_D))[r] = rd16(src + 208);
    for (int w = 0; w < 256; w++) {
        int h = w / 128, e = w % 128;
        int u = (ql[64 * h + e % 64] >> (4 * (e / 64)) & 15) | (qh[32 * h + e % 32] >> (2 * (e / 32)) & 3) << 4;
        uint8_t *blk = dst + SE_Q6K_BLOCK * (w / 32);
        int j = w % 32, lane = r * 4 + j % 4;
        blk[((j % 16) / 4) * 64 + lane] |= (uint8_t)((u & 15) << (j < 16 ? 0 : 4));
        blk[256 + (j / 16) * 64 + lane] |= (uint8_t)((u >> 4) << (2 * ((j / 4) % 4)));
    }
}

void se_pack_superblock(int type, const uint8_t *src, uint8_t *dst, int r) {
    if (type == SE_Q4_K || type == SE_Q5_K) pack_q4k(src, dst, r, type == SE_Q5_K);
    else pack_q6k(src, dst, r);
}

/* Exact values of lane r's 256 weights, in gguf-py's operation order: Q4_K (d * sc) * q - dmin * m, Q6_K
 * (d * sc) * (q - 32). */
void se_dequant_superblock(const se_mat *m, const uint8_t *sb, int r, float *out) {
    if (m->kern == SE_KERN_Q4K || m->kern == SE_KERN_Q5K) {
        int sub = m->kern == SE_KERN_Q5K ? SE_Q5K_SUB : 256;
        float d = se_f16_to_f32(((const uint16_t *)sb)[r]), dmin = se_f16_to_f32(((const uint16_t *)(sb + 32))[r]);
        for (int j = 0; j < SE_SUPER; j++) {
            float scale = d * (float)sb[64 + 16 * j + r], min = dmin * (float)sb[192 + 16 * j + r];
            for (int e = 0; e < SE_BLOCK; e++)
                out[j * SE_BLOCK + e] = scale * (float)se_unpacked(m->kern, sb + SE_Q4K_HEAD + sub * j, r, e) - min;
        }
        return;
    }
    float d = se_f16_to_f32(((const uint16_t *)(sb + SE_Q6K_D))[r]);
    for (int w = 0; w < 256; w++) {
        float scale = d * (float)(int8_t)sb[SE_Q6K_SC + 16 * (w / 16) + r];
        int u = se_unpacked(SE_KERN_Q6K, sb + SE_Q6K_BLOCK * (w / 32), r, w % 32);
        out[w] = scale * (float)(u - 32);
    }
}
