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
#define SE_QUERIES 16   /* queries one attention call takes: (row, head) pairs of one KV head, sharing its keys */
#define SE_KBLOCK 16    /* keys per K-cache block: a block is dims-major, key t of dim d at [d * SE_KBLOCK + t] */
#define SE_MAX_HD 512   /* the widest attention head */

/* GGML type ids of the formats the engine packs (the GGUF's own numbering). */
enum { SE_F32 = 0, SE_F16 = 1, SE_Q4_0 = 2, SE_Q4_1 = 3, SE_Q5_0 = 6, SE_Q8_0 = 8, SE_Q4_K = 12, SE_Q5_K = 13,
       SE_Q6_K = 14, SE_BF16 = 30 };

/* Kernel families: how a block's integers are stored in the packed form. Q4, Q5, Q8 pack 32-wide blocks; Q4K and
 * Q6K pack 256-wide superblocks of 8 such blocks (SE_SUPER), their scales in a per-superblock header. */
enum { SE_KERN_Q4 = 0, SE_KERN_Q8 = 1, SE_KERN_Q5 = 2, SE_KERN_Q4K = 3, SE_KERN_Q6K = 4, SE_KERN_Q5K = 5,
       SE_KERN_F32 = 6, SE_KERN_F16 = 7, SE_KERN_BF16 = 8 };
static inline int se_is_float(int kern) { return kern >= SE_KERN_F32; }
static inline int se_is_kquant(int kern) { return kern == SE_KERN_Q4K || kern == SE_KERN_Q5K || kern == SE_KERN_Q6K; }
#define SE_SUPER 8      /* 32-blocks per K-quant superblock */

/* Instruction sets. On x86 the choices are portable < AVX2 < AVX-512 (best last); on AArch64 portable and NEON. */
enum { SE_ISA_PORTABLE = 0, SE_ISA_AVX2 = 1, SE_ISA_AVX512 = 2, SE_ISA_NEON = 3 };

/* AArch64 kernels using sdot (ARMv8.2 dot product), compiled for it whatever the build's baseline (cpu.c checks the
 * CPU before choosing them). Apple's arm64 baseline already has it; clang spells the feature without arch=
 * (untested here: CI cross-compiles with GCC). */
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#define SE_DOTPROD
#elif defined(__aarch64__) && defined(__clang__)
#define SE_DOTPROD __attribute__((target("dotprod")))
#elif defined(__aarch64__)
#define SE_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

/* A weight matrix [n, k] (out x in) repacked: groups of 16 output rows, each group's blocks contiguous. Lane r of a
 * 64-byte vector is bytes r*4 .. r*4+3: four consecutive weights of row r (vpdpbusd's shape).
 * Q4 (Q4_0, Q4_1), 32 wide: 4 x 64 bytes of nibbles, vector t byte (r*4 + i) = w[r][4t+i] | w[r][16+4t+i] << 4;
 *    then 16 fp16 scales d; then (has_min) 16 fp16 mins m.
 * Q5 (Q5_0), 32 wide: Q4's nibbles; then 8 x 64-bit masks, bit (r*4 + i) of mask j = bit 4 of w[r][4j+i]; then 16
 *    fp16 d (352 bytes: Q5_0's 22 per row).
 * Q8 (Q8_0), 32 wide: 8 x 64 bytes, vector j byte (r*4 + i) = w[r][4j+i] + 128 (unsigned); then 16 fp16 scales d.
 * A weight's value: d * (u - offset) + (has_min ? m : 0), exactly the GGUF block's dequantized value.
 * Q4K (Q4_K), 256 wide: 16 fp16 d, 16 fp16 dmin, u8 sc[8][16], u8 m[8][16] (sub-block j, lane r: the 6-bit ints),
 *    then 8 Q4-layout nibble blocks (2368 bytes: 148 per row, Q4_K's 144 plus the unpacked 6-bit ints).
 *    w = (d * sc_j) * u - dmin * m_j (both products exact in fp32).
 * Q5K (Q5_K), 256 wide: Q4K's header, then 8 Q5-layout blocks of 320 bytes (Q4 nibbles, then the 8 x 64-bit masks
 *    of bit 4) (2880 bytes: 180 per row, Q5_K's 176 plus the unpacked 6-bit ints). The same w, u 0..31.
 * Q6K (Q6_K), 256 wide: 8 blocks of 384 bytes (Q4-layout nibbles of the low 4 bits, then 2 x 64 bytes: vector p byte
 *    (r*4 + i) bits 2c..2c+1 = bits 4-5 of w[r][4j+i] with j = 4p + c); then int8 sc[16][16] (per 16 weights, lane
 *    r), then 16 fp16 d (3360 bytes: Q6_K's 210 per row). w = (d * sc) * (u - 32), exact in fp32.
 * F32, F16, BF16, 32 wide: 32 vectors of the 16 rows' elements as stored (element (t, r) at t * 16 + r); these
 *    multiply the float activations (se_act.f), not the int8 ones (mm_f.c). */
typedef struct {
    int kern;        /* SE_KERN_* */
    int has_min;     /* per-block float min (Q4_1, Q4_K) */
    int offset;      /* integer subtracted from every stored integer (8: Q4_0, 16: Q5_0, 32: Q6_K, 128: Q8_0) */
    int n, k, nb, ngroups;   /* nb: 32-wide blocks per row */
    size_t block_bytes, group_bytes;  /* block: 32 wide, or a 256-wide superblock (K kernels) */
    uint8_t *data;   /* 64-byte aligned, ngroups * group_bytes */
} se_mat;

/* Activations quantized per 32: q int8 [rows, k], d float [rows, k/32] (the same for each run of `span` blocks: 8 where
 * a K-quant matrix reads them, act.c), s int32 [rows, k/32] (sum of each block's q),
 * h int32 [rows, k/32] (sum of its first 16 q: Q6_K's scale changes every 16 weights; the second half's is s - h),
 * m float [rows, k/32] = d * (float)s, the min term's factor (Q4_1, Q4_K, Q5_K): formed once per block here, not
 * once per block in every output group of every matrix that reads it. */
typedef struct {
    int8_t *q;
    float *d;
    int32_t *s, *h;
    int k, nb;
    float *f;        /* the float rows the quantization started from (float-weight matrices read these), or NULL */
    float *m;
    int span;        /* blocks per scale: 1, or 8 (K-quant kernels need it: they read d once per superblock) */
    int32_t *p;      /* span 8: int16 pairs of the sums, [rows, 3 k/64] (se_sum_pairs, se_half_pairs) */
} se_act;

typedef void (*se_mm_fn)(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);

/* cpu.c */
int se_cpu_isa(void);               /* the best ISA this CPU and build support */
int se_isa(void);                   /* the ISA in use */
int se_set_isa(int isa);            /* force one (tests); returns the ISA now in use (one this CPU runs, else
                                       the best) */
int se_cpu_dotprod(void);           /* AArch64: the CPU has the ARMv8.2 dot product (se_mm_neon needs it) */
se_mm_fn se_mm_for(const se_mat *w);  /* the kernel for w's family under the ISA in use */

/* pack.c */
int se_pack(se_mat *m, int type, const uint8_t *raw, size_t row_bytes, int n, int k);
void se_mat_free(se_mat *m);
void se_dequant_row(const se_mat *m, int row, float *out);  /* exact values of one row */
size_t se_type_row_bytes(int type, int k);                   /* 0: unsupported type or k */
/* pack_k.c: the K-quant superblocks (Q4_K, Q5_K, Q6_K) */
void se_pack_superblock(int type, const uint8_t *src, uint8_t *dst, int r);
void se_dequant_superblock(const se_mat *m, const uint8_t *sb, int r, float *out);

/* act.c */
void se_quantize_rows(const float *x, int rows, int ldx, se_act *a);
int se_act_quantized(const float *x, int rows, int k, int span, se_act *a);
void se_act_free(se_act *a);
float se_amax(const float *x, int n);  /* max |x| */
void se_act_pairs(se_act *a, int row, int b0, int nblocks); /* a->p of blocks b0 .. (even b0, nblocks) */
/* A row's int16 pairs (|s| <= 32 * 127): s[2i] | s[2i+1] << 16 for the Q4_K kernels' min term, then h[b] | (s[b] -
 * h[b]) << 16 for Q6_K's offset term; one vpdpwssd adds both products of a pair */
static inline const int32_t *se_sum_pairs(const se_act *x, int row) { return x->p + (size_t)row * (3 * x->nb / 2); }
static inline const int32_t *se_half_pairs(const se_act *x, int row) { return se_sum_pairs(x, row) + x->nb / 2; }
/* one block at the scale amax / 127 (amax: its run's se_amax); nblocks in runs of span sharing one scale */
void se_quantize_scaled(const float *x, float amax, int8_t *q, float *d, int32_t *s, int32_t *h, float *m);
void se_quantize_blocks(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h, float *m);
/* the default span of a matrix's activations: 8 for the K-quant kernels (which also take 1), else 1 */
static inline int se_span_for(const se_mat *w) { return se_is_kquant(w->kern) ? 8 : 1; }

/* mm_*.c */
void se_mm_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q4k_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q4k_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q4k_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q4k_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q6k_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q6k_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q6k_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_q6k_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_f_portable(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_f_avx2(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_f_avx512(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
void se_mm_f_neon(const se_mat *w, const se_act *x, int rows, float *out, int ldo, int g0, int g1);
float se_f_weight(const se_mat *w, const uint8_t *blk, int t, int r);  /* element t of lane r, exactly */

/* A SIMD register's running sum kept in its register and in program order: an empty asm with it as an in-out
 * operand. Without it GCC scheduled every row's products of an AVX2 block first and summed them as a tree, spilling
 * them and the float accumulators to the stack (SmolLM2-135M on that path: T(5) -14%, T(9) -15% with it). The
 * integer sums are the same either way. */
#define SE_PIN(v) __asm__("" : "+x"(v))

/* The size of the pass of at most `most` rows that starts at row i0, a call's rows split into the fewest passes of
 * sizes differing by at most one (64 rows at most 9: 8 of 8, not 7 of 9 and a row alone, whose pass unpacks the
 * weights for one row). A row's arithmetic never depends on its pass. */
static inline int se_pass_rows(int rows, int most, int i0) {
    int passes = (rows + most - 1) / most, base = rows / passes, extra = rows % passes;
    return i0 < extra * (base + 1) ? base + 1 : base;
}

/* Where a 32-wide block's fp16 scales start (after its integers). */
static inline size_t se_scale_at(int kern) { return kern == SE_KERN_Q8 ? 512 : kern == SE_KERN_Q5 ? 320 : 256; }
/* A 32-wide kernel's dispatch on w's format: PASSES(q8, q5, has_min), the ISA file's switch over row counts, with
 * the format as constants so no test of it is left inside the pass's loop. */
#define SE_BY_FORMAT(w, PASSES)                                                                                  \
    if ((w)->kern == SE_KERN_Q8) PASSES(1, 0, 0)                                                                 \
    else if ((w)->kern == SE_KERN_Q5) PASSES(0, 1, 0)                                                            \
    else if ((w)->has_min) PASSES(0, 0, 1)                                                                       \
    else PASSES(0, 0, 0)
/* Weight j (0..31) of lane r in a packed 32-wide block, as the unsigned integer the kernels multiply: a Q4K
 * sub-block's nibble, a Q6K block's 6 bits. */
static inline int se_unpacked(int kern, const uint8_t *blk, int r, int j) {
    int lane = r * 4 + j % 4;
    if (kern == SE_KERN_Q8) return blk[(j / 4) * 64 + lane];
    uint8_t byte = blk[((j % 16) / 4) * 64 + lane];
    int u = j < 16 ? byte & 15 : byte >> 4;
    if (kern == SE_KERN_Q5 || kern == SE_KERN_Q5K) u |= (blk[256 + (j / 4) * 8 + lane / 8] >> (lane % 8) & 1) << 4;
    if (kern == SE_KERN_Q6K) u |= (blk[256 + (j / 16) * 64 + lane] >> (2 * ((j / 4) % 4)) & 3) << 4;
    return u;
}

/* Superblock headers: Q4K's d, dmin, sc, m come first; Q6K's sc, d after its 8 blocks. */
#define SE_Q4K_HEAD 320
#define SE_Q4K_BYTES (SE_Q4K_HEAD + 8 * 256)
#define SE_Q5K_SUB 320  /* a Q5K sub-block: Q4 nibbles, then bit 4's masks (Q5_0's layout without its scales) */
#define SE_Q5K_BYTES (SE_Q4K_HEAD + 8 * SE_Q5K_SUB)
#define SE_Q6K_BLOCK 384
#define SE_Q6K_SC (8 * SE_Q6K_BLOCK)
#define SE_Q6K_D (SE_Q6K_SC + 256)
#define SE_Q6K_BYTES (SE_Q6K_D + 32)

/* fp16 <-> fp32, exact (f32 -> f16 rounds to nearest even) */
float se_f16_to_f32(uint16_t h);
uint16_t se_f32_to_f16(float f);

/* vec.c: the float primitives attention and norms share, one fixed order, every ISA (NEON's in vec_neon.c) */
typedef struct {
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int n);         /* y += a * x, n % 16 == 0 */
    void (*exp_inplace)(float *x, int n);                                    /* x = exp(x) */
    void (*to_f16)(const float *x, uint16_t *y, int n);                      /* round to nearest even */
    /* Scores of nq <= SE_QUERIES queries against the keys of K-cache blocks b0 .. b0 + nb - 1 of one head (K: the
     * head's first block; block b at K + b * hd * SE_KBLOCK): out[j][SE_KBLOCK * (b - b0) + t] = scale * the dot of
     * q[j] with key t of block b, each dot one fused chain over d from 0 (acc = fma(q[d], k[d], acc)), whatever
     * else the call batches with it */
    void (*scores)(const float *const *q, int nq, const uint16_t *K, int b0, int nb, int hd, float scale,
                   float *const *out);
    /* out[d] = sum over i (in order, fused) of w[i] * V[idx[i] * hd + d], from 0: axpy_f16 key after key */
    void (*wsum)(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out);
    /* the same for nq <= SE_QUERIES queries of one KV head (they share each V row's load and conversion):
     * out[j] = wsum(w[j], ...), bit for bit */
    void (*wsum_q)(const float *const *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd,
                   float *const *out);
} se_vec_ops;
const se_vec_ops *se_vec(void);
const se_vec_ops *se_vec_avx2(void);  /* vec_avx2.c (x86-64 builds only) */
const se_vec_ops *se_vec_neon(void);  /* vec_neon.c (AArch64 builds only) */
float se_expf(float x);  /* the engine's exp: the same polynomial in every ISA */

/* vec_rows.c: per-row steps of the norms, the softmax and the MLP, one fixed order (see the file), bit for bit in
 * every ISA */
typedef struct {
    float (*sum)(const float *x, int n);
    float (*sumsq)(const float *x, int n);
    float (*max)(const float *x, int n);
    float (*exp_sum)(float *x, int n, float m); /* x = exp(x - m) element by element; returns sum(x), sum's order */
    void (*silu_mul)(const float *g, const float *u, float *y, int n);
    void (*quantize)(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h, float *m);
} se_row_ops;
const se_row_ops *se_rows(void);
const se_row_ops *se_rows_neon(void);  /* vec_neon.c (AArch64 builds only) */
float se_exp_sum_steps(float *x, int n, float m); /* exp_sum as its three steps (vec_rows.c): every ISA but AVX-512 */
#endif
