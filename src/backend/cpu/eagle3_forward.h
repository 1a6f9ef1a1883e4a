/*
 * eagle3_forward.h - the EAGLE3 head's forward pass on the CPU (fp32 math over bf16 weights),
 * batched over rows of many sequences, each sequence with its own KV cache.
 *
 * One row computes one head position p of one sequence:
 *   hidden   = fc(aux[3H])                (a target position: its three boundary states)
 *            | prenorm of the row before  (a chained draft step: the head's own output)
 *   x        = [input_norm(embed(token)), hidden_norm(hidden)]         [2H]
 *   q, k, v  = x . {q,k,v}_proj^T, RoPE (rotate-half, rope_theta) at p  (k, v appended to the
 *              sequence's cache), causal attention over the cache [start, p], GQA, scale D^-1/2
 *   h        = o_proj(attn) + hidden
 *   prenorm  = h + down(silu(gate(post_norm(h))) * up(post_norm(h)))
 *   logits   = lm_head(norm(prenorm))                                   [DV] (when asked)
 * The embedding is of the token that FOLLOWS position p (so the head at p predicts p + 2).
 * Owns nothing but its grow-only scratch; the caches belong to the caller.
 */
#ifndef GPTOSS_BACKEND_CPU_EAGLE3_FORWARD_H
#define GPTOSS_BACKEND_CPU_EAGLE3_FORWARD_H

#include "model/eagle3.h"

#include <stdbool.h>
#include <stdint.h>

/* One sequence's head cache: K and V of positions [start, start + n). */
typedef struct gptoss_eagle3_kv {
    float *k;    /* [cap, NKV*D] */
    float *v;    /* [cap, NKV*D] */
    int32_t cap; /* rows allocated */
    int32_t start;
    int32_t n;
} gptoss_eagle3_kv;

typedef struct gptoss_eagle3_row {
    gptoss_eagle3_kv *kv; /* its sequence's cache; the row's position is kv->start + kv->n when
                             the rows before it in the batch have been appended */
    int32_t position;
    const float *embed;  /* [H] embedding of the token after `position` */
    const float *aux;    /* [3H] the target's boundary states, or NULL: */
    const float *hidden; /* [H] the head's own prenorm output (used when aux is NULL) */
    float *prenorm;      /* [H] written */
    float *logits;       /* [DV] written when not NULL */
    bool want_token;     /* write draft_token (argmax over the draft vocabulary) */
    int32_t draft_token; /* written: a draft-vocabulary id */
} gptoss_eagle3_row;

typedef struct gptoss_eagle3_cpu gptoss_eagle3_cpu;

gptoss_status gptoss_eagle3_cpu_create(const gptoss_eagle3_head *head, gptoss_eagle3_cpu **out,
                                       gptoss_error *error);
void gptoss_eagle3_cpu_free(gptoss_eagle3_cpu *f);

/* Grows kv to hold at least n_positions (keeps what it holds). */
bool gptoss_eagle3_kv_reserve(gptoss_eagle3_kv *kv, int32_t n_positions, int32_t kv_dim);

/* Runs rows[0..n). Rows of one sequence come in position order, each at the end of its cache
 * (position == kv->start + kv->n at its turn); a row's hidden may be an earlier row's prenorm
 * only in a later call. */
gptoss_status gptoss_eagle3_cpu_forward(gptoss_eagle3_cpu *f, gptoss_eagle3_row *rows, int32_t n,
                                        gptoss_error *error);

#endif
