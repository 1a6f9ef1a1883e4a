/*
 * eagle3.h - an EAGLE3 draft head in the published Hugging Face layout (docs/speculative.md):
 * its config.json, its tensors bound by name, and the checks that it fits a target model.
 *
 * The head is one Llama-style decoder layer that reads the target's residual stream at three
 * layer boundaries (concatenated [3H], projected to H by fc) next to the embedding of the
 * next token, and predicts the token after it over a reduced draft vocabulary (d2t maps a
 * draft id to a target id). Tensor names (prefix "midlayer." or "layers.0."):
 *   fc.weight [H, 3H]; midlayer.input_layernorm.weight [H] (the embedding's norm);
 *   midlayer.hidden_norm.weight [H]; midlayer.self_attn.{q,k,v}_proj.weight [NH*D | NKV*D, 2H];
 *   midlayer.self_attn.o_proj.weight [H, NH*D]; midlayer.post_attention_layernorm.weight [H];
 *   midlayer.mlp.{gate,up}_proj.weight [I, H]; midlayer.mlp.down_proj.weight [H, I];
 *   norm.weight [H]; lm_head.weight [DV, H]; d2t [DV] int64; t2d [V] bool (both may be left
 *   out when DV == V);
 *   embed_tokens.weight [V, H] (optional: else the target's embedding).
 * Knows nothing of devices or the engine; the tensors are views into the mapped files.
 */
#ifndef GPTOSS_MODEL_EAGLE3_H
#define GPTOSS_MODEL_EAGLE3_H

#include "format/tensor.h"
#include "gptoss.h"

#include <stdbool.h>
#include <stdint.h>

#define GPTOSS_EAGLE3_N_AUX 3

typedef struct gptoss_eagle3_config {
    int32_t hidden_size;       /* H: the head's width, equal to the target's */
    int32_t intermediate_size; /* I: the SwiGLU MLP's width */
    int32_t n_heads;           /* query heads */
    int32_t n_kv_heads;        /* key/value heads (GQA) */
    int32_t head_dim;          /* D */
    int32_t vocab_size;        /* V: the target's vocabulary (t2d, embed_tokens) */
    int32_t draft_vocab_size;  /* DV: lm_head rows */
    double rms_norm_eps;
    double rope_theta; /* plain RoPE (rotate-half), no scaling */
    /* eagle_config.eagle_aux_hidden_state_layer_ids as written; -1 when absent (then the
     * boundaries default to 2, L/2, L-3 of the target, SGLang's and vLLM's default). */
    int32_t aux_layer_ids[GPTOSS_EAGLE3_N_AUX];
} gptoss_eagle3_config;

/* Parses and validates a head's config.json text (the message names the field). */
gptoss_status gptoss_eagle3_config_parse(const char *json_text, size_t len,
                                         gptoss_eagle3_config *config, gptoss_error *error);

/* Writes config.json text for c (malloc'd), in the published layout. */
char *gptoss_eagle3_config_to_json(const gptoss_eagle3_config *c);

/*
 * The three target boundaries the head reads, for a target of n_layers layers. Boundary b is
 * the residual stream after b decoder layers (the input of layer b; b = n_layers is the
 * output of the last layer, before the final norm). The layer ids of published heads follow
 * one of two conventions, told apart as SGLang does: when the first id is 1 (SpecForge's
 * heads, e.g. [1, 17, 33] for 120b) an id names the layer whose OUTPUT is read (boundary =
 * id + 1); otherwise an id is the boundary itself (the input of layer id).
 */
gptoss_status gptoss_eagle3_boundaries(const gptoss_eagle3_config *c, int32_t n_layers,
                                       int32_t boundaries[GPTOSS_EAGLE3_N_AUX],
                                       gptoss_error *error);

typedef struct gptoss_eagle3_weights {
    gptoss_tensor fc;          /* [H, 3H] bf16 */
    gptoss_tensor input_norm;  /* [H] the embedding's norm */
    gptoss_tensor hidden_norm; /* [H] the hidden input's norm */
    gptoss_tensor q;           /* [NH*D, 2H] bf16 */
    gptoss_tensor k;           /* [NKV*D, 2H] bf16 */
    gptoss_tensor v;           /* [NKV*D, 2H] bf16 */
    gptoss_tensor o;           /* [H, NH*D] bf16 */
    gptoss_tensor post_norm;   /* [H] */
    gptoss_tensor gate;        /* [I, H] bf16 */
    gptoss_tensor up;          /* [I, H] bf16 */
    gptoss_tensor down;        /* [H, I] bf16 */
    gptoss_tensor final_norm;  /* [H] norm.weight */
    gptoss_tensor lm_head;     /* [DV, H] bf16 */
    gptoss_tensor embed;       /* [V, H] bf16; data NULL when the head has none */
    float *input_norm_f32;     /* [H] the norms widened once */
    float *hidden_norm_f32;    /* [H] */
    float *post_norm_f32;      /* [H] */
    float *final_norm_f32;     /* [H] */
    int32_t *draft_to_target;  /* [DV] d + d2t[d], each in [0, V) */
} gptoss_eagle3_weights;

/* The head read from its folder: loader/load_eagle3.c implements the functions below. */
typedef struct gptoss_eagle3_head gptoss_eagle3_head;

/* Loads a head folder (config.json + *.safetensors): every field, dtype and shape checked,
 * missing tensors named. *out owns the mappings until gptoss_eagle3_free. */
gptoss_status gptoss_eagle3_load(const char *dir, gptoss_eagle3_head **out, gptoss_error *error);
void gptoss_eagle3_free(gptoss_eagle3_head *head);

const gptoss_eagle3_config *gptoss_eagle3_head_config(const gptoss_eagle3_head *head);
const gptoss_eagle3_weights *gptoss_eagle3_head_weights(const gptoss_eagle3_head *head);

/* Whether the head fits a target of this shape (hidden size, vocabulary, layer ids); the
 * message names both numbers. Fills the boundaries to capture. */
gptoss_status gptoss_eagle3_check_target(const gptoss_eagle3_head *head, int32_t target_hidden,
                                         int32_t target_vocab, int32_t target_layers,
                                         int32_t boundaries[GPTOSS_EAGLE3_N_AUX],
                                         gptoss_error *error);

/* The target token of draft id d (0 <= d < DV): d + d2t[d]. */
static inline int32_t gptoss_eagle3_target_token(const gptoss_eagle3_weights *w, int32_t d) {
    return w->draft_to_target[d];
}

/* ---- running the head: the executors (backend/cpu/eagle3_forward.c, backend/cuda/) ---- */

/* One sequence's head cache: K and V of positions [start, start + n), in the executor's
 * memory (host or device; f32 [cap, NKV*D] each). The executor grows it (forward) and frees
 * it (kv_release); the caller moves start and n back to drop positions. */
typedef struct gptoss_eagle3_kv {
    float *k;
    float *v;
    int32_t cap; /* rows allocated */
    int32_t start;
    int32_t n;
} gptoss_eagle3_kv;

/* One head position p of one sequence (what the head computes: backend/cpu/eagle3_forward.h). */
typedef struct gptoss_eagle3_row {
    gptoss_eagle3_kv *kv; /* its sequence's cache; the row's position is kv->start + kv->n when
                             the rows before it in the batch have been appended */
    int32_t position;
    int32_t token;       /* the token after `position`, whose embedding the row reads */
    const float *embed;  /* [H] host f32 embedding of `token`: filled by the caller only for an
                            executor with wants_embed */
    const float *aux;    /* [3H] host: the target's boundary states, or NULL: */
    const float *hidden; /* [H] host: the head's own prenorm output (used when aux is NULL) */
    float *prenorm;      /* [H] host, written (an executor may skip rows without want_token) */
    float *logits;       /* [DV] host, written when not NULL */
    bool want_token;     /* write draft_token (argmax over the draft vocabulary) */
    int32_t draft_token; /* written: a draft-vocabulary id (the first of equal maxima) */
} gptoss_eagle3_row;

/* Where the head runs: the CPU (gptoss_eagle3_cpu_exec) or the target's GPU. */
typedef struct gptoss_eagle3_exec {
    void *state;
    bool wants_embed; /* rows must carry embed (else the executor embeds `token` itself) */
    /* Runs rows[0..n). Rows of one sequence come in position order, each at the end of its
     * cache (position == kv->start + kv->n at its turn); a row's hidden may be an earlier
     * row's prenorm only in a later call. */
    gptoss_status (*forward)(void *state, gptoss_eagle3_row *rows, int32_t n, gptoss_error *error);
    void (*kv_release)(void *state, gptoss_eagle3_kv *kv); /* frees k, v; cap 0 */
    void (*destroy)(void *state);
} gptoss_eagle3_exec;

#endif
