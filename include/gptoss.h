/*
 * gptoss.h - the public C API of gptoss.
 *
 * Load a gpt-oss checkpoint, create a backend (CPU reference or CUDA), and run batch plans
 * through it. gptoss_engine.h adds the engine on top (requests, sampling, continuous
 * batching). The CLI and the server are built on these two headers plus private layers that
 * are not public API: the o200k_harmony tokenizer (src/tokenizer/), the harmony chat format
 * and OpenAI request mapping (src/chat/), and internal helpers (KV pool sizing in
 * src/engine/kv_plan.h, config presets and helpers in src/model/config.h, src/util/).
 *
 * Conventions:
 *   - Every function that can fail returns a gptoss_status and, when given a non-NULL
 *     gptoss_error, fills it with a message a user can act on.
 *   - Handles are opaque. Whoever creates a handle frees it with the matching _free call.
 *   - Nothing here prints (progress goes through an optional callback), except the
 *     diagnostics knob gptoss_backend_options.testing.layer_stats.
 */
#ifndef GPTOSS_H
#define GPTOSS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef enum gptoss_status {
    GPTOSS_OK = 0,
    GPTOSS_ERR_INVALID_ARGUMENT = 1, /* a caller passed something out of range */
    GPTOSS_ERR_IO = 2,               /* a file could not be opened, read, written or mapped */
    GPTOSS_ERR_FORMAT = 3,           /* a file's contents are malformed */
    GPTOSS_ERR_MODEL = 4,            /* well-formed files that do not describe a valid model */
    GPTOSS_ERR_UNSUPPORTED = 5,      /* valid, but not something gptoss implements */
    GPTOSS_ERR_OUT_OF_MEMORY = 6,    /* host or device allocation failed */
    GPTOSS_ERR_BACKEND = 7,          /* the compute backend failed (e.g. a CUDA error) */
    GPTOSS_ERR_CAPACITY = 8,         /* a fixed capacity (KV blocks, queue) is exhausted */
} gptoss_status;

#define GPTOSS_ERROR_MESSAGE_MAX 1024

typedef struct gptoss_error {
    gptoss_status status;                   /* copy of the returned status */
    char message[GPTOSS_ERROR_MESSAGE_MAX]; /* NUL-terminated, human readable */
} gptoss_error;

/* A short stable name for a status, e.g. "format error". Never NULL. */
const char *gptoss_status_name(gptoss_status status);

/* ---------------------------------------------------------------------------------------- */
/* Model configuration (config.json, validated)                                             */
/* ---------------------------------------------------------------------------------------- */

#define GPTOSS_MAX_LAYERS 256

typedef struct gptoss_config {
    int32_t n_layers;            /* num_hidden_layers */
    int32_t hidden_size;         /* H: residual width (2880 in the real models) */
    int32_t intermediate_size;   /* I: expert MLP width; gate_up has 2*I rows */
    int32_t n_heads;             /* query heads (64) */
    int32_t n_kv_heads;          /* KV heads (8); n_heads % n_kv_heads == 0 */
    int32_t head_dim;            /* D (64); read from the file, never derived */
    int32_t n_experts;           /* num_local_experts */
    int32_t n_experts_per_token; /* top-k (4) */
    int32_t vocab_size;          /* embedding and lm_head rows */
    int32_t sliding_window;      /* window of sliding layers, in tokens, including self */
    int32_t max_position_embeddings;
    double rope_theta;                             /* RoPE base */
    double rope_scaling_factor;                    /* YaRN factor f (32) */
    double rope_beta_fast;                         /* YaRN beta_fast (32) */
    double rope_beta_slow;                         /* YaRN beta_slow (1) */
    int32_t rope_original_max_position_embeddings; /* YaRN L0 (4096) */
    bool rope_truncate;                       /* round the YaRN ramp bounds (false for gpt-oss) */
    double rms_norm_eps;                      /* 1e-5 */
    double swiglu_limit;                      /* clamp of the SwiGLU inputs (7.0) */
    double swiglu_alpha;                      /* sigmoid slope (1.702) */
    int32_t eos_token_id;                     /* config.json eos_token_id (first, if a list) */
    int32_t pad_token_id;                     /* config.json pad_token_id, or -1 */
    bool layer_is_sliding[GPTOSS_MAX_LAYERS]; /* from layer_types */
} gptoss_config;

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct gptoss_model gptoss_model;

/* Loads a Hugging Face gpt-oss model folder: config.json, tokenizer.json and the safetensors
 * weights (one file or sharded with model.safetensors.index.json), memory-mapped, zero-copy.
 * A path to a GGUF file (llama.cpp's gpt-oss layout, or the first part of a split one) is
 * loaded from that file instead (docs/gguf.md).
 * Every header, dtype, shape and byte range is validated; missing and unexpected tensors are
 * listed in the error. On success *out owns the mappings until gptoss_model_free. */
gptoss_status gptoss_model_load(const char *dir, gptoss_model **out, gptoss_error *error);

/* Frees a model from gptoss_model_load. NULL is allowed. */
void gptoss_model_free(gptoss_model *model);

/* The model's validated configuration; valid while the model lives. */
const gptoss_config *gptoss_model_config(const gptoss_model *model);

/* The folder the model was loaded from. */
const char *gptoss_model_dir(const gptoss_model *model);

/* ---------------------------------------------------------------------------------------- */
/* Batch plans: the seam between the engine and a backend                                    */
/* ---------------------------------------------------------------------------------------- */

/*
 * One step of work for a backend. Tokens are grouped by sequence (varlen, no padding):
 * sequence s owns tokens [seq_token_start[s], seq_token_start[s+1]). Its new tokens sit at
 * positions seq_n_cached[s], seq_n_cached[s]+1, ... and the backend writes their K and V into
 * the KV pages named by the sequence's block table before attending over
 * [0, position] (or the sliding window).
 *
 * KV paging: position p of sequence s lives in physical block
 * block_tables[s * max_blocks_per_seq + p / kv_block_size], slot p % kv_block_size.
 * Full-attention layers use block_tables; sliding-window layers use sliding_block_tables
 * (a separate pool of the same block size), or block_tables again when it is NULL. Entries a
 * step never touches may be -1 (e.g. sliding blocks that fell out of every window).
 */
typedef struct gptoss_batch_plan {
    int32_t n_tokens;                    /* new tokens this step, all sequences */
    const int32_t *token_ids;            /* [n_tokens] */
    const int32_t *positions;            /* [n_tokens] absolute positions */
    int32_t n_seqs;                      /* sequences in this step */
    const int32_t *seq_token_start;      /* [n_seqs + 1] prefix offsets into token_ids */
    const int32_t *seq_n_cached;         /* [n_seqs] tokens already in the KV cache */
    int32_t max_blocks_per_seq;          /* row stride of the block tables */
    const int32_t *block_tables;         /* [n_seqs, max_blocks_per_seq] full-layer pages */
    const int32_t *sliding_block_tables; /* same shape for sliding layers, or NULL */
    int32_t n_logits;                    /* rows of logits wanted (<= 128 * n_tokens) */
    /* [n_logits] indices into token_ids; an index may repeat (one row per draw: the n choices
     * at the end of a prompt each draw from its last token's row) */
    const int32_t *logit_token_index;
} gptoss_batch_plan;

/* Checks a plan against a backend's KV geometry: offsets monotone, positions equal
 * n_cached + i, block ids in range and present where needed, logit indices valid. */
gptoss_status gptoss_batch_plan_validate(const gptoss_batch_plan *plan, const gptoss_config *config,
                                         int32_t kv_block_size, int32_t n_kv_blocks,
                                         int32_t n_sliding_kv_blocks, gptoss_error *error);

/* ---------------------------------------------------------------------------------------- */
/* Backends                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef enum gptoss_backend_kind {
    GPTOSS_BACKEND_CPU = 0,
    GPTOSS_BACKEND_CUDA = 1,
} gptoss_backend_kind;

typedef void (*gptoss_progress_fn)(void *user, const char *what, double fraction);

/* Dense layers the CUDA backend can hold in FP8 (gptoss_backend_options.fp8_layers, a mask):
 * e4m3 weights with one fp32 scale per output row (row absmax / 448), quantized when the
 * backend is created. Activations stay bf16 and products are summed in fp32. Decode reads
 * half the bytes of these matrices. e4m3 keeps 3 mantissa bits, so each weight is off by at
 * most 2^-4 of itself and each output of a quantized projection by about 2.6% (relative L2):
 * lm_head alone moves the logits by that much, QKV and O move them further through the
 * layers. Steps of more than 16 tokens decode the rows to bf16 first (slower prefill).
 * Default: none. */
typedef enum gptoss_fp8_layer {
    GPTOSS_FP8_QKV = 1u << 0,     /* attention q, k, v projections */
    GPTOSS_FP8_O = 1u << 1,       /* attention output projection */
    GPTOSS_FP8_LM_HEAD = 1u << 2, /* the unembedding */
    GPTOSS_FP8_ALL = (1u << 3) - 1u,
} gptoss_fp8_layer;

/* What the KV pages hold (gptoss_backend_options.kv_cache_dtype).
 *   BF16 (default): the CUDA backend stores K and V as bf16; the CPU backend keeps them fp32
 *     (rounded to bf16 only with testing.emulate_bf16_activations).
 *   FP8: e4m3 values with one fp32 scale per token and KV head (the head's largest |value| /
 *     448), about half the bytes of bf16 (head_dim + 4 bytes per head instead of
 *     2 * head_dim), so about twice the tokens fit in the same memory. Each value moves by up
 *     to 2^-4 of itself (3 mantissa bits), a head vector by about 2-3% (relative L2); the CPU
 *     backend emulates it exactly (it rounds K and V through e4m3 and keeps the result in its
 *     fp32 pages), so both backends give the numbers of an FP8 cache. */
typedef enum gptoss_kv_cache_dtype {
    GPTOSS_KV_CACHE_BF16 = 0,
    GPTOSS_KV_CACHE_FP8 = 1,
} gptoss_kv_cache_dtype;

/* Which GPU's kernel paths the CUDA backend takes (gptoss_backend_options.cuda_profile). AUTO
 * takes every path this GPU runs. A named profile limits the capabilities the backend sees to
 * that GPU's, so a newer GPU runs exactly the kernel choices the older one would (the way the
 * lower GPUs are tested on an H100):
 *   AMPERE (A100, sm_80): no FP8 conversion, bulk copies (TMA), wgmma or programmatic
 *     dependent launch; 163 KB of shared memory per block.
 *   ADA (RTX 4090, sm_89): FP8 conversion, but no TMA, wgmma or PDL; 99 KB per block.
 *   HOPPER (H100/H200, sm_90): everything; 227 KB per block.
 * A profile above what the GPU has (ada on an A100, hopper on anything but compute capability
 * 9.0) fails creation. cuBLAS picks its own kernels for the GPU it runs on whatever the
 * profile. The tuning key device_profile (variable GPTOSS_CUDA_DEVICE_PROFILE: auto, ampere,
 * ada, hopper), when given, overrides the option. */
typedef enum gptoss_cuda_profile {
    GPTOSS_CUDA_PROFILE_AUTO = 0,
    GPTOSS_CUDA_PROFILE_AMPERE = 1,
    GPTOSS_CUDA_PROFILE_ADA = 2,
    GPTOSS_CUDA_PROFILE_HOPPER = 3,
} gptoss_cuda_profile;

/* gptoss_backend_options.moe_parallel */
typedef enum gptoss_moe_parallel {
    GPTOSS_MOE_PARALLEL_EP = 0, /* whole experts per GPU (the default) */
    GPTOSS_MOE_PARALLEL_TP = 1, /* every expert's intermediate rows split over the GPUs */
} gptoss_moe_parallel;

typedef struct gptoss_backend_options {
    gptoss_backend_kind kind;
    int32_t n_threads;           /* CPU: worker threads, 0 = all cores */
    int32_t kv_block_size;       /* tokens per KV page (default 16) */
    int32_t n_kv_blocks;         /* pages in the full-attention pool */
    int32_t n_sliding_kv_blocks; /* pages in the sliding pool; 0 = n_kv_blocks */
    /* CUDA: the sliding layers' pages share the full layers' memory (the k-th sliding layer
     * uses the k-th full layer's buffers), so one space of n_kv_blocks page ids serves both
     * pools and n_sliding_kv_blocks is ignored. The caller must then hand out every id to at
     * most one pool at a time (the engine does: gptoss_engine_options.kv_shared_pages). Needs
     * as many sliding as full layers; a backend that cannot share clears it (read back with
     * gptoss_backend_get_options). */
    bool kv_shared_pages;
    int32_t device;              /* CUDA device ordinal */
    gptoss_progress_fn progress; /* optional: weight upload progress */
    void *progress_user;
    /* CUDA: split each layer over this many GPUs, `device` onwards (1, 2, 4 or 8; 0 = 1): of
     * this process, or with a multi-process job (`gptoss serve --nnodes`) of all its processes
     * together, tensor_parallel_size / processes each. Attention heads and experts are divided, so
     * the count must divide the model's query heads, KV heads and experts. The KV pool
     * (n_kv_blocks, or the size chosen from gpu_memory_utilization) is per GPU, each page holding
     * that GPU's share of the heads. */
    int32_t tensor_parallel_size;
    /* Tensor parallelism: how the experts are divided (gptoss_moe_parallel): 0 = by whole
     * experts (each GPU runs its own experts of each token's top-k), 1 = by the intermediate
     * dimension (every GPU runs every chosen expert over its 1/N of the rows; needs
     * intermediate_size / N to be whole 32-wide MXFP4 groups). */
    int32_t moe_parallel;
    /* CUDA: when > 0, size the full-attention pool (n_kv_blocks is then ignored) so that the
     * process uses this fraction of the GPU's memory, after the weights and the workspace
     * for steps of max_step_tokens tokens and max_step_logits logit rows are allocated. The
     * chosen size is reported by gptoss_backend_get_options. */
    double gpu_memory_utilization;
    int32_t max_step_tokens; /* workspace reserved at creation (0 = grow on demand) */
    int32_t max_step_logits;
    /* CUDA: gptoss_fp8_layer bits of the dense layers to hold in FP8 (0 = all bf16). Bits
     * outside GPTOSS_FP8_ALL are refused, and so is any bit with the CPU backend (which
     * computes every layer in fp32). */
    uint32_t fp8_layers;
    /* Both backends: what the KV pages hold (see gptoss_kv_cache_dtype; default BF16). Where
     * the CUDA backend sizes its pool from gpu_memory_utilization, FP8 fits about twice the
     * tokens. */
    gptoss_kv_cache_dtype kv_cache_dtype;
    /* Both backends: every logits row depends only on its own sequence, bitwise, whatever else
     * shares the step, however its prompt was split into steps, and whether its prefix came
     * from the prefix cache (docs/batch-invariance.md). CUDA: one kernel per operation with
     * fixed reduction orders, slower than the default paths; the CPU backend is so already. */
    bool batch_invariant;
    /* CUDA: "key=value,key=value" overrides of the backend's tuning knobs (kernel choices and
     * A/B switches; the keys, values and defaults are listed in src/backend/cuda/tuning.h).
     * The GPTOSS_CUDA_* variable of a key, when set, overrides the string. An unknown key or
     * a bad value fails creation. Read only while the backend is created (the string need not
     * outlive that call; gptoss_backend_get_options returns NULL here); ignored by the CPU
     * backend. NULL = the defaults. */
    const char *cuda_tuning;
    /* CUDA: the kernel paths' profile (see gptoss_cuda_profile; default AUTO). */
    gptoss_cuda_profile cuda_profile;
    /* CUDA: use the weights in place in host memory instead of copying them to the GPU: the
     * checkpoint's mapped pages are registered with the driver (read-only) and the kernels
     * read them through their device addresses. On an integrated GPU (DGX Spark) that is the
     * same memory, so a model is held once; it is the default there. On a discrete GPU the
     * kernels read over PCIe (slow; for tests of this path). The matrices the backend
     * converts at load (QKV joined from q, k and v, FP8 layers, fp32 vectors and the router's
     * fp32 copy) stay in device memory, as does every tensor whose address is not 16-byte
     * aligned. Random weights are generated into pinned host memory. */
    bool weights_in_host_memory;
    /* Tests and diagnostics only; defaults off. */
    struct {
        /* CPU: print each layer's residual RMS and max to stderr (the one thing in this API
         * that prints) */
        bool layer_stats;
        /* CPU: round activations to bf16 at exactly the points where the CUDA backend stores
         * them as bf16 (see cpu_backend.c), so the two can be compared strictly; the default
         * CPU path stays fp32 everywhere */
        bool emulate_bf16_activations;
    } testing;
} gptoss_backend_options;

/* Defaults: CPU, all cores, 16-token pages, 256 pages, bf16 KV cache. */
gptoss_backend_options gptoss_backend_options_default(void);

/* Bytes one token's K and V take in one layer's KV pages: n_kv_heads * head_dim values each,
 * as bf16 (2 bytes) or as e4m3 (1 byte) plus one fp32 scale per KV head on the CUDA backend;
 * always fp32 (4 bytes) on the CPU backend, whose FP8 cache is an emulation. */
size_t gptoss_kv_cache_token_bytes(const gptoss_config *config, gptoss_backend_kind kind,
                                   gptoss_kv_cache_dtype dtype);

/* "bf16" or "fp8" (never NULL: "?" for a value outside the enum). */
const char *gptoss_kv_cache_dtype_name(gptoss_kv_cache_dtype dtype);

typedef struct gptoss_backend gptoss_backend;

/* Creates a backend for a loaded model; the model must outlive the backend. */
gptoss_status gptoss_backend_create(const gptoss_model *model,
                                    const gptoss_backend_options *options, gptoss_backend **out,
                                    gptoss_error *error);

/* Creates a backend with random weights of the config's shape, generated on the device (for
 * benchmarks and load tests; CUDA only). The config is copied. */
gptoss_status gptoss_backend_create_random(const gptoss_config *config,
                                           const gptoss_backend_options *options, uint64_t seed,
                                           gptoss_backend **out, gptoss_error *error);

/* Runs one plan. logits: [plan->n_logits, vocab_size] float32, written row by row in the
 * order of plan->logit_token_index. The plan is validated first; a bad plan changes nothing. */
gptoss_status gptoss_backend_forward(gptoss_backend *backend, const gptoss_batch_plan *plan,
                                     float *logits, gptoss_error *error);

/* At most this many top logits per row in a gptoss_logits_summary. */
#define GPTOSS_MAX_SUMMARY_TOP 64

/*
 * What a caller wants back of each logits row when it does not need all of it. For row i:
 * the n_top largest logits in decreasing order, ties by lower token id (NaN counts as -inf),
 * their token ids, and the natural log of the sum of exp(logit) over the whole row (NaN
 * logits skipped). Rows with full[i] != 0 are also written whole to logits (row i of
 * [n_logits, vocab]); full may be NULL (no row whole).
 */
typedef struct gptoss_logits_summary {
    int32_t n_top;       /* 1..GPTOSS_MAX_SUMMARY_TOP */
    int32_t *top_ids;    /* [n_logits, n_top] */
    float *top_logits;   /* [n_logits, n_top] */
    float *logsumexp;    /* [n_logits], or NULL: not needed (saves a pass over each row) */
    const uint8_t *full; /* [n_logits] or NULL */
    float *logits;       /* [n_logits, vocab] (rows with full[i]), or NULL if no full */
    /* Optional: host work that may run while the device computes the step (a backend that
     * computes asynchronously calls it once, after launching and before waiting; others may
     * not call it at all). It must not touch the plan or the output buffers. */
    void (*while_running)(void *user);
    void *while_running_user;
} gptoss_logits_summary;

/* Runs one plan and returns summaries of its logits: the backend reduces the rows where they
 * are (the CUDA backend on the GPU, so only n_top values per row cross to the host). */
gptoss_status gptoss_backend_forward_summary(gptoss_backend *backend, const gptoss_batch_plan *plan,
                                             const gptoss_logits_summary *out, gptoss_error *error);

/* The top-n and log-sum-exp (skipped when logsumexp is NULL) of one host row, by the rules of
 * gptoss_logits_summary. */
void gptoss_logits_summarize_row(const float *row, int32_t vocab_size, int32_t n_top,
                                 int32_t *top_ids, float *top_logits, float *logsumexp);

/* ---------------------------------------------------------------------------------------- */
/* Sampling where the logits are                                                             */
/* ---------------------------------------------------------------------------------------- */

/* At most this many most-likely alternatives per drawn token (OpenAI's top_logprobs bound). */
#define GPTOSS_MAX_SAMPLE_LOGPROBS 20

/*
 * How one logits row becomes a token: the rule of src/backend/sampling_rule.h (processed
 * logits, greedy or temperature, min_p -> top_k -> top_p, an exact integer-weight draw with
 * Philox random bits keyed by (seed, position, choice)). Every backend draws exactly the token
 * the host reference draws from the same row.
 */
typedef struct gptoss_sample_row {
    float temperature;        /* 0 = greedy */
    float top_p;              /* (0, 1]; 1 = off */
    int32_t top_k;            /* <= 0 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off (tokens with seen != 0 in the edits) */
    float frequency_penalty;  /* 0 = off (per output_count of the edits) */
    float presence_penalty;   /* 0 = off (tokens with output_count > 0) */
    uint64_t seed;            /* Philox key */
    int64_t position;         /* position of the token being drawn (Philox counter) */
    int32_t choice;           /* choice index (Philox counter) */
    int32_t n_top_logprobs; /* -1: no logprobs; 0: the drawn token's; 1..20: and the most likely */
    int32_t edit_start;     /* this row's edits: [edit_start, edit_start + n_edits) */
    int32_t n_edits;
    int32_t allowed_row; /* row of the batch's allowed_masks, or -1: every token allowed */
} gptoss_sample_row;

/* What a row changes about single tokens, one entry per token (a row's entries sorted by
 * token, no token twice). Applied in the rule's order: bias, then masked, then repetition
 * (seen), then frequency and presence (output_count). */
typedef struct gptoss_sample_edit {
    int32_t token;
    float bias;           /* added to the logit (0 = none) */
    int32_t output_count; /* times generated so far (frequency / presence penalties) */
    uint8_t seen;         /* in the prompt or the output (repetition penalty) */
    uint8_t masked;       /* may not be drawn (stop tokens before min_tokens) */
} gptoss_sample_edit;

typedef struct gptoss_sample_batch {
    const gptoss_sample_row *rows;   /* [plan->n_logits], in the order of logit_token_index */
    const gptoss_sample_edit *edits; /* [n_edits] */
    int32_t n_edits;
    /* [n_allowed_rows, (vocab + 31) / 32]: token j allowed iff bit j % 32 of word j / 32 */
    const uint32_t *allowed_masks;
    int32_t n_allowed_rows;
    /* Optional, instead of allowed_masks (which is then NULL): writes every word of the
     * n_allowed_rows masks (the layout above) into `masks` once the forward is under way, so
     * building them on the host overlaps the device's work. The backend calls it exactly once
     * per call with rows to draw, after launching the forward and before any row is drawn or
     * any mask is read. An error it returns is the call's error (no token is drawn). */
    gptoss_status (*fill_masks)(void *user, uint32_t *masks, gptoss_error *error);
    void *fill_masks_user;
    int32_t *token_ids;  /* out [n_logits] */
    float *logprobs;     /* out [n_logits]: raw logprob of the drawn token (n_top_logprobs >= 0) */
    int32_t *top_ids;    /* out [n_logits, GPTOSS_MAX_SAMPLE_LOGPROBS], or NULL */
    float *top_logprobs; /* out, same shape: most likely first, ties by lower id */
    /* Optional host work while the device computes (as in gptoss_logits_summary). */
    void (*while_running)(void *user);
    void *while_running_user;
} gptoss_sample_batch;

/* Runs one plan and draws one token per logits row. Only the token ids and the logprobs asked
 * for come back to the host. The plan and the batch are validated first (edits in range,
 * sorted, rows' parameters in range); a bad batch changes nothing. */
gptoss_status gptoss_backend_forward_sample(gptoss_backend *backend, const gptoss_batch_plan *plan,
                                            const gptoss_sample_batch *batch, gptoss_error *error);

/* The options the backend runs with, defaults and automatic sizes resolved. */
gptoss_backend_options gptoss_backend_get_options(const gptoss_backend *backend);

/* The shape the backend runs (the model's config, or the random-weight shape). */
const gptoss_config *gptoss_backend_config(const gptoss_backend *backend);

/* The backend's name ("cpu", "cuda"). */
const char *gptoss_backend_name(const gptoss_backend *backend);

void gptoss_backend_free(gptoss_backend *backend);

/* Whether this build includes the CUDA backend. */
bool gptoss_has_cuda(void);

/* Whether a backend of this kind can run here, before any model is loaded: the CPU always
 * can; CUDA needs the build's CUDA backend and GPU `device` present with compute capability
 * 8.0 or newer. The error says what is missing. */
gptoss_status gptoss_backend_check_device(gptoss_backend_kind kind, int32_t device,
                                          gptoss_error *error);

/* GPUs the CUDA backend can open (CUDA_VISIBLE_DEVICES applies): device ordinals run from 0 to
 * this minus one. 0 without CUDA in the build, without a driver, or without a GPU. */
int32_t gptoss_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* GPTOSS_H */
