/*
 * gpu_test_allreduce.cu - the tensor-parallel all-reduce (gptoss_cuda_tp_allreduce) alone,
 * on a tensor-parallel group of a tiny random model, against sums computed on the host.
 *
 * Needs 2 GPUs (4 for the size-4 pass, run when that many are visible), so it is not a ctest
 * test: `scripts/gpu-check --multi` runs it. Usage: gpu_test_allreduce [SIZE...] (default 2,
 * and 4 when 4 GPUs are visible).
 *
 * Every rank gets its own random data for every round; the host adds the ranks' values in
 * rank order in fp32, which is what the peer-memory kernel does, so its result must equal
 * the host sum bitwise on every rank. Sums too large for it go to NCCL: within 1e-5 of the
 * host sum (relative to the sum of magnitudes), and the same on every rank.
 *   - eager: 1000 rounds of 1 to 8 x 2880 floats, enqueued back to back on every rank without
 *     waiting (a fast rank runs ahead of a slow one), half of them at a buffer address that is
 *     not 16-byte aligned (the scalar path);
 *   - large: 64 x 2880 floats, the largest size the kernel takes and sizes above it (NCCL);
 *   - graphs: 4 all-reduces captured as one CUDA graph on every rank, replayed 200 times with
 *     new data, an eager all-reduce between replays (the kernel's round counters live on the
 *     GPU, so replays and eager launches must stay in step).
 * Then the latency of one all-reduce of 2880 floats (eager and in a graph), with the
 * peer-memory kernel and, in a second group made with GPTOSS_TP_P2P=0, with NCCL.
 *
 * Exits 1 on failure. GPTOSS_TP_P2P=0 in the environment tests the NCCL path alone.
 */
#include "backend/cuda/cuda_backend.h"

extern "C" {
#include "backend/tp_split.h"
#include "model/config.h"
}

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define ROW 2880 /* 120b's hidden size: one decode token */
#define EAGER_ROUNDS 1000
#define GRAPH_REPLAYS 200
#define TIMED 1000

typedef struct round_spec {
    size_t off, n; /* floats [off, off + n) of the round data */
    bool misaligned;
} round_spec;

typedef struct test_ctx {
    int32_t n_ranks;
    int mode; /* 0 rounds eagerly, 1 graph replays, 2 timing */
    std::vector<round_spec> rounds;
    size_t total, max_n;
    std::vector<float> in[GPTOSS_TP_MAX], out[GPTOSS_TP_MAX];
    int graph_rounds; /* graphs: rounds per replay captured in the graph (then 1 eager) */
    double eager_us[GPTOSS_TP_MAX], graph_us[GPTOSS_TP_MAX];
} test_ctx;

#define TRY_CUDA(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st = gptoss_cuda_error(error, e_, what);                                               \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
#define TRY_ST(call)                                                                               \
    do {                                                                                           \
        st = (call);                                                                               \
        if (st) goto done;                                                                         \
    } while (0)

/* Rounds rs[0, count): each copies its input (at off - base in `in`) to a work buffer, sums
 * it, and copies the result out (at off - base in `out`). */
static gptoss_status enqueue_rounds(gptoss_cuda_state *s, const round_spec *rs, size_t count,
                                    size_t base, const float *in, float *out, float *work,
                                    gptoss_error *error) {
    for (size_t k = 0; k < count; k++) {
        const round_spec *r = &rs[k];
        float *buf = work + (r->misaligned ? 1 : 0);
        CUDA_TRY(cudaMemcpyAsync(buf, in + (r->off - base), r->n * sizeof(float),
                                 cudaMemcpyDeviceToDevice, s->stream),
                 "round input");
        gptoss_status st = gptoss_cuda_tp_allreduce(s, buf, r->n, error);
        if (st) return st;
        CUDA_TRY(cudaMemcpyAsync(out + (r->off - base), buf, r->n * sizeof(float),
                                 cudaMemcpyDeviceToDevice, s->stream),
                 "round output");
    }
    return GPTOSS_OK;
}

static gptoss_status rank_job(gptoss_cuda_state *s, void *arg, gptoss_error *error) {
    test_ctx *ctx = (test_ctx *)arg;
    const int32_t r = s->tp_rank;
    gptoss_status st = GPTOSS_OK;
    float *in = NULL, *out = NULL, *work = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    if (ctx->mode == 2) { /* timing: zeros stay zeros */
        TRY_CUDA(cudaMalloc((void **)&work, ROW * sizeof(float)), "work buffer");
        TRY_CUDA(cudaMemsetAsync(work, 0, ROW * sizeof(float), s->stream), "work buffer");
        TRY_CUDA(cudaEventCreate(&ev[0]), "event");
        TRY_CUDA(cudaEventCreate(&ev[1]), "event");
        for (int i = 0; i < 10; i++)
            TRY_ST(gptoss_cuda_tp_allreduce(s, work, ROW, error));
        TRY_CUDA(cudaEventRecord(ev[0], s->stream), "event");
        for (int i = 0; i < TIMED; i++)
            TRY_ST(gptoss_cuda_tp_allreduce(s, work, ROW, error));
        TRY_CUDA(cudaEventRecord(ev[1], s->stream), "event");
        TRY_CUDA(cudaEventSynchronize(ev[1]), "timed all-reduces");
        float ms = 0;
        TRY_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]), "event time");
        ctx->eager_us[r] = 1e3 * ms / TIMED;
        TRY_CUDA(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal), "capture");
        for (int i = 0; i < 100; i++) {
            st = gptoss_cuda_tp_allreduce(s, work, ROW, error);
            if (st) break;
        }
        {
            cudaError_t ce = cudaStreamEndCapture(s->stream, &graph);
            if (st) goto done;
            TRY_CUDA(ce, "end of capture");
        }
        TRY_CUDA(cudaGraphInstantiate(&exec, graph, 0), "graph instantiation");
        TRY_ST(gptoss_cuda_tp_graph_barrier(s, error));
        TRY_CUDA(cudaGraphLaunch(exec, s->stream), "graph launch");
        TRY_CUDA(cudaEventRecord(ev[0], s->stream), "event");
        for (int i = 0; i < TIMED / 100; i++)
            TRY_CUDA(cudaGraphLaunch(exec, s->stream), "graph launch");
        TRY_CUDA(cudaEventRecord(ev[1], s->stream), "event");
        TRY_CUDA(cudaEventSynchronize(ev[1]), "timed graphs");
        TRY_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]), "event time");
        ctx->graph_us[r] = 1e3 * ms / TIMED;
        goto done;
    }
    TRY_CUDA(cudaMalloc((void **)&in, ctx->total * sizeof(float)), "round inputs");
    TRY_CUDA(cudaMalloc((void **)&out, ctx->total * sizeof(float)), "round outputs");
    TRY_CUDA(cudaMalloc((void **)&work, (ctx->max_n + 4) * sizeof(float)), "work buffer");
    TRY_CUDA(cudaMemcpyAsync(in, ctx->in[r].data(), ctx->total * sizeof(float),
                             cudaMemcpyHostToDevice, s->stream),
             "round inputs");
    TRY_CUDA(cudaMemsetAsync(out, 0xff, ctx->total * sizeof(float), s->stream), "round outputs");
    if (ctx->mode == 0) {
        TRY_ST(enqueue_rounds(s, ctx->rounds.data(), ctx->rounds.size(), 0, in, out, work, error));
    } else {
        /* the graph: the first graph_rounds rounds' layout, on the work buffer; each replay
         * reads its rounds from and writes them to a staging area the eager copies fill */
        const int g = ctx->graph_rounds;
        const size_t per = ctx->rounds.size() / GRAPH_REPLAYS; /* g graph rounds + 1 eager */
        const size_t g_floats = ctx->rounds[g].off - ctx->rounds[0].off;
        float *stage_in = NULL, *stage_out = NULL;
        TRY_CUDA(cudaMalloc((void **)&stage_in, 2 * g_floats * sizeof(float)), "staging");
        stage_out = stage_in + g_floats;
        TRY_CUDA(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal), "capture");
        st = enqueue_rounds(s, ctx->rounds.data(), (size_t)g, ctx->rounds[0].off, stage_in,
                            stage_out, work, error);
        {
            cudaError_t ce = cudaStreamEndCapture(s->stream, &graph);
            if (!st && ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "end of capture");
        }
        if (!st && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
            st = gptoss_set_error(error, GPTOSS_ERR_BACKEND, "graph instantiation failed");
        if (!st) st = gptoss_cuda_tp_graph_barrier(s, error);
        for (size_t rep = 0; !st && rep < GRAPH_REPLAYS; rep++) {
            const size_t k0 = rep * per, base = ctx->rounds[k0].off;
            cudaError_t ce = cudaMemcpyAsync(stage_in, in + base, g_floats * sizeof(float),
                                             cudaMemcpyDeviceToDevice, s->stream);
            if (ce == cudaSuccess) ce = cudaGraphLaunch(exec, s->stream);
            if (ce == cudaSuccess)
                ce = cudaMemcpyAsync(out + base, stage_out, g_floats * sizeof(float),
                                     cudaMemcpyDeviceToDevice, s->stream);
            if (ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "graph replay");
            if (!st)
                st = enqueue_rounds(s, ctx->rounds.data() + k0 + g, per - g, 0, in, out, work,
                                    error);
        }
        cudaStreamSynchronize(s->stream);
        cudaFree(stage_in);
        if (st) goto done;
    }
    TRY_CUDA(cudaStreamSynchronize(s->stream), "the rounds");
    ctx->out[r].resize(ctx->total);
    TRY_CUDA(
        cudaMemcpy(ctx->out[r].data(), out, ctx->total * sizeof(float), cudaMemcpyDeviceToHost),
        "round outputs");
done:
    cudaStreamSynchronize(s->stream);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    for (int i = 0; i < 2; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    cudaFree(in);
    cudaFree(out);
    cudaFree(work);
    return st;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float next_value(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    /* [-1, 1) times a scale from 2^-8 to 2^8: sums that round differently in another order */
    const double u = (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return (float)ldexp(u, (int)((rng_state >> 3) % 17) - 8);
}

static void add_round(test_ctx *ctx, size_t n, bool misaligned) {
    round_spec r = {ctx->total, n, misaligned};
    ctx->rounds.push_back(r);
    ctx->total += n;
    if (n > ctx->max_n) ctx->max_n = n;
}

/* Compares every round with the host sum; prints the first few mismatches. Returns the
 * number of bad rounds. */
static int check(const test_ctx *ctx, size_t p2p_max, const char *what) {
    int bad = 0, p2p_rounds = 0, nccl_rounds = 0;
    for (size_t k = 0; k < ctx->rounds.size(); k++) {
        const round_spec *rs = &ctx->rounds[k];
        const bool exact = rs->n <= p2p_max;
        (exact ? p2p_rounds : nccl_rounds)++;
        bool ok = true;
        for (size_t i = rs->off; i < rs->off + rs->n && ok; i++) {
            float ref = ctx->in[0][i];
            double mag = fabs((double)ref);
            for (int32_t q = 1; q < ctx->n_ranks; q++) {
                ref += ctx->in[q][i];
                mag += fabs((double)ctx->in[q][i]);
            }
            const float got0 = ctx->out[0][i];
            for (int32_t q = 0; q < ctx->n_ranks && ok; q++) {
                const float got = ctx->out[q][i];
                if (memcmp(&got, &got0, sizeof got)) {
                    if (bad < 5)
                        printf("  %s round %zu (%zu floats): element %zu differs between rank 0 "
                               "(%.9g) and rank %d (%.9g)\n",
                               what, k, rs->n, i - rs->off, got0, (int)q, got);
                    ok = false;
                } else if (exact ? memcmp(&got, &ref, sizeof got) != 0
                                 : !(fabs((double)got - ref) <= 1e-5 * mag + 1e-30)) {
                    if (bad < 5)
                        printf("  %s round %zu (%zu floats, %s): element %zu on rank %d is %.9g, "
                               "host sum %.9g\n",
                               what, k, rs->n, exact ? "peer memory" : "NCCL", i - rs->off, (int)q,
                               got, ref);
                    ok = false;
                }
            }
        }
        bad += !ok;
    }
    printf("%s: %d rounds (%d over peer memory, bitwise; %d by NCCL), %d wrong: %s\n", what,
           (int)ctx->rounds.size(), p2p_rounds, nccl_rounds, bad, bad ? "FAIL" : "ok");
    return bad;
}

static void fill_inputs(test_ctx *ctx) {
    for (int32_t q = 0; q < ctx->n_ranks; q++) {
        ctx->in[q].resize(ctx->total);
        for (size_t i = 0; i < ctx->total; i++)
            ctx->in[q][i] = next_value();
    }
}

static int run(void *group, test_ctx *ctx, const char *what, size_t p2p_max) {
    gptoss_error err;
    memset(&err, 0, sizeof err);
    fill_inputs(ctx);
    if (gptoss_cuda_tp_each_rank(group, rank_job, ctx, &err)) {
        printf("%s: FAIL (%s)\n", what, err.message);
        return 1;
    }
    fflush(stdout);
    return check(ctx, p2p_max, what) != 0;
}

static void *make_group(const gptoss_config *c, int32_t n, gptoss_error *err) {
    gptoss_backend_options o = gptoss_backend_options_default();
    o.kind = GPTOSS_BACKEND_CUDA;
    o.kv_block_size = 16;
    o.n_kv_blocks = 16;
    o.n_sliding_kv_blocks = 16;
    o.tensor_parallel_size = n;
    void *group = NULL;
    if (gptoss_cuda_tp_backend_ops.create_random(c, &o, 1, &group, err)) return NULL;
    return group;
}

static gptoss_status time_group(void *group, int32_t n, double *eager, double *graph) {
    test_ctx t;
    t.n_ranks = n;
    t.mode = 2;
    gptoss_error err;
    memset(&err, 0, sizeof err);
    if (gptoss_cuda_tp_each_rank(group, rank_job, &t, &err)) {
        printf("timing: FAIL (%s)\n", err.message);
        return GPTOSS_ERR_BACKEND;
    }
    *eager = t.eager_us[0];
    *graph = t.graph_us[0];
    return GPTOSS_OK;
}

static int run_size(const gptoss_config *tiny, int32_t n) {
    gptoss_error err;
    memset(&err, 0, sizeof err);
    gptoss_config cfg = *tiny;
    if (cfg.n_kv_heads % n) cfg.n_kv_heads = cfg.n_heads; /* a KV head per query head */
    const gptoss_config *c = &cfg;
    void *group = make_group(c, n, &err);
    if (!group) {
        printf("tensor parallel %d: FAIL (%s)\n", (int)n, err.message);
        return 1;
    }
    const size_t p2p_max = gptoss_cuda_tp_p2p_max_floats(gptoss_cuda_tp_rank0(group));
    const char *env = getenv("GPTOSS_TP_P2P");
    const char *max_env = getenv("GPTOSS_TP_P2P_MAX_BYTES");
    const bool want_p2p = !(env && !strcmp(env, "0")) && !(max_env && !strcmp(max_env, "0"));
    int failed = 0;
    printf("tensor parallel %d: peer-memory all-reduce up to %zu floats\n", (int)n, p2p_max);
    if (want_p2p && p2p_max == 0) {
        printf("tensor parallel %d: FAIL (the peer-memory all-reduce is off; see the log)\n",
               (int)n);
        failed = 1;
    }
    {
        test_ctx t;
        t.n_ranks = n;
        t.mode = 0;
        t.total = t.max_n = 0;
        static const size_t sizes[8] = {1, 3, 5, ROW, ROW + 1, 2 * ROW, 3 * ROW, 8 * ROW};
        for (int k = 0; k < EAGER_ROUNDS; k++)
            add_round(&t, sizes[k % 8], (k / 8) % 2 == 1);
        failed |= run(group, &t, "eager rounds", p2p_max);
    }
    {
        test_ctx t;
        t.n_ranks = n;
        t.mode = 0;
        t.total = t.max_n = 0;
        std::vector<size_t> sizes = {64 * ROW, 64 * ROW};
        if (p2p_max) {
            sizes.push_back(p2p_max);
            sizes.push_back(p2p_max + 4);
            sizes.push_back(p2p_max + 1);
        }
        sizes.push_back(256 * ROW); /* NCCL, at the default limit */
        for (int rep = 0; rep < 3; rep++)
            for (size_t i = 0; i < sizes.size(); i++)
                add_round(&t, sizes[i], (rep + i) % 2 == 1);
        failed |= run(group, &t, "large rounds", p2p_max);
    }
    {
        test_ctx t;
        t.n_ranks = n;
        t.mode = 1;
        t.total = t.max_n = 0;
        t.graph_rounds = 4;
        for (int rep = 0; rep < GRAPH_REPLAYS; rep++) {
            add_round(&t, ROW, false);
            add_round(&t, ROW + 1, true);
            add_round(&t, 8 * ROW, false);
            add_round(&t, ROW, false);
            add_round(&t, ROW, rep % 2 == 1); /* eager, between replays */
        }
        failed |= run(group, &t, "graph replays", p2p_max);
    }
    double pe = 0, pg = 0, ne = 0, ng = 0;
    failed |= time_group(group, n, &pe, &pg) != GPTOSS_OK;
    gptoss_cuda_tp_backend_ops.destroy(group);
    /* the same on NCCL alone */
    setenv("GPTOSS_TP_P2P", "0", 1);
    void *nccl = make_group(c, n, &err);
    if (env)
        setenv("GPTOSS_TP_P2P", env, 1);
    else
        unsetenv("GPTOSS_TP_P2P");
    if (!nccl) {
        printf("tensor parallel %d: FAIL (NCCL group: %s)\n", (int)n, err.message);
        return 1;
    }
    failed |= time_group(nccl, n, &ne, &ng) != GPTOSS_OK;
    gptoss_cuda_tp_backend_ops.destroy(nccl);
    printf("tensor parallel %d: one all-reduce of %d floats: %s %.2f us eager, %.2f us in a "
           "graph; NCCL %.2f us eager, %.2f us in a graph\n",
           (int)n, ROW, p2p_max ? "peer memory" : "(off)", pe, pg, ne, ng);
    printf("tensor parallel %d all-reduce: %s\n", (int)n, failed ? "FAIL" : "ok");
    fflush(stdout);
    return failed;
}

int main(int argc, char **argv) {
    gptoss_config c;
    gptoss_error err;
    memset(&err, 0, sizeof err);
    if (gptoss_config_preset("tiny", &c, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    int32_t sizes[8], n_sizes = 0;
    for (int i = 1; i < argc && n_sizes < 8; i++) {
        const int v = atoi(argv[i]);
        if (v != 2 && v != 4 && v != 8) {
            fprintf(stderr, "usage: gpu_test_allreduce [SIZE...] (sizes 2, 4 or 8)\n");
            return 2;
        }
        sizes[n_sizes++] = v;
    }
    const int32_t visible = gptoss_cuda_device_count();
    if (n_sizes == 0) {
        sizes[n_sizes++] = 2;
        if (visible >= 4) sizes[n_sizes++] = 4;
    }
    int failed = 0;
    for (int i = 0; i < n_sizes; i++) {
        if (sizes[i] > visible) {
            printf("tensor parallel %d: FAIL (%d GPUs visible)\n", (int)sizes[i], (int)visible);
            failed = 1;
            continue;
        }
        failed |= run_size(&c, sizes[i]);
    }
    return failed;
}
