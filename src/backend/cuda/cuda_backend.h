/*
 * cuda_backend.h - the CUDA backend's state and the entry points its files share (CUDA C++
 * only).
 *
 * The state owns one device context (device.h), its tuning (tuning.h, filled once at
 * creation), and everything it puts on that device: weights (weights.cu, uploaded once), the
 * two KV pools (kv_pool.cu: full-attention and sliding layers), per-step workspace
 * (forward.cu: grown to the largest step seen, never on the decode hot path once warm), the
 * plan staging buffers and the cuBLAS handle. gptoss_cuda_backend_ops (ops.cu) is the public
 * face; the bench and the GPU tests use the functions below to build a state from random
 * weights and to run a step without copying logits back.
 */
#ifndef GPTOSS_CUDA_BACKEND_H
#define GPTOSS_CUDA_BACKEND_H

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device.h"
#include "backend/cuda/kernels/dense_lowp.h"
#include "backend/cuda/tuning.h"

#include <cublas_v2.h>

extern "C" {
#include "backend/backend.h"
#include "util/error.h"
}

typedef struct cuda_layer {
    float *attn_norm;                    /* [H] */
    float *mlp_norm;                     /* [H] */
    gptoss_cuda_dense_weight qkv_weight; /* [(NH + 2 NKV) D, H]: q rows, then k, then v */
    float *qkv_bias;                     /* [(NH + 2 NKV) D] */
    gptoss_cuda_dense_weight o_weight;   /* [H, NH D] */
    float *o_bias;                       /* [H] */
    float *sinks;                        /* [NH] */
    bf16 *router_weight;                 /* [E, H] */
    float *router_weight_f32;    /* [E, H], the same values: SGEMM operand for large steps */
    float *router_bias;          /* [E] */
    gptoss_cuda_moe_weights moe; /* MXFP4 experts + f32 biases */
    bf16 *k_cache;  /* bf16 pages [pool blocks, block_size, NKV, D]; NULL with FP8 pages */
    bf16 *v_cache;  /* same */
    uint8_t *k_fp8; /* FP8 pages (kv_fp8.h): e4m3 codes [pool blocks, block_size, NKV, D], */
    uint8_t *v_fp8; /*   NULL with bf16 pages; one allocation each with its scales: */
    float *k_scale; /* [pool blocks, block_size, NKV] fp32, absmax / 448 */
    float *v_scale;
    bool sliding;  /* uses the sliding window and the sliding pool */
    bool kv_alias; /* its pages are another layer's buffers (shared pages): not freed */
} cuda_layer;

typedef struct cuda_workspace {
    int32_t cap_tokens; /* tokens per step the buffers hold */
    int32_t cap_logits; /* logit rows they hold */
    int32_t cap_table;  /* ints of each block table */
    void *base;         /* one device allocation carved below */
    size_t bytes;
    float *x;           /* [T, H] residual stream */
    bf16 *t;            /* [T, H] normalized activations */
    float *t_f32;       /* [T, H] the same before rounding (router input) */
    float *qkv;         /* [T, QKV] */
    float *q;           /* [T, NH, D] roped, pre-scaled */
    bf16 *attn;         /* [T, NH D] */
    float *proj;        /* [T, max(H, E)] o-proj and router outputs */
    int32_t *topk_idx;  /* [T, K] */
    float *topk_weight; /* [T, K] */
    void *route_mem;    /* gptoss_cuda_route storage */
    bf16 *h;            /* [T K, I] */
    float *y;           /* [T K, H] */
    float *partial;     /* split-K attention partials */
    size_t partial_floats;
    bf16 *lm_in;           /* [n_logits, H] */
    float *lm_part;        /* lm_head split by vocabulary (tp.cu): [n_logits, lm_rows] */
    float *lm_gather;      /* and every rank's part: [tp_size, n_logits, lm_rows] */
    float *logits;         /* [n_logits, V] */
    unsigned *router_done; /* [1] blocks of the fused router done (kept at 0 between launches) */
    int32_t *plan_dev;     /* device copy of the step's integer arrays */
    int32_t *plan_host;    /* pinned staging for the same */
    size_t plan_ints;
    int32_t *seq_start; /* host: each sequence's first token in the device order */
    int32_t seq_cap;
} cuda_workspace;

/* What fixes a captured step: every scalar its kernels were launched with. */
typedef struct cuda_step_key {
    int32_t n_tokens, n_logits, n_seqs, max_blocks, splits_full, splits_sliding;
    int32_t n_short; /* tokens [0, n_short) attend on the scalar kernel, the rest on tensor cores */
    size_t staged_ints;
} cuda_step_key;

typedef struct cuda_graph_entry {
    bool valid;
    cuda_step_key key;
    cudaGraphExec_t exec;
} cuda_graph_entry;

struct gptoss_cuda_sampler; /* forward_sample's buffers (cuda_sample_ops.cu) */

#define GPTOSS_CUDA_MAX_GRAPHS 8
#define GPTOSS_CUDA_MAX_PROF_EVENTS 1024

typedef struct gptoss_cuda_state {
    gptoss_config config;        /* copy of the model's config */
    gptoss_cuda_device dev;      /* the GPU: ordinal, capabilities, kernel set-up */
    gptoss_cuda_tuning tuning;   /* every knob, filled once at creation */
    int32_t kv_block_size;       /* tokens per page */
    int32_t n_kv_blocks;         /* pages of the full pool */
    int32_t n_sliding_kv_blocks; /* pages of the sliding pool */
    bool kv_shared;              /* sliding layers use the full layers' pages (one id space) */
    cudaStream_t stream;
    cublasHandle_t cublas;
    bf16 *embedding;                  /* [V, H] */
    gptoss_cuda_dense_weight lm_head; /* [V, H] */
    float *final_norm;                /* [H] */
    float *inv_freq;                  /* [D/2] YaRN */
    float concentration;
    cuda_layer *layers; /* [L] */
    cuda_workspace ws;
    void *summary_dev;    /* the logits summary kernels' scratch (from 256-aligned offset 0) */
    void *summary_host;   /* mapped pinned: [rows, n_top] ids | [rows, n_top] values | [rows] lse */
    void *summary_mapped; /* the device's pointer to summary_host */
    size_t summary_bytes; /* of summary_host */
    size_t summary_dev_bytes; /* of summary_dev */
    void *summary_scratch;
    size_t weight_bytes; /* device bytes of weights */
    /* weights in host memory (weights.cu): the large matrices used in place through device
     * addresses of host memory, registered checkpoint ranges or pinned buffers */
    bool weights_host;
    size_t host_weight_bytes;                   /* bytes of weights read from host memory */
    struct gptoss_cuda_host_block *host_blocks; /* what to unregister or free, [n_host_blocks] */
    int32_t n_host_blocks;
    uint32_t fp8_layers; /* gptoss_fp8_layer bits: matrices held as e4m3 + row scales */
    bf16 *dense_scratch; /* fp8 layers: bf16 rows on their way to e4m3 at load, then the
                          * prefill GEMM's decoded rows (dense_lowp.h); NULL without */
    size_t dense_scratch_elems;
    size_t kv_bytes; /* device bytes of both KV pools */
    bool kv_fp8;     /* the pages hold e4m3 codes and scales (kv_cache_dtype FP8) */
    cuda_graph_entry graphs[GPTOSS_CUDA_MAX_GRAPHS]; /* captured steps, keyed by shape */
    int32_t graph_next;                              /* round-robin slot for the next capture */
    bool profiling; /* record events between components (bench --profile, tuning.profile) */
    int32_t prof_n; /* events recorded this step */
    cudaEvent_t prof_events[GPTOSS_CUDA_MAX_PROF_EVENTS];
    int32_t prof_part[GPTOSS_CUDA_MAX_PROF_EVENTS]; /* component the time before event i is charged
                                                       to */
    double serve_prof_ms[2][8]; /* tuning.profile: [decode-only steps, steps with
                                   prefill][component] */
    double serve_prof_steps[2], serve_prof_tokens[2], serve_prof_wall_ms[2];
    /* tuning.step_timing: where a served step's wall time goes (host staging, GPU step, GPU
     * summaries, host wait), totals printed at exit; events only, graphs stay on */
    cudaEvent_t timing_events[3];
    double timing_ms[5], timing_steps;
    struct gptoss_cuda_sampler *sampler; /* NULL until the first forward_sample */
    /* gptoss_backend_options.batch_invariant: one kernel per operation for every step, each
     * with a fixed reduction order (forward.cu, kernels/batch_invariant.cu) */
    bool batch_invariant;
    /* Tensor parallelism (tp.cu): this state is rank tp_rank of tp_size; config holds the
     * rank's heads (tp_split.h), the router all experts, L->moe only the experts [tp_expert0,
     * tp_expert0 + tp_n_experts) (moe index = expert - tp_expert0). tp_size 1: a whole
     * model (tp_n_experts = n_experts), tp_comm NULL. */
    int32_t tp_rank, tp_size, tp_expert0, tp_n_experts;
    /* lm_head holds the vocabulary rows [lm_row0, lm_row0 + lm_rows): all of them, or with
     * tensor parallelism and GPTOSS_TP_SPLIT_LM_HEAD=1 the rank's 1/tp_size (every rank then
     * computes its logits columns and an all-gather puts the rows together on rank 0) */
    int32_t lm_row0, lm_rows;
    void *tp_comm; /* the rank's NCCL communicator */
    /* where this rank's host thread is in a step (a static string; __atomic: the watchdog of
     * tp.cu names it when a step hangs); set through gptoss_cuda_tp_phase */
    const char *tp_phase;
    void *tp_group; /* the group (tp.cu) of every rank (bench: gptoss_cuda_tp_step on rank 0) */
    /* EAGLE3 drafting (eagle3_head.cu): every step copies the residual stream at the layer
     * boundaries capture[0..n_capture) into capture_dev [tokens, n_capture * H] (device token
     * order; capture_order[plan token] = its device row when the step reordered them); read
     * back on demand into capture_host in plan order. */
    int32_t capture[8], n_capture;
    bool capture_on; /* a head reads them (off: still copied, see eagle3_head.cu) */
    float *capture_dev;
    int32_t capture_cap, captured_rows;
    bool captured_reordered, captured_read;
    int32_t *capture_order;
    float *capture_host, *capture_staging; /* pinned, [capture_cap, n_capture * H] each */
} gptoss_cuda_state;

/* Components of a step for profiling (index into gptoss_bench_part_names). */
enum { PART_MOE = 0, PART_ATTENTION, PART_DENSE, PART_LM_HEAD, PART_SMALL, PART_UPLOAD, PART_GAPS };

/* ---- ops.cu: creation and the public face ---- */

/* Creates a state with weights generated on the GPU (bench; values follow make-model's
 * distributions, cost does not depend on them). */
gptoss_status gptoss_cuda_state_create_random(const gptoss_config *config,
                                              const gptoss_backend_options *options, uint64_t seed,
                                              gptoss_cuda_state **out, gptoss_error *error);

void gptoss_cuda_state_free(gptoss_cuda_state *state);

/* Creates a state for config (a whole model, or one tensor-parallel rank's heads) holding
 * the experts [expert0, expert0 + n_experts) (n_experts 0: all) and the lm_head rows
 * [lm_row0, lm_row0 + lm_rows) (lm_rows 0: all), with weights copied from w, whose tensors
 * must match those shapes (expert tensors: the held experts only; lm_head: the held rows),
 * or random ones from seed when w is NULL (the whole model's values of the held parts). */
gptoss_status gptoss_cuda_state_create_rank(const gptoss_config *config,
                                            const gptoss_backend_options *options,
                                            const gptoss_weights *w, uint64_t seed, int32_t expert0,
                                            int32_t n_experts, int32_t lm_row0, int32_t lm_rows,
                                            gptoss_cuda_state **out, gptoss_error *error);

/* The step, then the summaries reduced on the GPU: n_top ids and values and one float per
 * row cross to the host, plus only the rows asked for whole. */
gptoss_status gptoss_cuda_summary_step(gptoss_cuda_state *s, const gptoss_batch_plan *plan,
                                       const gptoss_logits_summary *out, gptoss_error *error);

/* cuBLAS status to an error. */
gptoss_status gptoss_cublas_check(cublasStatus_t status, const char *what, gptoss_error *error);

/* ---- weights.cu ---- */

/* Device bytes the weights of config take (before allocation, for the memory check); with
 * weights_host, without the matrices held in host memory. */
size_t gptoss_cuda_weights_bytes(const gptoss_config *config, uint32_t fp8_layers,
                                 bool weights_host);
/* Allocates every weight buffer (contents undefined) and the FP8 layers' scratch; with
 * s->weights_host, not those of the matrices held in host memory (placed by upload or random). */
gptoss_status gptoss_cuda_weights_alloc(gptoss_cuda_state *s, gptoss_error *error);
/* Copies a model's weights in (FP8 matrices quantized on the way). */
gptoss_status gptoss_cuda_weights_upload(gptoss_cuda_state *s, const gptoss_weights *w,
                                         const gptoss_backend_options *options,
                                         gptoss_error *error);
/* Generates random weights in place (make-model's distributions). */
gptoss_status gptoss_cuda_weights_random(gptoss_cuda_state *s,
                                         const gptoss_backend_options *options, uint64_t seed,
                                         gptoss_error *error);
/* What is derived from the weights once they are in place (router fp32 copy, MoE checks). */
gptoss_status gptoss_cuda_weights_finish(gptoss_cuda_state *s, gptoss_error *error);
void gptoss_cuda_weights_free(gptoss_cuda_state *s);

/* ---- kv_pool.cu ---- */

/* Page geometry and the memory check before anything is allocated: the pools' page counts
 * from the options (or the first page of an automatic pool), page sharing. */
gptoss_status gptoss_cuda_kv_plan(gptoss_cuda_state *s, const gptoss_backend_options *options,
                                  size_t weight_bytes, gptoss_error *error);
/* Sizes an automatic pool from what is free now, then allocates the pages (and aliases the
 * sliding layers onto the full layers' with shared pages). */
gptoss_status gptoss_cuda_kv_alloc(gptoss_cuda_state *s, const gptoss_backend_options *options,
                                   gptoss_error *error);
void gptoss_cuda_kv_free(gptoss_cuda_state *s);

/* ---- forward.cu ---- */

/* Grows the step workspace to n_tokens / n_logits and the plan buffers to table_ints. */
gptoss_status gptoss_cuda_workspace_ensure(gptoss_cuda_state *s, int32_t n_tokens, int32_t n_logits,
                                           int32_t table_ints, gptoss_error *error);
void gptoss_cuda_workspace_free(gptoss_cuda_state *s);
/* Destroys every captured step. */
void gptoss_cuda_graphs_clear(gptoss_cuda_state *s);

/* Runs one validated plan; logits stay in state->ws.logits [n_logits, V] on the device. */
gptoss_status gptoss_cuda_forward_device(gptoss_cuda_state *state, const gptoss_batch_plan *plan,
                                         gptoss_error *error);

/* The ops table's forward_sample (cuda_sample_ops.cu): the step, then one token per logits row
 * drawn on the GPU (sampling.cu). The batch is validated by the caller (backend.c). */
gptoss_status gptoss_cuda_forward_sample(void *state, const gptoss_batch_plan *plan,
                                         const gptoss_sample_batch *batch, gptoss_error *error);
void gptoss_cuda_sampler_free(struct gptoss_cuda_sampler *sampler);

/* ---- eagle3_head.cu: a draft head's side of the state ---- */

/* Before a step of T tokens: room for its captured rows (captured steps are dropped when the
 * buffer moves); notes whether the step reorders its tokens. Nothing without a capture. */
gptoss_status gptoss_cuda_capture_prepare(gptoss_cuda_state *s, int32_t T, bool reorder,
                                          gptoss_error *error);
/* Frees the capture buffers and any head state the draft ops left. */
void gptoss_cuda_capture_free(gptoss_cuda_state *s);

/* ---- tp.cu: tensor parallelism ---- */

/* The ops table of a tensor-parallel backend (options->tensor_parallel_size > 1). */
extern "C" const gptoss_backend_ops gptoss_cuda_tp_backend_ops;
/* Rank 0's state of a group the table above created. */
gptoss_cuda_state *gptoss_cuda_tp_rank0(void *group);
/* One validated plan on every rank: rank 0's step is enqueued (not waited for), the others'
 * are run and waited for (bench). */
gptoss_status gptoss_cuda_tp_step(void *group, const gptoss_batch_plan *plan, gptoss_error *error);
/* Records where s's thread is in a step, for the tensor-parallel watchdog's message
 * (nothing without tensor parallelism). */
static inline void gptoss_cuda_tp_phase(gptoss_cuda_state *s, const char *phase) {
    if (s->tp_size > 1) __atomic_store_n(&s->tp_phase, phase, __ATOMIC_RELEASE);
}
/* A rank that captured a step calls this between instantiating and launching the graph:
 * it waits for its device to go idle and for every rank of its group to get there too (an
 * error when a peer failed meanwhile). Nothing when tp_size is 1. */
gptoss_status gptoss_cuda_tp_graph_barrier(gptoss_cuda_state *s, gptoss_error *error);
/* Enqueues the sum over the ranks of buf [n] f32, in place, on s->stream (nothing when
 * tp_size is 1): one kernel over peer memory up to gptoss_cuda_tp_p2p_max_floats(s) floats
 * (every rank then gets bitwise the same sum, added in rank order), NCCL above. */
gptoss_status gptoss_cuda_tp_allreduce(gptoss_cuda_state *s, float *buf, size_t n,
                                       gptoss_error *error);
/* The most floats the peer-memory all-reduce of s's group takes (0: NCCL for every size). */
size_t gptoss_cuda_tp_p2p_max_floats(const gptoss_cuda_state *s);
/* Runs fn on every rank of the group at once, each on its own thread with its device bound,
 * and waits for all (the first failure by rank is the error); bounded by the watchdog. */
gptoss_status gptoss_cuda_tp_each_rank(void *group,
                                       gptoss_status (*fn)(gptoss_cuda_state *s, void *arg,
                                                           gptoss_error *error),
                                       void *arg, gptoss_error *error);
/* Tensor parallelism (tp_weights.cu): a rank's state on device o->device for the slice sl of
 * config c, from the checkpoint w (its slices: views, and host copies where the experts are
 * split by rows) or, with w NULL, random weights equal to the whole model's from seed. lm_rows
 * > 0: lm_head rows [lm_row0, lm_row0 + lm_rows) only. */
struct gptoss_tp_slice;
gptoss_status gptoss_cuda_tp_rank_state(const gptoss_config *c, const struct gptoss_tp_slice *sl,
                                        const gptoss_backend_options *o, const gptoss_weights *w,
                                        uint64_t seed, int32_t lm_row0, int32_t lm_rows,
                                        gptoss_cuda_state **out, gptoss_error *error);
/* lm_head split by vocabulary: gathers every rank's part [NL, lm_rows] (w->lm_part) and,
 * on rank 0, puts the rows together in w->logits [NL, V]. */
gptoss_status gptoss_cuda_tp_gather_logits(gptoss_cuda_state *s, int32_t NL, gptoss_error *error);
/* Turns the top-k of T tokens into this rank's expert indices (expert - tp_expert0); slots
 * of other ranks' experts become -1 with weight 0: the MoE paths skip them (moe.h). */
void gptoss_cuda_tp_mask_experts(gptoss_cuda_state *s, int32_t *topk_idx, float *topk_weight,
                                 int32_t T, int32_t K);

#endif
