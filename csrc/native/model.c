/* Model state, loading, and the LM head. The layer loop is in forward.c. */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

se_model *se_model_new(const se_cfg *cfg) {
    if (cfg->n_layers <= 0 || cfg->d_model <= 0 || cfg->d_model % SE_BLOCK || cfg->head_dim % 16 ||
        cfg->head_dim > SE_MAX_HD || cfg->n_heads <= 0 || cfg->n_kv_heads <= 0 || cfg->n_heads % cfg->n_kv_heads ||
        cfg->d_ff % SE_BLOCK ||
        (cfg->n_heads * cfg->head_dim) % SE_BLOCK || cfg->max_rows <= 0 || cfg->vocab <= 0)
        return NULL;
    se_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->kspan = cfg->post_norms ? 1 : 8;
    m->layers = calloc((size_t)cfg->n_layers, sizeof(se_layer));
    m->pool = se_pool_new(cfg->threads);
    int n = cfg->max_rows, D = cfg->d_model, F = cfg->d_ff, QD = cfg->n_heads * cfg->head_dim;
    int KVD = cfg->n_kv_heads * cfg->head_dim, big = D > F ? D : F;
    big = big > QD ? big : QD;
    m->x = calloc((size_t)n * D, sizeof(float));
    m->a = calloc((size_t)n * D, sizeof(float));
    m->q = calloc((size_t)n * QD, sizeof(float));
    m->k = calloc((size_t)n * KVD, sizeof(float));
    m->v = calloc((size_t)n * KVD, sizeof(float));
    m->att = calloc((size_t)n * QD, sizeof(float));
    m->g = calloc((size_t)n * F, sizeof(float));
    m->u = calloc((size_t)n * F, sizeof(float));
    m->act.q = malloc((size_t)n * big);
    m->act.d = malloc((size_t)n * (big / SE_BLOCK) * sizeof(float));
    m->act.s = malloc((size_t)n * (big / SE_BLOCK) * sizeof(int32_t));
    m->act.h = malloc((size_t)n * (big / SE_BLOCK) * sizeof(int32_t));
    m->act.f = malloc((size_t)n * big * sizeof(float));
    m->act.m = malloc((size_t)n * (big / SE_BLOCK) * sizeof(float));
    m->act.p = malloc((size_t)n * (big / SE_BLOCK / 2) * 3 * sizeof(int32_t) + 4);
    se_act *ff = &m->act_ff; /* the MLP's gated values: written while the gate/up matmuls still read m->act */
    ff->q = malloc((size_t)n * F);
    ff->d = malloc((size_t)n * (F / SE_BLOCK) * sizeof(float));
    ff->s = malloc((size_t)n * (F / SE_BLOCK) * sizeof(int32_t));
    ff->h = malloc((size_t)n * (F / SE_BLOCK) * sizeof(int32_t));
    ff->f = malloc((size_t)n * F * sizeof(float));
    ff->m = malloc((size_t)n * (F / SE_BLOCK) * sizeof(float));
    ff->p = malloc((size_t)n * (F / SE_BLOCK / 2) * 3 * sizeof(int32_t) + 4);
    m->nthreads = se_pool_threads(m->pool);
    m->scratch = calloc((size_t)m->nthreads, sizeof(float *));
    int units = cfg->n_heads + 2 * cfg->n_kv_heads > F / SE_BLOCK ? cfg->n_heads + 2 * cfg->n_kv_heads : F / SE_BLOCK;
    m->units = calloc((size_t)units, sizeof *m->units);
    if (!m->layers || !m->pool || !m->x || !m->a || !m->q || !m->k || !m->v || !m->att || !m->g || !m->u ||
        !m->act.q || !m->act.d || !m->act.s || !m->act.h || !m->act.f || !m->act.m || !m->act.p || !m->scratch ||
        !m->units ||
        !ff->q || !ff->d || !ff->s || !ff->h || !ff->f || !ff->m || !ff->p) {
        se_model_free(m);
        return NULL;
    }
    return m;
}

void se_model_free(se_model *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) {
            for (int w = 0; w < SE_W_NMATS; w++) se_mat_free(&m->layers[l].w[w]);
            for (int v = 0; v < SE_V_NVECS; v++) free(m->layers[l].v[v]);
        }
    se_mat_free(&m->embed);
    se_mat_free(&m->lm_head);
    free(m->norm);
    if (m->scratch)
        for (int t = 0; t < m->nthreads; t++) free(m->scratch[t]);
    free(m->scratch);
    free((void *)m->units);
    se_pool_free(m->pool);
    free(m->layers);
    free(m->x); free(m->a); free(m->q); free(m->k); free(m->v); free(m->att); free(m->g); free(m->u);
    free(m->act.q); free(m->act.d); free(m->act.s); free(m->act.h); free(m->act.f); free(m->act.m); free(m->act.p);
    free(m->act_ff.q); free(m->act_ff.d); free(m->act_ff.s); free(m->act_ff.h); free(m->act_ff.f); free(m->act_ff.m);
    free(m->act_ff.p);
    free(m);
}

/* layer -1: which 0 = embed, 1 = lm_head (matrices), 0 = final norm (vectors). */
int se_model_set_mat(se_model *m, int layer, int which, int type, const uint8_t *raw, size_t row_bytes, int n, int k) {
    se_mat *dst;
    if (layer == -1) dst = which == 0 ? &m->embed : which == 1 ? &m->lm_head : NULL;
    else if (layer >= 0 && layer < m->cfg.n_layers && which >= 0 && which < SE_W_NMATS) dst = &m->layers[layer].w[which];
    else dst = NULL;
    if (!dst) return -1;
    se_mat_free(dst);
    int rc = se_pack(dst, type, raw, row_bytes, n, k);
    if (rc == 0 && se_is_float(dst->kern)) m->float_acts = 1;
    return rc;
}

int se_model_set_vec(se_model *m, int layer, int which, const float *v, int len) {
    float **dst;
    if (layer == -1) dst = which == 0 ? &m->norm : NULL;
    else if (layer >= 0 && layer < m->cfg.n_layers && which >= 0 && which < SE_V_NVECS) dst = &m->layers[layer].v[which];
    else dst = NULL;
    if (!dst || len <= 0) return -1;
    free(*dst);
    *dst = malloc((size_t)len * sizeof(float));
    if (!*dst) return -2;
    memcpy(*dst, v, (size_t)len * sizeof(float));
    return 0;
}

static int mat_ok(const se_mat *w, int n, int k) { return w->data && w->n == n && w->k == k; }

int se_model_ready(const se_model *m) {
    const se_cfg *c = &m->cfg;
    int D = c->d_model, QD = c->n_heads * c->head_dim, KVD = c->n_kv_heads * c->head_dim, F = c->d_ff;
    if (!mat_ok(&m->embed, c->vocab, D) || !m->norm) return -1;
    if (!c->tied && !mat_ok(&m->lm_head, c->vocab, D)) return -2;
    for (int l = 0; l < c->n_layers; l++) {
        const se_layer *L = &m->layers[l];
        if (!mat_ok(&L->w[SE_W_Q], QD, D) || !mat_ok(&L->w[SE_W_K], KVD, D) || !mat_ok(&L->w[SE_W_V], KVD, D) ||
            !mat_ok(&L->w[SE_W_O], D, QD) || !mat_ok(&L->w[SE_W_GATE], F, D) || !mat_ok(&L->w[SE_W_UP], F, D) ||
            !mat_ok(&L->w[SE_W_DOWN], D, F))
            return -100 - l;
        if (!L->v[SE_V_ATTN_NORM] || !L->v[SE_V_FFN_NORM]) return -200 - l;
        if (c->qkv_bias && (!L->v[SE_V_Q_BIAS] || !L->v[SE_V_K_BIAS] || !L->v[SE_V_V_BIAS])) return -300 - l;
        if (c->o_bias && !L->v[SE_V_O_BIAS]) return -300 - l;
        if (c->qk_norm && (!L->v[SE_V_Q_NORM] || !L->v[SE_V_K_NORM])) return -400 - l;
        if (c->post_norms && (!L->v[SE_V_POST_ATTN_NORM] || !L->v[SE_V_POST_FFN_NORM])) return -500 - l;
    }
    return 0;
}

size_t se_model_bytes(const se_model *m) {
    size_t total = m->embed.group_bytes * (size_t)m->embed.ngroups;
    if (!m->cfg.tied) total += m->lm_head.group_bytes * (size_t)m->lm_head.ngroups;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int w = 0; w < SE_W_NMATS; w++) total += m->layers[l].w[w].group_bytes * (size_t)m->layers[l].w[w].ngroups;
    return total;
}
