/* What vec.c, vec_avx2.c, vec_rows.c and vec_neon.c share: the exp polynomial's constants (se_expf's, step for
 * step in every ISA), its 16-lane form, and the scores calls' grouping of blocks and queries (vec.c). */
#ifndef SE_VEC_COMMON_H
#define SE_VEC_COMMON_H

#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f
#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define MAGIC 12582912.0f

/* A scores call: groups of G blocks, then single ones, through the `group` kernel (always_inline), with NQ a constant
 * at each instance so its accumulators stay in registers. Expects K (moved to block b0), nb, hd, scale. */
#define SCORES_RUN(group, G, NQ, qs, os)                                                                            \
    do {                                                                                                            \
        int b = 0;                                                                                                  \
        for (; b + (G) <= nb; b += (G)) group(qs, NQ, G, K, b, hd, scale, os);                                      \
        for (; b < nb; b++) group(qs, NQ, 1, K, b, hd, scale, os);                                                  \
    } while (0)
/* up to 3 queries: groups of G blocks; more: even chunks of up to W queries (so a chunk's conversion of a key's
 * dims serves up to W fma), groups of G2 blocks. A query's chains are the same in every chunk and group. */
#define SCORES_BY_NQ(group, G, W, G2)                                                                               \
    do {                                                                                                            \
        if (nq <= 3) {                                                                                              \
            if (nq == 1) SCORES_RUN(group, G, 1, q, out);                                                           \
            else if (nq == 2) SCORES_RUN(group, G, 2, q, out);                                                      \
            else SCORES_RUN(group, G, 3, q, out);                                                                   \
            return;                                                                                                 \
        }                                                                                                           \
        int chunks = (nq + (W) - 1) / (W), size = (nq + chunks - 1) / chunks;                                       \
        size = size < (W) ? size : (W); /* already so; said so the compiler drops the cases above W */             \
        for (int j0 = 0; j0 < nq; j0 += size) {                                                                     \
            const float *const *qc = q + j0;                                                                        \
            float *const *oc = out + j0;                                                                            \
            switch (nq - j0 < size ? nq - j0 : size) {                                                              \
            case 1: SCORES_RUN(group, G2, 1, qc, oc); break;                                                        \
            case 2: SCORES_RUN(group, G2, 2, qc, oc); break;                                                        \
            case 3: SCORES_RUN(group, G2, 3, qc, oc); break;                                                        \
            case 4: SCORES_RUN(group, G2, 4, qc, oc); break;                                                        \
            case 5: SCORES_RUN(group, G2, 5, qc, oc); break;                                                        \
            case 6: SCORES_RUN(group, G2, 6, qc, oc); break;                                                        \
            case 7: SCORES_RUN(group, G2, 7, qc, oc); break;                                                        \
            default: SCORES_RUN(group, G2, 8, qc, oc); break;                                                       \
            }                                                                                                       \
        }                                                                                                           \
    } while (0)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* exp of 16 lanes, the polynomial of se_expf step for step (so a lane's bits are se_expf's) */
static inline __attribute__((target("avx512f,avx512dq,fma"), always_inline)) __m512 exp16(__m512 v) {
    __m512 c = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 m = _mm512_set1_ps(MAGIC);
    __m512 nn = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(c, _mm512_set1_ps(LOG2E)), m), m);
    __m512 r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LN2_HI), c);
    r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(P0), r, _mm512_set1_ps(P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(nn), _mm512_set1_epi32(127)), 23);
    __m512 out = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
    __mmask16 under = _mm512_cmp_ps_mask(v, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    return _mm512_mask_mov_ps(out, under, _mm512_setzero_ps());
}
#endif

#endif
