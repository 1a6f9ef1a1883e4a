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

typedef struct gptoss_eagle3_cpu gptoss_eagle3_cpu;

gptoss_status gptoss_eagle3_cpu_create(const gptoss_eagle3_head *head, gptoss_eagle3_cpu **out,
                                       gptoss_error *error);
void gptoss_eagle3_cpu_free(gptoss_eagle3_cpu *f);

/* The CPU forward as an executor (wants_embed: the caller fills each row's embed). */
gptoss_status gptoss_eagle3_cpu_exec(const gptoss_eagle3_head *head, gptoss_eagle3_exec *out,
                                     gptoss_error *error);

/* Grows kv to hold at least n_positions (keeps what it holds). */
bool gptoss_eagle3_kv_reserve(gptoss_eagle3_kv *kv, int32_t n_positions, int32_t kv_dim);

/* Runs rows[0..n) (rows carry embed; gptoss_eagle3_exec.forward's rules). */
gptoss_status gptoss_eagle3_cpu_forward(gptoss_eagle3_cpu *f, gptoss_eagle3_row *rows, int32_t n,
                                        gptoss_error *error);

#endif
