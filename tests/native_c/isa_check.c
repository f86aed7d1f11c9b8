/* Every ISA this CPU runs against the portable C, bit for bit, on seeded random inputs (built by
 * tests/test_native_isa_harness.py natively and for AArch64 under qemu-user, with the flags setup.py uses):
 *   - se_matmul on random GGUF blocks of every packed format, widths 1..16 and a row alone;
 *   - the float primitives (vec.c, vec_rows.c and their SIMD forms);
 *   - whole forwards of three small random models (weights Q4_0/Q4_1/Q5_0/Q8_0, Q4_K/Q5_K/Q6_K/Q8_0,
 *     F16/BF16/F32/Q8_0), GQA, RoPE, a sliding window, a KV cache filled by a first call, 1 and 2 threads: their
 *     logits.
 * Prints one line per ISA and exits 1 on any difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "se.h"

/* api.c */
se_mat *se_mat_new(int type, const uint8_t *raw, size_t row_bytes, int n, int k);
void se_mat_delete(se_mat *m);
int se_matmul(const se_mat *w, const float *x, int rows, float *out, int isa, int span);

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() & 0xffffff) / 16777216.0f; }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void fill(float *x, size_t n, float lo, float hi) { for (size_t i = 0; i < n; i++) x[i] = frand(lo, hi); }
static void fill_f16(uint16_t *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = se_f32_to_f16(frand(-2, 2)); }

static int g_failures = 0;
static int same(const void *a, const void *b, size_t bytes, const char *what, int isa) {
    if (memcmp(a, b, bytes) == 0) return 1;
    if (g_failures++ < 20) printf("MISMATCH isa %d: %s\n", isa, what);
    return 0;
}

/* n rows of random GGUF blocks of `type` (fp16 scales finite, every quant bit random) */
static uint8_t *random_rows(int type, int n, int k, size_t *row_bytes) {
    size_t rb = se_type_row_bytes(type, k);
    uint8_t *raw = malloc(rb * (size_t)n);
    for (size_t i = 0; i < rb * (size_t)n; i++) raw[i] = (uint8_t)next_u32();
    for (int r = 0; r < n; r++) {
        uint8_t *row = raw + rb * (size_t)r;
        if (type == SE_F32 || type == SE_F16 || type == SE_BF16)
            for (int t = 0; t < k; t++) {
                float f = frand(-1, 1);
                uint32_t bits;
                memcpy(&bits, &f, 4);
                if (type == SE_F32) memcpy(row + 4 * t, &f, 4);
                else put16(row + 2 * t, type == SE_F16 ? se_f32_to_f16(f) : (uint16_t)(bits >> 16));
            }
        int q32 = type == SE_Q4_0 || type == SE_Q4_1 || type == SE_Q5_0 || type == SE_Q8_0;
        for (int b = 0; q32 && b < k / 32; b++) {
            size_t bb = rb / (size_t)(k / 32);
            put16(row + b * bb, se_f32_to_f16(frand(-0.05f, 0.05f)));
            if (type == SE_Q4_1) put16(row + b * bb + 2, se_f32_to_f16(frand(-0.1f, 0.1f)));
        }
        for (int s = 0; type == SE_Q4_K || type == SE_Q5_K || type == SE_Q6_K ? s < k / 256 : 0; s++) {
            size_t sb = rb / (size_t)(k / 256);
            if (type == SE_Q6_K) {
                put16(row + s * sb + 208, se_f32_to_f16(frand(-0.002f, 0.002f)));
            } else {
                put16(row + s * sb, se_f32_to_f16(frand(-0.01f, 0.01f)));
                put16(row + s * sb + 2, se_f32_to_f16(frand(-0.01f, 0.01f)));
            }
        }
    }
    *row_bytes = rb;
    return raw;
}

static void check_matmuls(int isa) {
    static const int types[] = {SE_Q4_0, SE_Q4_1, SE_Q5_0, SE_Q8_0, SE_Q4_K, SE_Q5_K, SE_Q6_K, SE_F32, SE_F16, SE_BF16};
    /* 37: a last group of 5 rows (a partial NEON quarter, AVX2 half); 512: 2 K-quant superblocks */
    const int n = 37, k = 512, rows = 16;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        size_t rb;
        uint8_t *raw = random_rows(types[t], n, k, &rb);
        se_mat *w = se_mat_new(types[t], raw, rb, n, k);
        float *x = malloc(sizeof(float) * rows * k), *want = malloc(sizeof(float) * rows * n);
        float *got = malloc(sizeof(float) * rows * n);
        fill(x, (size_t)rows * k, -3, 3);
        char what[64];
        int kquant = types[t] == SE_Q4_K || types[t] == SE_Q5_K || types[t] == SE_Q6_K;
        for (int span = 0; span <= kquant; span++) { /* K-quants: activations per 256 (the default), then per 32 */
            snprintf(what, sizeof what, "matmul of type %d (not packed)", types[t]);
            if (!w || se_matmul(w, x, rows, want, SE_ISA_PORTABLE, span) != 0) {
                same("a", "b", 1, what, isa);
                break;
            }
            for (int width = 1; width <= rows; width++) {
                se_matmul(w, x, width, got, isa, span);
                snprintf(what, sizeof what, "matmul type %d span %d width %d", types[t], span, width);
                same(got, want, sizeof(float) * width * n, what, isa);
            }
            se_matmul(w, x + 9 * k, 1, got, isa, span);
            snprintf(what, sizeof what, "matmul type %d span %d row 9 alone", types[t], span);
            same(got, want + 9 * n, sizeof(float) * n, what, isa);
        }
        se_mat_delete(w);
        free(raw); free(x); free(want); free(got);
    }
}

/* the float primitives of vec.c / vec_rows.c under `isa` into `out` (a flat record), for comparison */
static size_t run_primitives(int isa, float *out) {
    enum { HD = 64, KEYS = 37, N = 100, NB = 7 };
    uint64_t seed = g_rng;
    size_t o = 0;
    enum { Q = SE_QUERIES };
    float q[Q][HD], x[N], g[N], u[N], y[N], w[Q][KEYS];
    uint16_t K[NB * SE_KBLOCK * HD], V[KEYS * HD], h16[N];
    int32_t idx[KEYS];
    fill(&q[0][0], Q * HD, -1, 1);
    fill(&w[0][0], Q * KEYS, 0, 1);
    fill_f16(K, NB * SE_KBLOCK * HD);
    fill_f16(V, KEYS * HD);
    for (int i = 0; i < KEYS; i++) idx[i] = (i * 7) % KEYS;
    se_set_isa(isa);
    const se_vec_ops *v = se_vec();
    const se_row_ops *r = se_rows();
    fill(x, N, -100, 100);
    v->exp_inplace(x, N);
    memcpy(out + o, x, sizeof x), o += N;
    for (int len = 1; len <= 33; len++) { /* every tail the vector paths mask (n % 16, n % 8) */
        fill(x, len, -90, 90);
        v->exp_inplace(x, len);
        memcpy(out + o, x, (size_t)len * sizeof(float)), o += (size_t)len;
    }
    fill(y, HD, -1, 1);
    v->axpy_f16(y, 0.75f, V, HD);
    memcpy(out + o, y, HD * sizeof(float)), o += HD;
    fill(x, N, -70000, 70000);
    for (int i = 0; i < 8; i++) x[i] = frand(-1e-6f, 1e-6f); /* fp16 subnormals */
    v->to_f16(x, h16, N);
    for (int i = 0; i < N; i++) out[o++] = (float)h16[i];
    v->wsum(w[0], V, idx, KEYS, HD, out + o), o += HD;
    const float *qs[Q], *ws[Q];
    float *so[Q], *wo[Q];
    for (int j = 0; j < Q; j++) qs[j] = q[j], ws[j] = w[j];
    /* 1-3 queries take the kernels' narrow path, more their chunks (AVX-512: of up to 8 and 12, AVX2: 6) */
    static const int widths[] = {1, 2, 3, 4, 7, 8, 13, Q};
    for (size_t k = 0; k < sizeof widths / sizeof *widths; k++) {
        int nq = widths[k];
        enum { S = (NB - 1) * SE_KBLOCK }; /* blocks 1 .. 6: a group of 4 and two single blocks on AVX-512 */
        for (int j = 0; j < nq; j++) so[j] = out + o + (size_t)j * S;
        v->scores(qs, nq, K, 1, NB - 1, HD, 0.125f, so), o += (size_t)nq * S;
        for (int j = 0; j < nq; j++) wo[j] = out + o + (size_t)j * HD;
        v->wsum_q(ws, nq, V, idx, KEYS, HD, wo), o += (size_t)nq * HD;
    }
    static const int lens[] = {1, 15, 16, 17, 64, 100};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        fill(x, N, -4, 4);
        out[o++] = r->sum(x, lens[i]);
        out[o++] = r->sumsq(x, lens[i]);
        out[o++] = r->max(x, lens[i]);
    }
    fill(g, N, -12, 12);
    fill(u, N, -2, 2);
    r->silu_mul(g, u, y, N - 3);
    memcpy(out + o, y, (N - 3) * sizeof(float)), o += N - 3;
    int8_t qq[96];
    float d[3], mm[3];
    int32_t s[3], hh[3];
    fill(x, 96, -5, 5);
    r->quantize(x, 3, 3, qq, d, s, hh, mm); /* one run of 3 blocks sharing a scale */
    for (int i = 0; i < 96; i++) out[o++] = qq[i];
    for (int i = 0; i < 3; i++) out[o++] = d[i], out[o++] = (float)s[i], out[o++] = (float)hh[i], out[o++] = mm[i];
    se_set_isa(SE_ISA_PORTABLE);
    g_rng = seed; /* every ISA sees the same inputs */
    return o;
}

static void check_primitives(int isa) {
    static float want[16384], got[16384];
    size_t n = run_primitives(SE_ISA_PORTABLE, want);
    run_primitives(isa, got);
    same(got, want, n * sizeof(float), "float primitives", isa);
    for (size_t i = 0; i < n && g_failures < 20; i++)
        if (memcmp(&got[i], &want[i], 4)) printf("  primitive value %zu: %.9g != %.9g\n", i, got[i], want[i]);
}

/* ---- a whole small model ---- */
enum { L = 2, H = 4, KVH = 2, VOCAB = 67, ROWS = 20, CAP = 32, MAX_HD = 64 };

/* dims and the weight types the matrices cycle through: 32-wide formats at d 64, K-quants (k % 256) at d 256,
 * float weights (multiplied with the float activations) beside Q8_0 */
typedef struct { int d, hd, f; int types[4]; } model_kind;
static const model_kind KINDS[] = {{64, 16, 96, {SE_Q4_0, SE_Q4_1, SE_Q5_0, SE_Q8_0}},
                                   {256, 64, 256, {SE_Q4_K, SE_Q5_K, SE_Q6_K, SE_Q8_0}},
                                   {64, 16, 96, {SE_F16, SE_BF16, SE_F32, SE_Q8_0}}};

static se_model *random_model(const model_kind *mk, int threads, uint64_t seed) {
    g_rng = seed;
    int D = mk->d, HD = mk->hd, F = mk->f;
    se_cfg cfg = {L, D, H, KVH, HD, F, VOCAB, 1e-5f, 1.0f, SE_ACT_SILU, 0, 0, 0, 0, 0, ROWS, threads};
    se_model *m = se_model_new(&cfg);
    int shapes[SE_W_NMATS][2] = {{H * HD, D}, {KVH * HD, D}, {KVH * HD, D}, {D, H * HD}, {F, D}, {F, D}, {D, F}};
    float vec[256];
    size_t rb;
    for (int l = -1; l < L; l++) {
        for (int w = 0; w < (l < 0 ? 2 : SE_W_NMATS); w++) {
            int n = l < 0 ? VOCAB : shapes[w][0], k = l < 0 ? D : shapes[w][1], type = mk->types[(l + 1 + w) % 4];
            uint8_t *raw = random_rows(type, n, k, &rb);
            if (se_model_set_mat(m, l, w, type, raw, rb, n, k) != 0) return NULL;
            free(raw);
        }
        for (int v = 0; v < (l < 0 ? 1 : 2); v++) {
            fill(vec, D, 0.5f, 1.5f);
            se_model_set_vec(m, l, v == 0 ? (l < 0 ? 0 : SE_V_ATTN_NORM) : SE_V_FFN_NORM, vec, D);
        }
    }
    return se_model_ready(m) == 0 ? m : NULL;
}

/* two calls (12 rows, then 8 more over the cache): the logits of all 20 rows */
static int run_model(const model_kind *mk, int isa, int threads, float *logits) {
    se_model *m = random_model(mk, threads, 1234);
    if (!m) return -1;
    int HD = mk->hd;
    static float cos_t[ROWS * MAX_HD / 2], sin_t[ROWS * MAX_HD / 2];
    for (int p = 0; p < ROWS; p++)
        for (int j = 0; j < HD / 2; j++) {
            double a = p * pow(10000.0, -2.0 * j / HD);
            cos_t[p * HD / 2 + j] = (float)cos(a), sin_t[p * HD / 2 + j] = (float)sin(a);
        }
    const float *cs[L] = {cos_t, cos_t}, *sn[L] = {sin_t, sin_t};
    int32_t half[L] = {HD / 2, HD / 2}, window[L] = {0, 8}, layers[L] = {0, 1}, tokens[ROWS], pos[ROWS];
    for (int i = 0; i < ROWS; i++) tokens[i] = (int32_t)(next_u32() % VOCAB), pos[i] = i;
    uint16_t *kc = calloc((size_t)L * KVH * CAP * HD, 2), *vc = calloc((size_t)L * KVH * CAP * HD, 2);
    se_set_isa(isa);
    int rc = 0;
    for (int part = 0; part < 2 && rc == 0; part++) {
        int start = part ? 12 : 0, n = part ? 8 : 12;
        se_call c = {n, start, CAP, tokens + start, pos + start, NULL, cs, sn, half, window, kc, vc, layers, L,
                     NULL, 0, NULL, NULL, pos, n, logits + (size_t)start * VOCAB};
        rc = se_forward(m, &c);
    }
    se_set_isa(SE_ISA_PORTABLE);
    free(kc); free(vc);
    se_model_free(m);
    return rc;
}

static void check_model(int isa) {
    static float want[ROWS * VOCAB], got[ROWS * VOCAB];
    for (size_t kind = 0; kind < sizeof KINDS / sizeof *KINDS; kind++) {
        char what[64];
        snprintf(what, sizeof what, "model %zu forward failed", kind);
        if (run_model(&KINDS[kind], SE_ISA_PORTABLE, 1, want) != 0) {
            same("a", "b", 1, what, isa);
            continue;
        }
        int finite = 1, varied = 0; /* equal garbage would pass a bitwise comparison */
        for (int i = 0; i < ROWS * VOCAB; i++) finite &= isfinite(want[i]) != 0, varied |= want[i] != want[0];
        snprintf(what, sizeof what, "model %zu logits not finite or all equal", kind);
        if (!finite || !varied) same("a", "b", 1, what, isa);
        for (int threads = 1; threads <= 2; threads++) {
            snprintf(what, sizeof what, "model %zu logits, %d thread(s)", kind, threads);
            if (run_model(&KINDS[kind], isa, threads, got) != 0) same("a", "b", 1, what, isa);
            else same(got, want, sizeof want, what, isa);
        }
    }
}

uint64_t se_dot_roof(se_pool *p, int items, uint64_t *check); /* dot_roof.c (a perf tool's) */

/* The compute roof's chains do the multiply-adds they count under this ISA (its dot instruction's width). */
static void check_dot_roof(int isa) {
    static const uint64_t width[] = {1, 32, 64, 16};
    se_pool *p = se_pool_new(2);
    uint64_t check = 0, want = 3ull * 8 * 4096 * (isa == SE_ISA_NEON && !se_cpu_dotprod() ? 1 : width[isa]);
    se_set_isa(isa);
    uint64_t got = se_dot_roof(p, 3, &check);
    se_set_isa(SE_ISA_PORTABLE);
    se_pool_free(p);
    same(&got, &want, sizeof got, "the dot roof's multiply-add count", isa);
}

int main(void) {
    static const char *names[] = {"portable", "avx2", "avx512", "neon"};
    int best = se_cpu_isa(), checked = 0;
    printf("cpu isa: %s%s\n", names[best], best == SE_ISA_NEON && !se_cpu_dotprod() ? " (no dotprod)" : "");
    for (int isa = 0; isa <= SE_ISA_NEON; isa++) {
        if (se_set_isa(isa) != isa) continue; /* this CPU does not run it */
        se_set_isa(SE_ISA_PORTABLE);
        int before = g_failures;
        g_rng = 0x9e3779b97f4a7c15ull;
        check_matmuls(isa);
        check_primitives(isa);
        check_model(isa);
        check_dot_roof(isa);
        printf("%s: %s\n", names[isa], g_failures == before ? "bitwise equal to portable" : "MISMATCH");
        checked++;
    }
    printf("%d isa(s) checked, %d mismatch(es)\n", checked, g_failures);
    return g_failures ? 1 : 0;
}
