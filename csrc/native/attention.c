/* Attention of the call's rows over the KV cache (docs/native.md, "Attention"): an item is one KV head's group of
 * query heads (up to SE_QUERIES at a time, sharing each key's load and fp16 conversion) for one row. Its scores are
 * one fused chain per key over the dimensions (vec.c, the K cache in dims-major blocks of SE_KBLOCK keys), then
 * max, exp, sum and the weighted sum of V rows in one fixed order: a row's bits never depend on the call's width or
 * on the threads. */
#include "model_internal.h"

#include <math.h>
#include <string.h>

typedef struct {
    se_model *m;
    const se_call *c;
    int l;
} att_phase;

/* Attention of row r for query heads h0 .. h0 + nq - 1, all of one KV head (they share its keys' loads). */
static void attend(se_model *m, const se_call *c, int l, int r, int h0, int nq, float *scratch) {
    const se_cfg *cf = &m->cfg;
    const se_vec_ops *ops = se_vec();
    int hd = cf->head_dim, QD = cf->n_heads * hd, kvh = h0 / (cf->n_heads / cf->n_kv_heads);
    size_t head_base = ((size_t)l * cf->n_kv_heads + kvh) * (size_t)c->capacity * hd;
    const uint16_t *K = c->k_cache + head_base, *V = c->v_cache + head_base;
    size_t span = (size_t)c->capacity + (size_t)cf->max_rows;
    int32_t *idx = (int32_t *)(scratch + SE_QUERIES * span);
    float scale = (float)(1.0 / sqrt((double)hd));
    int win = c->window[l], pos = c->positions[r], cnt = 0, first = win && pos - win + 1 > 0 ? pos - win + 1 : 0;
    for (int s = first; s < c->length; s++) idx[cnt++] = s;
    for (int j = 0; j < c->n; j++) {
        int seen = c->mask ? c->mask[r * c->n + j] : j <= r;
        if (seen && !(win && pos - c->positions[j] >= win)) idx[cnt++] = c->length + j;
    }
    const float *q[SE_QUERIES];
    float *sc[SE_QUERIES], *out[SE_QUERIES], sum[SE_QUERIES];
    for (int j = 0; j < nq; j++) {
        q[j] = m->q + (size_t)r * QD + (size_t)(h0 + j) * hd;
        sc[j] = scratch + j * span;
        out[j] = m->att + (size_t)r * QD + (size_t)(h0 + j) * hd;
    }
    /* scores of every key in the blocks the row sees, then kept in idx's order (in place: idx[i] - base >= i; a
     * chain's keys are one run, so only moved down) */
    int b0 = idx[0] / SE_KBLOCK, base = b0 * SE_KBLOCK, run = idx[cnt - 1] - idx[0] == cnt - 1;
    ops->scores(q, nq, K, b0, idx[cnt - 1] / SE_KBLOCK - b0 + 1, hd, scale, sc);
    for (int j = 0; j < nq; j++) {
        if (run) memmove(sc[j], sc[j] + idx[0] - base, (size_t)cnt * sizeof(float));
        else
            for (int i = 0; i < cnt; i++) sc[j][i] = sc[j][idx[i] - base];
    }
    for (int j = 0; j < nq; j++) {
        float mx = se_rows()->max(sc[j], cnt);
        for (int i = 0; i < cnt; i++) sc[j][i] = sc[j][i] - mx;
        ops->exp_inplace(sc[j], cnt);
        sum[j] = se_rows()->sum(sc[j], cnt);
    }
    ops->wsum_q((const float *const *)sc, nq, V, idx, cnt, hd, out);
    for (int j = 0; j < nq; j++) {
        float inv = 1.0f / sum[j];
        for (int d = 0; d < hd; d++) out[j][d] = out[j][d] * inv;
        if (hd % SE_BLOCK == 0) { /* whole blocks: quantized here; else by rows once every head is done */
            se_act a = se_act_view(m, QD);
            se_quantize_span(out[j], hd, &a, r, (h0 + j) * hd);
        }
    }
}

/* items: (KV head, part of its query heads of up to SE_QUERIES, row), rows innermost: a thread's contiguous share
 * reads few heads' keys and values, each from memory once and then from its cache */
static void attend_items(void *p, int thread, int a, int b) {
    const att_phase *ph = p;
    const se_cfg *cf = &ph->m->cfg;
    int G = cf->n_heads / cf->n_kv_heads, parts = (G + SE_QUERIES - 1) / SE_QUERIES, n = ph->c->n;
    for (int it = a; it < b; it++) {
        /* the group's G query heads in parts as even as SE_QUERIES allows (gemma3's 4: 2 + 2, not 3 + 1, so one
         * row's two items take equal time); a query's arithmetic does not depend on its part */
        int r = it % n, g = it / n / parts, part = it / n % parts, base = G / parts, extra = G % parts;
        int h0 = g * G + part * base + (part < extra ? part : extra), nq = base + (part < extra);
        attend(ph->m, ph->c, ph->l, r, h0, nq, ph->m->scratch[thread]);
    }
}

void se_attention(se_model *m, const se_call *c, int l) {
    int G = m->cfg.n_heads / m->cfg.n_kv_heads, parts = (G + SE_QUERIES - 1) / SE_QUERIES;
    att_phase ph = {m, c, l};
    se_pool_for(m->pool, c->n * m->cfg.n_kv_heads * parts, 1, attend_items, &ph);
}
