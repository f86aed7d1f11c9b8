/* The forward: every thread runs `job`, phases separated by barriers. Work is split by output-row groups
 * (matmuls), by (row, head) (RoPE, attention) and by rows (norms); a row's arithmetic never depends on the split. */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    se_model *m;
    const se_call *c;
    const float *h_in;   /* se_head: hidden states instead of a forward */
    const se_mat *head;
    float *logits;
    int n_head_rows;
} job_ctx;

static void rms_norm(const float *x, const float *w, int n, float eps, float *y) {
    float ss = 0.0f;
    for (int d = 0; d < n; d++) ss += x[d] * x[d];
    float s = sqrtf(ss / (float)n + eps);
    for (int d = 0; d < n; d++) y[d] = x[d] / s * w[d];
}

static void quantize_span(const float *x, int n, se_act *a, int row, int col) {
    for (int b = 0; b < n / SE_BLOCK; b++) {
        int blk = col / SE_BLOCK + b;
        se_quantize_block(x + b * SE_BLOCK, a->q + (size_t)row * a->k + blk * SE_BLOCK, a->d + (size_t)row * a->nb + blk,
                          a->s + (size_t)row * a->nb + blk, a->h + (size_t)row * a->nb + blk);
    }
}

static se_act act_view(se_model *m, int k) {
    se_act a = m->act;
    a.k = k;
    a.nb = k / SE_BLOCK;
    return a;
}

typedef struct { const se_mat *w; float *out; int ldo; } mm_task;

/* This thread's share of the output groups of several matrices over the same activations. */
static void matmuls(const mm_task *t, int count, const se_act *x, int rows, int ith, int nth) {
    int total = 0;
    for (int i = 0; i < count; i++) total += t[i].w->ngroups;
    int a, b;
    se_split(total, ith, nth, &a, &b);
    for (int i = 0, base = 0; i < count; base += t[i].w->ngroups, i++) {
        int g0 = a > base ? a - base : 0, g1 = b - base < t[i].w->ngroups ? b - base : t[i].w->ngroups;
        if (g0 < g1) se_mm_for(t[i].w)(t[i].w, x, rows, t[i].out, t[i].ldo, g0, g1);
    }
}

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

static void attend(se_model *m, const se_call *c, int l, int r, int h, float *scratch) {
    const se_cfg *cf = &m->cfg;
    const se_vec_ops *ops = se_vec();
    int hd = cf->head_dim, QD = cf->n_heads * hd, kvh = h / (cf->n_heads / cf->n_kv_heads);
    size_t head_base = ((size_t)l * cf->n_kv_heads + kvh) * (size_t)c->capacity * hd;
    const uint16_t *K = c->k_cache + head_base, *V = c->v_cache + head_base;
    const float *q = m->q + (size_t)r * QD + (size_t)h * hd;
    float *sc = scratch, scale = (float)(1.0 / sqrt((double)hd));
    int32_t *idx = (int32_t *)(scratch + c->capacity + cf->max_rows);
    int win = c->window[l], pos = c->positions[r], cnt = 0;
    for (int s = 0; s < c->length; s++) {
        if (win && pos - s >= win) continue;
        idx[cnt] = s;
        sc[cnt++] = ops->dot_f16(q, K + (size_t)s * hd, hd) * scale;
    }
    for (int j = 0; j < c->n; j++) {
        int seen = c->mask ? c->mask[r * c->n + j] : j <= r;
        if (!seen || (win && pos - c->positions[j] >= win)) continue;
        idx[cnt] = c->length + j;
        sc[cnt++] = ops->dot_f16(q, K + (size_t)(c->length + j) * hd, hd) * scale;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < cnt; i++) mx = sc[i] > mx ? sc[i] : mx;
    for (int i = 0; i < cnt; i++) sc[i] = sc[i] - mx;
    ops->exp_inplace(sc, cnt);
    for (int i = 0; i < cnt; i++) sum += sc[i];
    float *out = m->att + (size_t)r * QD + (size_t)h * hd;
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int i = 0; i < cnt; i++) ops->axpy_f16(out, sc[i], V + (size_t)idx[i] * hd, hd);
    float inv = 1.0f / sum;
    for (int d = 0; d < hd; d++) out[d] = out[d] * inv;
    if (hd % SE_BLOCK == 0) { /* whole blocks: quantized here; else by rows once every head is done */
        se_act a = act_view(m, QD);
        quantize_span(out, hd, &a, r, h * hd);
    }
}

/* RoPE, norms and biases of one (row, head); K and V heads also go into the cache. */
static void prepare_head(se_model *m, const se_call *c, int l, int r, int h) {
    const se_cfg *cf = &m->cfg;
    const se_layer *L = &m->layers[l];
    int hd = cf->head_dim, H = cf->n_heads, QD = H * hd, KVD = cf->n_kv_heads * hd, half = c->rope_half[l];
    int is_q = h < H, kh = is_q ? h : h - H;
    float *x = is_q ? m->q + (size_t)r * QD + (size_t)h * hd : m->k + (size_t)r * KVD + (size_t)kh * hd;
    if (cf->qkv_bias) add(x, L->v[is_q ? SE_V_Q_BIAS : SE_V_K_BIAS] + (size_t)kh * hd, hd);
    if (cf->qk_norm) rms_norm(x, L->v[is_q ? SE_V_Q_NORM : SE_V_K_NORM], hd, cf->rms_eps, x);
    if (half) rope(x, c->rope_cos[l] + (size_t)r * half, c->rope_sin[l] + (size_t)r * half, half);
    if (is_q) return;
    size_t at = (((size_t)l * cf->n_kv_heads + kh) * (size_t)c->capacity + (size_t)(c->length + r)) * hd;
    float *v = m->v + (size_t)r * KVD + (size_t)kh * hd;
    if (cf->qkv_bias) add(v, L->v[SE_V_V_BIAS] + (size_t)kh * hd, hd);
    for (int d = 0; d < hd; d++) {
        c->k_cache[at + d] = se_f32_to_f16(x[d]);
        c->v_cache[at + d] = se_f32_to_f16(v[d]);
    }
}

static float activation(int kind, float g) {
    if (kind == SE_ACT_SILU) return g / (1.0f + se_expf(-g));
    const float k = (float)0.7978845608028654; /* sqrt(2 / pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}

static void layer(se_model *m, const se_call *c, int l, int ith, int nth, float *tmp, float *scratch) {
    const se_cfg *cf = &m->cfg;
    const se_layer *L = &m->layers[l];
    int n = c->n, D = cf->d_model, F = cf->d_ff, H = cf->n_heads, KV = cf->n_kv_heads, hd = cf->head_dim;
    int QD = H * hd, KVD = KV * hd, r0, r1, a, b;
    se_split(n, ith, nth, &r0, &r1);
    se_act xD = act_view(m, D), xQ = act_view(m, QD), xF = act_view(m, F);
    for (int r = r0; r < r1; r++) {
        rms_norm(m->x + (size_t)r * D, L->v[SE_V_ATTN_NORM], D, cf->rms_eps, tmp);
        quantize_span(tmp, D, &xD, r, 0);
    }
    se_barrier(m->pool);
    mm_task qkv[3] = {{&L->w[SE_W_Q], m->q, QD}, {&L->w[SE_W_K], m->k, KVD}, {&L->w[SE_W_V], m->v, KVD}};
    matmuls(qkv, 3, &xD, n, ith, nth);
    se_barrier(m->pool);
    se_split(n * (H + KV), ith, nth, &a, &b);
    for (int it = a; it < b; it++) prepare_head(m, c, l, it / (H + KV), it % (H + KV));
    se_barrier(m->pool);
    se_split(n * H, ith, nth, &a, &b);
    for (int it = a; it < b; it++) attend(m, c, l, it / H, it % H, scratch);
    se_barrier(m->pool);
    if (hd % SE_BLOCK) {
        for (int r = r0; r < r1; r++) quantize_span(m->att + (size_t)r * QD, QD, &xQ, r, 0);
        se_barrier(m->pool);
    }
    mm_task o = {&L->w[SE_W_O], m->a, D};
    matmuls(&o, 1, &xQ, n, ith, nth);
    se_barrier(m->pool);
    for (int r = r0; r < r1; r++) {
        float *ar = m->a + (size_t)r * D, *xr = m->x + (size_t)r * D;
        if (cf->o_bias) add(ar, L->v[SE_V_O_BIAS], D);
        if (cf->post_norms) rms_norm(ar, L->v[SE_V_POST_ATTN_NORM], D, cf->rms_eps, ar);
        add(xr, ar, D);
        rms_norm(xr, L->v[SE_V_FFN_NORM], D, cf->rms_eps, tmp);
        quantize_span(tmp, D, &xD, r, 0);
    }
    se_barrier(m->pool);
    mm_task gu[2] = {{&L->w[SE_W_GATE], m->g, F}, {&L->w[SE_W_UP], m->u, F}};
    matmuls(gu, 2, &xD, n, ith, nth);
    se_barrier(m->pool);
    se_split(n * (F / SE_BLOCK), ith, nth, &a, &b);
    for (int it = a; it < b; it++) {
        int r = it / (F / SE_BLOCK), col = (it % (F / SE_BLOCK)) * SE_BLOCK;
        const float *g = m->g + (size_t)r * F + col, *u = m->u + (size_t)r * F + col;
        for (int j = 0; j < SE_BLOCK; j++) tmp[j] = activation(cf->activation, g[j]) * u[j];
        quantize_span(tmp, SE_BLOCK, &xF, r, col);
    }
    se_barrier(m->pool);
    mm_task down = {&L->w[SE_W_DOWN], m->a, D};
    matmuls(&down, 1, &xF, n, ith, nth);
    se_barrier(m->pool);
    for (int r = r0; r < r1; r++) {
        float *ar = m->a + (size_t)r * D;
        if (cf->post_norms) rms_norm(ar, L->v[SE_V_POST_FFN_NORM], D, cf->rms_eps, ar);
        add(m->x + (size_t)r * D, ar, D);
    }
    /* no barrier: the next phase that reads these rows (the next layer's norm, a tap) is this thread's own */
}

/* Final norm + LM head over rows `rows` (NULL: 0..count-1) of hidden states h. */
static void head(se_model *m, const float *h, const int32_t *rows, int count, const se_mat *w, float *logits,
                 int ith, int nth, float *tmp) {
    int D = m->cfg.d_model, r0, r1;
    se_act xD = act_view(m, D);
    se_split(count, ith, nth, &r0, &r1);
    for (int i = r0; i < r1; i++) {
        rms_norm(h + (size_t)(rows ? rows[i] : i) * D, m->norm, D, m->cfg.rms_eps, tmp);
        quantize_span(tmp, D, &xD, i, 0);
    }
    se_barrier(m->pool);
    mm_task t = {w, logits, w->n};
    matmuls(&t, 1, &xD, count, ith, nth);
}

static void job(void *p, int ith, int nth) {
    job_ctx *j = p;
    se_model *m = j->m;
    const se_call *c = j->c;
    int D = m->cfg.d_model, r0, r1;
    float *scratch = m->scratch[ith];
    float *tmp = scratch + m->scratch_len - (size_t)D - 64 - SE_BLOCK;
    if (j->h_in) {
        head(m, j->h_in, NULL, j->n_head_rows, j->head, j->logits, ith, nth, tmp);
        return;
    }
    const se_mat *lm = m->cfg.tied ? &m->embed : &m->lm_head;
    se_split(c->n, ith, nth, &r0, &r1);
    for (int r = r0; r < r1; r++) {
        float *x = m->x + (size_t)r * D;
        se_dequant_row(&m->embed, c->tokens[r], x);
        if (m->cfg.embed_scale != 1.0f)
            for (int d = 0; d < D; d++) x[d] = x[d] * m->cfg.embed_scale;
    }
    for (int t = 0; t < c->n_taps; t++)
        if (c->taps[t] == 0)
            for (int r = r0; r < r1; r++) memcpy(c->tap_out[t] + (size_t)r * D, m->x + (size_t)r * D, D * sizeof(float));
    se_barrier(m->pool);
    for (int li = 0; li < c->n_run; li++) {
        int l = c->layers[li];
        layer(m, c, l, ith, nth, tmp, scratch);
        for (int t = 0; t < c->n_taps; t++)
            if (c->taps[t] == l + 1)
                for (int r = r0; r < r1; r++)
                    memcpy(c->tap_out[t] + (size_t)r * D, m->x + (size_t)r * D, D * sizeof(float));
    }
    if (c->h_out)
        for (int r = r0; r < r1; r++) memcpy(c->h_out + (size_t)r * D, m->x + (size_t)r * D, D * sizeof(float));
    if (c->logits && c->n_out > 0) {
        se_barrier(m->pool); /* the head's rows may belong to another thread's share */
        head(m, m->x, c->out_rows, c->n_out, lm, c->logits, ith, nth, tmp);
    }
}

static int ensure_scratch(se_model *m, int capacity) {
    size_t want = 2 * ((size_t)capacity + (size_t)m->cfg.max_rows) + (size_t)m->cfg.d_model + 64 + SE_BLOCK;
    if (want <= m->scratch_len) return 0;
    for (int t = 0; t < m->nthreads; t++) {
        float *s = realloc(m->scratch[t], want * sizeof(float));
        if (!s) return -1;
        m->scratch[t] = s;
    }
    m->scratch_len = want;
    return 0;
}

int se_forward(se_model *m, const se_call *c) {
    if (c->n <= 0 || c->n > m->cfg.max_rows || c->length < 0 || c->length + c->n > c->capacity) return -1;
    for (int i = 0; i < c->n; i++)
        if (c->tokens[i] < 0 || c->tokens[i] >= m->cfg.vocab) return -2;
    for (int i = 0; i < c->n_out; i++)
        if (c->out_rows[i] < 0 || c->out_rows[i] >= c->n) return -3;
    for (int i = 0; i < c->n_run; i++)
        if (c->layers[i] < 0 || c->layers[i] >= m->cfg.n_layers || (i && c->layers[i] <= c->layers[i - 1])) return -4;
    if (se_model_ready(m) != 0) return -5;
    if (ensure_scratch(m, c->capacity)) return -6;
    job_ctx j = {m, c, NULL, NULL, NULL, 0};
    se_pool_run(m->pool, job, &j);
    return 0;
}

int se_head(se_model *m, const float *h, int n, float *logits, const se_mat *w) {
    if (n <= 0 || n > m->cfg.max_rows || se_model_ready(m) != 0 || ensure_scratch(m, 1)) return -1;
    job_ctx j = {m, NULL, h, w ? w : (m->cfg.tied ? &m->embed : &m->lm_head), logits, n};
    se_pool_run(m->pool, job, &j);
    return 0;
}
