/* What vec.c, vec_avx2.c and vec_neon.c share: the exp polynomial's constants (se_expf's, step for step in
 * every ISA) and the scores calls' grouping of blocks and queries (vec.c). */
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

#endif
