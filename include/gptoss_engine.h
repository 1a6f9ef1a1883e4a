/*
 * gptoss_engine.h - the public C API of the inference engine: requests in, tokens out, one
 * dedicated thread. Together with gptoss.h (models and backends) it is what a library user
 * needs to serve a model: engine options, sampling parameters, requests and their events,
 * the one-request generate helper, and statistics.
 *
 * The engine owns the request queue, the scheduler (continuous batching with chunked
 * prefill and preemption), the KV block manager with its prefix cache, and the sampler.
 * Each step it builds one gptoss_batch_plan and one gptoss_sample_batch (each row's sampling
 * parameters, seed and penalty edits) and runs them through an injectable forward_sample
 * function (normally gptoss_backend_forward_sample), which draws one token for every sequence
 * that produced logits where the logits are. It must not know about HTTP, JSON, text or the
 * tokenizer: callers speak token ids.
 *
 * Threads: gptoss_engine_start() launches the engine thread. Every other function here may
 * be called from any thread, except gptoss_engine_free (one caller, after all other calls
 * returned). Requests submitted before start simply wait in the queue.
 *
 * Life of a request:
 *   gptoss_engine_submit()      -> a gptoss_request handle (the caller holds one reference)
 *   gptoss_request_next_event() -> tokens (with logprobs) and, last, one finish event per
 *                                  choice; or set an on_event callback to be woken instead
 *   gptoss_request_cancel()     -> the engine frees the request's KV blocks at its next step
 *                                  and emits finish events with GPTOSS_FINISH_CANCELLED
 *   gptoss_request_release()    -> drops the caller's reference (cancels if unfinished)
 *
 * Stop strings need text, which the engine does not have: the caller detokenizes, and on a
 * match calls gptoss_request_stop_choice(); the engine then finishes that choice with
 * GPTOSS_FINISH_STOP (tokens generated in the meantime are still delivered; ignore them).
 */
#ifndef GPTOSS_ENGINE_H
#define GPTOSS_ENGINE_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* The function the engine calls once per step, with gptoss_backend_forward_sample's contract:
 * run the plan and draw one token per logits row by the rule of the batch's rows, calling the
 * batch's fill_masks (when set) once the forward is under way and before drawing. Tests
 * inject fakes. */
typedef gptoss_status (*gptoss_forward_sample_fn)(void *user, const gptoss_batch_plan *plan,
                                                  const gptoss_sample_batch *batch,
                                                  gptoss_error *error);

#define GPTOSS_ENGINE_MAX_EOS 8

/* Speculative decoding (docs/speculative.md): where draft tokens come from. Drafting never
 * changes what a request gets: every position is drawn from the target model's own row with
 * the key it would have without drafting, and drafts only decide how many positions one step
 * verifies. */
typedef enum gptoss_draft_kind {
    GPTOSS_DRAFT_NONE = 0,   /* one token per decoding sequence and step */
    GPTOSS_DRAFT_NGRAM = 1,  /* prompt lookup: the tokens that followed the latest earlier
                                occurrence of the last n tokens of prompt + output */
    GPTOSS_DRAFT_REPLAY = 2, /* measurement: the request's draft_replay tokens, each replaced
                                by a wrong token with probability 1 - replay_accept */
    GPTOSS_DRAFT_EAGLE3 = 3  /* an EAGLE3 draft head (model_dir) reading the target's hidden
                                states (engine options draft_target) */
} gptoss_draft_kind;

#define GPTOSS_MAX_SPECULATIVE_TOKENS 7

typedef struct gptoss_draft_options {
    gptoss_draft_kind kind;
    int32_t num_speculative_tokens; /* k: drafts per sequence and step, 1..7 (default 3) */
    /* The step is compute-bound with many decoding sequences: above max_batch of them nobody
     * drafts; above max_batch / 2, k is halved (default 16; 0 = no limit). */
    int32_t max_batch;
    int32_t ngram_max, ngram_min; /* n-gram lengths tried, longest first (default 3, 1) */
    /* A sequence whose acceptance (the recent rate at which a draft is right given the ones
     * before it were) falls below min_acceptance stops drafting for cooldown_steps of its
     * steps, then tries again (defaults 0.25 and 32). */
    float min_acceptance;
    int32_t cooldown_steps;
    float replay_accept;  /* replay: probability that a drafted token is kept right, [0, 1] */
    uint64_t replay_seed; /* replay: key of the wrong-token draws */
    /* Each step verifies only as many drafts as pay for themselves, judged from measured
     * step times by width and each sequence's acceptance (docs/speculative.md). Tests that
     * count drafts set this to verify every draft the other rules allow. */
    bool ignore_step_cost;
    const char *model_dir; /* eagle3: the head's folder (config.json + *.safetensors) */
} gptoss_draft_options;

/* What a draft head needs from the target model (GPTOSS_DRAFT_EAGLE3); set by
 * gptoss_engine_options_for_backend. Called on the engine thread only. */
struct gptoss_eagle3_head;
struct gptoss_eagle3_exec;

typedef struct gptoss_draft_target {
    void *user;
    int32_t n_layers, hidden_size;
    /* Keep the residual stream at these layer boundaries for every token of later forwards
     * (the backend may refuse: GPTOSS_ERR_UNSUPPORTED). */
    gptoss_status (*capture_hidden)(void *user, const int32_t *boundaries, int32_t n,
                                    gptoss_error *error);
    /* The last forward's rows [n_tokens, n * hidden] in plan token order, or NULL. */
    const float *(*captured_hidden)(void *user, int32_t *n_tokens);
    /* The target's embedding rows of tokens[0..n) as f32 [n, hidden]. */
    gptoss_status (*embed_tokens)(void *user, const int32_t *tokens, int32_t n, float *out,
                                  gptoss_error *error);
    /* Optional: an executor that runs the head on the target's device (the internal
     * model/eagle3.h types); NULL: the head runs on the CPU. */
    gptoss_status (*head_exec)(void *user, const struct gptoss_eagle3_head *head,
                               struct gptoss_eagle3_exec *out, gptoss_error *error);
} gptoss_draft_target;

typedef struct gptoss_engine_options {
    gptoss_forward_sample_fn forward_sample; /* required */
    void *forward_user;             /* passed to forward_sample (e.g. the gptoss_backend) */
    int32_t vocab_size;             /* logits row width */
    int32_t sliding_window;         /* tokens incl. self of sliding layers; 0 = none */
    int32_t kv_block_size;          /* tokens per KV page; must match the backend */
    int32_t n_kv_blocks;            /* pages in the full-attention pool; match the backend */
    int32_t n_sliding_kv_blocks;    /* pages in the sliding pool (0 = n_kv_blocks) */
    bool kv_shared_pages;           /* one id space of n_kv_blocks for both pools;
                                       required when the backend shares them */
    int32_t max_num_seqs;           /* sequences per step (default 64) */
    int32_t max_num_batched_tokens; /* new tokens per step, decodes + prefill (default 2048) */
    int32_t max_model_len;          /* prompt + generated tokens per sequence */
    int32_t max_queue_len;          /* requests waiting to start; submit beyond -> CAPACITY */
    bool enable_prefix_cache;       /* reuse full KV blocks across requests (default on) */
    int32_t admit_headroom;         /* a waiting request starts while others run only if its
                                       prompt leaves this many free KV tokens per running
                                       sequence (default 1; 0 = none; src/engine/scheduler.h) */
    int32_t eos_token_ids[GPTOSS_ENGINE_MAX_EOS]; /* tokens that end generation */
    int32_t n_eos_token_ids;
    gptoss_draft_options draft;       /* speculative decoding (default: kind NONE) */
    gptoss_draft_target draft_target; /* the target's side of a draft head (eagle3) */
    /* Tests and diagnostics only; defaults off. */
    struct {
        /* keep only this many bits of the prefix cache's block hash (forces collisions);
         * 0 = all 64 index bits */
        int32_t prefix_hash_bits;
    } testing;
} gptoss_engine_options;

/* Defaults: 16-token pages, 256 pages, 64 seqs, 2048 tokens/step, max_model_len 8192,
 * queue 4096, prefix cache on, no drafting (draft options at their defaults, kind NONE), no
 * forward function (the caller must set one). */
gptoss_engine_options gptoss_engine_options_default(void);

/* Fills forward_sample/forward_user (gptoss_backend_forward_sample on `backend`), vocab_size,
 * sliding_window (0 when no layer slides), the KV geometry of backend_options, and the eos
 * tokens (the config's eos_token_id when it is in the vocabulary); caps max_model_len at
 * max_position_embeddings. Other fields keep what the caller set. A front end that speaks
 * harmony then replaces the eos tokens with the chat layer's stop ids
 * (gptoss_engine_options_set_eos with gptoss_chat_stop_ids). */
void gptoss_engine_options_for_backend(gptoss_engine_options *options, const gptoss_config *config,
                                       gptoss_backend *backend,
                                       const gptoss_backend_options *backend_options);

/* Makes ids[0..n) that lie in [0, vocab_size) the eos tokens (at most GPTOSS_ENGINE_MAX_EOS;
 * set vocab_size first). When none does (a model without the harmony vocabulary), the eos
 * tokens stay as they were. */
void gptoss_engine_options_set_eos(gptoss_engine_options *options, const int32_t *ids, size_t n);

/* ---------------------------------------------------------------------------------------- */
/* Sampling parameters (vLLM / OpenAI semantics)                                             */
/* ---------------------------------------------------------------------------------------- */

#define GPTOSS_MAX_TOP_LOGPROBS 20
#define GPTOSS_MAX_STOP_TOKENS 16
#define GPTOSS_MAX_LOGIT_BIAS 1024
#define GPTOSS_MAX_SALT_BYTES 256

typedef struct gptoss_sampling_params {
    float temperature;        /* 0 = greedy (argmax after penalties) */
    float top_p;              /* (0, 1]; 1 = off */
    int32_t top_k;            /* 0 or -1 = off */
    float min_p;              /* [0, 1]; 0 = off; keeps p >= min_p * max p */
    float presence_penalty;   /* [-2, 2], on generated tokens */
    float frequency_penalty;  /* [-2, 2], on generated tokens, per occurrence */
    float repetition_penalty; /* > 0; 1 = off; prompt and generated tokens */
    bool has_seed;            /* false: seeded from the engine's own entropy */
    uint64_t seed;            /* same seed, same output, whatever the batch, preemptions or
                                 backend (Philox keyed by seed, counter position, choice) */
    bool logprobs;            /* return the sampled token's logprob */
    int32_t top_logprobs;     /* 0..GPTOSS_MAX_TOP_LOGPROBS alternatives per token */
    int32_t max_tokens;       /* generated tokens; 0 = up to max_model_len / KV capacity */
    int32_t min_tokens;       /* stop tokens are masked until this many were generated */
    bool ignore_eos;          /* do not stop on the engine's eos tokens */
    int32_t stop_token_ids[GPTOSS_MAX_STOP_TOKENS]; /* extra stop tokens */
    int32_t n_stop_token_ids;
    int32_t n; /* choices sharing the prompt's KV (1..max_num_seqs) */
    /* logit_bias: added to the logits of these tokens before any penalty (OpenAI's
     * logit_bias, values in [-100, 100]). The arrays are copied at submit; NULL when
     * n_logit_bias is 0. */
    const int32_t *logit_bias_tokens; /* [n_logit_bias], distinct, each in [0, vocab) */
    const float *logit_bias_values;   /* [n_logit_bias] */
    int32_t n_logit_bias;             /* 0..GPTOSS_MAX_LOGIT_BIAS */
} gptoss_sampling_params;

/* temperature 1, top_p 1, top_k off, min_p 0, no penalties, no seed, no logprobs,
 * max_tokens 0 (as many as fit), n 1. */
gptoss_sampling_params gptoss_sampling_params_default(void);

/* Checks ranges; the message names the offending field (fit for an HTTP 400). */
gptoss_status gptoss_sampling_params_validate(const gptoss_sampling_params *params,
                                              int32_t vocab_size, gptoss_error *error);

/* ---------------------------------------------------------------------------------------- */
/* Events                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef enum gptoss_finish_reason {
    GPTOSS_FINISH_NONE = 0,      /* not finished: the event carries a token */
    GPTOSS_FINISH_STOP = 1,      /* eos / stop token / stop string reported by the caller */
    GPTOSS_FINISH_LENGTH = 2,    /* max_tokens or max_model_len reached */
    GPTOSS_FINISH_CANCELLED = 3, /* gptoss_request_cancel, release, or engine shutdown */
    GPTOSS_FINISH_ERROR = 4,     /* the backend failed; see gptoss_request_error */
} gptoss_finish_reason;

/* Short stable name: "stop", "length", "cancelled", "error", "none". */
const char *gptoss_finish_reason_name(gptoss_finish_reason reason);

typedef struct gptoss_token_logprob {
    int32_t token_id;
    float logprob; /* natural log of the model's probability (raw logits, before penalties) */
} gptoss_token_logprob;

typedef struct gptoss_engine_event {
    int32_t index;          /* choice 0..n-1 */
    int32_t token_id;       /* the generated token, or -1 on a finish event without one */
    float logprob;          /* when params.logprobs or top_logprobs > 0 */
    int32_t n_top_logprobs; /* filled entries of top_logprobs, highest first */
    gptoss_token_logprob top_logprobs[GPTOSS_MAX_TOP_LOGPROBS];
    gptoss_finish_reason finish; /* != NONE: this is the choice's last event */
    int32_t stop_token_id;       /* on FINISH_STOP by a token: that token, else -1 */
} gptoss_engine_event;

/* ---------------------------------------------------------------------------------------- */
/* Engine                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct gptoss_engine gptoss_engine;
typedef struct gptoss_request gptoss_request;

/* Validates options and allocates everything the engine needs (no thread yet). */
gptoss_status gptoss_engine_create(const gptoss_engine_options *options, gptoss_engine **out,
                                   gptoss_error *error);

/* Starts the engine thread. Calling it twice is an error. */
gptoss_status gptoss_engine_start(gptoss_engine *engine, gptoss_error *error);

/* Graceful drain (SIGTERM): stop accepting new requests (submit answers CAPACITY with a
 * "shutting down" message), let in-flight ones finish. Waits up to timeout_ms (< 0 = forever)
 * and returns true when nothing is left. The thread keeps running until free. */
bool gptoss_engine_drain(gptoss_engine *engine, int64_t timeout_ms);

/* Stops the thread, cancels whatever is left (its requests get FINISH_CANCELLED) and frees
 * the engine. Request handles still held by callers stay valid until released. NULL ok. */
void gptoss_engine_free(gptoss_engine *engine);

/* Called on the engine thread whenever new events were queued for a request; must be quick
 * and must not block (typically: wake the connection that reads the events). */
typedef void (*gptoss_request_notify_fn)(void *user, gptoss_request *request);

/* Constrains the next draw of one choice (structured output): fills mask[(vocab_size + 31) / 32]
 * (token t may be drawn iff bit t % 32 of word t / 32 is set; the engine zeroes the words
 * first) given the tokens the choice generated so far. Called on the engine thread before
 * every draw of every choice of the request (while the device runs the step's forward pass,
 * through gptoss_sample_batch.fill_masks), without any lock held; must be quick and must
 * not call into the engine. Returning false, or allowing no token, ends the choice with
 * GPTOSS_FINISH_ERROR. */
typedef bool (*gptoss_allowed_tokens_fn)(void *user, int32_t choice, const int32_t *generated,
                                         int32_t n_generated, uint32_t *mask, int32_t vocab_size);

typedef struct gptoss_request_options {
    const uint8_t *cache_salt;       /* per-tenant salt: prefix cache hits only within a salt */
    size_t cache_salt_len;           /* 0..GPTOSS_MAX_SALT_BYTES */
    gptoss_request_notify_fn notify; /* optional */
    void *notify_user;
    gptoss_allowed_tokens_fn allowed_tokens; /* optional: every token allowed when NULL */
    void *allowed_tokens_user;
    /* Optional: when the submit succeeds, the request owns allowed_tokens_user and calls this
     * once it is freed (after the caller released it and the engine is done with it), so a
     * callback never outlives its state. A refused submit leaves it to the caller. */
    void (*allowed_tokens_free)(void *user);
    /* allowed_tokens is a pure function of (choice, generated tokens), with no state of its
     * own: speculative decoding may then ask it about draft positions (histories that end in
     * drafts not verified yet). Without it, a request with allowed_tokens never drafts. */
    bool allowed_tokens_stateless;
    /* Replay drafting (GPTOSS_DRAFT_REPLAY, measurement only): the continuation to draft
     * from, e.g. the request's own greedy output recorded in a first run; copied at submit.
     * Ignored by the other draft kinds. */
    const int32_t *draft_replay; /* [n_draft_replay] token ids, each in [0, vocab) */
    int32_t n_draft_replay;
} gptoss_request_options;

/* Queues a request. prompt: [n_prompt] token ids, copied. Refuses with a clear message:
 * bad params or token ids (INVALID_ARGUMENT), a prompt/max_tokens beyond max_model_len or
 * a sequence that could never fit the KV pools (CAPACITY, permanent), a full queue or a
 * draining engine (CAPACITY, retry later; see gptoss_engine_queue_full). */
gptoss_status gptoss_engine_submit(gptoss_engine *engine, const int32_t *prompt, int32_t n_prompt,
                                   const gptoss_sampling_params *params,
                                   const gptoss_request_options *request_options,
                                   gptoss_request **out, gptoss_error *error);

/* Whether the waiting queue is at max_queue_len or the engine is draining (HTTP 429/503). */
bool gptoss_engine_queue_full(gptoss_engine *engine);

/* Cancels by id; false when no such live request. */
bool gptoss_engine_cancel(gptoss_engine *engine, uint64_t request_id);

/* Unique id of a request (monotone in submission order, starting at 1). */
uint64_t gptoss_request_id(const gptoss_request *request);

/* Takes the next event. timeout_ms: 0 = poll, < 0 = wait forever. Returns 1 with an event,
 * 0 on timeout, -1 when every choice has finished and all events were taken. */
int gptoss_request_next_event(gptoss_request *request, gptoss_engine_event *event,
                              int64_t timeout_ms);

/* Asks the engine to finish the request (all choices) as cancelled. Idempotent. */
void gptoss_request_cancel(gptoss_request *request);

/* The caller found a stop string in choice `index`: finish it with GPTOSS_FINISH_STOP. */
void gptoss_request_stop_choice(gptoss_request *request, int32_t index);

/* Prompt tokens served from the prefix cache (known once the request started). */
int32_t gptoss_request_cached_prompt_tokens(const gptoss_request *request);

/* Seconds the request waited: from submit to the start of the engine step that admitted it;
 * -1 if it never started. Read it once a finish event was taken (which orders the write). */
double gptoss_request_queue_seconds(const gptoss_request *request);

/* The message of a GPTOSS_FINISH_ERROR (empty otherwise); valid until release. */
const char *gptoss_request_error(const gptoss_request *request);

/* Drops the caller's reference; cancels the request when it has not finished. NULL ok. */
void gptoss_request_release(gptoss_request *request);

/* ---------------------------------------------------------------------------------------- */
/* One request, synchronously                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Called with each generated token of the request, in order, on the caller's thread (the
 * token that finished it included). Returning false stops the request (FINISH_CANCELLED). */
typedef bool (*gptoss_generate_token_fn)(void *user, const gptoss_engine_event *event);

/* Polled at least every 20 ms while the request runs; returning true stops it (a terminal
 * front end polls its Ctrl-C flag here). */
typedef bool (*gptoss_generate_stop_fn)(void *user);

typedef struct gptoss_generate_options {
    gptoss_generate_token_fn on_token;             /* optional */
    gptoss_generate_stop_fn should_stop;           /* optional */
    void *user;                                    /* passed to both */
    const gptoss_request_options *request_options; /* optional (cache salt) */
} gptoss_generate_options;

typedef struct gptoss_generate_result {
    gptoss_finish_reason finish; /* why it ended: STOP, LENGTH, CANCELLED (stopped) or ERROR */
    int32_t stop_token_id;       /* on FINISH_STOP by a token: that token, else -1 */
    int32_t n_generated;         /* tokens handed to on_token */
    int32_t n_cached_prompt;     /* prompt tokens the prefix cache served */
    double first_token_seconds;  /* from submit to the first token (0 when none came) */
    double seconds;              /* from submit to the finish */
} gptoss_generate_result;

/* Submits one request with params (params->n must be 1) and waits for it to finish, handing
 * every token to options->on_token. The engine must be running. Fails as
 * gptoss_engine_submit does; a request the backend failed returns the request's error (the
 * tokens before it were delivered). A stopped request is not an error: result->finish says
 * CANCELLED. */
gptoss_status gptoss_engine_generate(gptoss_engine *engine, const int32_t *prompt, int32_t n_prompt,
                                     const gptoss_sampling_params *params,
                                     const gptoss_generate_options *options,
                                     gptoss_generate_result *result, gptoss_error *error);

/* ---------------------------------------------------------------------------------------- */
/* Statistics (/metrics)                                                                     */
/* ---------------------------------------------------------------------------------------- */

#define GPTOSS_LATENCY_BUCKETS 12

/* Upper bounds in seconds of the latency histogram buckets (cumulative, Prometheus style;
 * the last bucket is +Inf). */
extern const double gptoss_latency_bucket_bounds[GPTOSS_LATENCY_BUCKETS];

typedef struct gptoss_latency_histogram {
    uint64_t buckets[GPTOSS_LATENCY_BUCKETS]; /* cumulative counts <= bound */
    uint64_t count;
    double sum_seconds;
} gptoss_latency_histogram;

typedef struct gptoss_engine_stats {
    int32_t n_running;          /* sequences holding KV and being stepped */
    int32_t n_waiting;          /* sequences queued (new or preempted), requests not yet taken in */
    int32_t n_waiting_requests; /* requests not yet started (queue length) */
    int32_t kv_blocks_total;    /* full-attention pool (shared pages: the whole id space) */
    int32_t kv_blocks_used;     /* referenced by a sequence (cached-but-idle not counted; shared
                                   pages: both pools' pages) */
    int32_t kv_blocks_cached;   /* idle blocks kept for the prefix cache (evictable) */
    int32_t sliding_blocks_total;
    int32_t sliding_blocks_used;
    uint64_t prefix_cache_queries; /* prompt tokens looked up */
    uint64_t prefix_cache_hits;    /* prompt tokens found */
    uint64_t prompt_tokens;        /* prompt tokens of started requests */
    uint64_t generation_tokens;    /* tokens sampled */
    uint64_t requests_finished[5]; /* choices finished, indexed by gptoss_finish_reason */
    uint64_t preemptions;          /* sequences preempted for lack of KV */
    uint64_t steps;                /* forward calls */
    /* Speculative decoding: draft tokens verified, and of those accepted (acceptance rate =
     * accepted / drafted); sequence steps that verified drafts. */
    uint64_t draft_tokens;
    uint64_t draft_accepted_tokens;
    uint64_t draft_seq_steps;
    double draft_seconds; /* engine-thread time in the draft source (proposing and, for a draft
                             head, reading each step's hidden states) */
    uint64_t draft_proposed_tokens; /* drafts the source proposed; the step-cost rule verifies
                                       draft_tokens of them */
    gptoss_latency_histogram ttft;  /* submit -> first token of choice 0 */
    gptoss_latency_histogram itl;   /* between consecutive tokens of a choice */
    bool draining;
} gptoss_engine_stats;

/* A consistent snapshot (as of the end of the last step). */
void gptoss_engine_get_stats(gptoss_engine *engine, gptoss_engine_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* GPTOSS_ENGINE_H */
