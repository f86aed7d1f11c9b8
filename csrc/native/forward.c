/* The forward: every thread runs `job`, phases separated by barriers. Work is split by output-row groups
 * (matmuls), by (row, head) (RoPE, attention) and by rows (norms); a row's arithmetic never depends on the split. */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


static void rms_norm(const float *x, const float *w, int n, float eps, float *y) {
    float s = sqrtf(se_rows()->sumsq(x, n) / (float)n + eps);
    for (int d = 0; d < n; d++) y[d] = x[d] / s * w[d];
}

void se_quantize_span(const float *x, int n, se_act *a, int row, int col) {
    int blk = col / SE_BLOCK;
    if (a->f) memcpy(a->f + (size_t)row * a->k + col, x, (size_t)n * sizeof(float));
    size_t at = (size_t)row * a->nb + blk;
    se_rows()->quantize(x, n / SE_BLOCK, a->span, a->q + (size_t)row * a->k + blk * SE_BLOCK, a->d + at, a->s + at,
                        a->h + at, a->m + at);
    if (a->span > 1) se_act_pairs(a, row, blk, n / SE_BLOCK);
}

/* the activations' view for a k-wide input that matrices w[0..n-1] read: one scale per superblock if a K-quant does */
static se_act view_of(se_model *m, const se_act *buf, int k, const se_mat *const *w, int n) {
    se_act a = *buf;
    a.k = k;
    a.nb = k / SE_BLOCK;
    a.f = m->float_acts ? buf->f : NULL;
    a.span = 1;
    for (int i = 0; i < n; i++)
        if (se_is_kquant(w[i]->kern)) a.span = m->kspan;
    return a;
}

/* the views of layer l's four inputs: attention's (Q, K, V read it), its output (O), the MLP's (gate, up) and the
 * gated values (down) */
se_act se_act_of(se_model *m, int l, int which) {
    const se_mat *w = m->layers[l].w;
    const se_mat *const qkv[3] = {&w[SE_W_Q], &w[SE_W_K], &w[SE_W_V]}, *const gu[2] = {&w[SE_W_GATE], &w[SE_W_UP]};
    const se_mat *const o = &w[SE_W_O], *const down = &w[SE_W_DOWN];
    int D = m->cfg.d_model;
    switch (which) {
    case SE_IN_ATT: return view_of(m, &m->act, D, qkv, 3);
    case SE_IN_O: return view_of(m, &m->act, m->cfg.n_heads * m->cfg.head_dim, &o, 1);
    case SE_IN_MLP: return view_of(m, &m->act, D, gu, 2);
    default: return view_of(m, &m->act_ff, m->cfg.d_ff, &down, 1);
    }
}

/* A matrix of a matmul phase. Fused phases count the groups done per unit (a head's rows, a 32-wide block of d_ff
 * columns) in done[]: the piece that completes a unit runs the phase's step on it, its outputs still in cache. */
typedef struct {
    const se_mat *w;
    float *out;
    int ldo;
    _Atomic int *done;      /* NULL: no step */
    int per_unit, unit_all; /* this matrix's groups per unit; the unit's groups over every matrix of the phase */
} mm_task;


static void rope(float *x, const float *cos, const float *sin, int half) {
    for (int j = 0; j < half; j++) {
        float x1 = x[j], x2 = x[j + half];
        x[j] = x1 * cos[j] - x2 * sin[j];
        x[j + half] = x2 * cos[j] + x1 * sin[j];
    }
}

static void add(float *y, const float *x, int n) {
    for (int d = 0; d < n; d++) y[d] = y[d] + x[d];
}

enum { HEAD_Q, HEAD_K, HEAD_V };

/* Biases, norms and RoPE of one row's query, key or value head h; keys and values also go into the cache. */
static void prepare_head(se_model *m, const se_call *c, int l, int r, int part, int h) {
    const se_cfg *cf = &m->cfg;
    const se_layer *L = &m->layers[l];
    int hd = cf->head_dim, QD = cf->n_heads * hd, KVD = cf->n_kv_heads * hd, half = c->rope_half[l];
    size_t slot = (size_t)(c->length + r), head = ((size_t)l * cf->n_kv_heads + h) * (size_t)c->capacity;
    if (part == HEAD_V) {
        float *v = m->v + (size_t)r * KVD + (size_t)h * hd;
        if (cf->qkv_bias) add(v, L->v[SE_V_V_BIAS] + (size_t)h * hd, hd);
        se_vec()->to_f16(v, c->v_cache + (head + slot) * hd, hd);
        return;
    }
    int is_q = part == HEAD_Q;
    float *x = is_q ? m->q + (size_t)r * QD + (size_t)h * hd : m->k + (size_t)r * KVD + (size_t)h * hd;
    if (cf->qkv_bias) add(x, L->v[is_q ? SE_V_Q_BIAS : SE_V_K_BIAS] + (size_t)h * hd, hd);
    if (cf->qk_norm) rms_norm(x, L->v[is_q ? SE_V_Q_NORM : SE_V_K_NORM], hd, cf->rms_eps, x);
    if (half) {
        size_t at = (size_t)c->positions[r] * half;
        rope(x, c->rope_cos[l] + at, c->rope_sin[l] + at, half);
    }
    if (is_q) return;
    uint16_t k16[SE_MAX_HD]; /* K's blocks are dims-major: this key is lane slot % SE_KBLOCK of every dim's row */
    se_vec()->to_f16(x, k16, hd);
    uint16_t *kb = c->k_cache + (head + slot / SE_KBLOCK * SE_KBLOCK) * hd + slot % SE_KBLOCK;
    for (int d = 0; d < hd; d++) kb[(size_t)d * SE_KBLOCK] = k16[d];
}

/* act(g) * u over n values, element by element with the engine's exp (the same in every ISA), so a span's values
 * never depend on the span: silu(g) = g / (1 + exp(-g)); gelu's tanh form 0.5 g (1 + tanh(z)), z = sqrt(2/pi) (g +
 * 0.044715 g^3), as the identical g / (1 + exp(-2z)) (vectorised; libm's scalar tanhf was a fifth of a gemma3
 * prompt's time). */
static void gated_span(int kind, const float *g, const float *u, float *y, int n) {
    if (kind == SE_ACT_SILU) {
        se_rows()->silu_mul(g, u, y, n);
        return;
    }
    const float k2 = (float)(2.0 * 0.7978845608028654); /* 2 sqrt(2 / pi) */
    for (int j = 0; j < n; j++) {
        float x = g[j];
        y[j] = -(k2 * (x + 0.044715f * x * x * x));
    }
    se_vec()->exp_inplace(y, n);
    for (int j = 0; j < n; j++) y[j] = g[j] / (1.0f + y[j]) * u[j];
}

/* ---- phases: each is a parallel-for over independent items (pool.h) ---- */

typedef struct phase phase;
struct phase {
    se_model *m;
    const se_call *c;
    int l;                       /* the layer */
    const mm_task *tasks;        /* matmul phases */
    int ntasks;
    int interleave;              /* items: group g of every task in turn (tasks of equal sizes), not task by task */
    void (*step)(const phase *ph, int thread, int task, int unit); /* a fused phase's step on a completed unit */
    const se_act *x;
    int rows;
    const float *h;              /* head phases: hidden states and which rows */
    const int32_t *hrows;
    int residual, norm_next;     /* row phase: add m->a into x first; then norm + quantize for layer l */
};

/* the per-thread row buffer at the end of the scratch: a d_model row, or the gate/up step's 3 x SE_MAX_ROWS blocks */
static size_t tmp_len(const se_model *m) {
    size_t blocks = (size_t)3 * SE_MAX_ROWS * SE_BLOCK;
    return ((size_t)m->cfg.d_model > blocks ? (size_t)m->cfg.d_model : blocks) + 64 + SE_BLOCK;
}

static float *tmp_of(se_model *m, int thread) { return m->scratch[thread] + m->scratch_len - tmp_len(m); }

static void groups(const phase *ph, int thread, int i, int g0, int g1) {
    const mm_task *t = &ph->tasks[i];
    se_mm_for(t->w)(t->w, ph->x, ph->rows, t->out, t->ldo, g0, g1);
    if (!t->done) return;
    for (int u = g0 / t->per_unit; u * t->per_unit < g1; u++) {
        int lo = u * t->per_unit > g0 ? u * t->per_unit : g0;
        int hi = (u + 1) * t->per_unit < g1 ? (u + 1) * t->per_unit : g1;
        /* acq_rel: the piece that completes the unit sees every other piece's outputs */
        if (atomic_fetch_add_explicit(&t->done[u], hi - lo, memory_order_acq_rel) + hi - lo == t->unit_all)
            ph->step(ph, thread, i, u);
    }
}

/* items: output groups, numbered across the tasks' matrices (or interleaved: group it / ntasks of task it % ntasks) */
static void mm_items(void *p, int thread, int a, int b) {
    const phase *ph = p;
    if (ph->interleave) {
        for (int it = a; it < b; it++) groups(ph, thread, it % ph->ntasks, it / ph->ntasks, it / ph->ntasks + 1);
        return;
    }
    for (int i = 0, base = 0; i < ph->ntasks; base += ph->tasks[i].w->ngroups, i++) {
        int g0 = a > base ? a - base : 0, g1 = b - base < ph->tasks[i].w->ngroups ? b - base : ph->tasks[i].w->ngroups;
        if (g0 < g1) groups(ph, thread, i, g0, g1);
    }
}

/* fused: NULL, or the phase whose step, interleave, call and layer the matmul carries; the tasks' done counters are
 * zeroed here */
static void matmul_phase(se_model *m, const mm_task *t, int count, const se_act *x, int rows, const phase *fused) {
    int total = 0;
    for (int i = 0; i < count; i++) {
        total += t[i].w->ngroups;
        for (int u = 0; t[i].done && u * t[i].per_unit < t[i].w->ngroups; u++)
            atomic_store_explicit(&t[i].done[u], 0, memory_order_relaxed); /* published by the pool's phase start */
    }
    /* each thread streams its contiguous share of the groups (pool.h); small pieces bound what a descheduled
     * worker holds up, and at 3+ rows (a piece computes longer) what the last piece leaves the other thread waiting:
     * 64 pieces a thread there took SmolLM2's T(5) down 11% against 16 (one process, mirrored loads), Qwen2.5-Coder
     * and gemma3 within noise; at 1-2 rows 32 was 3% slower than 16 */
    int per = rows > 2 ? 64 : 16, chunk = (total + per * m->nthreads - 1) / (per * m->nthreads);
    phase ph = fused ? *fused : (phase){.m = m};
    ph.tasks = t, ph.ntasks = count, ph.x = x, ph.rows = rows;
    se_pool_for(m->pool, total, chunk, mm_items, &ph);
}

/* items: rows. The residual of the previous sublayer, taps, then the norm + quantization the next matmul reads. */
static void row_items(void *p, int thread, int a, int b) {
    const phase *ph = p;
    se_model *m = ph->m;
    const se_call *c = ph->c;
    const se_cfg *cf = &m->cfg;
    int D = cf->d_model;
    float *tmp = tmp_of(m, thread);
    se_act xD = se_act_of(m, ph->l, SE_IN_ATT);
    for (int r = a; r < b; r++) {
        float *xr = m->x + (size_t)r * D, *ar = m->a + (size_t)r * D;
        if (ph->residual) { /* the MLP's output of the layer before l */
            const se_layer *P = &m->layers[ph->residual - 1];
            if (cf->post_norms) rms_norm(ar, P->v[SE_V_POST_FFN_NORM], D, cf->rms_eps, ar);
            add(xr, ar, D);
            for (int t = 0; t < c->n_taps; t++)
                if (c->taps[t] == ph->residual) memcpy(c->tap_out[t] + (size_t)r * D, xr, D * sizeof(float));
        }
        if (ph->norm_next) {
            rms_norm(xr, m->layers[ph->l].v[SE_V_ATTN_NORM], D, cf->rms_eps, tmp);
            se_quantize_span(tmp, D, &xD, r, 0);
        }
    }
}

/* items: rows. The attention output's residual, then the MLP's norm + quantization. */
static void mid_items(void *p, int thread, int a, int b) {
    const phase *ph = p;
    se_model *m = ph->m;
    const se_cfg *cf = &m->cfg;
    const se_layer *L = &m->layers[ph->l];
    int D = cf->d_model;
    float *tmp = tmp_of(m, thread);
    se_act xD = se_act_of(m, ph->l, SE_IN_MLP);
    for (int r = a; r < b; r++) {
        float *ar = m->a + (size_t)r * D, *xr = m->x + (size_t)r * D;
        if (cf->o_bias) add(ar, L->v[SE_V_O_BIAS], D);
        if (cf->post_norms) rms_norm(ar, L->v[SE_V_POST_ATTN_NORM], D, cf->rms_eps, ar);
        add(xr, ar, D);
        rms_norm(xr, L->v[SE_V_FFN_NORM], D, cf->rms_eps, tmp);
        se_quantize_span(tmp, D, &xD, r, 0);
    }
}

/* the QKV phase's step: a query, key or value head (task 0, 1, 2) is done for every row */
static void head_step(const phase *ph, int thread, int task, int head) {
    (void)thread;
    for (int r = 0; r < ph->rows; r++) prepare_head(ph->m, ph->c, ph->l, r, task, head);
}

static void att_quant_items(void *p, int thread, int a, int b) {
    const phase *ph = p;
    int QD = ph->m->cfg.n_heads * ph->m->cfg.head_dim;
    se_act xQ = se_act_of(ph->m, ph->l, SE_IN_O);
    (void)thread;
    for (int r = a; r < b; r++) se_quantize_span(ph->m->att + (size_t)r * QD, QD, &xQ, r, 0);
}

/* the gate/up phase's step: a unit of d_ff columns (a 32-wide block, or the 256 of a superblock when the down
 * projection is a K-quant) is done in both matrices for every row. Up to SE_MAX_ROWS rows' blocks are gathered so
 * that one call computes their activations and one quantizes them: their exps and reductions overlap instead of
 * waiting on one another (element-wise and per block: the same bits). A superblock's row is long enough alone. */
static void gated_step(const phase *ph, int thread, int task, int block) {
    se_model *m = ph->m;
    se_act xF = se_act_of(m, ph->l, SE_IN_DOWN);
    int F = m->cfg.d_ff, col = block * SE_BLOCK * xF.span;
    float *g = tmp_of(m, thread), *u = g + SE_MAX_ROWS * SE_BLOCK, *y = u + SE_MAX_ROWS * SE_BLOCK;
    int8_t q[SE_MAX_ROWS * SE_BLOCK];
    float d[SE_MAX_ROWS], mm[SE_MAX_ROWS];
    int32_t sums[SE_MAX_ROWS], half[SE_MAX_ROWS];
    (void)task;
    if (xF.span > 1) {
        for (int r = 0; r < ph->rows; r++) {
            gated_span(m->cfg.activation, m->g + (size_t)r * F + col, m->u + (size_t)r * F + col, y,
                       xF.span * SE_BLOCK);
            se_quantize_span(y, xF.span * SE_BLOCK, &xF, r, col);
        }
        return;
    }
    if (ph->rows == 1) { /* nothing to overlap: straight from the row into the activations */
        gated_span(m->cfg.activation, m->g + col, m->u + col, y, SE_BLOCK);
        se_quantize_span(y, SE_BLOCK, &xF, 0, col);
        return;
    }
    for (int r0 = 0; r0 < ph->rows; r0 += SE_MAX_ROWS) {
        int n = ph->rows - r0 < SE_MAX_ROWS ? ph->rows - r0 : SE_MAX_ROWS;
        for (int r = 0; r < n; r++) {
            memcpy(g + r * SE_BLOCK, m->g + (size_t)(r0 + r) * F + col, SE_BLOCK * sizeof(float));
            memcpy(u + r * SE_BLOCK, m->u + (size_t)(r0 + r) * F + col, SE_BLOCK * sizeof(float));
        }
        gated_span(m->cfg.activation, g, u, y, n * SE_BLOCK);
        se_rows()->quantize(y, n, 1, q, d, sums, half, mm);
        for (int r = 0; r < n; r++) {
            size_t row = (size_t)(r0 + r), at = row * xF.nb + block;
            if (xF.f) memcpy(xF.f + row * F + col, y + r * SE_BLOCK, SE_BLOCK * sizeof(float));
            memcpy(xF.q + row * F + col, q + r * SE_BLOCK, SE_BLOCK);
            xF.d[at] = d[r], xF.s[at] = sums[r], xF.h[at] = half[r], xF.m[at] = mm[r];
        }
    }
}

static void head_norm_items(void *p, int thread, int a, int b) {
    const phase *ph = p;
    se_model *m = ph->m;
    int D = m->cfg.d_model;
    float *tmp = tmp_of(m, thread);
    se_act xD = view_of(m, &m->act, D, &ph->tasks->w, 1); /* the head's matrix */
    for (int i = a; i < b; i++) {
        rms_norm(ph->h + (size_t)(ph->hrows ? ph->hrows[i] : i) * D, m->norm, D, m->cfg.rms_eps, tmp);
        se_quantize_span(tmp, D, &xD, i, 0);
    }
}

static void embed_items(void *p, int thread, int a, int b) {
    const phase *ph = p;
    se_model *m = ph->m;
    int D = m->cfg.d_model;
    (void)thread;
    for (int r = a; r < b; r++) {
        float *x = m->x + (size_t)r * D;
        se_dequant_row(&m->embed, ph->c->tokens[r], x);
        if (m->cfg.embed_scale != 1.0f)
            for (int d = 0; d < D; d++) x[d] = x[d] * m->cfg.embed_scale;
        for (int t = 0; t < ph->c->n_taps; t++)
            if (ph->c->taps[t] == 0) memcpy(ph->c->tap_out[t] + (size_t)r * D, x, D * sizeof(float));
    }
}

static void layer(se_model *m, const se_call *c, int l, int li) {
    const se_cfg *cf = &m->cfg;
    const se_layer *L = &m->layers[l];
    int n = c->n, D = cf->d_model, F = cf->d_ff, H = cf->n_heads, KV = cf->n_kv_heads, hd = cf->head_dim;
    int QD = H * hd, KVD = KV * hd;
    se_act xD = se_act_of(m, l, SE_IN_ATT), xQ = se_act_of(m, l, SE_IN_O), xM = se_act_of(m, l, SE_IN_MLP);
    se_act xF = se_act_of(m, l, SE_IN_DOWN);
    phase ph = {.m = m, .c = c, .l = l, .residual = li ? c->layers[li - 1] + 1 : 0, .norm_next = 1};
    se_pool_for(m->pool, n, 1, row_items, &ph);
    int G = hd / SE_GROUP; /* a head's groups of output rows; each head is prepared once its groups are done */
    mm_task qkv[3] = {{&L->w[SE_W_Q], m->q, QD, m->units, G, G}, {&L->w[SE_W_K], m->k, KVD, m->units + H, G, G},
                      {&L->w[SE_W_V], m->v, KVD, m->units + H + KV, G, G}};
    phase fused = ph;
    fused.step = head_step;
    matmul_phase(m, qkv, 3, &xD, n, &fused);
    se_attention(m, c, l);
    if (hd % SE_BLOCK || xQ.span > 1) se_pool_for(m->pool, n, 1, att_quant_items, &ph); /* else done by attention */
    mm_task o = {&L->w[SE_W_O], m->a, D};
    matmul_phase(m, &o, 1, &xQ, n, NULL);
    se_pool_for(m->pool, n, 1, mid_items, &ph);
    /* gate and up interleaved, so a thread's share holds both halves of its d_ff blocks (a unit: a run of blocks
     * sharing the down projection's activation scale) */
    int B = xF.span * SE_BLOCK / SE_GROUP;
    mm_task gu[2] = {{&L->w[SE_W_GATE], m->g, F, m->units, B, 2 * B}, {&L->w[SE_W_UP], m->u, F, m->units, B, 2 * B}};
    fused.step = gated_step;
    fused.interleave = 1;
    matmul_phase(m, gu, 2, &xM, n, &fused);
    mm_task down = {&L->w[SE_W_DOWN], m->a, D};
    matmul_phase(m, &down, 1, &xF, n, NULL);
}

/* Final norm + LM head over rows `rows` (NULL: 0..count-1) of hidden states h. */
static void head(se_model *m, const float *h, const int32_t *rows, int count, const se_mat *w, float *logits) {
    mm_task t = {w, logits, w->n};
    phase ph = {.m = m, .h = h, .hrows = rows, .tasks = &t};
    se_pool_for(m->pool, count, 1, head_norm_items, &ph);
    se_act xD = view_of(m, &m->act, m->cfg.d_model, &t.w, 1);
    matmul_phase(m, &t, 1, &xD, count, NULL);
}

static void run_forward(se_model *m, const se_call *c) {
    int D = m->cfg.d_model;
    phase ph = {.m = m, .c = c};
    se_pool_for(m->pool, c->n, 1, embed_items, &ph);
    for (int li = 0; li < c->n_run; li++) layer(m, c, c->layers[li], li);
    if (c->n_run) { /* the last layer's MLP residual (and its tap) */
        phase last = {.m = m, .c = c, .residual = c->layers[c->n_run - 1] + 1, .norm_next = 0};
        se_pool_for(m->pool, c->n, 1, row_items, &last);
    }
    if (c->h_out) memcpy(c->h_out, m->x, (size_t)c->n * D * sizeof(float));
    if (c->logits && c->n_out > 0)
        head(m, m->x, c->out_rows, c->n_out, m->cfg.tied ? &m->embed : &m->lm_head, c->logits);
}

static int ensure_scratch(se_model *m, int capacity) {
    /* attention's scores of SE_QUERIES queries, the item's keys, a row's keys, the rows' places (attention.c),
     * then the row buffer */
    size_t want = (SE_QUERIES + 3) * ((size_t)capacity + (size_t)m->cfg.max_rows) + tmp_len(m);
    if (want <= m->scratch_len) return 0;
    for (int t = 0; t < m->nthreads; t++) {
        float *s = realloc(m->scratch[t], want * sizeof(float));
        if (!s) return -1;
        m->scratch[t] = s;
    }
    m->scratch_len = want;
    return 0;
}

/* One packed matrix that is not the model's (a draft head's) on the model's thread pool: x [rows, w->k] quantized
 * per block as se_matmul quantizes it, out [rows, w->n]. Each output is one thread's dot in the kernel's fixed order,
 * so out equals se_matmul's at the best ISA bit for bit, whatever the thread count. Not concurrent with a forward. */
int se_model_matmul(se_model *m, const se_mat *w, const float *x, int rows, float *out) {
    se_act a;
    if (rows <= 0) return -1;
    if (se_act_quantized(x, rows, w->k, se_is_kquant(w->kern) ? m->kspan : 1, &a)) return -2;
    mm_task t = {w, out, w->n};
    matmul_phase(m, &t, 1, &a, rows, NULL);
    se_act_free(&a);
    return 0;
}

int se_forward(se_model *m, const se_call *c) {
    if (c->n <= 0 || c->n > m->cfg.max_rows || c->length < 0 || c->length + c->n > c->capacity ||
        c->capacity % SE_KBLOCK)
        return -1;
    for (int i = 0; i < c->n; i++)
        if (c->tokens[i] < 0 || c->tokens[i] >= m->cfg.vocab) return -2;
    for (int i = 0; i < c->n_out; i++)
        if (c->out_rows[i] < 0 || c->out_rows[i] >= c->n) return -3;
    for (int i = 0; i < c->n_run; i++)
        if (c->layers[i] < 0 || c->layers[i] >= m->cfg.n_layers || (i && c->layers[i] <= c->layers[i - 1])) return -4;
    if (se_model_ready(m) != 0) return -5;
    if (ensure_scratch(m, c->capacity)) return -6;
    run_forward(m, c);
    return 0;
}

int se_head(se_model *m, const float *h, int n, float *logits, const se_mat *w) {
    if (n <= 0 || n > m->cfg.max_rows || se_model_ready(m) != 0 || ensure_scratch(m, 1)) return -1;
    if (w && se_is_float(w->kern)) m->float_acts = 1;
    head(m, h, NULL, n, w ? w : (m->cfg.tied ? &m->embed : &m->lm_head), logits);
    return 0;
}
