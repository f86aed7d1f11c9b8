/* Q4_K and Q5_K matmul, the x86 ISAs in one file so the mirrored operation order is read side by side (NEON's is
 * mm_q4k_neon.c). Q5_K is Q4_K with a fifth bit ORed into each weight from its sub-block's masks (u 0..31: no dot
 * overflows). A superblock holds 8 Q4-layout sub-blocks of 32 (se.h); sub-block j's scale d * sc_j is an exact fp32
 * product. The activations share one scale xd per superblock (se_act.span 8, act.c: llama.cpp's q8_K), so it is
 * folded in once per superblock, as is the min term, an exact integer sum over the sub-blocks:
 *     a = 0;  a = fma(d * sc_j, (float)dot_j, a)  for j = 0..7;      mi = sum_j m_j * xs_j   (int32, < 2^21)
 *     a = fma(-dmin, (float)mi, a);  acc = fma(xd, a, acc)
 * superblock after superblock, dot_j the exact integer sum of q * x over sub-block j (q 0..15), xs_j the sum of its
 * activations. Per sub-block and row that leaves a conversion and an FMA beside the integer dots (the scale's product
 * with a per-32 activation scale and the min's FMA had been two more: 21% of a 9-row Qwen2.5-Coder forward). The
 * SIMD paths compute the scales and the mins' int16 pairs once per superblock for all 16 lanes and reuse them for
 * every activation row. */
#include <math.h>

#include "se.h"

static inline const uint8_t *superblock(const se_mat *w, int g, int sb) {
    return w->data + (size_t)g * w->group_bytes + (size_t)sb * w->block_bytes;
}

static inline const uint8_t *sub_block(const se_mat *w, const uint8_t *s, int j) {
    return s + SE_Q4K_HEAD + (size_t)(w->kern == SE_KERN_Q5K ? SE_Q5K_SUB : 256) * j;
}

void se_mm_q4k_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP < SE_GROUP ? w->n - g * SE_GROUP : SE_GROUP;
        for (int i = 0; i < rows; i++) {
            const int8_t *xq = x->q + (size_t)i * x->k;
            const float *xd = x->d + (size_t)i * x->nb;
            const int32_t *xs = x->s + (size_t)i * x->nb;
            const float *xm = x->m + (size_t)i * x->nb;
            for (int r = 0; r < lanes; r++) {
                float acc = 0.0f;
                for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
                    const uint8_t *s = superblock(w, g, sb);
                    float d = se_f16_to_f32(((const uint16_t *)s)[r]);
                    float dmin = se_f16_to_f32(((const uint16_t *)(s + 32))[r]);
                    float a = 0.0f;
                    int32_t mi = 0;
                    for (int j = 0; j < SE_SUPER; j++) {
                        int b = sb * SE_SUPER + j;
                        int32_t dot = 0;
                        for (int e = 0; e < SE_BLOCK; e++)
                            dot += se_unpacked(w->kern, sub_block(w, s, j), r, e) * xq[b * SE_BLOCK + e];
                        float scale = d * (float)s[64 + 16 * j + r];
                        if (x->span == 1) { /* a scale per block: both terms every block, in order */
                            acc = fmaf(scale * xd[b], (float)dot, acc);
                            acc = fmaf(-(dmin * (float)s[192 + 16 * j + r]), xm[b], acc);
                            continue;
                        }
                        a = fmaf(scale, (float)dot, a);
                        mi += (int32_t)s[192 + 16 * j + r] * xs[b];
                    }
                    if (x->span == 1) continue;
                    a = fmaf(-dmin, (float)mi, a);
                    acc = fmaf(xd[sb * SE_SUPER], a, acc);
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

#define SE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define PASS512 9 /* activation rows per pass: 2 * 9 accumulators (a, dot) + the weights' registers fit the 32 zmm
                     * (10 spilled to the stack, and 12 ran a 9-row Qwen forward 27% slower) */
#define PF 2048     /* ahead into L1 */
#define PF_L2 12288 /* ahead into L2 (the prototype's second level: PERF_FACTS.md) */
#define INL __attribute__((always_inline))
#define PASS256 5 /* AVX2 rows per pass (4: a 5-row Qwen2.5-Coder-1.5B forward 7% slower, two passes a half) */

static inline INL void prefetch_sub(const se_mat *w, const uint8_t *s, int j) { /* an eighth per sub-block */
    int lines = (int)(w->block_bytes / 8 / 64) + 1;
    for (int off = j * lines * 64; off < (j + 1) * lines * 64; off += 64) {
        _mm_prefetch((const char *)s + PF + off, _MM_HINT_T0);
        _mm_prefetch((const char *)s + PF_L2 + off, _MM_HINT_T1);
    }
}

/* Q5_K: bit 4 of the weights of vector t (one bit per byte, se.h), as a byte mask (AVX-512) or 0x10 bytes (AVX2) */
static inline INL __mmask64 high_mask(const uint8_t *blk, int t) {
    uint64_t m;
    __builtin_memcpy(&m, blk + 256 + 8 * t, 8);
    return (__mmask64)m;
}

static inline SE_AVX2 INL __m256i high_bytes(const uint8_t *blk, int t, int h) {
    uint32_t m;
    __builtin_memcpy(&m, blk + 256 + 8 * t + 4 * h, 4);
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                         3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), idx);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
}

/* Lanes' min pairs (m_2p, m_2p+1) of a superblock as int16 pairs (the 32-bit lane r: lane r's two); a row's
 * activation sums (xs_2p, xs_2p+1) are one int16 pair (|xs| <= 32 * 127, se_act.p): one vpdpwssd adds both. */
static inline SE_AVX512 INL __m512i min_pairs512(const uint8_t *s, int p) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + 192 + 32 * p));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + 192 + 32 * p + 16));
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
}

/* q5, sb8 (the activations' span is 8) and R are constants at every call (the switch below): no test of the format
 * inside the loop. With a scale per block (sb8 0) a holds the row's whole sum, both terms added every block. */
static inline SE_AVX512 INL void pass512(const se_mat *w, int g, const se_act *x, int i0, const int R, float *out,
                                          int ldo, int lanes, const int q5, const int sb8) {
    const __m512i nib = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    /* the rows' sums in L1, touched once per superblock: the registers hold each row's a and dot */
    float acc[PASS512][SE_GROUP] __attribute__((aligned(64)));
    const int8_t *xq[PASS512]; /* each row's activations, found once per pass (not per block: fewer integer steps) */
    const float *xd[PASS512];
    const int32_t *xp[PASS512];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < R; i++) {
        _mm512_store_ps(acc[i], _mm512_setzero_ps());
        xq[i] = x->q + (size_t)(i0 + i) * x->k;
        xd[i] = x->d + (size_t)(i0 + i) * x->nb;
        xp[i] = se_sum_pairs(x, i0 + i);
    }
    __m512 a[PASS512]; /* with dot[], 2 R registers: d and dmin are loaded where they are used, not held */
    _Pragma("GCC unroll 16")
    for (int i = 0; i < R; i++) a[i] = _mm512_setzero_ps();
    for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
        const uint8_t *s = superblock(w, g, sb);
        if (sb8 && sb > 0) {
            _Pragma("GCC unroll 16")
            for (int i = 0; i < R; i++) a[i] = _mm512_setzero_ps();
        }
        for (int j = 0; j < SE_SUPER; j++) {
            int b = sb * SE_SUPER + j;
            const uint8_t *blk = sub_block(w, s, j);
            prefetch_sub(w, s, j);
            __m512i dot[PASS512];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < R; i++) dot[i] = _mm512_setzero_si512();
            _Pragma("GCC unroll 16")
            for (int t = 0; t < 4; t++) {
                __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * t));
                __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                if (q5) {
                    lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(high_mask(blk, t), bit4));
                    hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(high_mask(blk, 4 + t), bit4));
                }
                _Pragma("GCC unroll 16")
                for (int i = 0; i < R; i++) {
                    dot[i] = se_dpbusd_bcast(dot[i], lo, xq[i] + b * SE_BLOCK + 4 * t);
                    dot[i] = se_dpbusd_bcast(dot[i], hi, xq[i] + b * SE_BLOCK + 16 + 4 * t);
                }
            }
            __m512 scale = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)),
                                         _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                             _mm_loadu_si128((const __m128i *)(s + 64 + 16 * j)))));
            if (!sb8) {
                __m512 min = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32))),
                                           _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                               _mm_loadu_si128((const __m128i *)(s + 192 + 16 * j)))));
                _Pragma("GCC unroll 16")
                for (int i = 0; i < R; i++) {
                    const float *xm = x->m + (size_t)(i0 + i) * x->nb;
                    a[i] = _mm512_fmadd_ps(_mm512_mul_ps(scale, _mm512_set1_ps(xd[i][b])), _mm512_cvtepi32_ps(dot[i]),
                                           a[i]);
                    a[i] = _mm512_fnmadd_ps(min, _mm512_set1_ps(xm[b]), a[i]);
                }
                continue;
            }
            _Pragma("GCC unroll 16")
            for (int i = 0; i < R; i++) a[i] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot[i]), a[i]);
        }
        if (!sb8) continue;
        __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32)));
        __m512i mp[4];
        _Pragma("GCC unroll 16")
        for (int p = 0; p < 4; p++) mp[p] = min_pairs512(s, p);
        _Pragma("GCC unroll 16")
        for (int i = 0; i < R; i++) {
            __m512i mi = _mm512_setzero_si512();
            _Pragma("GCC unroll 16")
            for (int p = 0; p < 4; p++)
                mi = se_dpwssd_bcast(mi, mp[p], xp[i] + sb * SE_SUPER / 2 + p);
            __m512 v = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(mi), a[i]);
            _mm512_store_ps(acc[i], _mm512_fmadd_ps(_mm512_set1_ps(xd[i][sb * SE_SUPER]), v, _mm512_load_ps(acc[i])));
        }
    }
    __mmask16 mask = lanes >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << lanes) - 1);
    _Pragma("GCC unroll 16")
    for (int i = 0; i < R; i++)
        _mm512_mask_storeu_ps(out + (size_t)(i0 + i) * ldo + g * SE_GROUP, mask, sb8 ? _mm512_load_ps(acc[i]) : a[i]);
}

#define PASS_CASE(n, q5, sb8) \
    case n: pass512(w, g, x, i0, n, out, ldo, lanes, q5, sb8); break;
#define PASSES(q5, sb8)                                                                                          \
    switch (n = se_pass_rows(rows, PASS512, i0)) { /* constant row counts: accumulators in registers */        \
        PASS_CASE(1, q5, sb8) PASS_CASE(2, q5, sb8) PASS_CASE(3, q5, sb8) PASS_CASE(4, q5, sb8)                 \
        PASS_CASE(5, q5, sb8) PASS_CASE(6, q5, sb8) PASS_CASE(7, q5, sb8) PASS_CASE(8, q5, sb8)                 \
        default: pass512(w, g, x, i0, PASS512, out, ldo, lanes, q5, sb8); break;                                 \
    }

SE_AVX512 void se_mm_q4k_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP;
        for (int i0 = 0, n; i0 < rows; i0 += n) {
            if (w->kern == SE_KERN_Q5K && x->span > 1) PASSES(1, 1)
            else if (w->kern == SE_KERN_Q5K) PASSES(1, 0)
            else if (x->span > 1) PASSES(0, 1)
            else PASSES(0, 0)
        }
    }
}

/* AVX2: 8-lane halves of the group; u8 x s8 dots as vpmaddubsw, whose int16 pair sums a block keeps and widens once
 * with vpmaddwd (Q4_K: 8 of at most 2 * 15 * 127, 30480 < 2^15; Q5_K: twice, 4 of at most 2 * 31 * 127), the same
 * exact integer as widening each; SE_PIN (se.h) keeps each row's running sum in a register. A pass runs R rows times
 * H halves from half h0, slot z = (half h0 + z / R, row z % R): with H = 2 (1-2 rows) each superblock is walked once
 * and its prefetches run without a pause, as in mm_avx2.c. */

static inline SE_AVX2 INL void pass256(const se_mat *w, int g, const se_act *x, int i0, const int R, float *out,
                                       int ldo, int lanes, int h0, const int H, const int q5) {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const int S = R * H;
    __m256 acc[PASS256];
    for (int z = 0; z < S; z++) acc[z] = _mm256_setzero_ps();
    for (int sb = 0; sb < w->nb / SE_SUPER; sb++) {
        const uint8_t *s = superblock(w, g, sb);
        __m256 d[2], a[PASS256];
        for (int e = 0; e < H; e++) d[e] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 * (h0 + e))));
        for (int z = 0; z < S; z++) a[z] = _mm256_setzero_ps();
        for (int j = 0; j < SE_SUPER; j++) {
            int b = sb * SE_SUPER + j;
            const uint8_t *blk = sub_block(w, s, j);
            if (h0 == 0) prefetch_sub(w, s, j);
            __m256i dot[PASS256], sum16[PASS256];
            for (int z = 0; z < S; z++) dot[z] = sum16[z] = _mm256_setzero_si256();
            for (int t = 0; t < 4; t++) {
                __m256i lo[2], hi[2];
                for (int e = 0; e < H; e++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * t + 32 * (h0 + e)));
                    lo[e] = _mm256_and_si256(v, nib), hi[e] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    if (q5) {
                        lo[e] = _mm256_or_si256(lo[e], high_bytes(blk, t, h0 + e));
                        hi[e] = _mm256_or_si256(hi[e], high_bytes(blk, 4 + t, h0 + e));
                    }
                }
                for (int z = 0; z < S; z++) {
                    const int8_t *xq = x->q + (size_t)(i0 + z % R) * x->k + b * SE_BLOCK;
                    int32_t a0, a1;
                    __builtin_memcpy(&a0, xq + 4 * t, 4);
                    __builtin_memcpy(&a1, xq + 16 + 4 * t, 4);
                    sum16[z] = _mm256_add_epi16(sum16[z], _mm256_maddubs_epi16(lo[z / R], _mm256_set1_epi32(a0)));
                    SE_PIN(sum16[z]);
                    sum16[z] = _mm256_add_epi16(sum16[z], _mm256_maddubs_epi16(hi[z / R], _mm256_set1_epi32(a1)));
                    SE_PIN(sum16[z]);
                }
                if (t == 3 || (q5 && t == 1))
                    for (int z = 0; z < S; z++) {
                        dot[z] = _mm256_add_epi32(dot[z], _mm256_madd_epi16(sum16[z], _mm256_set1_epi16(1)));
                        sum16[z] = _mm256_setzero_si256();
                    }
            }
            __m256 scale[2];
            for (int e = 0; e < H; e++) {
                __m128i sc = _mm_loadl_epi64((const __m128i *)(s + 64 + 16 * j + 8 * (h0 + e)));
                scale[e] = _mm256_mul_ps(d[e], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
            }
            if (x->span == 1) { /* a scale per block: pass512's sb8 0 */
                __m256 min[2];
                for (int e = 0; e < H; e++)
                    min[e] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32 + 16 * (h0 + e)))),
                                           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                               (const __m128i *)(s + 192 + 16 * j + 8 * (h0 + e))))));
                for (int z = 0; z < S; z++) {
                    size_t at = (size_t)(i0 + z % R) * x->nb + b;
                    acc[z] = _mm256_fmadd_ps(_mm256_mul_ps(scale[z / R], _mm256_set1_ps(x->d[at])),
                                             _mm256_cvtepi32_ps(dot[z]), acc[z]);
                    acc[z] = _mm256_fnmadd_ps(min[z / R], _mm256_set1_ps(x->m[at]), acc[z]);
                }
                continue;
            }
            for (int z = 0; z < S; z++) a[z] = _mm256_fmadd_ps(scale[z / R], _mm256_cvtepi32_ps(dot[z]), a[z]);
        }
        if (x->span == 1) continue;
        for (int e = 0; e < H; e++) {
            __m256i mp[4]; /* min_pairs512's pairs for the half's lanes */
            for (int p = 0; p < 4; p++) {
                const uint8_t *at = s + 192 + 32 * p + 8 * (h0 + e);
                mp[p] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)at),
                                                               _mm_loadl_epi64((const __m128i *)(at + 16))));
            }
            __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32 + 16 * (h0 + e))));
            for (int z = e * R; z < (e + 1) * R; z++) {
                const int32_t *xp = se_sum_pairs(x, i0 + z % R) + sb * SE_SUPER / 2;
                __m256i mi = _mm256_setzero_si256();
                for (int p = 0; p < 4; p++)
                    mi = _mm256_add_epi32(mi, _mm256_madd_epi16(mp[p], _mm256_set1_epi32(xp[p])));
                __m256 v = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(mi), a[z]);
                acc[z] = _mm256_fmadd_ps(_mm256_set1_ps(x->d[(size_t)(i0 + z % R) * x->nb + sb * SE_SUPER]), v, acc[z]);
            }
        }
    }
    for (int z = 0; z < S; z++)
        se_store8(out + (size_t)(i0 + z % R) * ldo + g * SE_GROUP + 8 * (h0 + z / R), acc[z],
                  lanes - 8 * (h0 + z / R));
}

#define ONE256(R, H, q5) pass256(w, g, x, i0, R, out, ldo, lanes, h, H, q5)
#define BY_KERN(R, H) (w->kern == SE_KERN_Q5K ? ONE256(R, H, 1) : ONE256(R, H, 0))

SE_AVX2 void se_mm_q4k_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        int lanes = w->n - g * SE_GROUP;
        if (rows <= 2) { /* both halves in one pass (a pass a half: T(2) +9% on Qwen2.5-Coder-1.5B) */
            int h = 0, i0 = 0;
            if (rows == 1) BY_KERN(1, 2);
            else BY_KERN(2, 2);
            continue;
        }
        for (int h = 0; h < 2; h++)
            for (int i0 = 0, n; i0 < rows; i0 += n) {
                switch (n = se_pass_rows(rows, PASS256, i0)) {
                case 1: BY_KERN(1, 1); break;
                case 2: BY_KERN(2, 1); break;
                case 3: BY_KERN(3, 1); break;
                case 4: BY_KERN(4, 1); break;
                default: BY_KERN(PASS256, 1); break;
                }
            }
    }
}
#endif
