/*
 * cuda_bench.cu - prefill/decode throughput of the CUDA backend (see cuda_bench.h).
 *
 * A case runs whole batch plans through gptoss_cuda_forward_device, exactly as the server
 * would (plan upload included, logits left on the device: sampling is not part of a step).
 * Prefill pp N: one sequence of N new tokens after `depth` cached ones, logits for the last.
 * Decode tg N at depth d: N single-token steps at positions d .. d+N-1, timed as a whole
 * (host gaps between steps count, as they would for a user). With a batch B, each step holds
 * B sequences (own KV pages, all at the same depth) with one token and one logit row each,
 * the decode steps of a loaded server. Before a case the KV cache is filled to the depth by
 * untimed prefill chunks. Each case: one warm-up, then `repeats` timed runs, median reported.
 *
 * Decode floor per step = bytes that must cross the memory bus once: dense bf16 weights of
 * every layer (q, k, v, o, router) + lm_head (those held in FP8: one byte per weight and
 * four per row) + the experts the step selects in every layer in MXFP4 (blocks, scales, f32
 * biases; for a batch, the expected number of distinct experts under uniform routing,
 * E * (1 - (1 - k/E)^B)) + K and V of every attended position of every sequence (bf16, or
 * e4m3 codes and scales), over the copy bandwidth measured here (cudaMemcpy device to device,
 * read + write bytes).
 */
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "backend/cuda/cuda_bench.h"
}

extern "C" const char *const gptoss_bench_part_names[GPTOSS_BENCH_N_PARTS] = {
    "MoE", "attention", "dense GEMMs", "lm_head", "norms/rope/router", "plan upload", "gaps"};

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t cuda_try_code_ = (call);                                                       \
        if (cuda_try_code_ != cudaSuccess) return gptoss_cuda_error(error, cuda_try_code_, what);  \
    } while (0)

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

static gptoss_status measure_copy_bandwidth(double *gb_per_s, gptoss_error *error) {
    size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    CUDA_TRY(cudaMalloc(&a, bytes), "bandwidth buffer");
    cudaError_t ce = cudaMalloc(&b, bytes);
    if (ce != cudaSuccess) {
        cudaFree(a);
        return gptoss_cuda_error(error, ce, "bandwidth buffer");
    }
    cudaMemset(a, 1, bytes);
    cudaMemset(b, 2, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> times;
    for (int i = 0; i < 6; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0) times.push_back(ms);
    }
    ce = cudaGetLastError();
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "bandwidth measurement");
    *gb_per_s = 2.0 * bytes / (median(times) * 1e-3) / 1e9;
    return GPTOSS_OK;
}

/* One sequence whose block table maps position p to block p / block_size (identity pages). */
typedef struct bench_seq {
    std::vector<int32_t> table;
    int32_t max_blocks;
} bench_seq;

/* One step: on s alone, or with tensor parallelism on every rank of s's group (s is rank 0,
 * whose stream the timing events are on; the other ranks are waited for). */
static gptoss_status bench_step(gptoss_cuda_state *s, const gptoss_batch_plan *plan,
                                gptoss_error *error) {
    if (s->tp_group) return gptoss_cuda_tp_step(s->tp_group, plan, error);
    return gptoss_cuda_forward_device(s, plan, error);
}

static gptoss_status run_plan(gptoss_cuda_state *s, bench_seq *seq, int32_t first_pos, int32_t n,
                              std::vector<int32_t> &ids, std::vector<int32_t> &pos,
                              gptoss_error *error) {
    ids.resize(n);
    pos.resize(n);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = first_pos + i;
        /* deterministic, varied token ids (the cost does not depend on them) */
        ids[i] =
            (int32_t)(((uint64_t)(first_pos + i) * 2654435761u) % (uint64_t)s->config.vocab_size);
    }
    int32_t start[2] = {0, n};
    int32_t cached = first_pos;
    int32_t logit_index = n - 1;
    gptoss_batch_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tokens = n;
    plan.token_ids = ids.data();
    plan.positions = pos.data();
    plan.n_seqs = 1;
    plan.seq_token_start = start;
    plan.seq_n_cached = &cached;
    plan.max_blocks_per_seq = seq->max_blocks;
    plan.block_tables = seq->table.data();
    plan.sliding_block_tables = NULL;
    plan.n_logits = 1;
    plan.logit_token_index = &logit_index;
    return bench_step(s, &plan, error);
}

/* One decode step of B sequences (tables [B, max_blocks] in `tables`), one token each at
 * position `p`, logits for every row. */
typedef struct bench_batch {
    std::vector<int32_t> tables, ids, pos, start, cached, logit;
    int32_t max_blocks;
} bench_batch;
static gptoss_status run_batch_step(gptoss_cuda_state *s, bench_batch *b, int32_t B, int32_t p,
                                    gptoss_error *error) {
    b->ids.resize(B), b->pos.resize(B), b->start.resize(B + 1), b->cached.resize(B),
        b->logit.resize(B);
    for (int32_t i = 0; i < B; i++) {
        b->ids[i] =
            (int32_t)(((uint64_t)(p * 131 + i) * 2654435761u) % (uint64_t)s->config.vocab_size);
        b->pos[i] = p;
        b->start[i] = i;
        b->cached[i] = p;
        b->logit[i] = i;
    }
    b->start[B] = B;
    gptoss_batch_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tokens = B;
    plan.token_ids = b->ids.data();
    plan.positions = b->pos.data();
    plan.n_seqs = B;
    plan.seq_token_start = b->start.data();
    plan.seq_n_cached = b->cached.data();
    plan.max_blocks_per_seq = b->max_blocks;
    plan.block_tables = b->tables.data();
    plan.n_logits = B;
    plan.logit_token_index = b->logit.data();
    return bench_step(s, &plan, error);
}
static gptoss_status fill_depth(gptoss_cuda_state *s, bench_seq *seq, int32_t depth,
                                gptoss_error *error) {
    std::vector<int32_t> ids, pos;
    for (int32_t p = 0; p < depth; p += 4096) {
        int32_t n = std::min(4096, depth - p);
        gptoss_status st = run_plan(s, seq, p, n, ids, pos, error);
        if (st) return st;
    }
    CUDA_TRY(cudaStreamSynchronize(s->stream), "KV fill");
    return GPTOSS_OK;
}

/* Charges the time between consecutive profiling events to their components. */
static void collect_profile(gptoss_cuda_state *s, double *parts) {
    for (int i = 1; i < s->prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, s->prof_events[i - 1], s->prof_events[i]);
        parts[s->prof_part[i]] += ms;
    }
}

/* Bytes a decode step reads of a dense [n, k] matrix. */
static double dense_read_bytes(double n, double k, bool fp8) {
    return fp8 ? n * k + n * 4 : n * k * 2;
}

static double decode_floor_bytes(const gptoss_config *c, uint32_t fp8_layers,
                                 gptoss_kv_cache_dtype kv_dtype, int32_t batch,
                                 double kv_positions_full, double kv_positions_sliding) {
    double kv_token = (double)gptoss_kv_cache_token_bytes(c, GPTOSS_BACKEND_CUDA,
                                                          kv_dtype); /* K and V, a layer */
    double H = c->hidden_size, I = c->intermediate_size, D = c->head_dim, NH = c->n_heads,
           NKV = c->n_kv_heads;
    double E = c->n_experts, K = c->n_experts_per_token, V = c->vocab_size;
    double active =
        batch <= 1 ? std::min(E, K) : E * (1.0 - pow(1.0 - std::min(E, K) / E, (double)batch));
    double dense = dense_read_bytes((NH + 2 * NKV) * D, H, fp8_layers & GPTOSS_FP8_QKV) +
                   dense_read_bytes(H, NH * D, fp8_layers & GPTOSS_FP8_O) + E * H * 2.0;
    double expert = 2 * I * (H / 32) * 17 + 2 * I * 4 + H * (I / 32) * 17 + H * 4;
    double total = dense_read_bytes(V, H, fp8_layers & GPTOSS_FP8_LM_HEAD);
    for (int l = 0; l < c->n_layers; l++) {
        bool sliding = c->layer_is_sliding[l] && c->sliding_window > 0;
        total += dense + active * expert;
        total += (double)batch * (sliding ? kv_positions_sliding : kv_positions_full) * kv_token;
    }
    return total;
}

gptoss_status gptoss_cuda_bench(const gptoss_bench_request *rq, gptoss_bench_report *report,
                                gptoss_error *error) {
    memset(report, 0, sizeof *report);
    const gptoss_config *c = rq->config;
    int32_t max_pp = 1, max_tg = 0, max_depth = 0;
    for (int i = 0; i < rq->n_pp; i++)
        max_pp = std::max(max_pp, rq->pp[i]);
    for (int i = 0; i < rq->n_tg; i++)
        max_tg = std::max(max_tg, rq->tg[i]);
    for (int i = 0; i < rq->n_depth; i++)
        max_depth = std::max(max_depth, rq->depth[i]);
    int32_t max_ctx =
        max_depth + std::max(max_pp, max_tg) + 16; /* prefill and decode both start at a depth */
    static const int32_t one = 1;
    const int32_t *batches = rq->batch && rq->n_batch > 0 ? rq->batch : &one;
    const int32_t n_batch = rq->batch && rq->n_batch > 0 ? rq->n_batch : 1;
    int32_t max_batch = 1;
    for (int i = 0; i < n_batch; i++)
        max_batch = std::max(max_batch, batches[i]);
    int32_t n_cases = (rq->n_pp + rq->n_tg * n_batch) * std::max(1, rq->n_depth);
    if (n_cases > GPTOSS_BENCH_MAX_CASES)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "bench: %d cases; at most %d",
                                n_cases, GPTOSS_BENCH_MAX_CASES);

    gptoss_backend_options opt = gptoss_backend_options_default();
    opt.kind = GPTOSS_BACKEND_CUDA;
    opt.device = rq->device;
    opt.fp8_layers = rq->fp8_layers;
    opt.kv_cache_dtype = rq->kv_cache_dtype;
    opt.cuda_profile = rq->cuda_profile;
    opt.weights_in_host_memory = rq->weights_in_host_memory;
    opt.batch_invariant = rq->batch_invariant;
    opt.kv_block_size = 16;
    const int32_t seq_blocks = (max_ctx + 15) / 16;
    /* batched decode: sequence 0 is the one prefill cases use, b > 0 own the next ranges */
    if ((int64_t)seq_blocks * max_batch > INT32_MAX / 16)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "bench: batch x context too large");
    opt.n_kv_blocks = seq_blocks * max_batch;
    opt.n_sliding_kv_blocks = opt.n_kv_blocks;
    opt.progress = rq->progress;
    opt.progress_user = rq->progress_user;

    double bw = 0;
    CUDA_TRY(cudaSetDevice(rq->device), "cudaSetDevice");
    gptoss_status st = measure_copy_bandwidth(&bw, error);
    if (st) return st;
    report->copy_gb_per_s = bw;

    gptoss_cuda_state *s = NULL;
    void *tp = NULL; /* tensor parallelism: the group; s is its rank 0 */
    opt.tensor_parallel_size = rq->tensor_parallel_size > 1 ? rq->tensor_parallel_size : 1;
    opt.moe_parallel = rq->moe_parallel;
    if (opt.tensor_parallel_size > 1) {
        st = rq->model ? gptoss_cuda_tp_backend_ops.create(rq->model, &opt, &tp, error)
                       : gptoss_cuda_tp_backend_ops.create_random(c, &opt, 1, &tp, error);
        if (st) return st;
        s = gptoss_cuda_tp_rank0(tp);
        CUDA_TRY(cudaSetDevice(s->dev.ordinal), "cudaSetDevice");
    } else if (rq->model) {
        void *state = NULL;
        st = gptoss_cuda_backend_ops.create(rq->model, &opt, &state, error);
        s = (gptoss_cuda_state *)state;
    } else {
        st = gptoss_cuda_state_create_random(c, &opt, 1, &s, error);
    }
    if (st) return st;
    c = &s->config;
    snprintf(report->device_name, sizeof report->device_name, "%s", s->dev.name);
    snprintf(report->cuda_profile, sizeof report->cuda_profile, "%s",
             gptoss_cuda_profile_name(s->dev.profile));
    /* tensor parallelism: only where the group allows graphs (GPTOSS_TP_GRAPHS); the other
     * ranks follow rank 0 */
    s->tuning.graphs = rq->use_graphs && (!tp || s->tuning.graphs);
    if (rq->profile) {
        for (int i = 0; i < GPTOSS_CUDA_MAX_PROF_EVENTS; i++) {
            cudaError_t ce = cudaEventCreate(&s->prof_events[i]);
            if (ce != cudaSuccess) {
                if (tp)
                    gptoss_cuda_tp_backend_ops.destroy(tp);
                else
                    gptoss_cuda_state_free(s);
                return gptoss_cuda_error(error, ce, "cudaEventCreate");
            }
        }
    }

    bench_seq seq;
    seq.max_blocks = seq_blocks;
    seq.table.resize(seq.max_blocks);
    for (int32_t i = 0; i < seq.max_blocks; i++)
        seq.table[i] = i;
    bench_batch batch;
    batch.max_blocks = seq_blocks;
    batch.tables.resize((size_t)max_batch * seq_blocks);
    for (size_t i = 0; i < batch.tables.size(); i++)
        batch.tables[i] = (int32_t)i;

    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<int32_t> ids, pos;
    int done = 0;
    for (int di = 0; di < std::max(1, rq->n_depth) && !st; di++) {
        int32_t depth = rq->n_depth ? rq->depth[di] : 0;
        st = fill_depth(s, &seq, depth, error);
        int32_t filled = 1; /* sequences whose KV holds the depth (0 done above) */
        for (int kind = 0; kind < 2 && !st; kind++) {
            int32_t n_sizes = kind == 0 ? rq->n_pp : rq->n_tg * n_batch;
            for (int si = 0; si < n_sizes && !st; si++) {
                int32_t n = kind == 0 ? rq->pp[si] : rq->tg[si / n_batch];
                int32_t B = kind == 0 ? 1 : batches[si % n_batch];
                for (; kind == 1 && filled < B && !st; filled++) {
                    bench_seq other;
                    other.max_blocks = seq_blocks;
                    other.table.assign(batch.tables.begin() + (size_t)filled * seq_blocks,
                                       batch.tables.begin() + (size_t)(filled + 1) * seq_blocks);
                    st = fill_depth(s, &other, depth, error);
                }
                if (st) break;
                gptoss_bench_case *cs = &report->cases[report->n_cases];
                cs->decode = kind == 1;
                cs->n_tokens = n;
                cs->depth = depth;
                cs->batch = B;
                std::vector<double> times;
                for (int r = -1; r < rq->repeats && !st; r++) {
                    s->profiling = false;
                    cudaEventRecord(e0, s->stream);
                    if (kind == 0) {
                        st = run_plan(s, &seq, depth, n, ids, pos, error);
                    } else {
                        for (int32_t i = 0; i < n && !st; i++)
                            st = B == 1 ? run_plan(s, &seq, depth + i, 1, ids, pos, error)
                                        : run_batch_step(s, &batch, B, depth + i, error);
                    }
                    cudaEventRecord(e1, s->stream);
                    cudaError_t ce = cudaEventSynchronize(e1);
                    if (!st && ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "bench step");
                    float ms = 0;
                    cudaEventElapsedTime(&ms, e0, e1);
                    if (r >= 0) times.push_back(ms);
                }
                if (st) break;
                cs->median_ms = median(times);
                cs->tokens_per_s = (double)n * B / (cs->median_ms * 1e-3);
                if (cs->decode) {
                    double mid = depth + n / 2.0 + 1;
                    double win =
                        c->sliding_window > 0 ? std::min<double>(mid, c->sliding_window) : mid;
                    cs->floor_bytes_per_step =
                        decode_floor_bytes(c, s->fp8_layers, rq->kv_cache_dtype, B, mid, win);
                    cs->floor_ms = n * cs->floor_bytes_per_step / (bw * 1e9) * 1e3;
                }
                if (rq->profile) {
                    /* one extra profiled step (or token) with events between components */
                    s->profiling = true;
                    if (kind == 0)
                        st = run_plan(s, &seq, depth, n, ids, pos, error);
                    else if (B == 1)
                        st = run_plan(s, &seq, depth + n / 2, 1, ids, pos, error);
                    else
                        st = run_batch_step(s, &batch, B, depth + n / 2, error);
                    if (!st) {
                        cudaError_t ce = cudaStreamSynchronize(s->stream);
                        if (ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "profiled step");
                    }
                    if (!st) collect_profile(s, cs->part_ms);
                    s->profiling = false;
                    /* gaps: the unprofiled per-step time not covered by kernels */
                    double per_step = kind == 0 ? cs->median_ms : cs->median_ms / n;
                    double covered = 0;
                    for (int p = 0; p < GPTOSS_BENCH_N_PARTS; p++)
                        covered += cs->part_ms[p];
                    cs->part_ms[PART_GAPS] += std::max(0.0, per_step - covered);
                }
                report->n_cases++;
                done++;
                if (rq->progress)
                    rq->progress(rq->progress_user, "benchmarking", (double)done / n_cases);
            }
        }
    }
    report->weight_bytes = (double)s->weight_bytes;
    report->workspace_bytes =
        (double)s->ws.bytes + (double)s->ws.plan_ints * 4 + (double)s->dense_scratch_elems * 2;
    report->kv_bytes = (double)s->kv_bytes;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (tp)
        gptoss_cuda_tp_backend_ops.destroy(tp);
    else
        gptoss_cuda_state_free(s);
    return st;
}
