#ifndef SE_MODEL_INTERNAL_H
#define SE_MODEL_INTERNAL_H
#include "model.h"

#include <stdatomic.h>

typedef struct {
    se_mat w[SE_W_NMATS];
    float *v[SE_V_NVECS];
} se_layer;

struct se_model {
    se_cfg cfg;
    se_layer *layers;
    se_mat embed, lm_head;
    float *norm;
    se_pool *pool;
    int nthreads;
    /* workspace for max_rows rows */
    float *x, *a, *q, *k, *v, *att, *g, *u;
    se_act act, act_ff;  /* quantized activations: the matmuls' inputs; act_ff: the down projection's */
    int float_acts;      /* a float-weight matrix is loaded: the activations keep their float rows too (act.f) */
    int kspan;           /* the span of the activations a K-quant matrix reads: 8, or 1 where a family's activations
                            lose too much at one scale per 256 (gemma3's post-norm stream: docs/native.md) */
    float **scratch;     /* per thread: attention scores and a row, grown to the cache's capacity */
    _Atomic int *units;  /* a fused matmul phase's groups done per unit (n_heads + 2 n_kv_heads, or d_ff / 32) */
    size_t scratch_len;
};

/* forward.c: the activations' view for a k-wide input; a span of a row quantized into it */
enum { SE_IN_ATT, SE_IN_O, SE_IN_MLP, SE_IN_DOWN };
se_act se_act_of(se_model *m, int l, int which);
void se_quantize_span(const float *x, int n, se_act *a, int row, int col);

/* attention.c: one layer's attention for the call's rows (after the QKV phase has filled q and the cache) */
void se_attention(se_model *m, const se_call *c, int l);

static inline void se_split(int total, int ith, int nth, int *a, int *b) {
    *a = (int)((long long)total * ith / nth);
    *b = (int)((long long)total * (ith + 1) / nth);
}
#endif
