/* specedge native engine: the C side. Python (runtime/backends/native.py) owns orchestration, validation and every
 * buffer that outlives a call; C owns the packed weights, the thread pool and the forward.
 *
 * Invariant kept everywhere (docs/native.md): a row's arithmetic never depends on how many rows share the call, on
 * which thread computes it, or on which instruction set runs it. The integer dot products are exact; every float
 * operation happens in one fixed order, written once in the portable C and mirrored lane for lane by the SIMD
 * paths. So logits are bitwise identical across batch widths, thread counts and ISAs. */
#ifndef SE_H
#define SE_H
#include <stddef.h>
#include <stdint.h>

#define SE_GROUP 16     /* output rows interleaved per group: one 32-bit lane each in a zmm */
#define SE_BLOCK 32     /* weights per quantization block along K */
#define SE_MAX_ROWS 16  /* activation rows one kernel pass takes at most (callers loop) */

/* GGML type ids of the formats the engine packs (the GGUF's own numbering). */
enum { SE_F32 = 0, SE_F16 = 1, SE_Q4_0 = 2, SE_Q4_1 = 3, SE_Q8_0 = 8, SE_Q4_K = 12, SE_Q6_K = 14 };

/* Kernel families: how a 32-weight block's integers are stored in the packed form. */
enum { SE_KERN_Q4 = 0, SE_KERN_Q8 = 1 };

/* Instruction sets, best last. */
enum { SE_ISA_PORTABLE = 0, SE_ISA_AVX2 = 1, SE_ISA_AVX512 = 2 };

/* A weight matrix [n, k] (out x in) repacked: groups of 16 output rows, each group's 32-wide blocks contiguous.
 * Block layout (Q4): 4 x 64 bytes of nibbles, vector t byte (r*4 + i) = w[r][4t+i] | w[r][16+4t+i] << 4;
 *                    then 16 fp16 scales d; then (has_min) 16 fp16 mins m.
 * Block layout (Q8): 8 x 64 bytes, vector j byte (r*4 + i) = w[r][4j+i] + 128 (unsigned); then 16 fp16 scales d.
 * A weight's value: d * (u - offset) + (has_min ? m : 0), exactly the GGUF block's dequantized value. */
typedef struct {
    int kern;        /* SE_KERN_Q4 | SE_KERN_Q8 */
    int has_min;     /* per-block float min (Q4_1, Q4_K) */
    int offset;      /* integer subtracted from every stored integer (8: Q4_0, 128: Q8_0, 0: Q4_1) */
    int n, k, nb, ngroups;
    size_t block_bytes, group_bytes;
    uint8_t *data;   /* 64-byte aligned, ngroups * group_bytes */
} se_mat;

/* Activations quantized per 32: q int8 [rows, k], d float [rows, k/32], s int32 [rows, k/32] (sum of each block's q). */
typedef struct {
    int8_t *q;
    float *d;
    int32_t *s;
    int k, nb;
} se_act;

typedef void (*se_mm_fn)(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);

/* cpu.c */
int se_cpu_isa(void);               /* the best ISA this CPU and build support */
int se_isa(void);                   /* the ISA in use */
int se_set_isa(int isa);            /* force one (tests); returns the ISA now in use (never above the CPU's) */
se_mm_fn se_mm_for(const se_mat *w);

/* pack.c */
int se_pack(se_mat *m, int type, const uint8_t *raw, size_t row_bytes, int n, int k);
void se_mat_free(se_mat *m);
void se_dequant_row(const se_mat *m, int row, float *out);  /* exact values of one row */
size_t se_type_row_bytes(int type, int k);                   /* 0: unsupported type or k */

/* act.c */
void se_quantize_rows(const float *x, int rows, int ldx, se_act *a);
void se_quantize_block(const float *x, int8_t *q, float *d, int32_t *s);

/* mm_*.c */
void se_mm_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);

/* fp16 <-> fp32, exact (f32 -> f16 rounds to nearest even) */
float se_f16_to_f32(uint16_t h);
uint16_t se_f32_to_f16(float f);

/* vec.c: the float primitives attention and norms share, one fixed order, three ISAs */
typedef struct {
    float (*dot_f16)(const float *q, const uint16_t *k, int n);             /* n % 16 == 0 */
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int n);         /* y += a * x, n % 16 == 0 */
    void (*exp_inplace)(float *x, int n);                                    /* x = exp(x) */
    void (*to_f16)(const float *x, uint16_t *y, int n);                      /* round to nearest even */
} se_vec_ops;
const se_vec_ops *se_vec(void);
float se_expf(float x);  /* the engine's exp: the same polynomial in every ISA */
#endif
