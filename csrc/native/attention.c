/* Attention of the call's rows over the KV cache (docs/native.md, "Attention"). An item is a run of up to SE_QUERIES
 * queries of one KV head, a query being a (row, head) pair, rows outer: they share each key's and each V row's load
 * and fp16 conversion. A query's scores are one fused chain per key over the dimensions (vec.c, the K cache in
 * dims-major blocks of SE_KBLOCK keys); its softmax runs over exactly the keys its row sees (max, exp, sum in one
 * fixed order); its weighted sum of V rows runs over the item's keys in order, a key its row does not see weighing
 * +0, which leaves the sum's value as it was. So a row's bits never depend on the call's width, on which queries
 * share its item, or on the threads. */
#include "model_internal.h"

#include <math.h>
#include <string.h>

typedef struct {
    se_model *m;
    const se_call *c;
    int l, parts; /* each KV head's n x G queries in `parts` items as even as they divide */
} att_phase;

/* the item's keys: the cached ones from the first any of its rows sees, then the call's rows any of them sees */
typedef struct {
    int32_t *keys, *chain; /* chain[j]: the position of the call's row j among the keys, or -1 */
    int cnt, first;        /* first: the first cached key, at position 0 */
} key_set;

static int first_seen(const se_call *c, int l, int r) {
    int win = c->window[l], pos = c->positions[r];
    return win && pos - win + 1 > 0 ? pos - win + 1 : 0;
}

static int sees_row(const se_call *c, int l, int r, int j) {
    int win = c->window[l], seen = c->mask ? c->mask[r * c->n + j] : j <= r;
    return seen && !(win && c->positions[r] - c->positions[j] >= win);
}

/* row r's keys, in order: the cached ones its window holds, then the call's rows it sees */
static int row_keys(const se_call *c, int l, int r, int32_t *idx) {
    int cnt = 0;
    for (int s = first_seen(c, l, r); s < c->length; s++) idx[cnt++] = s;
    for (int j = 0; j < c->n; j++)
        if (sees_row(c, l, r, j)) idx[cnt++] = c->length + j;
    return cnt;
}

static void item_keys(const se_call *c, int l, int r0, int r1, key_set *u) {
    u->first = c->length;
    for (int r = r0; r <= r1; r++) {
        int f = first_seen(c, l, r);
        u->first = f < u->first ? f : u->first;
    }
    u->cnt = 0;
    for (int s = u->first; s < c->length; s++) u->keys[u->cnt++] = s;
    for (int j = 0; j < c->n; j++) {
        int any = 0;
        for (int r = r0; r <= r1 && !any; r++) any = sees_row(c, l, r, j);
        u->chain[j] = any ? u->cnt : -1;
        if (any) u->keys[u->cnt++] = c->length + j;
    }
}

static int key_pos(const se_call *c, const key_set *u, int key) {
    return key < c->length ? key - u->first : u->chain[key - c->length];
}

/* One query's weights: its scores (sc[key - base], whole blocks) gathered to its row's keys in order, the softmax
 * there (returns the sum), then spread over the item's keys, +0 where its row sees none; all in place (a key's
 * place in its row's keys <= its place in the item's <= key - base). */
static float softmax_spread(const se_call *c, const key_set *u, const int32_t *idx, int cnt, int base, float *sc) {
    int run = idx[cnt - 1] - idx[0] == cnt - 1;
    if (run) memmove(sc, sc + idx[0] - base, (size_t)cnt * sizeof(float));
    else
        for (int i = 0; i < cnt; i++) sc[i] = sc[idx[i] - base];
    float sum = se_rows()->exp_sum(sc, cnt, se_rows()->max(sc, cnt));
    int p0 = key_pos(c, u, idx[0]), p1 = key_pos(c, u, idx[cnt - 1]);
    if (p1 - p0 == cnt - 1) { /* the row's keys are one run of the item's (a causal chain, a window) */
        memmove(sc + p0, sc, (size_t)cnt * sizeof(float));
        memset(sc + p0 + cnt, 0, (size_t)(u->cnt - p0 - cnt) * sizeof(float));
    } else {
        memset(sc + p1 + 1, 0, (size_t)(u->cnt - p1 - 1) * sizeof(float));
        for (int i = cnt - 1, next = p1 + 1; i >= 0; i--) {
            int p = key_pos(c, u, idx[i]);
            float v = sc[i];
            for (int z = p + 1; z < next; z++) sc[z] = 0.0f;
            sc[p] = v, next = p;
        }
    }
    memset(sc, 0, (size_t)p0 * sizeof(float));
    return sum;
}

/* queries q0 .. q0 + nq - 1 of KV head g (query i: row i / G, head g G + i % G) */
static void attend(se_model *m, const se_call *c, int l, int g, int q0, int nq, float *scratch) {
    const se_cfg *cf = &m->cfg;
    int hd = cf->head_dim, QD = cf->n_heads * hd, G = cf->n_heads / cf->n_kv_heads;
    size_t head_base = ((size_t)l * cf->n_kv_heads + g) * (size_t)c->capacity * hd;
    const uint16_t *K = c->k_cache + head_base, *V = c->v_cache + head_base;
    size_t span = (size_t)c->capacity + (size_t)cf->max_rows;
    key_set u = {.keys = (int32_t *)(scratch + SE_QUERIES * span)};
    int32_t *idx = u.keys + span;
    u.chain = idx + span;
    item_keys(c, l, q0 / G, (q0 + nq - 1) / G, &u);
    const float *q[SE_QUERIES];
    float *sc[SE_QUERIES], *out[SE_QUERIES], sum[SE_QUERIES];
    int row[SE_QUERIES], col[SE_QUERIES]; /* query j's row, and its head's first column in the row */
    for (int j = 0; j < nq; j++) {
        row[j] = (q0 + j) / G, col[j] = (g * G + (q0 + j) % G) * hd;
        q[j] = m->q + (size_t)row[j] * QD + col[j];
        sc[j] = scratch + j * span;
        out[j] = m->att + (size_t)row[j] * QD + col[j];
    }
    int b0 = u.keys[0] / SE_KBLOCK, base = b0 * SE_KBLOCK;
    se_vec()->scores(q, nq, K, b0, u.keys[u.cnt - 1] / SE_KBLOCK - b0 + 1, hd, (float)(1.0 / sqrt((double)hd)), sc);
    for (int j = 0, cnt = 0; j < nq; j++) {
        if (j == 0 || row[j] != row[j - 1]) cnt = row_keys(c, l, row[j], idx);
        sum[j] = softmax_spread(c, &u, idx, cnt, base, sc[j]);
    }
    se_vec()->wsum_q((const float *const *)sc, nq, V, u.keys, u.cnt, hd, out);
    se_act xO = se_act_of(m, l, SE_IN_O);
    for (int j = 0; j < nq; j++) {
        float inv = 1.0f / sum[j];
        for (int d = 0; d < hd; d++) out[j][d] = out[j][d] * inv;
        if (hd % SE_BLOCK == 0 && xO.span == 1) /* whole blocks: quantized here; else by rows once every head is
                                                  done (forward.c) */
            se_quantize_span(out[j], hd, &xO, row[j], col[j]);
    }
}

/* items: (KV head, part of its queries), parts innermost: a thread's contiguous share reads few heads' keys and
 * values, each from memory once and then from its cache */
static void attend_items(void *p, int thread, int a, int b) {
    const att_phase *ph = p;
    const se_cfg *cf = &ph->m->cfg;
    int nG = ph->c->n * (cf->n_heads / cf->n_kv_heads), base = nG / ph->parts, extra = nG % ph->parts;
    for (int it = a; it < b; it++) {
        int g = it / ph->parts, part = it % ph->parts;
        int q0 = part * base + (part < extra ? part : extra), nq = base + (part < extra);
        attend(ph->m, ph->c, ph->l, g, q0, nq, ph->m->scratch[thread]);
    }
}

/* Each KV head's queries in the fewest parts of at most SE_QUERIES that make the items a multiple of the threads
 * (SmolLM2's 3 KV heads at 5 rows on 2 threads: 6 items of 8 and 7 queries, not 3 of 15). One row waits on its
 * keys' memory more than on arithmetic, so there it is enough that every thread has an item (SmolLM2: 3 items, a
 * KV head's keys read by one thread; 6 measured 0.4% slower). */
void se_attention(se_model *m, const se_call *c, int l) {
    int nG = c->n * (m->cfg.n_heads / m->cfg.n_kv_heads), threads = se_pool_threads(m->pool), kv = m->cfg.n_kv_heads;
    int parts = (nG + SE_QUERIES - 1) / SE_QUERIES;
    while ((c->n == 1 ? kv * parts < threads : (kv * parts) % threads) && parts < nG) parts++;
    att_phase ph = {m, c, l, parts};
    se_pool_for(m->pool, kv * parts, 1, attend_items, &ph);
}
