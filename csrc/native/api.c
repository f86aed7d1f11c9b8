/* Entry points for the Python side beyond the model: single matrices (tests, the kernel benchmark, a trimmed LM
 * head) and the float primitives, each callable with a chosen ISA so every fast path is checked against the
 * portable C. */
#include <stdlib.h>

#include "model.h"
#include "pool.h"
#include "se.h"

se_mat *se_mat_new(int type, const uint8_t *raw, size_t row_bytes, int n, int k) {
    se_mat *m = malloc(sizeof *m);
    if (!m) return NULL;
    if (se_pack(m, type, raw, row_bytes, n, k) != 0) {
        se_mat_free(m);
        free(m);
        return NULL;
    }
    return m;
}

void se_mat_delete(se_mat *m) {
    if (!m) return;
    se_mat_free(m);
    free(m);
}

size_t se_mat_bytes(const se_mat *m) { return m->group_bytes * (size_t)m->ngroups; }

/* out [rows, n] = x [rows, k] times the matrix, activations quantized first (span: blocks per scale, 1 or 8 for a
 * K-quant, 0 its default 8); one thread, the given ISA's kernel. */
int se_matmul(const se_mat *w, const float *x, int rows, float *out, int isa, int span) {
    se_act a;
    if (rows <= 0 || span < 0 || span > 8 || (span > 1 && (span != 8 || !se_is_kquant(w->kern)))) return -1;
    if (se_act_quantized(x, rows, w->k, span ? span : se_span_for(w), &a)) return -2;
    int before = se_isa();
    se_set_isa(isa);
    se_mm_for(w)(w, &a, rows, out, w->n, 0, w->ngroups);
    se_set_isa(before);
    se_act_free(&a);
    return 0;
}

typedef struct { const se_mat *w; se_act *a; int rows; float *out; } mm_job;

static void mm_job_run(void *p, int thread, int g0, int g1) {
    mm_job *j = p;
    (void)thread;
    se_mm_for(j->w)(j->w, j->a, j->rows, j->out, j->w->n, g0, g1);
}

/* The kernel benchmark's call: pre-quantized activations, the pool's threads, reps repetitions. */
int se_matmul_pool(se_pool *p, const se_mat *const *ws, int count, const int8_t *q, const float *d, const int32_t *s,
                   const int32_t *h, const float *m, const float *f, int rows, float *out, int reps) {
    int kmax = 0;
    for (int i = 0; i < count; i++) kmax = ws[i]->k > kmax ? ws[i]->k : kmax;
    int32_t *pairs = malloc((size_t)rows * (kmax / 64) * 3 * sizeof(int32_t) + 4);
    if (!pairs) return -2;
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < count; i++) {
            se_act a = {.q = (int8_t *)q, .d = (float *)d, .s = (int32_t *)s, .h = (int32_t *)h, .k = ws[i]->k,
                        .nb = ws[i]->nb, .f = (float *)f, .m = (float *)m, .span = 8, .p = pairs};
            for (int row = 0; ws[i]->nb % 2 == 0 && row < rows; row++) se_act_pairs(&a, row, 0, a.nb);
            mm_job j = {ws[i], &a, rows, out};
            int chunk = ws[i]->ngroups / (8 * se_pool_threads(p));
            se_pool_for(p, ws[i]->ngroups, chunk < 1 ? 1 : chunk > 16 ? 16 : chunk, mm_job_run, &j);
        }
    free(pairs);
    return 0;
}

void se_quantize(const float *x, int rows, int k, int span, int8_t *q, float *d, int32_t *s, int32_t *h, float *m) {
    se_act a = {.q = q, .d = d, .s = s, .h = h, .k = k, .nb = k / 32, .f = NULL, .m = m, .span = span};
    se_quantize_rows(x, rows, k, &a);
}

/* Float primitives under a chosen ISA (tests). */
void se_vec_exp(float *x, int n, int isa) {
    int before = se_isa();
    se_set_isa(isa);
    se_vec()->exp_inplace(x, n);
    se_set_isa(before);
}

void se_vec_axpy(float *y, float a, const uint16_t *x, int n, int isa) {
    int before = se_isa();
    se_set_isa(isa);
    se_vec()->axpy_f16(y, a, x, n);
    se_set_isa(before);
}

int se_abi_version(void) { return 7; }

typedef struct { const uint8_t *buf; size_t bytes; uint64_t sums[64]; } roof_job;

#define ROOF_CHUNK 4096 /* lines (256 KB) per item */

static void roof_run(void *p, int thread, int a, int b) {
    roof_job *j = p;
    size_t lines = j->bytes / 64, end = (size_t)b * ROOF_CHUNK < lines ? (size_t)b * ROOF_CHUNK : lines;
    uint64_t acc = 0;
    for (size_t i = (size_t)a * ROOF_CHUNK; i < end; i++) {
        const uint64_t *line = (const uint64_t *)(j->buf + i * 64);
        acc ^= line[0] ^ line[7];
    }
    j->sums[thread % 64] ^= acc;
}

/* Read `bytes` of `buf` once with the pool's threads (the memory roof the kernel benchmark reports against). */
uint64_t se_read_roof(se_pool *p, const uint8_t *buf, size_t bytes) {
    roof_job j = {buf, bytes, {0}};
    int items = (int)((bytes / 64 + ROOF_CHUNK - 1) / ROOF_CHUNK);
    se_pool_for(p, items, (items + 2 * se_pool_threads(p) - 1) / (2 * se_pool_threads(p)), roof_run, &j);
    uint64_t x = 0;
    for (int i = 0; i < 64; i++) x ^= j.sums[i];
    return x;
}

/* scores of nq queries (q: [nq, hd]) against K-cache blocks b0 .. b0 + nb - 1 (out: [nq, 16 nb]) */
void se_vec_scores(const float *q, int nq, const uint16_t *K, int b0, int nb, int hd, float scale, float *out,
                   int isa) {
    const float *qs[SE_QUERIES];
    float *os[SE_QUERIES];
    for (int j = 0; j < nq && j < SE_QUERIES; j++) qs[j] = q + (size_t)j * hd, os[j] = out + (size_t)j * nb * SE_KBLOCK;
    int before = se_isa();
    se_set_isa(isa);
    se_vec()->scores(qs, nq < SE_QUERIES ? nq : SE_QUERIES, K, b0, nb, hd, scale, os);
    se_set_isa(before);
}

void se_vec_wsum(const float *w, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out, int isa) {
    int before = se_isa();
    se_set_isa(isa);
    se_vec()->wsum(w, V, idx, cnt, hd, out);
    se_set_isa(before);
}

/* nq queries' weighted sums (w: [nq, cnt], out: [nq, hd]) in one call, as attention makes it */
void se_vec_wsum_q(const float *w, int nq, const uint16_t *V, const int32_t *idx, int cnt, int hd, float *out,
                   int isa) {
    const float *ws[SE_QUERIES];
    float *os[SE_QUERIES];
    nq = nq < SE_QUERIES ? nq : SE_QUERIES;
    for (int j = 0; j < nq; j++) ws[j] = w + (size_t)j * cnt, os[j] = out + (size_t)j * hd;
    int before = se_isa();
    se_set_isa(isa);
    se_vec()->wsum_q(ws, nq, V, idx, cnt, hd, os);
    se_set_isa(before);
}

/* vec_rows.c under a chosen ISA (tests): op 0 sum, 1 sum of squares, 2 max */
float se_vec_reduce(const float *x, int n, int op, int isa) {
    int before = se_isa();
    se_set_isa(isa);
    const se_row_ops *r = se_rows();
    float v = op == 0 ? r->sum(x, n) : op == 1 ? r->sumsq(x, n) : r->max(x, n);
    se_set_isa(before);
    return v;
}

/* x = exp(x - m), returning the sum (the softmax's step) */
float se_vec_exp_sum(float *x, int n, float m, int isa) {
    int before = se_isa();
    se_set_isa(isa);
    float s = se_rows()->exp_sum(x, n, m);
    se_set_isa(before);
    return s;
}

void se_vec_silu_mul(const float *g, const float *u, float *y, int n, int isa) {
    int before = se_isa();
    se_set_isa(isa);
    se_rows()->silu_mul(g, u, y, n);
    se_set_isa(before);
}

void se_vec_quantize(const float *x, int nblocks, int span, int8_t *q, float *d, int32_t *s, int32_t *h, float *m,
                     int isa) {
    int before = se_isa();
    se_set_isa(isa);
    se_rows()->quantize(x, nblocks, span, q, d, s, h, m);
    se_set_isa(before);
}
