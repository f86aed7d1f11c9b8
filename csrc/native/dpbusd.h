/* acc += w (16 lanes of 4 unsigned bytes) . the 4 signed bytes at p, broadcast to every lane: one vpdpbusd with an
 * embedded broadcast ({1to16}). Written with the intrinsic and _mm512_set1_epi32, GCC broadcasts most activations
 * into a register first: one more vector instruction per dot product, which in a compute-bound pass (a prompt, a
 * 9-row verify) costs 10-27% of the kernel's rate (docs/native.md). The sum is the same instruction's. */
#ifndef SE_DPBUSD_H
#define SE_DPBUSD_H
#include <immintrin.h>
#include <stdint.h>

static inline __attribute__((target("avx512f,avx512vnni"), always_inline)) __m512i
se_dpbusd_bcast(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
}

/* acc += w (16 lanes of 2 int16) . the int16 pair at p, broadcast: one vpdpwssd with an embedded broadcast */
static inline __attribute__((target("avx512f,avx512vnni"), always_inline)) __m512i
se_dpwssd_bcast(__m512i acc, __m512i w, const int32_t *p) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
}
#endif
