/*
 * tp.cu - tensor parallelism over N GPUs of one host: one process, one full CUDA state per
 * GPU holding its rank's share of the model (tp_split.h), one host thread per rank, and two
 * sum all-reduces per layer (the o-projection's output and the experts' weighted sum, both
 * enqueued on the rank's stream, so a decode step can be one captured CUDA graph): small ones
 * by one kernel writing into the peers' memory (below), larger ones by NCCL.
 *
 * The engine sees one backend: every call hands the same validated plan to every rank and
 * waits for all of them; rank 0 runs the ops table's own call (forward, summary or sample) and
 * alone computes logits, the others run the step. Pages hold only a rank's KV heads, so each
 * GPU fits about N times the tokens; the pool the engine sees is the smallest rank's.
 *
 * NCCL is opened at run time (tp_nccl.h), so a binary without tensor parallelism needs no
 * NCCL. A failing rank aborts every communicator (ranks
 * waiting in a collective for it return) and the backend refuses later calls.
 *
 * Decode steps are captured as CUDA graphs (GPTOSS_TP_GRAPHS=0 runs them eagerly): every rank
 * captures the same step at the same time (one rank capturing while another runs a step can
 * deadlock NCCL inside one process), no rank launches a new graph before every rank has
 * instantiated its own, and the graphs are destroyed before the communicators (tp_free).
 *
 * A watchdog bounds every step: a step still running after GPTOSS_TP_TIMEOUT seconds (a rank
 * hung, or its GPU died) is logged with the ranks still in it, the communicators are aborted,
 * and the process ends (exit status 3). A step that fails on a rank ends the process the same
 * way, after the error is logged: its communicators are aborted, so no later step could run,
 * and a server must not go on failing every request.
 *
 * Across processes (one per node, tp_net.h): the communicators span the GPUs of every process
 * (global rank = process * local GPUs + local index), the split follows the global rank, and
 * the peer-memory all-reduce is off (NCCL sums every size). Process 0 runs the engine: before
 * its own ranks run a step it sends the step's kind, its plan and whether its ranks run it as a
 * captured graph to every follower; a follower's command loops in tp_follow, running each step on
 * its ranks. The watchdog also watches the link: on process 0 a follower that failed, closed its
 * connection or whose host stopped answering ends the process (exit status 3) within about a
 * second (or the keep-alive's 30 s); on a follower, process 0 gone while a step runs ends it.
 *
 * A rank's share of the weights is built by tp_weights.cu.
 *
 * Owns the rank states, their threads and communicators, the peer-memory all-reduce's
 * buffers, the watchdog thread, and (across processes) the link to the other processes.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/tp_allreduce.h"
#include "backend/cuda/tp_nccl.h"

#include <poll.h>
#include <sys/socket.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "backend/tp_net.h"
#include "backend/tp_split.h"
#include "model/config.h"
#include "util/dist.h"
#include "util/log.h"
}

/* ---- the all-reduce over peer memory (kernels/tp_allreduce.cu) ---------------------------- */

/* The peer-memory all-reduce of a group (tp_backend.p2p): on, and each rank's pointers. */
typedef struct tp_p2p {
    bool on;
    size_t max_floats;                        /* sums of at most this many floats take it */
    void *mem[GPTOSS_TP_MAX];                 /* rank r's allocation: slots, flags, counters */
    uint32_t *abort_host;                     /* mapped host word: 1 once tp_abort ran */
    uint32_t *abort_dev[GPTOSS_TP_MAX];       /* rank r's address of it */
    gptoss_cuda_p2p_ptrs ptrs[GPTOSS_TP_MAX]; /* rank r's kernel arguments */
} tp_p2p;

static tp_p2p *group_p2p(void *group);

/* ---- what the layer loop calls ---------------------------------------------------------- */

static gptoss_status nccl_allreduce(gptoss_cuda_state *s, float *buf, size_t n,
                                    gptoss_error *error) {
    const char *was = __atomic_load_n(&s->tp_phase, __ATOMIC_ACQUIRE);
    gptoss_cuda_tp_phase(s, "in ncclAllReduce");
    nccl_result_t r = gptoss_tp_nccl.all_reduce(buf, buf, n, NCCL_FLOAT32, NCCL_SUM,
                                                (nccl_comm_t)s->tp_comm, s->stream);
    gptoss_cuda_tp_phase(s, was);
    return gptoss_tp_nccl_check(r, "all-reduce", error);
}

/* The choice depends on n alone, so every rank of a group takes the same path. */
gptoss_status gptoss_cuda_tp_allreduce(gptoss_cuda_state *s, float *buf, size_t n,
                                       gptoss_error *error) {
    if (s->tp_size <= 1 || n == 0) return GPTOSS_OK;
    const tp_p2p *p = s->tp_group ? group_p2p(s->tp_group) : NULL;
    if (!p || !p->on || n > p->max_floats) return nccl_allreduce(s, buf, n, error);
    gptoss_cuda_p2p_allreduce(&p->ptrs[s->tp_rank], s->tp_size, buf, (uint32_t)n, s->stream);
    CUDA_TRY(cudaGetLastError(), "the peer-memory all-reduce");
    return GPTOSS_OK;
}

size_t gptoss_cuda_tp_p2p_max_floats(const gptoss_cuda_state *s) {
    const tp_p2p *p = s->tp_size > 1 && s->tp_group ? group_p2p(s->tp_group) : NULL;
    return p && p->on ? p->max_floats : 0;
}

/* rows [NL, V] from parts [n, NL, V/n]: part r holds the columns [r V/n, (r+1) V/n). */
static __global__ void join_logits_kernel(const float *parts, float *rows, int32_t NL, int32_t cols,
                                          int32_t n) {
    const size_t total = (size_t)NL * cols * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i % cols, rest = i / cols, row = rest % NL, r = rest / NL;
        rows[row * (size_t)cols * n + r * cols + j] = parts[i];
    }
}

gptoss_status gptoss_cuda_tp_gather_logits(gptoss_cuda_state *s, int32_t NL, gptoss_error *error) {
    if (NL <= 0 || s->tp_size <= 1) return GPTOSS_OK;
    cuda_workspace *w = &s->ws;
    const char *was = __atomic_load_n(&s->tp_phase, __ATOMIC_ACQUIRE);
    gptoss_cuda_tp_phase(s, "in ncclAllGather");
    nccl_result_t r = gptoss_tp_nccl.all_gather(w->lm_part, w->lm_gather, (size_t)NL * s->lm_rows,
                                                NCCL_FLOAT32, (nccl_comm_t)s->tp_comm, s->stream);
    gptoss_cuda_tp_phase(s, was);
    gptoss_status st = gptoss_tp_nccl_check(r, "logits all-gather", error);
    if (st || s->tp_rank != 0) return st;
    join_logits_kernel<<<1024, 256, 0, s->stream>>>(w->lm_gather, w->logits, NL, s->lm_rows,
                                                    s->tp_size);
    return GPTOSS_OK;
}

/* One thread per token: local experts become indices into the rank's experts; slots of
 * other ranks' experts become -1 with weight 0, which every MoE path skips (no weights read,
 * no output row written) and the weighted sum leaves out. */
static __global__ void mask_experts_kernel(int32_t *idx, float *weight, int32_t T, int32_t K,
                                           int32_t lo, int32_t hi) {
    int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    int32_t *ti = idx + (size_t)t * K;
    float *tw = weight + (size_t)t * K;
    for (int32_t k = 0; k < K; k++) {
        if (ti[k] >= lo && ti[k] < hi) {
            ti[k] -= lo;
        } else {
            ti[k] = -1;
            tw[k] = 0.0f;
        }
    }
}

void gptoss_cuda_tp_mask_experts(gptoss_cuda_state *s, int32_t *topk_idx, float *topk_weight,
                                 int32_t T, int32_t K) {
    if (s->tp_size <= 1 || T <= 0) return;
    mask_experts_kernel<<<(T + 127) / 128, 128, 0, s->stream>>>(
        topk_idx, topk_weight, T, K, s->tp_expert0, s->tp_expert0 + s->tp_n_experts);
}

/* ---- the ranks and their threads -------------------------------------------------------- */

struct tp_backend;

typedef struct tp_rank {
    struct tp_backend *tp;
    int32_t rank;
    gptoss_cuda_state *s;
    pthread_t thread;
    bool started;
    uint64_t seen; /* the last job this rank ran */
    int busy;      /* running a job (__atomic: the watchdog reads it) */
    gptoss_status st;
    gptoss_error error;
} tp_rank;

/* A job: what every rank runs for one call (rank 0 on the caller's thread). */
typedef gptoss_status (*tp_job_fn)(tp_rank *r, void *arg, gptoss_error *error);

/* Exit status of a process whose tensor-parallel step failed on a rank or outlived the
 * watchdog. */
#define TP_EXIT_FAILED 3
/* Seconds the watchdog lets the ranks return after it aborted the communicators. */
#define TP_ABORT_GRACE_S 5.0

typedef struct tp_backend {
    int32_t n;
    tp_rank ranks[GPTOSS_TP_MAX];
    nccl_comm_t comms[GPTOSS_TP_MAX];
    bool have_comms;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    uint64_t job_seq;
    int32_t pending; /* ranks 1..n-1 still running the job */
    bool quit;
    tp_job_fn job;
    void *job_arg;
    bool broken; /* a rank failed: the communicators are aborted */
    pthread_mutex_t abort_mu;
    /* the graph rendezvous (tp_graph_barrier): ranks arrived in generation sync_gen */
    pthread_mutex_t sync_mu;
    pthread_cond_t sync_cv;
    int32_t sync_count;
    uint64_t sync_gen;
    bool graphs;          /* GPTOSS_TP_GRAPHS: decode steps may be captured */
    bool split_lm_head;   /* GPTOSS_TP_SPLIT_LM_HEAD: lm_head split by vocabulary */
    int32_t moe_parallel; /* gptoss_moe_parallel: experts by whole experts or by rows */
    /* the watchdog (under mu): the job running since job_t0, named job_what, bounded by
     * job_limit_s seconds (0: not watched) */
    pthread_t watchdog;
    bool watchdog_started;
    pthread_cond_t cv_watch; /* CLOCK_MONOTONIC */
    double timeout_s;        /* GPTOSS_TP_TIMEOUT; 0: no watchdog */
    bool job_active;
    double job_t0, job_limit_s;
    const char *job_what;
    uint64_t steps; /* step jobs run so far */
    tp_p2p p2p;     /* the all-reduce over peer memory (off: NCCL for every size) */
    /* Across processes (tp_net.h); a single process has procs 1, world n, rank0 0. */
    int32_t procs, proc; /* processes in the job, this one's index */
    int32_t world;       /* GPU ranks in the job (n per process) */
    int32_t rank0;       /* the global rank of this process's local rank 0 */
    gptoss_tp_link link;
    bool link_live;        /* (under mu) created: the watchdog watches the link */
    gptoss_config config;  /* the whole model's (a follower validates plans with it) */
    int32_t kv_block_size; /* a follower's KV geometry, for the same validation */
    int32_t n_kv_blocks, n_sliding_kv_blocks;
    gptoss_tp_net_buf net_buf; /* process 0: the STEP frame being sent */
    uint64_t net_seq;          /* the last step sent (process 0) or received (a follower) */
    uint64_t gone_seq;         /* a follower: the job during which process 0 was seen gone */
    double gone_at;            /* and when */
} tp_backend;

static tp_p2p *group_p2p(void *group) {
    return &((tp_backend *)group)->p2p;
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct timespec mono_at(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    return ts;
}

/* Aborts every communicator once (ranks blocked in a collective for a failed peer return,
 * and so do ranks waiting at the graph rendezvous). */
static void tp_abort(tp_backend *tp) {
    pthread_mutex_lock(&tp->abort_mu);
    if (!tp->broken) {
        tp->broken = true;
        if (tp->procs > 1) gptoss_tp_job_broken(); /* the server answers /health with 503 */
        if (tp->have_comms)
            for (int32_t r = 0; r < tp->n; r++)
                if (tp->comms[r]) gptoss_tp_nccl.comm_abort(tp->comms[r]);
        tp->have_comms = false;
        /* kernels of the peer-memory all-reduce waiting for a peer stop waiting */
        if (tp->p2p.abort_host) __atomic_store_n(tp->p2p.abort_host, 1u, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&tp->abort_mu);
    pthread_mutex_lock(&tp->sync_mu);
    pthread_cond_broadcast(&tp->sync_cv);
    pthread_mutex_unlock(&tp->sync_mu);
}

static void rank_run(tp_rank *r, tp_job_fn job, void *arg) {
    memset(&r->error, 0, sizeof r->error);
    __atomic_store_n(&r->busy, 1, __ATOMIC_RELEASE);
    r->st = job(r, arg, &r->error);
    __atomic_store_n(&r->busy, 0, __ATOMIC_RELEASE);
    if (r->st && r->tp->have_comms) {
        GPTOSS_LOG_E("cuda",
                     "tensor parallel: GPU rank %d of %d failed (%s); aborting the NCCL "
                     "communicators",
                     (int)r->rank, (int)r->tp->n, r->error.message);
        tp_abort(r->tp);
    }
}

static void *rank_thread(void *p) {
    tp_rank *r = (tp_rank *)p;
    tp_backend *tp = r->tp;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->quit && tp->job_seq == r->seen)
            pthread_cond_wait(&tp->cv_job, &tp->mu);
        if (tp->quit) break;
        r->seen = tp->job_seq;
        tp_job_fn job = tp->job;
        void *arg = tp->job_arg;
        pthread_mutex_unlock(&tp->mu);
        rank_run(r, job, arg);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->cv_done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

/* The ranks still inside the running job with where their threads are, as "1 (waiting for
 * its GPU), 3 (capturing a step)" (under tp->mu). */
static void busy_ranks(tp_backend *tp, char *out, size_t cap) {
    size_t used = 0;
    out[0] = 0;
    for (int32_t r = 0; r < tp->n && used + 64 < cap; r++) {
        const tp_rank *k = &tp->ranks[r];
        const bool picked = r == 0 || k->seen == tp->job_seq;
        if (picked && !__atomic_load_n(&k->busy, __ATOMIC_ACQUIRE)) continue;
        const char *phase = !picked ? "has not started it"
                            : k->s  ? __atomic_load_n(&k->s->tp_phase, __ATOMIC_ACQUIRE)
                                    : NULL;
        used += (size_t)snprintf(out + used, cap - used, "%s%d (%s)", used ? ", " : "", (int)r,
                                 phase ? phase : "outside a step");
    }
    if (!used) snprintf(out, cap, "none (the caller's thread)");
}

/* Across processes: tells the other processes why this one is about to end
 * (gptoss_tp_link_tell). */
static void tp_tell_peers(tp_backend *tp, const char *message) {
    if (tp->procs > 1) gptoss_tp_link_tell(&tp->link, message);
}

/* The link failed: says why (to the log, and from process 0 to the followers still there),
 * turns the server's /health to 503 and ends the process. The communicators are not aborted
 * first: the exit ends every rank's work anyway, and an abort can wait on a kernel that waits
 * for the lost peer. */
static void tp_link_lost(tp_backend *tp, const char *why) {
    GPTOSS_LOG_E("cuda", "tensor parallel across processes: %s; ending the process with status %d",
                 why, TP_EXIT_FAILED);
    gptoss_tp_job_broken();
    if (tp->proc == 0) tp_tell_peers(tp, why);
    fflush(stdout);
    fflush(stderr);
    _exit(TP_EXIT_FAILED);
}

/* The watchdog's look at the link (not under tp->mu; job_active/job_seq: a snapshot). Process
 * 0: any follower that sent something (its ERROR), closed its connection or whose host stopped
 * answering ends the process. A follower: process 0 seen gone for 2 s while a step of it still
 * runs ends the process (the step waits in a collective for ranks that no longer exist);
 * between steps the follower's loop sees the closed connection itself. */
static void link_watch(tp_backend *tp, bool job_active, uint64_t job_seq) {
    char why[1200];
    if (tp->proc == 0) {
        gptoss_error e = {};
        if (!gptoss_tp_link_check(&tp->link, &e)) return;
        snprintf(why, sizeof why,
                 "%s (the follower exited, failed or its host went down; its own "
                 "log says why)",
                 e.message);
        tp_link_lost(tp, why);
    }
    if (!job_active || !gptoss_tp_link_leader_gone(&tp->link)) {
        tp->gone_seq = 0;
        return;
    }
    if (tp->gone_seq != job_seq) {
        tp->gone_seq = job_seq;
        tp->gone_at = mono_now();
        return;
    }
    if (mono_now() - tp->gone_at < 2.0) return;
    snprintf(why, sizeof why,
             "process 0 closed its connection while step %llu ran here (it exited or its host "
             "went down; its log says why)",
             (unsigned long long)tp->net_seq);
    tp_link_lost(tp, why);
}

/* Ends the process when a watched job outlives its limit: the ranks still in it are named,
 * the communicators aborted (a rank waiting in a collective for a dead peer returns), and
 * after a short grace the process exits, because a rank that hung leaves no usable backend
 * (its thread may never return) and a server must not wait on it forever. */
static void *watchdog_thread(void *p) {
    tp_backend *tp = (tp_backend *)p;
    pthread_mutex_lock(&tp->mu);
    while (!tp->quit) {
        /* across processes the link is looked at every second, steps or not */
        const bool watch_link = tp->link_live;
        if (watch_link) {
            const bool active = tp->job_active;
            const uint64_t job_seq = tp->job_seq;
            pthread_mutex_unlock(&tp->mu);
            link_watch(tp, active, job_seq);
            pthread_mutex_lock(&tp->mu);
            if (tp->quit) break;
        }
        const double tick = watch_link ? mono_now() + 1.0 : 0;
        if (!tp->job_active || tp->job_limit_s <= 0) {
            if (watch_link) {
                struct timespec ts = mono_at(tick);
                pthread_cond_timedwait(&tp->cv_watch, &tp->mu, &ts);
            } else {
                pthread_cond_wait(&tp->cv_watch, &tp->mu);
            }
            continue;
        }
        const uint64_t seq = tp->job_seq;
        const double deadline = tp->job_t0 + tp->job_limit_s;
        if (mono_now() < deadline) {
            struct timespec ts = mono_at(watch_link && tick < deadline ? tick : deadline);
            pthread_cond_timedwait(&tp->cv_watch, &tp->mu, &ts);
            continue; /* woken, timed out or spurious: look again */
        }
        if (!tp->job_active || tp->job_seq != seq) continue;
        char who[1024];
        busy_ranks(tp, who, sizeof who);
        const char *what = tp->job_what ? tp->job_what : "a step";
        const double limit = tp->job_limit_s;
        const unsigned long long step = (unsigned long long)tp->steps;
        pthread_mutex_unlock(&tp->mu);
        GPTOSS_LOG_E("cuda",
                     "tensor parallel: %s (step %llu) has not finished after %.0f s; GPU "
                     "rank(s) %s of %d are still in it (a rank hung or its GPU failed); "
                     "aborting the NCCL communicators and ending the process (GPTOSS_TP_TIMEOUT "
                     "sets the limit in seconds)",
                     what, step, limit, who, (int)tp->n);
        if (tp->procs > 1)
            GPTOSS_LOG_E("cuda",
                         "tensor parallel: those are the local GPUs of process %d of %d (job ranks "
                         "%d..%d); ranks waiting in a collective may be waiting for another "
                         "process, whose log says whether it hung",
                         (int)tp->proc, (int)tp->procs, (int)tp->rank0,
                         (int)(tp->rank0 + tp->n - 1));
        tp_abort(tp);
        pthread_mutex_lock(&tp->mu);
        const double grace_end = mono_now() + TP_ABORT_GRACE_S;
        while (tp->job_active && tp->job_seq == seq && mono_now() < grace_end) {
            struct timespec ts = mono_at(grace_end);
            pthread_cond_timedwait(&tp->cv_watch, &tp->mu, &ts);
        }
        const bool returned = !(tp->job_active && tp->job_seq == seq);
        busy_ranks(tp, who, sizeof who);
        pthread_mutex_unlock(&tp->mu);
        if (returned)
            GPTOSS_LOG_E("cuda",
                         "tensor parallel: the ranks returned after the abort; exiting "
                         "with status %d",
                         TP_EXIT_FAILED);
        else
            GPTOSS_LOG_E("cuda",
                         "tensor parallel: GPU rank(s) %s did not return %.0f s after the "
                         "abort; exiting with status %d",
                         who, TP_ABORT_GRACE_S, TP_EXIT_FAILED);
        char told[256];
        snprintf(told, sizeof told,
                 "%s (step %llu) did not finish within %.0f s (GPTOSS_TP_TIMEOUT)", what, step,
                 limit);
        tp_tell_peers(tp, told);
        fflush(stdout);
        fflush(stderr);
        _exit(TP_EXIT_FAILED);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

/* Runs job on every rank (rank 0 here, the others on their threads) and waits for all; the
 * first failure (by rank) becomes the call's error. limit_s > 0: the watchdog ends the
 * process if the job runs longer (what names it in that message). */
static gptoss_status tp_run(tp_backend *tp, tp_job_fn job, void *arg, double limit_s,
                            const char *what, gptoss_error *error) {
    if (tp->broken)
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND,
                                "tensor parallel backend: a rank failed earlier; the backend "
                                "must be recreated");
    pthread_mutex_lock(&tp->mu);
    tp->job = job;
    tp->job_arg = arg;
    tp->pending = tp->n - 1;
    tp->job_seq++;
    tp->job_active = true;
    tp->job_t0 = mono_now();
    tp->job_limit_s = tp->watchdog_started ? limit_s : 0;
    tp->job_what = what;
    pthread_cond_broadcast(&tp->cv_job);
    pthread_cond_signal(&tp->cv_watch);
    pthread_mutex_unlock(&tp->mu);
    rank_run(&tp->ranks[0], job, arg);
    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0)
        pthread_cond_wait(&tp->cv_done, &tp->mu);
    tp->job_active = false;
    pthread_cond_signal(&tp->cv_watch);
    pthread_mutex_unlock(&tp->mu);
    for (int32_t r = 0; r < tp->n; r++) {
        if (!tp->ranks[r].st) continue;
        if (error)
            snprintf(error->message, sizeof error->message, "GPU rank %d of %d: %.960s", (int)r,
                     (int)tp->n, tp->ranks[r].error.message);
        if (error) error->status = tp->ranks[r].st;
        return tp->ranks[r].st;
    }
    if (tp->broken) /* every rank returned, but a peer's failure cut the job short */
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND,
                                "tensor parallel backend: the NCCL communicators were aborted "
                                "during this call");
    return GPTOSS_OK;
}

/* Every rank of s's group calls this once per captured graph, between instantiation and the
 * first launch: no rank's GPU then runs a collective of the new graph while a peer is still
 * capturing (NCCL's work upload and buffer set-up of a capture are host-side calls that must
 * not wait on a peer), and the device is idle before it (the capture's eager uploads done). */
gptoss_status gptoss_cuda_tp_graph_barrier(gptoss_cuda_state *s, gptoss_error *error) {
    tp_backend *tp = (tp_backend *)s->tp_group;
    if (!tp || tp->n <= 1) return GPTOSS_OK;
    gptoss_cuda_tp_phase(s, "waiting for its GPU after a capture");
    CUDA_TRY(cudaDeviceSynchronize(), "the upload of a captured step");
    gptoss_cuda_tp_phase(s, "waiting for the other ranks' captures");
    pthread_mutex_lock(&tp->sync_mu);
    const uint64_t gen = tp->sync_gen;
    if (++tp->sync_count == tp->n) {
        tp->sync_count = 0;
        tp->sync_gen++;
        pthread_cond_broadcast(&tp->sync_cv);
    } else {
        while (tp->sync_gen == gen && !tp->broken)
            pthread_cond_wait(&tp->sync_cv, &tp->sync_mu);
    }
    const bool broken = tp->sync_gen == gen && tp->broken;
    pthread_mutex_unlock(&tp->sync_mu);
    if (broken)
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND,
                                "tensor parallel: a peer failed while the ranks met after a "
                                "graph capture");
    return GPTOSS_OK;
}

static void tp_free(tp_backend *tp) {
    if (!tp) return;
    if (tp->procs > 1 && tp->proc > 0) gptoss_tp_job_set_follower(NULL, NULL);
    pthread_mutex_lock(&tp->mu);
    /* the followers end when told QUIT, closing their connections: the watchdog, which would
     * take that for a failure, is stopped first */
    const bool quit_followers = tp->procs > 1 && tp->proc == 0 && tp->link_live && !tp->broken;
    tp->link_live = false;
    tp->quit = true;
    pthread_cond_broadcast(&tp->cv_job);
    pthread_cond_broadcast(&tp->cv_watch);
    pthread_mutex_unlock(&tp->mu);
    for (int32_t r = 1; r < tp->n; r++)
        if (tp->ranks[r].started) pthread_join(tp->ranks[r].thread, NULL);
    if (tp->watchdog_started) pthread_join(tp->watchdog, NULL);
    if (quit_followers) {
        gptoss_error ignored = {};
        gptoss_tp_link_broadcast(&tp->link, GPTOSS_TP_NET_QUIT, NULL, 0, 5000, NULL, &ignored);
    }
    for (int32_t r = 0; r < tp->n; r++) {
        gptoss_cuda_state *s = tp->ranks[r].s;
        if (s && s->stream) {
            cudaSetDevice(s->dev.ordinal);
            cudaStreamSynchronize(s->stream);
            /* graphs holding NCCL kernels go before their communicators: NCCL keeps resources
             * alive for captured collectives, and destroying a communicator a graph still
             * references waits for ever */
            gptoss_cuda_graphs_clear(s);
        }
    }
    if (tp->have_comms)
        for (int32_t r = 0; r < tp->n; r++)
            if (tp->comms[r]) gptoss_tp_nccl.comm_destroy(tp->comms[r]);
    for (int32_t r = 0; r < tp->n; r++)
        if (tp->p2p.mem[r] && tp->ranks[r].s) {
            cudaSetDevice(tp->ranks[r].s->dev.ordinal);
            cudaFree(tp->p2p.mem[r]);
        }
    for (int32_t r = 0; r < tp->n; r++)
        gptoss_cuda_state_free(tp->ranks[r].s);
    if (tp->p2p.abort_host) cudaFreeHost(tp->p2p.abort_host);
    gptoss_tp_link_close(&tp->link);
    gptoss_tp_net_buf_free(&tp->net_buf);
    pthread_mutex_destroy(&tp->mu);
    pthread_mutex_destroy(&tp->abort_mu);
    pthread_mutex_destroy(&tp->sync_mu);
    pthread_cond_destroy(&tp->cv_job);
    pthread_cond_destroy(&tp->cv_done);
    pthread_cond_destroy(&tp->cv_watch);
    pthread_cond_destroy(&tp->sync_cv);
    free(tp);
}

/* ---- creation --------------------------------------------------------------------------- */

typedef struct tp_create_args {
    const gptoss_config *config;
    const gptoss_backend_options *options;
    const gptoss_weights *weights; /* NULL: random weights from seed */
    uint64_t seed;
} tp_create_args;

static gptoss_status rank_create(tp_rank *r, void *arg, gptoss_error *error) {
    const tp_create_args *a = (const tp_create_args *)arg;
    const gptoss_config *c = a->config;
    const int32_t n = r->tp->world, rank = r->tp->rank0 + r->rank; /* the job's */
    const gptoss_tp_slice sl = gptoss_tp_rank_slice_moe(c, n, rank, r->tp->moe_parallel);
    /* lm_head by vocabulary: where asked, the vocabulary divides evenly and its rows can be
     * sliced (bf16 in the checkpoint) */
    const bool lm_split = r->tp->split_lm_head && c->vocab_size % n == 0 &&
                          (!a->weights || a->weights->lm_head.dtype == GPTOSS_DTYPE_BF16);
    const int32_t lm_rows = lm_split ? c->vocab_size / n : 0, lm_row0 = rank * lm_rows;
    gptoss_backend_options o = *a->options;
    o.device = a->options->device + r->rank;
    if (r->rank > 0) o.progress = NULL; /* one progress report: rank 0's */
    gptoss_status st =
        gptoss_cuda_tp_rank_state(c, &sl, &o, a->weights, a->seed, lm_row0, lm_rows, &r->s, error);
    if (st) return st;
    r->s->tp_rank = rank;
    r->s->tp_size = n;
    r->s->tp_group = r->tp;
    r->s->tuning.graphs = r->s->tuning.graphs && r->tp->graphs;
    return GPTOSS_OK;
}

/* Eager all-reduces of the sizes decode steps use (one row to 64 rows), so NCCL connects
 * its channels before the first step is captured into a graph, and the peer-memory kernel
 * (where it takes these sizes) has run once on every rank. */
static gptoss_status rank_warm_up(tp_rank *r, void *arg, gptoss_error *error) {
    (void)arg;
    gptoss_cuda_state *s = r->s;
    gptoss_status st = gptoss_cuda_device_bind(&s->dev, error);
    if (st) return st;
    const size_t H = (size_t)s->config.hidden_size;
    float *buf = NULL;
    st = gptoss_cuda_alloc((void **)&buf, 64 * H * sizeof(float), "an all-reduce warm-up", error);
    if (st) return st;
    cudaError_t ce = cudaMemsetAsync(buf, 0, 64 * H * sizeof(float), s->stream);
    const size_t sizes[3] = {H, 8 * H, 64 * H};
    gptoss_cuda_tp_phase(s, "enqueuing the warm-up all-reduces");
    for (int i = 0; i < 3 && ce == cudaSuccess && !st; i++) {
        st = nccl_allreduce(s, buf, sizes[i], error);
        if (!st) st = gptoss_cuda_tp_allreduce(s, buf, sizes[i], error); /* peer memory */
    }
    gptoss_cuda_tp_phase(s, "waiting for its GPU (warm-up all-reduces)");
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(s->stream);
    gptoss_cuda_tp_phase(s, "warm-up done");
    cudaFree(buf);
    if (st) return st;
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "all-reduce warm-up");
    return GPTOSS_OK;
}

/* Rank r's part of the peer-memory all-reduce: access to every peer's memory and its own
 * receive area. Not possible (no peer access between two of the GPUs, or no memory) is not an
 * error: the group then uses NCCL for every size, and *why says so. */
typedef struct p2p_setup_args {
    bool ok[GPTOSS_TP_MAX];
    char why[GPTOSS_TP_MAX][160];
} p2p_setup_args;

static gptoss_status rank_p2p_setup(tp_rank *r, void *arg, gptoss_error *error) {
    p2p_setup_args *a = (p2p_setup_args *)arg;
    tp_backend *tp = r->tp;
    gptoss_cuda_state *s = r->s;
    gptoss_status st = gptoss_cuda_device_bind(&s->dev, error);
    if (st) return st;
    const int32_t n = tp->n, me = s->dev.ordinal;
    for (int32_t q = 0; q < n; q++) {
        const int peer = tp->ranks[q].s->dev.ordinal;
        if (peer == me) continue;
        int can = 0;
        cudaError_t ce = cudaDeviceCanAccessPeer(&can, me, peer);
        if (ce != cudaSuccess || !can) {
            snprintf(a->why[r->rank], sizeof a->why[r->rank],
                     "GPU %d cannot access the memory of GPU %d", me, peer);
            cudaGetLastError();
            return GPTOSS_OK;
        }
        ce = cudaDeviceEnablePeerAccess(peer, 0);
        if (ce == cudaErrorPeerAccessAlreadyEnabled) {
            cudaGetLastError(); /* NCCL enabled it */
        } else if (ce != cudaSuccess) {
            snprintf(a->why[r->rank], sizeof a->why[r->rank],
                     "enabling access from GPU %d to GPU %d failed: %s", me, peer,
                     cudaGetErrorString(ce));
            cudaGetLastError();
            return GPTOSS_OK;
        }
    }
    const size_t slots = 2 * (size_t)n * tp->p2p.max_floats * sizeof(float);
    const size_t bytes =
        slots + 2 * (size_t)GPTOSS_CUDA_P2P_BLOCKS * GPTOSS_TP_MAX * sizeof(uint32_t);
    void *mem = NULL;
    cudaError_t ce = cudaMalloc(&mem, bytes);
    if (ce == cudaSuccess) ce = cudaMemset(mem, 0, bytes);
    if (ce == cudaSuccess) ce = cudaDeviceSynchronize(); /* zeroed before any peer writes */
    if (ce != cudaSuccess) {
        if (mem) cudaFree(mem);
        cudaGetLastError();
        snprintf(a->why[r->rank], sizeof a->why[r->rank],
                 "no room for %zu bytes of receive area on GPU %d (%s)", bytes, me,
                 cudaGetErrorString(ce));
        return GPTOSS_OK;
    }
    uint32_t *abort_dev = NULL;
    ce = cudaHostGetDevicePointer((void **)&abort_dev, tp->p2p.abort_host, 0);
    if (ce != cudaSuccess) {
        cudaFree(mem);
        cudaGetLastError();
        snprintf(a->why[r->rank], sizeof a->why[r->rank], "GPU %d cannot map host memory (%s)", me,
                 cudaGetErrorString(ce));
        return GPTOSS_OK;
    }
    tp->p2p.abort_dev[r->rank] = abort_dev;
    tp->p2p.mem[r->rank] = mem;
    a->ok[r->rank] = true;
    return GPTOSS_OK;
}

/* The peer-memory all-reduce of tp (tp->p2p.max_floats set from the environment): on when
 * every rank set up its part; otherwise off, every part freed, and why logged. */
static gptoss_status p2p_setup(tp_backend *tp, gptoss_error *error) {
    tp_p2p *p = &tp->p2p;
    if (p->max_floats == 0) return GPTOSS_OK;
    cudaError_t ce = cudaHostAlloc((void **)&p->abort_host, sizeof(uint32_t),
                                   cudaHostAllocMapped | cudaHostAllocPortable);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        p->abort_host = NULL;
        GPTOSS_LOG_W("cuda",
                     "tensor parallel: no all-reduce over peer memory (no mapped host "
                     "memory: %s); NCCL sums every size",
                     cudaGetErrorString(ce));
        return GPTOSS_OK;
    }
    *(volatile uint32_t *)p->abort_host = 0;
    p2p_setup_args a;
    memset(&a, 0, sizeof a);
    gptoss_status st =
        tp_run(tp, rank_p2p_setup, &a, tp->timeout_s, "the peer access set-up", error);
    if (st) return st;
    const char *why = NULL;
    for (int32_t r = 0; r < tp->n && !why; r++)
        if (!a.ok[r]) why = a.why[r];
    if (why) {
        GPTOSS_LOG_W("cuda",
                     "tensor parallel: no all-reduce over peer memory (%s); NCCL sums "
                     "every size",
                     why);
        int current = 0;
        cudaGetDevice(&current);
        for (int32_t r = 0; r < tp->n; r++)
            if (p->mem[r]) {
                cudaSetDevice(tp->ranks[r].s->dev.ordinal);
                cudaFree(p->mem[r]);
                p->mem[r] = NULL;
            }
        cudaSetDevice(current);
        cudaFreeHost(p->abort_host);
        p->abort_host = NULL;
        return GPTOSS_OK;
    }
    const size_t slots = 2 * (size_t)tp->n * p->max_floats;
    for (int32_t r = 0; r < tp->n; r++) {
        gptoss_cuda_p2p_ptrs *k = &p->ptrs[r];
        memset(k, 0, sizeof *k);
        for (int32_t q = 0; q < tp->n; q++) {
            k->slots[q] = (float *)p->mem[q];
            k->flags[q] = (uint32_t *)((float *)p->mem[q] + slots);
        }
        k->counters = k->flags[r] + GPTOSS_CUDA_P2P_BLOCKS * GPTOSS_TP_MAX;
        k->abort = p->abort_dev[r];
        k->rank = r;
        k->slot_floats = (uint32_t)p->max_floats;
    }
    p->on = true;
    return GPTOSS_OK;
}

/* GPTOSS_TP_P2P (0: NCCL for every all-reduce) and GPTOSS_TP_P2P_MAX_BYTES (the largest sum
 * the peer-memory kernel takes, default 1 MiB: 64 rows of 120b's 2880 floats; 0: none) into
 * the most floats it takes, a multiple of 4. */
static gptoss_status p2p_env(size_t *max_floats, gptoss_error *error) {
    size_t bytes = (size_t)1 << 20;
    const char *on = getenv("GPTOSS_TP_P2P");
    if (on && *on) {
        if (strcmp(on, "0") && strcmp(on, "1"))
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "GPTOSS_TP_P2P is '%s'; it must be 0 or 1", on);
        if (on[0] == '0') bytes = 0;
    }
    const char *m = getenv("GPTOSS_TP_P2P_MAX_BYTES");
    if (bytes && m && *m) {
        char *end = NULL;
        unsigned long long v = strtoull(m, &end, 10);
        if (end == m || *end || m[0] == '-' || v > (64ull << 20))
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "GPTOSS_TP_P2P_MAX_BYTES is '%s'; it must be a number of "
                                    "bytes from 0 (NCCL for every size) to 67108864",
                                    m);
        bytes = (size_t)v;
    }
    *max_floats = bytes / sizeof(float) / 4 * 4;
    return GPTOSS_OK;
}

/* Seconds a step or the warm-up may take before the watchdog ends the process: 60 (a
 * 120b prefill step of 8192 tokens takes about a second), or GPTOSS_TP_TIMEOUT (0: never). */
static gptoss_status tp_env(double *timeout_s, bool *graphs, bool *split_lm_head,
                            gptoss_error *error) {
    *timeout_s = 60;
    *graphs = true;
    *split_lm_head = false;
    const char *l = getenv("GPTOSS_TP_SPLIT_LM_HEAD");
    if (l && *l) {
        if (strcmp(l, "0") && strcmp(l, "1"))
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "GPTOSS_TP_SPLIT_LM_HEAD is '%s'; it must be 0 or 1", l);
        *split_lm_head = l[0] == '1';
    }
    const char *t = getenv("GPTOSS_TP_TIMEOUT");
    if (t && *t) {
        char *end = NULL;
        double v = strtod(t, &end);
        if (end == t || *end || !(v >= 0) || v > 86400)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "GPTOSS_TP_TIMEOUT is '%s'; it must be a number of seconds "
                                    "from 0 (no watchdog) to 86400",
                                    t);
        *timeout_s = v;
    }
    const char *g = getenv("GPTOSS_TP_GRAPHS");
    if (g && *g) {
        if (strcmp(g, "0") && strcmp(g, "1"))
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "GPTOSS_TP_GRAPHS is '%s'; it must be 0 or 1", g);
        *graphs = g[0] == '1';
    }
    return GPTOSS_OK;
}

/* ---- across processes: the job's start-up ---------------------------------------------- */

/* How long the processes of a job may take to start and find process 0. */
#define JOB_JOIN_TIMEOUT_MS (300 * 1000)
/* How long the HELLOs may take once every process is connected. */
#define JOB_HELLO_TIMEOUT_MS (60 * 1000)

/* What this process was started with, as every process of the job must have been. */
static gptoss_tp_net_hello job_hello(const tp_backend *tp, const gptoss_config *c,
                                     const gptoss_backend_options *o, bool random, uint64_t seed) {
    gptoss_tp_net_hello h;
    memset(&h, 0, sizeof h);
    h.proc = tp->proc;
    h.n_procs = tp->procs;
    h.tp_size = tp->world;
    h.n_layers = c->n_layers;
    h.hidden_size = c->hidden_size;
    h.intermediate_size = c->intermediate_size;
    h.n_heads = c->n_heads;
    h.n_kv_heads = c->n_kv_heads;
    h.head_dim = c->head_dim;
    h.n_experts = c->n_experts;
    h.vocab_size = c->vocab_size;
    h.sliding_window = c->sliding_window;
    h.kv_block_size = o->kv_block_size;
    h.kv_cache_dtype = (int32_t)o->kv_cache_dtype;
    h.fp8_layers = (int32_t)o->fp8_layers;
    h.batch_invariant = o->batch_invariant ? 1 : 0;
    h.random_weights = random ? 1 : 0;
    h.seed = random ? seed : 0;
    h.split_lm_head = tp->split_lm_head ? 1 : 0;
    h.moe_parallel = tp->moe_parallel;
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, o->device) != cudaSuccess) {
        cudaGetLastError();
        sms = 0;
    }
    h.gpu_sms = sms;
    return h;
}

/* Before loading: the link to the other processes (process 0's NCCL id travels with the
 * rendezvous) and the HELLOs compared, so that a process started with another model or other
 * options fails before any weights are loaded. */
static gptoss_status job_connect(tp_backend *tp, const gptoss_dist_info *job,
                                 const gptoss_tp_net_hello *mine, nccl_unique_id *id,
                                 gptoss_error *error) {
    gptoss_status st = GPTOSS_OK;
    if (tp->proc == 0)
        st = gptoss_tp_nccl_check(gptoss_tp_nccl.get_unique_id(id), "ncclGetUniqueId", error);
    if (!st)
        st = gptoss_tp_link_open(job, (uint8_t *)id->internal, JOB_JOIN_TIMEOUT_MS, &tp->link,
                                 error);
    if (!st) st = gptoss_tp_link_hello(&tp->link, mine, JOB_HELLO_TIMEOUT_MS, error);
    return st;
}

/* The communicators of this process's ranks in the job's group (one NCCL group call, as NCCL
 * asks of one thread creating several). */
static gptoss_status job_comms(tp_backend *tp, const nccl_unique_id *id, int32_t device,
                               gptoss_error *error) {
    nccl_result_t r = gptoss_tp_nccl.group_start();
    const char *what = "ncclGroupStart";
    for (int32_t q = 0; q < tp->n && r == 0; q++) {
        cudaSetDevice(device + q);
        r = gptoss_tp_nccl.comm_init_rank(&tp->comms[q], tp->world, *id, tp->rank0 + q);
        what = "ncclCommInitRank";
    }
    nccl_result_t end = gptoss_tp_nccl.group_end();
    if (r == 0 && end != 0) r = end, what = "ncclGroupEnd";
    cudaSetDevice(device);
    return gptoss_tp_nccl_check(r, what, error);
}

static gptoss_status tp_follow(void *state, gptoss_error *error);

static gptoss_status tp_create_common(const gptoss_config *config, gptoss_backend_options *options,
                                      const gptoss_weights *weights, uint64_t seed, void **state,
                                      gptoss_error *error) {
    /* tensor_parallel_size counts the GPUs of every process of a job (tp_net.h) */
    const gptoss_dist_info *job = gptoss_tp_job();
    const int32_t world = options->tensor_parallel_size, procs = job ? job->world_size : 1;
    gptoss_status st = gptoss_tp_check_options(world, options->kind, error);
    if (st) return st;
    st = gptoss_tp_check_job(config, world, procs, options->device, gptoss_cuda_count_devices(),
                             error);
    if (!st) st = gptoss_tp_check_moe(config, world, options->moe_parallel, error);
    if (st) return st;
    const int32_t n = world / procs; /* the GPUs of this process */
    double timeout_s = 0;
    bool graphs = false, split_lm_head = false;
    st = tp_env(&timeout_s, &graphs, &split_lm_head, error);
    if (st) return st;
    size_t p2p_max_floats = 0;
    st = p2p_env(&p2p_max_floats, error);
    if (st) return st;
    st = gptoss_tp_nccl_load(error);
    if (st) return st;
    if (procs > 1 && (!gptoss_tp_nccl.get_unique_id || !gptoss_tp_nccl.comm_init_rank ||
                      !gptoss_tp_nccl.group_start || !gptoss_tp_nccl.group_end))
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "tensor parallelism across processes needs ncclGetUniqueId, "
                                "ncclCommInitRank, ncclGroupStart and ncclGroupEnd, which this "
                                "NCCL library lacks");
    gptoss_dist_env_defaults();
    /* 0 keeps the user's value. Connect at creation, not inside a capture. A rank's NCCL work
     * all goes on its one stream, in order, and every step ends before the next begins, so
     * NCCL's ordering of graph launches against eager calls (whose events NCCL's
     * documentation names as a source of deadlocks with several GPUs in one process) and its
     * buffer registration during a capture (calls to the peers' proxies) are not needed. */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", 0);
    setenv("NCCL_GRAPH_REGISTER", "0", 0);
    tp_backend *tp = (tp_backend *)calloc(1, sizeof *tp);
    if (!tp) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    tp->n = n;
    tp->graphs = graphs;
    tp->split_lm_head = split_lm_head;
    tp->moe_parallel = options->moe_parallel;
    tp->timeout_s = timeout_s;
    tp->p2p.max_floats = procs > 1 ? 0 : p2p_max_floats; /* peers in other processes: NCCL */
    tp->procs = procs;
    tp->proc = job ? job->rank : 0;
    tp->world = world;
    tp->rank0 = tp->proc * n;
    tp->config = *config;
    for (int i = 0; i < GPTOSS_TP_NET_MAX_PROCS; i++)
        tp->link.fds[i] = -1;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_mutex_init(&tp->abort_mu, NULL);
    pthread_mutex_init(&tp->sync_mu, NULL);
    pthread_cond_init(&tp->cv_job, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    pthread_cond_init(&tp->sync_cv, NULL);
    pthread_condattr_t watch_attr;
    pthread_condattr_init(&watch_attr);
    pthread_condattr_setclock(&watch_attr, CLOCK_MONOTONIC);
    pthread_cond_init(&tp->cv_watch, &watch_attr);
    pthread_condattr_destroy(&watch_attr);
    for (int32_t r = 0; r < n; r++) {
        tp->ranks[r].tp = tp;
        tp->ranks[r].rank = r;
    }
    if (timeout_s > 0 || procs > 1) { /* across processes it watches the link too */
        if (pthread_create(&tp->watchdog, NULL, watchdog_thread, tp) != 0) {
            tp_free(tp);
            return gptoss_set_error(error, GPTOSS_ERR_BACKEND,
                                    "tensor parallelism: cannot start the watchdog thread");
        }
        tp->watchdog_started = true;
    }
    for (int32_t r = 1; r < n; r++) {
        if (pthread_create(&tp->ranks[r].thread, NULL, rank_thread, &tp->ranks[r]) != 0) {
            tp_free(tp);
            return gptoss_set_error(error, GPTOSS_ERR_BACKEND,
                                    "tensor parallelism: cannot start a thread per GPU");
        }
        tp->ranks[r].started = true;
    }
    nccl_unique_id id;
    memset(&id, 0, sizeof id);
    if (procs > 1) {
        const gptoss_tp_net_hello mine = job_hello(tp, config, options, !weights, seed);
        st = job_connect(tp, job, &mine, &id, error);
        if (st) {
            gptoss_error_prefix(error, "tensor parallel across processes: ");
            tp_free(tp);
            return st;
        }
    }
    tp_create_args args = {config, options, weights, seed};
    st = tp_run(tp, rank_create, &args, 0, "loading", error);
    int32_t blocks = INT_MAX, sliding = INT_MAX;
    for (int32_t r = 0; r < n && !st; r++) {
        const gptoss_cuda_state *s = tp->ranks[r].s;
        if (s->n_kv_blocks < blocks) blocks = s->n_kv_blocks;
        if (s->n_sliding_kv_blocks < sliding) sliding = s->n_sliding_kv_blocks;
    }
    if (procs > 1) {
        gptoss_tp_net_pool pool = {blocks, sliding, !st && tp->ranks[0].s->kv_shared ? 1 : 0};
        const gptoss_status load_st = st;
        char load_message[sizeof error->message];
        snprintf(load_message, sizeof load_message, "%s", st ? error->message : "");
        st = gptoss_tp_link_ready(&tp->link, load_st, load_message, &pool, error);
        if (st && !load_st) gptoss_error_prefix(error, "tensor parallel across processes: ");
        blocks = pool.n_kv_blocks;
        sliding = pool.n_sliding_kv_blocks;
    }
    if (st) {
        tp_free(tp);
        return st;
    }
    if (procs > 1) {
        st = job_comms(tp, &id, options->device, error);
    } else {
        int devices[GPTOSS_TP_MAX];
        for (int32_t r = 0; r < n; r++)
            devices[r] = options->device + r;
        st = gptoss_tp_nccl_check(gptoss_tp_nccl.comm_init_all(tp->comms, n, devices),
                                  "communicator creation", error);
    }
    if (st) {
        tp_free(tp);
        return st;
    }
    tp->have_comms = true;
    for (int32_t r = 0; r < n; r++)
        tp->ranks[r].s->tp_comm = tp->comms[r];
    options->n_kv_blocks = blocks;
    options->n_sliding_kv_blocks = sliding;
    options->kv_shared_pages = tp->ranks[0].s->kv_shared;
    st = p2p_setup(tp, error);
    if (st) {
        tp_free(tp);
        return st;
    }
    st = tp_run(tp, rank_warm_up, NULL, tp->timeout_s, "the all-reduce warm-up", error);
    if (st) {
        tp_free(tp);
        return st;
    }
    int version = 0;
    gptoss_tp_nccl.get_version(&version);
    if (procs > 1) {
        tp->kv_block_size = options->kv_block_size;
        tp->n_kv_blocks = blocks;
        tp->n_sliding_kv_blocks = sliding;
        if (tp->proc > 0) gptoss_tp_job_set_follower(tp_follow, tp);
        pthread_mutex_lock(&tp->mu);
        tp->link_live = true;
        pthread_cond_signal(&tp->cv_watch);
        pthread_mutex_unlock(&tp->mu);
        GPTOSS_LOG_I("cuda",
                     "tensor parallel across %d processes: this is process %d, GPU ranks %d..%d of "
                     "%d on GPUs %d..%d here (NCCL %d), %d KV pages per GPU (the job's smallest)",
                     (int)procs, (int)tp->proc, (int)tp->rank0, (int)(tp->rank0 + n - 1),
                     (int)world, (int)options->device, (int)(options->device + n - 1), version,
                     (int)blocks);
    } else {
        GPTOSS_LOG_I("cuda", "tensor parallel over GPUs %d..%d (NCCL %d), %d KV pages per GPU",
                     (int)options->device, (int)(options->device + n - 1), version, (int)blocks);
    }
    if (tp->ranks[0].s->tuning.graphs)
        GPTOSS_LOG_I("cuda", "tensor parallel: decode steps captured as CUDA graphs "
                             "(GPTOSS_TP_GRAPHS=0 runs them eagerly)");
    else
        GPTOSS_LOG_I("cuda", "tensor parallel: decode steps run without CUDA graphs "
                             "(GPTOSS_TP_GRAPHS=0)");
    if (tp->p2p.on)
        GPTOSS_LOG_I("cuda",
                     "tensor parallel: all-reduces of up to %zu bytes over peer memory (one "
                     "kernel), larger ones by NCCL (GPTOSS_TP_P2P_MAX_BYTES; GPTOSS_TP_P2P=0: "
                     "NCCL for all)",
                     tp->p2p.max_floats * sizeof(float));
    else if (procs > 1)
        GPTOSS_LOG_I("cuda", "tensor parallel: every all-reduce by NCCL (the ranks are in "
                             "several processes)");
    else if (tp->p2p.max_floats == 0)
        GPTOSS_LOG_I("cuda", "tensor parallel: every all-reduce by NCCL (GPTOSS_TP_P2P=0 or "
                             "GPTOSS_TP_P2P_MAX_BYTES=0)");
    if (tp->ranks[0].s->lm_rows < config->vocab_size)
        GPTOSS_LOG_I("cuda",
                     "tensor parallel: lm_head split by vocabulary, %d rows per GPU "
                     "(GPTOSS_TP_SPLIT_LM_HEAD=1)",
                     (int)tp->ranks[0].s->lm_rows);
    if (tp->timeout_s > 0)
        GPTOSS_LOG_I("cuda",
                     "tensor parallel: a step running over %.0f s ends the process "
                     "(GPTOSS_TP_TIMEOUT)",
                     tp->timeout_s);
    *state = tp;
    return GPTOSS_OK;
}

/* ---- the ops table ---------------------------------------------------------------------- */

static gptoss_status tp_create(const gptoss_model *model, gptoss_backend_options *options,
                               void **state, gptoss_error *error) {
    return tp_create_common(gptoss_model_config(model), options, gptoss_model_weights(model), 0,
                            state, error);
}

static gptoss_status tp_create_random(const gptoss_config *config, gptoss_backend_options *options,
                                      uint64_t seed, void **state, gptoss_error *error) {
    return tp_create_common(config, options, NULL, seed, state, error);
}

static void tp_destroy(void *state) {
    tp_free((tp_backend *)state);
}

/* The arguments of one forward call; rank 0 runs `rank0`, the others the bare step. */
typedef struct tp_step_args {
    const gptoss_batch_plan *plan;
    float *logits;
    const gptoss_logits_summary *summary;
    const gptoss_sample_batch *batch;
    /* 0 forward, 1 summary, 2 sample, 3 the step alone (rank 0 not waited for), 4 a
     * follower's step (process 0's plan) */
    int kind;
    /* whether the step may be a captured graph on ranks other than the job's rank 0: -1 reads
     * rank 0's state (one process), else process 0's decision (0 or 1) */
    int graphs;
} tp_step_args;

static const char *const step_names[5] = {"a forward step", "a summary step", "a sampling step",
                                          "a benchmark step", "a step of process 0"};

static gptoss_status rank_step(tp_rank *r, void *arg, gptoss_error *error) {
    const tp_step_args *a = (const tp_step_args *)arg;
    gptoss_cuda_state *s = r->s;
    gptoss_cuda_tp_phase(s, "starting a step");
    if (r->rank == 0 && r->tp->proc == 0) { /* its own waits for the GPU are in these */
        gptoss_status st;
        switch (a->kind) {
        case 0:
            st = gptoss_cuda_backend_ops.forward(s, a->plan, a->logits, error);
            break;
        case 1:
            st = gptoss_cuda_backend_ops.forward_summary(s, a->plan, a->summary, error);
            break;
        case 3:
            st = gptoss_cuda_forward_device(s, a->plan, error);
            break;
        default:
            st = gptoss_cuda_backend_ops.forward_sample(s, a->plan, a->batch, error);
            break;
        }
        gptoss_cuda_tp_phase(s, "step done");
        return st;
    }
    /* Every rank captures, replays or runs eagerly exactly when rank 0 does: a collective
     * captured on one rank and run eagerly on another is not the same NCCL operation. Rank 0's
     * graph switch and profiling (bench) decide. */
    if (a->graphs >= 0) {
        s->tuning.graphs = a->graphs == 1;
    } else {
        const gptoss_cuda_state *r0 = r->tp->ranks[0].s;
        s->tuning.graphs = r0->tuning.graphs && !r0->profiling;
    }
    gptoss_status st = gptoss_cuda_forward_device(s, a->plan, error);
    if (st) return st;
    gptoss_cuda_tp_phase(s, "waiting for its GPU");
    CUDA_TRY(cudaStreamSynchronize(s->stream), "forward pass");
    gptoss_cuda_tp_phase(s, "step done");
    return GPTOSS_OK;
}

/* Process 0 of a job of several: the step to every follower, before its own ranks start it.
 * Rank 0's graph decision travels with it (its tuning, and profiling: bench's switch, or the
 * profile knob, with which rank 0 runs summary steps eagerly). A follower that cannot be
 * reached ends the process. */
static void send_step(tp_backend *tp, tp_step_args *a) {
    const gptoss_cuda_state *r0 = tp->ranks[0].s;
    const bool eager = r0->profiling || (a->kind == 1 && r0->tuning.profile);
    a->graphs = r0->tuning.graphs && !eager ? 1 : 0;
    gptoss_error e = {};
    int32_t failed = 0;
    gptoss_status st = gptoss_tp_net_encode_step(&tp->net_buf, tp->net_seq + 1, (uint8_t)a->kind,
                                                 a->graphs == 1, a->plan, &e);
    const double limit_s = tp->timeout_s > 0 ? tp->timeout_s : 60;
    if (!st)
        st = gptoss_tp_link_broadcast(&tp->link, GPTOSS_TP_NET_STEP, tp->net_buf.data,
                                      tp->net_buf.len, (int64_t)(limit_s * 1000), &failed, &e);
    if (st) {
        char why[1200];
        gptoss_error said = {}; /* a follower that failed may have said why before it left */
        if (gptoss_tp_link_check(&tp->link, &said))
            snprintf(why, sizeof why, "%s", said.message);
        else
            snprintf(why, sizeof why, "cannot send step %llu: %s",
                     (unsigned long long)(tp->net_seq + 1), e.message);
        tp_link_lost(tp, why);
    }
    tp->net_seq++;
}

static gptoss_status tp_step_run(tp_backend *tp, tp_step_args *a, gptoss_error *error) {
    pthread_mutex_lock(&tp->mu);
    tp->steps++;
    const unsigned long long step = (unsigned long long)tp->steps;
    pthread_mutex_unlock(&tp->mu);
    gptoss_error local;
    if (!error) error = &local;
    if (tp->procs > 1 && tp->proc == 0) send_step(tp, a);
    gptoss_status st = tp_run(tp, rank_step, a, tp->timeout_s, step_names[a->kind], error);
    if (st && tp->procs > 1 && tp->proc == 0) {
        /* NCCL failing a collective is often the first sign of a lost follower: name it */
        gptoss_error lost = {};
        if (gptoss_tp_link_check(&tp->link, &lost)) tp_link_lost(tp, lost.message);
    }
    if (st) {
        GPTOSS_LOG_E("cuda",
                     "tensor parallel: %s (step %llu) failed: %s; the NCCL communicators are "
                     "aborted, so no later step can run: exiting with status %d",
                     step_names[a->kind], step, error->message, TP_EXIT_FAILED);
        char told[1200];
        snprintf(told, sizeof told, "%s (step %llu) failed on process %d: %.1000s",
                 step_names[a->kind], step, (int)tp->proc, error->message);
        tp_tell_peers(tp, told);
        fflush(stdout);
        fflush(stderr);
        _exit(TP_EXIT_FAILED);
    }
    return GPTOSS_OK;
}

static gptoss_status tp_forward(void *state, const gptoss_batch_plan *plan, float *logits,
                                gptoss_error *error) {
    tp_step_args a = {plan, logits, NULL, NULL, 0, -1};
    return tp_step_run((tp_backend *)state, &a, error);
}

static gptoss_status tp_forward_summary(void *state, const gptoss_batch_plan *plan,
                                        const gptoss_logits_summary *out, gptoss_error *error) {
    tp_step_args a = {plan, NULL, out, NULL, 1, -1};
    return tp_step_run((tp_backend *)state, &a, error);
}

static gptoss_status tp_forward_sample(void *state, const gptoss_batch_plan *plan,
                                       const gptoss_sample_batch *batch, gptoss_error *error) {
    tp_step_args a = {plan, NULL, NULL, batch, 2, -1};
    return tp_step_run((tp_backend *)state, &a, error);
}

gptoss_status gptoss_cuda_tp_step(void *group, const gptoss_batch_plan *plan, gptoss_error *error) {
    tp_step_args a = {plan, NULL, NULL, NULL, 3, -1};
    return tp_step_run((tp_backend *)group, &a, error);
}

/* One step of process 0 on this follower's ranks (gptoss_tp_link_follow checked it). A step
 * that fails ends the process (tp_step_run). */
static gptoss_status follow_step(void *user, const gptoss_tp_net_step *step, gptoss_error *error) {
    tp_backend *tp = (tp_backend *)user;
    tp->net_seq = step->seq;
    tp_step_args a = {&step->plan, NULL, NULL, NULL, 4, step->graphs ? 1 : 0};
    return tp_step_run(tp, &a, error);
}

/* A follower's loop (gptoss_tp_job_follow): each step process 0 sends, on this process's
 * ranks, until QUIT. When the loop fails (the connection ended, a bad frame or plan) the
 * communicators are aborted: without process 0 no collective can finish. */
static gptoss_status tp_follow(void *state, gptoss_error *error) {
    tp_backend *tp = (tp_backend *)state;
    GPTOSS_LOG_I("cuda",
                 "tensor parallel: process %d of %d runs process 0's steps on GPU ranks %d..%d",
                 (int)tp->proc, (int)tp->procs, (int)tp->rank0, (int)(tp->rank0 + tp->n - 1));
    const gptoss_tp_follow_geometry geo = {&tp->config, tp->kv_block_size, tp->n_kv_blocks,
                                           tp->n_sliding_kv_blocks};
    uint64_t last = tp->net_seq;
    gptoss_status st = gptoss_tp_link_follow(&tp->link, &geo, follow_step, tp, &last, error);
    if (st) {
        gptoss_error_prefix(error, "tensor parallel across processes: ");
        tp_abort(tp);
        return st;
    }
    GPTOSS_LOG_I("cuda", "tensor parallel: process 0 is shutting down after %llu steps",
                 (unsigned long long)last);
    return GPTOSS_OK;
}

gptoss_cuda_state *gptoss_cuda_tp_rank0(void *group) {
    return ((tp_backend *)group)->ranks[0].s;
}

typedef struct each_rank_args {
    gptoss_status (*fn)(gptoss_cuda_state *s, void *arg, gptoss_error *error);
    void *arg;
} each_rank_args;

static gptoss_status rank_each(tp_rank *r, void *arg, gptoss_error *error) {
    const each_rank_args *a = (const each_rank_args *)arg;
    gptoss_status st = gptoss_cuda_device_bind(&r->s->dev, error);
    if (st) return st;
    return a->fn(r->s, a->arg, error);
}

gptoss_status gptoss_cuda_tp_each_rank(void *group,
                                       gptoss_status (*fn)(gptoss_cuda_state *s, void *arg,
                                                           gptoss_error *error),
                                       void *arg, gptoss_error *error) {
    tp_backend *tp = (tp_backend *)group;
    each_rank_args a = {fn, arg};
    return tp_run(tp, rank_each, &a, tp->timeout_s, "a job on every rank", error);
}

extern "C" const gptoss_backend_ops gptoss_cuda_tp_backend_ops = {
    "cuda",
    tp_create,
    tp_create_random,
    tp_destroy,
    tp_forward,
    tp_forward_summary,
    tp_forward_sample,
    false /* converts_ggml_experts: the ranks slice unpacked experts (backend.c unpacks) */};
