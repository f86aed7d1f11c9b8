/* The transformer forward over the packed weights (llama2.c's shape: one struct of weights, one of call state, one
 * function per step). The families differ only in the flags of se_cfg (models/block.py declares them). */
#ifndef SE_MODEL_H
#define SE_MODEL_H
#include "pool.h"
#include "se.h"

enum { SE_ACT_SILU = 0, SE_ACT_GELU_TANH = 1 };

typedef struct {
    int n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab;
    float rms_eps, embed_scale;
    int activation, qkv_bias, o_bias, qk_norm, post_norms, tied;
    int max_rows;   /* most rows one call takes (the workspace is sized for it) */
    int threads;
} se_cfg;

/* Per-layer tensors; vectors are float32 multipliers (a norm's stored weight already turned into what it
 * multiplies by, BlockSpec.norm_scale). */
enum { SE_W_Q, SE_W_K, SE_W_V, SE_W_O, SE_W_GATE, SE_W_UP, SE_W_DOWN, SE_W_NMATS };
enum { SE_V_ATTN_NORM, SE_V_FFN_NORM, SE_V_Q_BIAS, SE_V_K_BIAS, SE_V_V_BIAS, SE_V_O_BIAS, SE_V_Q_NORM, SE_V_K_NORM,
       SE_V_POST_ATTN_NORM, SE_V_POST_FFN_NORM, SE_V_NVECS };

typedef struct se_model se_model;

/* One call: n rows appended at cache slots length .. length + n - 1.
 * mask: NULL for a chain, else [n, n] bytes (mask[i*n + j]: new row i sees new row j); positions: [n] RoPE
 * positions (length + i for a chain, length + depth for a tree); rope_cos/sin[layer]: [positions, rope_half[layer]]
 * tables indexed by position, covering every position of the call (rope_half 0: no RoPE), window[layer]: 0 or the sliding window. k_cache/v_cache: fp16 [layers, kv heads, capacity,
 * head_dim]. layers: the layer indices to run (ascending), taps: after how many layers h is copied to tap_out[t]
 * ([n, d_model] each). h_out: [n, d_model] after the last layer, before the final norm (NULL: not wanted).
 * logits: [n_out, vocab] for rows out_rows (NULL: no LM head). */
typedef struct {
    int n, length, capacity;
    const int32_t *tokens, *positions;
    const uint8_t *mask;
    const float *const *rope_cos, *const *rope_sin;
    const int32_t *rope_half, *window;
    uint16_t *k_cache, *v_cache;
    const int32_t *layers;
    int n_run;
    const int32_t *taps;
    int n_taps;
    float *const *tap_out;
    float *h_out;
    const int32_t *out_rows;
    int n_out;
    float *logits;
} se_call;

se_model *se_model_new(const se_cfg *cfg);
void se_model_free(se_model *m);
int se_model_set_mat(se_model *m, int layer, int which, int type, const uint8_t *raw, size_t row_bytes, int n, int k);
int se_model_set_vec(se_model *m, int layer, int which, const float *v, int len);
int se_model_ready(const se_model *m);   /* 0 when every tensor the config needs is set, else a negative code */
int se_forward(se_model *m, const se_call *c);
/* Final norm + LM head on hidden states h [n, d_model] -> logits [n, head rows]; head NULL: the model's own. */
int se_head(se_model *m, const float *h, int n, float *logits, const se_mat *head);
int se_model_matmul(se_model *m, const se_mat *w, const float *x, int rows, float *out);
size_t se_model_bytes(const se_model *m);
#endif
