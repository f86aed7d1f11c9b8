/* Q6_K matmul, the x86 ISAs in one file so the mirrored operation order is read side by side (NEON's is
 * mm_q6k_neon.c). Each 32-block of a superblock (se.h) holds 6-bit q as Q4-layout nibbles plus a 2-bit part;
 * its two int8 scales cover 16 weights each, so the kernel forms two integer dots (q 0..63) and folds the offset
 * and both scales in exactly, in int32:
 *     isum = sc_0 * (dot_0 - 32 * h) + sc_1 * (dot_1 - 32 * (s - h))   (h: the activations' first-16 sum)
 * and, the activations sharing one scale xd per superblock (se_act.span 8, act.c), sums them over the superblock's
 * 8 blocks in int32 (each |isum| <= 2 * 128 * 16 * 32 * 127 < 2^24: the total < 2^27) before one float step:
 *     acc = fma(d * xd, (float)isb, acc)
 * (the conversion rounds above 2^24, the same in every ISA). Per block and row that leaves integer steps only. */
#include <math.h>

#include "se.h"

static inline const uint8_t *superblock(const se_mat *w, int g, int sb) {
    return w->data + (size_t)g * w->group_bytes + (size_t)sb * w->block_bytes;
}

void se_mm_q6k_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP < SE_GROUP ? w->n - g * SE_GROUP : SE_GROUP;
        for (int i = 0; i < rows; i++) {
            const int8_t *xq = x->q + (size_t)i * x->k;
            const float *xd = x->d + (size_t)i * x->nb;
            const int32_t *xs = x->s + (size_t)i * x->nb, *xh = x->h + (size_t)i * x->nb;
            for (int r = 0; r < lanes; r++) {
                float acc = 0.0f;
                for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
                    const uint8_t *s = superblock(w, g, sb);
                    float d = se_f16_to_f32(((const uint16_t *)(s + SE_Q6K_D))[r]);
                    int32_t isb = 0;
                    for (int j = 0; j < SE_SUPER; j++) {
                        int b = sb * SE_SUPER + j;
                        int32_t dot[2] = {0, 0};
                        for (int e = 0; e < SE_BLOCK; e++)
                            dot[e / 16] += se_unpacked(SE_KERN_Q6K, s + SE_Q6K_BLOCK * j, r, e) * xq[b * SE_BLOCK + e];
                        int32_t sc0 = (int8_t)s[SE_Q6K_SC + 32 * j + r], sc1 = (int8_t)s[SE_Q6K_SC + 32 * j + 16 + r];
                        int32_t isum = sc0 * (dot[0] - 32 * xh[b]) + sc1 * (dot[1] - 32 * (xs[b] - xh[b]));
                        if (x->span == 1) /* a scale per block: folded in block by block */
                            acc = fmaf(d * xd[b], (float)isum, acc);
                        isb += isum;
                    }
                    if (x->span > 1) acc = fmaf(d * xd[sb * SE_SUPER], (float)isb, acc);
                }
                out[(size_t)i * ldo + g * SE_GROUP + r] = acc;
            }
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "avx2.h"
#include "dpbusd.h"

#define PASS512 8 /* activation rows per pass (3 accumulators a row; the unpack is shared): 8 spill little, 12 had */

#define SE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define PF 2048     /* ahead into L1 */
#define PF_L2 12288 /* ahead into L2 (the prototype's second level: PERF_FACTS.md) */
#define INL __attribute__((always_inline))

static inline INL void prefetch_sub(const uint8_t *s, int j) { /* the superblock's lines, an eighth per block */
    for (int off = j * (SE_Q6K_BYTES / 8 / 64 + 1) * 64; off < (j + 1) * (SE_Q6K_BYTES / 8 / 64 + 1) * 64; off += 64) {
        _mm_prefetch((const char *)s + PF + off, _MM_HINT_T0);
        _mm_prefetch((const char *)s + PF_L2 + off, _MM_HINT_T1);
    }
}

/* The 2-bit part of dot vector 4p + c sits at bits 2c..2c+1 of vector p's bytes: moved to bits 4-5. 16-bit shifts
 * only carry bits across bytes outside 0x30. */
#define HI2_512(H, c) _mm512_and_si512((c) == 3 ? _mm512_srli_epi16(H, 2) : _mm512_slli_epi16(H, 4 - 2 * (c)), m30)
#define HI2_256(H, c) _mm256_and_si256((c) == 3 ? _mm256_srli_epi16(H, 2) : _mm256_slli_epi16(H, 4 - 2 * (c)), m30)

/* sb8: the activations' span is 8 (a constant at every call); else each block's isum is folded in as it is done */
static inline SE_AVX512 INL void pass512(const se_mat *w, int g, const se_act *x, int i0, const int R, float *out,
                                          int ldo, int lanes, const int sb8) {
    const __m512i nib = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    float acc[PASS512 + 1][SE_GROUP] __attribute__((aligned(64))); /* in L1, touched once per superblock */
    for (int i = 0; i < R; i++) _mm512_store_ps(acc[i], _mm512_setzero_ps());
    for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
        const uint8_t *s = superblock(w, g, sb);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + SE_Q6K_D)));
        __m512i isb[PASS512 + 1];
        for (int i = 0; i < R; i++) isb[i] = _mm512_setzero_si512();
        for (int j = 0; j < SE_SUPER; j++) {
            int b = sb * SE_SUPER + j;
            const uint8_t *blk = s + SE_Q6K_BLOCK * j;
            prefetch_sub(s, j);
            __m512i h0 = _mm512_loadu_si512((const void *)(blk + 256));
            __m512i h1 = _mm512_loadu_si512((const void *)(blk + 320));
            __m512i dot0[PASS512 + 1], dot1[PASS512 + 1];
            for (int i = 0; i < R; i++) dot0[i] = dot1[i] = _mm512_setzero_si512();
            for (int t = 0; t < 4; t++) {
                __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * t));
                __m512i lo = _mm512_or_si512(_mm512_and_si512(v, nib), HI2_512(h0, t));
                __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), nib), HI2_512(h1, t));
                for (int i = 0; i < R; i++) {
                    const int8_t *xq = x->q + (size_t)(i0 + i) * x->k + b * SE_BLOCK;
                    dot0[i] = se_dpbusd_bcast(dot0[i], lo, xq + 4 * t);
                    dot1[i] = se_dpbusd_bcast(dot1[i], hi, xq + 16 + 4 * t);
                }
            }
            __m512i sc0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + SE_Q6K_SC + 32 * j)));
            __m512i sc1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + SE_Q6K_SC + 32 * j + 16)));
            for (int i = 0; sb8 && i < R; i++)
                isb[i] = _mm512_add_epi32(isb[i], _mm512_add_epi32(_mm512_mullo_epi32(sc0, dot0[i]),
                                                                   _mm512_mullo_epi32(sc1, dot1[i])));
            for (int i = 0; !sb8 && i < R; i++) {
                size_t at = (size_t)(i0 + i) * x->nb + b;
                int32_t xs = x->s[at], xh = x->h[at];
                __m512i isum = _mm512_add_epi32(
                    _mm512_mullo_epi32(sc0, _mm512_sub_epi32(dot0[i], _mm512_set1_epi32(32 * xh))),
                    _mm512_mullo_epi32(sc1, _mm512_sub_epi32(dot1[i], _mm512_set1_epi32(32 * (xs - xh)))));
                _mm512_store_ps(acc[i], _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x->d[at])),
                                                        _mm512_cvtepi32_ps(isum), _mm512_load_ps(acc[i])));
            }
        }
        if (!sb8) continue;
        /* the offset terms, 32 * (sc_0 h + sc_1 (s - h)) a block: one vpdpwssd a block and row over the int16 pairs
         * (sc_0, sc_1) and (h, s - h) (se_half_pairs); the same integer as subtracting them block by block */
        __m512i off[PASS512 + 1];
        for (int i = 0; i < R; i++) off[i] = _mm512_setzero_si512();
        for (int j = 0; j < SE_SUPER; j++) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + SE_Q6K_SC + 32 * j));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + SE_Q6K_SC + 32 * j + 16));
            __m512i pairs = _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, c), _mm_unpacklo_epi8(a, c)));
            for (int i = 0; i < R; i++)
                off[i] = se_dpwssd_bcast(off[i], pairs, se_half_pairs(x, i0 + i) + sb * SE_SUPER + j);
        }
        for (int i = 0; i < R; i++) isb[i] = _mm512_sub_epi32(isb[i], _mm512_slli_epi32(off[i], 5));
        for (int i = 0; i < R; i++) {
            float xd = x->d[(size_t)(i0 + i) * x->nb + sb * SE_SUPER];
            _mm512_store_ps(acc[i], _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xd)), _mm512_cvtepi32_ps(isb[i]),
                                                    _mm512_load_ps(acc[i])));
        }
    }
    __mmask16 mask = lanes >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << lanes) - 1);
    for (int i = 0; i < R; i++)
        _mm512_mask_storeu_ps(out + (size_t)(i0 + i) * ldo + g * SE_GROUP, mask, _mm512_load_ps(acc[i]));
}

static inline SE_AVX512 INL void groups512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0,
                                            int g1, const int sb8) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP;
        for (int i0 = 0, n; i0 < rows; i0 += n) {
            /* a verify of 9 rows in one pass (some spill), a prompt in passes of at most 8 */
            switch (n = se_pass_rows(rows, rows == PASS512 + 1 ? rows : PASS512, i0)) {
            case 1: pass512(w, g, x, i0, 1, out, ldo, lanes, sb8); break;
            case 2: pass512(w, g, x, i0, 2, out, ldo, lanes, sb8); break;
            case 3: pass512(w, g, x, i0, 3, out, ldo, lanes, sb8); break;
            case 4: pass512(w, g, x, i0, 4, out, ldo, lanes, sb8); break;
            case 5: pass512(w, g, x, i0, 5, out, ldo, lanes, sb8); break;
            case 6: pass512(w, g, x, i0, 6, out, ldo, lanes, sb8); break;
            case 7: pass512(w, g, x, i0, 7, out, ldo, lanes, sb8); break;
            case 9: pass512(w, g, x, i0, 9, out, ldo, lanes, sb8); break;
            default: pass512(w, g, x, i0, PASS512, out, ldo, lanes, sb8); break;
            }
        }
    }
}

SE_AVX512 void se_mm_q6k_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    if (x->span > 1) groups512(w, x, rows, out, ldo, g0, g1, 1);
    else groups512(w, x, rows, out, ldo, g0, g1, 0);
}

/* AVX2: 8-lane halves of the group; u8 x s8 dots as vpmaddubsw, two of whose int16 pair sums (each at most
 * 2 * 63 * 127 = 16002) are added before vpmaddwd widens them: the same exact integer as widening each; SE_PIN (se.h)
 * keeps each row's running sum in a register. A pass runs R rows times H halves from half h0, slot z = (half
 * h0 + z / R, row z % R): with H = 2 (one row) each superblock is walked once and its prefetches run without a
 * pause, as in mm_avx2.c. */

static inline SE_AVX2 INL void pass256(const se_mat *w, int g, const se_act *x, int i0, const int R, float *out,
                                       int ldo, int lanes, int h0, const int H, const int sb8) {
    const __m256i nib = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const int S = R * H;
    __m256 acc[4];
    for (int z = 0; z < S; z++) acc[z] = _mm256_setzero_ps();
    for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
        const uint8_t *s = superblock(w, g, sb);
        __m256 d[2];
        for (int e = 0; e < H; e++)
            d[e] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + SE_Q6K_D + 16 * (h0 + e))));
        __m256i isb[4]; /* sb8: the superblock's integer sums */
        for (int z = 0; sb8 && z < S; z++) isb[z] = _mm256_setzero_si256();
        for (int j = 0; j < SE_SUPER; j++) {
            int b = sb * SE_SUPER + j;
            const uint8_t *blk = s + SE_Q6K_BLOCK * j;
            if (h0 == 0) prefetch_sub(s, j);
            __m256i dot0[4], dot1[4], s0[4], s1[4]; /* s0, s1: int16 sums of two t's products */
            for (int z = 0; z < S; z++) dot0[z] = dot1[z] = s0[z] = s1[z] = _mm256_setzero_si256();
            __m256i b0[2], b1[2]; /* the block's 2-bit high parts, each half's loaded once */
            for (int e = 0; e < H; e++) {
                b0[e] = _mm256_loadu_si256((const __m256i *)(blk + 256 + 32 * (h0 + e)));
                b1[e] = _mm256_loadu_si256((const __m256i *)(blk + 320 + 32 * (h0 + e)));
            }
            for (int t = 0; t < 4; t++) {
                __m256i lo[2], hi[2];
                for (int e = 0; e < H; e++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * t + 32 * (h0 + e)));
                    lo[e] = _mm256_or_si256(_mm256_and_si256(v, nib), HI2_256(b0[e], t));
                    hi[e] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), nib), HI2_256(b1[e], t));
                }
                for (int z = 0; z < S; z++) {
                    const int8_t *xq = x->q + (size_t)(i0 + z % R) * x->k + b * SE_BLOCK;
                    int32_t a0, a1;
                    __builtin_memcpy(&a0, xq + 4 * t, 4);
                    __builtin_memcpy(&a1, xq + 16 + 4 * t, 4);
                    s0[z] = _mm256_add_epi16(s0[z], _mm256_maddubs_epi16(lo[z / R], _mm256_set1_epi32(a0)));
                    SE_PIN(s0[z]);
                    s1[z] = _mm256_add_epi16(s1[z], _mm256_maddubs_epi16(hi[z / R], _mm256_set1_epi32(a1)));
                    SE_PIN(s1[z]);
                }
                if (t % 2)
                    for (int z = 0; z < S; z++) {
                        dot0[z] = _mm256_add_epi32(dot0[z], _mm256_madd_epi16(s0[z], _mm256_set1_epi16(1)));
                        dot1[z] = _mm256_add_epi32(dot1[z], _mm256_madd_epi16(s1[z], _mm256_set1_epi16(1)));
                        s0[z] = s1[z] = _mm256_setzero_si256();
                    }
            }
            for (int e = 0; e < H; e++) {
                const uint8_t *sc = s + SE_Q6K_SC + 32 * j + 8 * (h0 + e);
                __m256i sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc));
                __m256i sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16)));
                for (int z = e * R; sb8 && z < (e + 1) * R; z++)
                    isb[z] = _mm256_add_epi32(isb[z], _mm256_add_epi32(_mm256_mullo_epi32(sc0, dot0[z]),
                                                                       _mm256_mullo_epi32(sc1, dot1[z])));
                for (int z = e * R; !sb8 && z < (e + 1) * R; z++) { /* a scale per block: offsets, scales a block */
                    size_t at = (size_t)(i0 + z % R) * x->nb + b;
                    int32_t xs = x->s[at], xh = x->h[at];
                    __m256i isum = _mm256_add_epi32(
                        _mm256_mullo_epi32(sc0, _mm256_sub_epi32(dot0[z], _mm256_set1_epi32(32 * xh))),
                        _mm256_mullo_epi32(sc1, _mm256_sub_epi32(dot1[z], _mm256_set1_epi32(32 * (xs - xh)))));
                    acc[z] = _mm256_fmadd_ps(_mm256_mul_ps(d[e], _mm256_set1_ps(x->d[at])), _mm256_cvtepi32_ps(isum),
                                             acc[z]);
                }
            }
        }
        if (!sb8) continue;
        /* the offset terms as pass512's: one vpmaddwd a block and row over the int16 pairs (sc_0, sc_1) and
         * (h, s - h), after the superblock's dots (the same integer as subtracting them block by block) */
        for (int e = 0; e < H; e++) {
            __m256i off[4];
            for (int z = e * R; z < (e + 1) * R; z++) off[z] = _mm256_setzero_si256();
            for (int j = 0; j < SE_SUPER; j++) {
                __m128i a = _mm_loadl_epi64((const __m128i *)(s + SE_Q6K_SC + 32 * j + 8 * (h0 + e)));
                __m128i c = _mm_loadl_epi64((const __m128i *)(s + SE_Q6K_SC + 32 * j + 16 + 8 * (h0 + e)));
                __m256i pairs = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, c));
                for (int z = e * R; z < (e + 1) * R; z++)
                    off[z] = _mm256_add_epi32(off[z], _mm256_madd_epi16(pairs, _mm256_set1_epi32(
                                                          se_half_pairs(x, i0 + z % R)[sb * SE_SUPER + j])));
            }
            for (int z = e * R; z < (e + 1) * R; z++) {
                isb[z] = _mm256_sub_epi32(isb[z], _mm256_slli_epi32(off[z], 5));
                float xd = x->d[(size_t)(i0 + z % R) * x->nb + sb * SE_SUPER];
                acc[z] = _mm256_fmadd_ps(_mm256_mul_ps(d[e], _mm256_set1_ps(xd)), _mm256_cvtepi32_ps(isb[z]), acc[z]);
            }
        }
    }
    for (int z = 0; z < S; z++)
        se_store8(out + (size_t)(i0 + z % R) * ldo + g * SE_GROUP + 8 * (h0 + z / R), acc[z],
                  lanes - 8 * (h0 + z / R));
}

#define ONE256(R, H) pass256(w, g, x, i0, R, out, ldo, lanes, h, H, sb8)

static inline SE_AVX2 INL void groups256(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0,
                                         int g1, const int sb8) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP;
        if (rows == 1) { /* both halves in one pass */
            int h = 0, i0 = 0;
            ONE256(1, 2);
            continue;
        }
        for (int h = 0; h < 2; h++)
            for (int i0 = 0, n; i0 < rows; i0 += n) {
                switch (n = se_pass_rows(rows, 4, i0)) {
                case 1: ONE256(1, 1); break;
                case 2: ONE256(2, 1); break;
                case 3: ONE256(3, 1); break;
                default: ONE256(4, 1); break;
                }
            }
    }
}

SE_AVX2 void se_mm_q6k_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    if (x->span > 1) groups256(w, x, rows, out, ldo, g0, g1, 1);
    else groups256(w, x, rows, out, ldo, g0, g1, 0);
}
#endif
