/*
 * tp_net.h - tensor parallelism across processes (one per node): the TCP link between
 * process 0 and its followers, the frames they exchange, and the process-wide job the
 * command line hands to the CUDA backend (host C, no CUDA).
 *
 * Process 0 runs the engine; each follower holds the GPU ranks of its node and runs, for
 * every step, the plan process 0 sends it, in step with process 0's own ranks (the NCCL
 * collectives of the step join them). The link is the rendezvous connection
 * (gptoss_dist_rendezvous_keep), kept open from start-up to shutdown.
 *
 * A frame: magic "GOTP" u32, version u16, type u16, payload length u32 (all little-endian),
 * then the payload. Every field of a received frame is checked; a frame that fails a check
 * is an error naming what was wrong, never a crash. The order of a job's frames:
 *   follower -> 0: HELLO (what it was started with: the model's shape and the options that
 *                  must agree), then READY (its ranks are loaded; its KV pool) or ERROR
 *   0 -> follower: START (the job goes on; the KV pool every rank uses) or ERROR, then STEP
 *                  per step, then QUIT at shutdown
 *   follower -> 0: ERROR when a step fails on it (then it exits)
 * A closed connection, either way, ends the job.
 *
 * Owns: the encoding and checks of frames, the link's sockets, and the job registry.
 * Threads: a link is used by one thread at a time; the job registry is set once by the
 * command before any backend exists.
 */
#ifndef GPTOSS_BACKEND_TP_NET_H
#define GPTOSS_BACKEND_TP_NET_H

#include "gptoss.h"
#include "util/dist.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPTOSS_TP_NET_MAGIC 0x50544f47u /* "GOTP" as little-endian bytes */
#define GPTOSS_TP_NET_VERSION 2u
#define GPTOSS_TP_NET_HEADER_BYTES 12
/* The largest payload accepted: a step of 1M tokens with its tables fits with room. */
#define GPTOSS_TP_NET_MAX_PAYLOAD (64u << 20)
/* The most processes in a job (each holds at least one of at most 8 GPU ranks). */
#define GPTOSS_TP_NET_MAX_PROCS 8
#define GPTOSS_TP_NET_MAX_MESSAGE 1024

typedef enum gptoss_tp_net_type {
    GPTOSS_TP_NET_HELLO = 1,
    GPTOSS_TP_NET_READY = 2,
    GPTOSS_TP_NET_START = 3,
    GPTOSS_TP_NET_STEP = 4,
    GPTOSS_TP_NET_QUIT = 5,
    GPTOSS_TP_NET_ERROR = 6,
} gptoss_tp_net_type;

/* "HELLO", "READY", ...; "?" outside the enum. */
const char *gptoss_tp_net_type_name(uint32_t type);

/* A growable byte buffer (frames being built or received). */
typedef struct gptoss_tp_net_buf {
    uint8_t *data;
    size_t len, cap;
} gptoss_tp_net_buf;

void gptoss_tp_net_buf_free(gptoss_tp_net_buf *buf);

/* What a process was started with that must be the same in every process of a job. */
typedef struct gptoss_tp_net_hello {
    int32_t proc, n_procs; /* the sender's process rank, the job's processes */
    int32_t tp_size;       /* GPU ranks in the job */
    int32_t n_layers, hidden_size, intermediate_size, n_heads, n_kv_heads, head_dim, n_experts,
        vocab_size, sliding_window;
    int32_t kv_block_size, kv_cache_dtype, fp8_layers, batch_invariant;
    int32_t random_weights; /* 1: random weights (their seed must agree too) */
    int32_t gpu_sms;        /* the first GPU's multiprocessors (the kernels' splits follow it) */
    int32_t split_lm_head;  /* GPTOSS_TP_SPLIT_LM_HEAD */
    int32_t moe_parallel;   /* gptoss_moe_parallel */
    uint64_t seed;
} gptoss_tp_net_hello;

/* READY (a follower's pool) and START (the pool of the job: the smallest). */
typedef struct gptoss_tp_net_pool {
    int32_t n_kv_blocks, n_sliding_kv_blocks, kv_shared_pages;
} gptoss_tp_net_pool;

/* What process 0 runs for a step (its ranks: the ops table's call; a follower's ranks run the
 * step alone whatever it is). */
typedef enum gptoss_tp_net_step_kind {
    GPTOSS_TP_NET_STEP_FORWARD = 0,
    GPTOSS_TP_NET_STEP_SUMMARY = 1,
    GPTOSS_TP_NET_STEP_SAMPLE = 2,
    GPTOSS_TP_NET_STEP_BENCH = 3, /* the step alone (bench) */
    GPTOSS_TP_NET_STEP_KINDS = 4,
} gptoss_tp_net_step_kind;

/* A decoded STEP: the step's number (1, 2, ... in order), its kind, whether process 0's ranks
 * run it as a captured graph, and the plan, whose arrays point into `ints` (owned). */
typedef struct gptoss_tp_net_step {
    uint64_t seq;
    uint8_t kind; /* gptoss_tp_net_step_kind */
    bool graphs;
    gptoss_batch_plan plan;
    int32_t *ints;
    size_t ints_cap;
} gptoss_tp_net_step;

void gptoss_tp_net_step_free(gptoss_tp_net_step *step);

/* Payload encoders (into buf, replacing what it held) and decoders (the payload alone, after
 * the header was checked). A decoder fails, naming the field, on a payload of the wrong
 * length, a count out of range or a flag that is neither 0 nor 1. */
gptoss_status gptoss_tp_net_encode_hello(gptoss_tp_net_buf *buf, const gptoss_tp_net_hello *h,
                                         gptoss_error *error);
gptoss_status gptoss_tp_net_decode_hello(const uint8_t *p, size_t n, gptoss_tp_net_hello *h,
                                         gptoss_error *error);
gptoss_status gptoss_tp_net_encode_pool(gptoss_tp_net_buf *buf, const gptoss_tp_net_pool *pool,
                                        gptoss_error *error);
gptoss_status gptoss_tp_net_decode_pool(const uint8_t *p, size_t n, gptoss_tp_net_pool *pool,
                                        gptoss_error *error);
/* The plan's arrays as they are (its validation is gptoss_batch_plan_validate's). */
gptoss_status gptoss_tp_net_encode_step(gptoss_tp_net_buf *buf, uint64_t seq, uint8_t kind,
                                        bool graphs, const gptoss_batch_plan *plan,
                                        gptoss_error *error);
gptoss_status gptoss_tp_net_decode_step(const uint8_t *p, size_t n, gptoss_tp_net_step *step,
                                        gptoss_error *error);
/* An ERROR payload is the message's bytes (at most GPTOSS_TP_NET_MAX_MESSAGE - 1; longer
 * ones are cut); decoding makes it a string (bytes other than printable ASCII become '?'). */
gptoss_status gptoss_tp_net_encode_error(gptoss_tp_net_buf *buf, const char *message,
                                         gptoss_error *error);
void gptoss_tp_net_decode_error(const uint8_t *p, size_t n, char *out, size_t out_size);

/* The first field in which two hellos differ, as "the model's KV heads: 8 here, 4 there", or
 * false when every field that must agree does (proc is not compared). */
bool gptoss_tp_net_hello_differs(const gptoss_tp_net_hello *mine, const gptoss_tp_net_hello *theirs,
                                 char *why, size_t why_size);

/* One frame over a socket (blocking or not). timeout_ms < 0: no limit. A send fails when the
 * peer is gone or the time runs out; a receive when the connection closes (the message then
 * says "closed the connection"), the time runs out, or the header is not a valid frame
 * (magic, version, type, length): the payload is then not read. */
gptoss_status gptoss_tp_net_send(int fd, uint32_t type, const uint8_t *payload, size_t n,
                                 int64_t timeout_ms, gptoss_error *error);
gptoss_status gptoss_tp_net_recv(int fd, uint32_t *type, gptoss_tp_net_buf *payload,
                                 int64_t timeout_ms, gptoss_error *error);

/* ---- the link ---------------------------------------------------------------------------- */

typedef struct gptoss_tp_link {
    int32_t proc, n_procs;
    /* process 0: fds[p], the socket of follower p (1..n_procs-1); a follower: fds[0] */
    int fds[GPTOSS_TP_NET_MAX_PROCS];
} gptoss_tp_link;

/* The rendezvous (blob: process 0's, handed to every follower; see gptoss_dist_rendezvous)
 * with its connections kept as the link, with TCP keep-alive on them (a peer host that goes
 * silent is noticed within about 30 s) and no Nagle delay. A job of more than
 * GPTOSS_TP_NET_MAX_PROCS processes is refused. */
gptoss_status gptoss_tp_link_open(const gptoss_dist_info *info, uint8_t *blob, int64_t timeout_ms,
                                  gptoss_tp_link *link, gptoss_error *error);
void gptoss_tp_link_close(gptoss_tp_link *link);

/* Process 0: one frame to every follower. On failure *failed_proc names the first follower
 * that could not be reached. */
gptoss_status gptoss_tp_link_broadcast(gptoss_tp_link *link, uint32_t type, const uint8_t *payload,
                                       size_t n, int64_t timeout_ms, int32_t *failed_proc,
                                       gptoss_error *error);

/* Process 0: one frame of `type` from every follower, each decoded by decode into
 * (char *)out + p * out_stride for follower p (out's entry 0 is left alone), before the
 * deadline; a follower that sends ERROR instead, closes its connection or sends another type
 * fails the call with a message naming it. timeout_ms < 0: no limit. */
gptoss_status gptoss_tp_link_gather(gptoss_tp_link *link, uint32_t type,
                                    gptoss_status (*decode)(const uint8_t *p, size_t n, void *out,
                                                            gptoss_error *error),
                                    void *out, size_t out_stride, int64_t timeout_ms,
                                    gptoss_error *error);

/* Process 0, between and during steps: whether every follower is still there. Looks without
 * waiting; a follower that sent something (followers send nothing after READY unless they
 * failed: their ERROR is read here), closed its connection or whose host stopped answering
 * the keep-alive fails it, with a message naming the process. */
gptoss_status gptoss_tp_link_check(gptoss_tp_link *link, gptoss_error *error);

/* A follower: whether process 0 has closed its side of the connection (or the connection
 * failed). Reads nothing: frames still queued stay for the follower's loop. */
bool gptoss_tp_link_leader_gone(const gptoss_tp_link *link);

/* ---- a job's exchanges over the link ---------------------------------------------------- */

/* Before loading: a follower sends its HELLO and checks the one process 0 answers with;
 * process 0 gathers every follower's (within timeout_ms), checks each against its own and
 * answers with its own, or tells every follower the first difference (ERROR) and fails with
 * it. Either side's message names the field that differs. */
gptoss_status gptoss_tp_link_hello(gptoss_tp_link *link, const gptoss_tp_net_hello *mine,
                                   int64_t timeout_ms, gptoss_error *error);

/* After loading. load_status and load_message: how loading went here (a failure is told to
 * the peers, then returned). *pool: this process's KV pool in, the job's out: process 0
 * gathers every follower's READY (no time limit: a follower may load for minutes; one that
 * dies closes its connection), takes the smallest pool and answers START with it; a follower
 * sends READY and waits for START. A follower whose pages are shared where process 0's are
 * not (or the reverse) fails the job. */
gptoss_status gptoss_tp_link_ready(gptoss_tp_link *link, gptoss_status load_status,
                                   const char *load_message, gptoss_tp_net_pool *pool,
                                   gptoss_error *error);

/* Tells the other side why this process is about to end (ERROR; best effort, about a second):
 * process 0 every follower, a follower process 0. A follower then stops sending and waits up
 * to 2 s for process 0 to close, so that the message is read before the exit resets the
 * connection. */
void gptoss_tp_link_tell(gptoss_tp_link *link, const char *message);

/* Where a follower's plans must fit (gptoss_batch_plan_validate's arguments). */
typedef struct gptoss_tp_follow_geometry {
    const gptoss_config *config;
    int32_t kv_block_size, n_kv_blocks, n_sliding_kv_blocks;
} gptoss_tp_follow_geometry;

/* A follower's loop: every STEP from process 0 is decoded, checked (step numbers follow
 * *last_seq by one; the plan passes gptoss_batch_plan_validate against geo) and handed to
 * run; *last_seq is the last step run. Returns GPTOSS_OK on QUIT; fails when the connection
 * ends, process 0 sends ERROR, a frame or plan fails a check (process 0 is then told why), or
 * run fails. */
gptoss_status gptoss_tp_link_follow(gptoss_tp_link *link, const gptoss_tp_follow_geometry *geo,
                                    gptoss_status (*run)(void *user, const gptoss_tp_net_step *step,
                                                         gptoss_error *error),
                                    void *user, uint64_t *last_seq, gptoss_error *error);

/* ---- the job of this process ------------------------------------------------------------ */

/* Records the multi-process job this process belongs to (world_size > 1), for the CUDA
 * backend created next; gptoss_tp_job() then returns a copy's address. A job of one process
 * clears it. */
void gptoss_tp_job_set(const gptoss_dist_info *info);
const gptoss_dist_info *gptoss_tp_job(void);

/* What the command does when the backend breaks (the server answers /health with 503); the
 * backend calls gptoss_tp_job_broken once it knows, before it ends the process. */
void gptoss_tp_job_on_broken(void (*fn)(void *user), void *user);
void gptoss_tp_job_broken(void);

/* A follower's backend registers its step loop when it is created; the command calls
 * gptoss_tp_job_follow, which runs it until process 0 says QUIT (GPTOSS_OK) or the job
 * fails. Without a registered loop it fails. */
void gptoss_tp_job_set_follower(gptoss_status (*follow)(void *state, gptoss_error *error),
                                void *state);
gptoss_status gptoss_tp_job_follow(gptoss_error *error);

#endif
