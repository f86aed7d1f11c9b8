/* What the AVX2 kernel files share (x86 only): the target attribute and a half group's store. */
#ifndef SE_AVX2_H
#define SE_AVX2_H

#include <immintrin.h>

#define SE_AVX2 __attribute__((target("avx2,fma,f16c")))

/* the `valid` first of 8 output lanes (a group's last rows: fewer than 8, or none) */
static inline SE_AVX2 __attribute__((always_inline)) void se_store8(float *dst, __m256 v, int valid) {
    if (valid >= 8) {
        _mm256_storeu_ps(dst, v);
    } else if (valid > 0) {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        for (int r = 0; r < valid; r++) dst[r] = tmp[r];
    }
}
#endif
