/* Which instruction set runs the kernels: the best the CPU and compiler support, or one forced for tests. */
#include "se.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SE_X86 1
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define SE_ARM 1
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif
#endif

/* The NEON float primitives need only base AArch64; its matmul needs the ARMv8.2 dot product (sdot), without
 * which the NEON ISA runs the portable matmul. Every Apple arm64 CPU has it. */
int se_cpu_dotprod(void) {
#if defined(SE_ARM) && defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(SE_ARM) && defined(__APPLE__)
    return 1;
#else
    return 0;
#endif
}

int se_cpu_isa(void) {
#ifdef SE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return SE_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return SE_ISA_AVX2;
#endif
#ifdef SE_ARM
    return SE_ISA_NEON;
#endif
    return SE_ISA_PORTABLE;
}

static int g_isa = -1;

int se_isa(void) {
    if (g_isa < 0) g_isa = se_cpu_isa();
    return g_isa;
}

/* x86: portable, AVX2, AVX-512 up to the CPU's best; AArch64: portable or NEON. Anything else: the best. */
int se_set_isa(int isa) {
    int best = se_cpu_isa();
    int ok = isa == SE_ISA_PORTABLE || isa == best || (best != SE_ISA_NEON && isa > 0 && isa < best);
    g_isa = ok ? isa : best;
    return g_isa;
}

se_mm_fn se_mm_for(const se_mat *w) {
    int isa = se_isa();
#ifdef SE_X86
    if (se_is_float(w->kern)) return isa == SE_ISA_AVX512 ? se_mm_f_avx512 : isa == SE_ISA_AVX2 ? se_mm_f_avx2
                                                                                : se_mm_f_portable;
    if (isa == SE_ISA_AVX512)
        return w->kern == SE_KERN_Q4K || w->kern == SE_KERN_Q5K ? se_mm_q4k_avx512 : w->kern == SE_KERN_Q6K ? se_mm_q6k_avx512 : se_mm_avx512;
    if (isa == SE_ISA_AVX2)
        return w->kern == SE_KERN_Q4K || w->kern == SE_KERN_Q5K ? se_mm_q4k_avx2 : w->kern == SE_KERN_Q6K ? se_mm_q6k_avx2 : se_mm_avx2;
#endif
#ifdef SE_ARM
    if (isa == SE_ISA_NEON && se_is_float(w->kern)) return se_mm_f_neon;
    if (isa == SE_ISA_NEON && se_cpu_dotprod()) {
        if (w->kern == SE_KERN_Q4 || w->kern == SE_KERN_Q5 || w->kern == SE_KERN_Q8) return se_mm_neon;
        if (w->kern == SE_KERN_Q4K || w->kern == SE_KERN_Q5K) return se_mm_q4k_neon;
        if (w->kern == SE_KERN_Q6K) return se_mm_q6k_neon;
    }
#endif
    (void)isa;
    if (se_is_float(w->kern)) return se_mm_f_portable;
    return w->kern == SE_KERN_Q4K || w->kern == SE_KERN_Q5K ? se_mm_q4k_portable : w->kern == SE_KERN_Q6K ? se_mm_q6k_portable : se_mm_portable;
}

/* IEEE half <-> single, bit exact (no F16C dependency: the portable path must run anywhere). */
float se_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t se_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (uint16_t)half;
}
