/*
 * gpu_test_attention.cu - the tensor-core prefill attention (attention_tc.cu) against a double
 * host reference and against the scalar kernel (gptoss_cuda_attention with n_splits = 1),
 * then both timed on the 20b prefill shape.
 *
 * Needs a GPU, so it is not a ctest test: scripts/gpu-check builds and runs it on the GPU
 * machine. Inputs are random and never zero; every cache slot that no token may read (past
 * each sequence's last position, spare blocks) holds NaN, and the output is poisoned with NaN
 * bytes plus a guard region past its end, so a read out of range, an unwritten element or a
 * write past the end fails. Prints one line per case, a summary table and the timings last;
 * exits 1 on any failure.
 */
#include "backend/cuda/kernels/attention_tc.h"
#include "backend/cuda/cuda_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <utility>
#include <vector>

#define GPU_TEST_SEED 0x9e3779b97f4a7c15ull
#include "gpu_test_util.h"

/* ---- one attention problem: paged caches, tokens, host reference ------------------------ */

typedef struct problem {
    int NH, NKV, D, window, bs, T, S, max_blocks, n_blocks;
    std::vector<std::pair<int, int>> seqs; /* (cached positions, new tokens) per sequence */
    std::vector<int32_t> pos, seq, table;  /* [T], [T], [S, max_blocks] (physical ids shuffled) */
    std::vector<uint16_t> kc, vc;          /* [n_blocks, bs, NKV, D] bf16 bits */
    std::vector<float> q, sinks;           /* [T, NH, D] (pre-scaled), [NH] */
    /* device copies */
    bf16 *dk, *dv;
    float *dq, *dsink;
    int32_t *dpos, *dseq, *dtab;
} problem;

/* Tokens of sequence s are positions cached_s .. cached_s + new_s - 1, in step order. Every
 * cache slot is NaN except positions 0 .. cached_s + new_s - 1 of each sequence. */
static problem make_problem(int NH, int NKV, int D, const std::vector<std::pair<int, int>> &seqs,
                            int window, int bs) {
    problem P;
    P.NH = NH, P.NKV = NKV, P.D = D, P.window = window, P.bs = bs, P.seqs = seqs;
    P.S = (int)seqs.size();
    int max_len = 1;
    for (int s = 0; s < P.S; s++) {
        for (int i = 0; i < seqs[s].second; i++) {
            P.pos.push_back(seqs[s].first + i);
            P.seq.push_back(s);
        }
        max_len = std::max(max_len, seqs[s].first + seqs[s].second);
    }
    P.T = (int)P.pos.size();
    P.max_blocks = (max_len + bs - 1) / bs;
    P.n_blocks = P.S * P.max_blocks + 3;
    std::vector<int32_t> ids(P.n_blocks);
    for (int i = 0; i < P.n_blocks; i++)
        ids[i] = i;
    for (int i = P.n_blocks - 1; i > 0; i--)
        std::swap(ids[i], ids[rnd_int(i + 1)]);
    P.table.assign(ids.begin(), ids.begin() + (size_t)P.S * P.max_blocks);
    size_t cache_elems = (size_t)P.n_blocks * bs * NKV * D;
    P.kc.assign(cache_elems, 0xffff); /* NaN */
    P.vc.assign(cache_elems, 0xffff);
    for (int s = 0; s < P.S; s++) {
        for (int j = 0; j < seqs[s].first + seqs[s].second; j++) {
            size_t off =
                ((size_t)P.table[(size_t)s * P.max_blocks + j / bs] * bs + j % bs) * NKV * D;
            for (int i = 0; i < NKV * D; i++) {
                P.kc[off + i] = f2bf(rnd_nz(1.0f));
                P.vc[off + i] = f2bf(rnd_nz(1.0f));
            }
        }
    }
    P.q.resize((size_t)P.T * NH * D);
    P.sinks.resize(NH);
    for (auto &v : P.q)
        v = rnd_nz(0.6f);
    for (auto &v : P.sinks)
        v = rnd_nz(3.0f);
    CK(cudaMalloc(&P.dk, cache_elems * 2));
    CK(cudaMalloc(&P.dv, cache_elems * 2));
    CK(cudaMemcpy(P.dk, P.kc.data(), cache_elems * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.dv, P.vc.data(), cache_elems * 2, cudaMemcpyHostToDevice));
    P.dq = dev_upload(P.q), P.dsink = dev_upload(P.sinks);
    P.dpos = dev_upload(P.pos), P.dseq = dev_upload(P.seq), P.dtab = dev_upload(P.table);
    return P;
}

static void free_problem(problem &P) {
    cudaFree(P.dk), cudaFree(P.dv), cudaFree(P.dq), cudaFree(P.dsink);
    cudaFree(P.dpos), cudaFree(P.dseq), cudaFree(P.dtab);
}

/* out[t, h, :] from the definition: softmax over [lo, p] plus the sink logit, in double */
static std::vector<double> reference(const problem &P) {
    const int NH = P.NH, D = P.D, G = P.NH / P.NKV;
    std::vector<double> ref((size_t)P.T * NH * D);
#pragma omp parallel for schedule(dynamic, 4)
    for (int t = 0; t < P.T; t++) {
        int p = P.pos[t], s = P.seq[t];
        int lo = P.window > 0 ? std::max(0, p - P.window + 1) : 0;
        std::vector<double> sc(p - lo + 1), acc(D);
        for (int h = 0; h < NH; h++) {
            int g = h / G;
            const float *qh = &P.q[((size_t)t * NH + h) * D];
            double m = P.sinks[h];
            for (int j = lo; j <= p; j++) {
                size_t off =
                    (((size_t)P.table[(size_t)s * P.max_blocks + j / P.bs] * P.bs + j % P.bs) *
                         P.NKV +
                     g) *
                    D;
                double d = 0;
                for (int c = 0; c < D; c++)
                    d += (double)qh[c] * bf2f(P.kc[off + c]);
                sc[j - lo] = d;
                m = fmax(m, d);
            }
            double z = exp(P.sinks[h] - m);
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = lo; j <= p; j++) {
                size_t off =
                    (((size_t)P.table[(size_t)s * P.max_blocks + j / P.bs] * P.bs + j % P.bs) *
                         P.NKV +
                     g) *
                    D;
                double w = exp(sc[j - lo] - m);
                z += w;
                for (int c = 0; c < D; c++)
                    acc[c] += w * bf2f(P.vc[off + c]);
            }
            for (int c = 0; c < D; c++)
                ref[((size_t)t * NH + h) * D + c] = acc[c] / z;
        }
    }
    return ref;
}

static std::vector<double> bf16_to_double(const std::vector<bf16> &v, size_t n) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, &v[i], 2);
        out[i] = bf2f(h);
    }
    return out;
}

/* Runs both kernels on one problem; checks the new one against the reference and the old one,
 * and that nothing past the output was written. */
static void test_case(int NH, int NKV, int D, const std::vector<std::pair<int, int>> &seqs,
                      int window, int bs, const char *label, bool pdl = false) {
    problem P = make_problem(NH, NKV, D, seqs, window, bs);
    const size_t n_out = (size_t)P.T * NH * D, guard = (size_t)16 * NH * D;
    bf16 *out_tc = dev_poisoned<bf16>(n_out, guard), *out_scalar = dev_poisoned<bf16>(n_out);
    float *partial = dev_poisoned<float>((size_t)P.T * NH * (D + 2));
    char name[112];
    snprintf(name, sizeof name, "tc %s NH=%d NKV=%d D=%d T=%d win=%d bs=%d%s", label, NH, NKV, D,
             P.T, window, bs, pdl ? " pdl" : "");
    gptoss_cuda_set_pdl(pdl);
    int rc = gptoss_cuda_attention_tc(P.dq, P.dk, P.dv, P.dpos, P.dseq, P.dtab, P.max_blocks, bs,
                                      P.dsink, P.T, NH, NKV, D, window, out_tc, 0);
    gptoss_cuda_set_pdl(false);
    int rc_scalar =
        gptoss_cuda_attention(P.dq, P.dk, P.dv, P.dpos, P.dseq, P.dtab, P.max_blocks, bs, P.dsink,
                              P.T, NH, NKV, D, window, 1, partial, out_scalar, 0);
    if (rc != 0 || rc_scalar != 0) {
        char msg[192];
        snprintf(msg, sizeof msg, "%s: launcher refused (tc %d, scalar %d)", name, rc, rc_scalar);
        check_true(msg, false);
    } else {
        std::vector<bf16> got_tc = dev_download(out_tc, n_out + guard);
        std::vector<bf16> got_scalar = dev_download(out_scalar, n_out);
        std::vector<double> tc = bf16_to_double(got_tc, n_out),
                            scalar = bf16_to_double(got_scalar, n_out);
        std::vector<double> ref = reference(P);
        char sub[192];
        /* q and P enter as bf16 hi + lo (16 significant bits), so what remains is the bf16
         * output rounding: at most 2^-9 relative per element (rel_l2 about 1.1e-3), bar 2.5e-3.
         * Against the scalar kernel (also rounded to bf16 at the end) elements differ by at
         * most one bf16 ulp where the two fp32 results straddle a rounding boundary. */
        snprintf(sub, sizeof sub, "%s vs double", name);
        check(sub, tc, ref, 2.5e-3);
        snprintf(sub, sizeof sub, "%s vs scalar kernel", name);
        check(sub, tc, scalar, 2.5e-3);
        bool untouched = true;
        for (size_t i = n_out; i < n_out + guard; i++) {
            uint16_t h;
            memcpy(&h, &got_tc[i], 2);
            untouched = untouched && h == 0xffff;
        }
        snprintf(sub, sizeof sub, "%s: nothing written past the output", name);
        check_true(sub, untouched);
    }
    cudaFree(out_tc), cudaFree(out_scalar), cudaFree(partial);
    free_problem(P);
}

/* Shapes the kernel does not take: nonzero return and nothing written. */
static void test_refusal(int NH, int NKV, int D, const char *why) {
    std::vector<std::pair<int, int>> seqs = {{0, 20}};
    problem P = make_problem(NH, NKV, D, seqs, 0, 16);
    size_t n_out = (size_t)P.T * NH * D;
    bf16 *out = dev_poisoned<bf16>(n_out);
    int rc = gptoss_cuda_attention_tc(P.dq, P.dk, P.dv, P.dpos, P.dseq, P.dtab, P.max_blocks, 16,
                                      P.dsink, P.T, NH, NKV, D, 0, out, 0);
    std::vector<bf16> got = dev_download(out, n_out);
    bool untouched = true;
    for (size_t i = 0; i < n_out; i++) {
        uint16_t h;
        memcpy(&h, &got[i], 2);
        untouched = untouched && h == 0xffff;
    }
    char name[112];
    snprintf(name, sizeof name, "tc refuses NH=%d NKV=%d D=%d (%s)", NH, NKV, D, why);
    check_true(name, rc != 0 && untouched);
    cudaFree(out);
    free_problem(P);
}

/* ---- timing ------------------------------------------------------------------------------ */

typedef struct timing {
    char name[64];
    double tc_ms, scalar_ms, gflop;
} timing;
static std::vector<timing> timings;

/* Median of 5 timed launches after 3 warm-ups; kind 0 = tensor-core, 1 = scalar. */
static double time_kernel(const problem &P, int kind, bf16 *out, float *partial) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> ms;
    for (int r = 0; r < 8; r++) {
        CK(cudaEventRecord(a, 0));
        if (kind == 0)
            gptoss_cuda_attention_tc(P.dq, P.dk, P.dv, P.dpos, P.dseq, P.dtab, P.max_blocks, P.bs,
                                     P.dsink, P.T, P.NH, P.NKV, P.D, P.window, out, 0);
        else
            gptoss_cuda_attention(P.dq, P.dk, P.dv, P.dpos, P.dseq, P.dtab, P.max_blocks, P.bs,
                                  P.dsink, P.T, P.NH, P.NKV, P.D, P.window, 1, partial, out, 0);
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        CK(cudaGetLastError());
        float t = 0;
        CK(cudaEventElapsedTime(&t, a, b));
        if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms[ms.size() / 2];
}

/* The 20b attention shape on one prefill of T tokens from position 0. FLOPs counted are the
 * useful ones: 4 * head_dim per (token, head, visible key) (QK^T and PV). */
static void bench(int T, int window) {
    const int NH = 64, NKV = 8, D = 64;
    std::vector<std::pair<int, int>> seqs = {{0, T}};
    problem P = make_problem(NH, NKV, D, seqs, window, 16);
    bf16 *out = dev_poisoned<bf16>((size_t)T * NH * D);
    float *partial = dev_poisoned<float>((size_t)T * NH * (D + 2));
    double flop = 0;
    for (int t = 0; t < T; t++) {
        int p = P.pos[t], lo = window > 0 ? std::max(0, p - window + 1) : 0;
        flop += 4.0 * D * NH * (p - lo + 1);
    }
    timing tm;
    snprintf(tm.name, sizeof tm.name, "20b prefill T=%d win=%d", T, window);
    tm.tc_ms = time_kernel(P, 0, out, partial);
    tm.scalar_ms = time_kernel(P, 1, out, partial);
    tm.gflop = flop * 1e-9;
    printf("%-32s tc %.3f ms (%.1f TFLOP/s)  scalar %.3f ms (%.1f TFLOP/s)  speedup %.1fx\n",
           tm.name, tm.tc_ms, tm.gflop / tm.tc_ms, tm.scalar_ms, tm.gflop / tm.scalar_ms,
           tm.scalar_ms / tm.tc_ms);
    timings.push_back(tm);
    cudaFree(out), cudaFree(partial);
    free_problem(P);
}

int main(int argc, char **argv) {
    cudaDeviceProp prop = open_device();

    /* one long prefill from position 0, chunked prefill over a cached prefix, a varlen step
     * whose token tiles hold several sequences (lengths 1, 15, 16, 17, 100, T not a multiple
     * of 16), and a batch of single tokens at depth (a tile of many one-token segments) */
    std::vector<std::pair<int, int>> prefill_1000 = {{0, 1000}};
    std::vector<std::pair<int, int>> prefill_2048 = {{0, 2048}};
    std::vector<std::pair<int, int>> chunked = {{300, 257}};
    std::vector<std::pair<int, int>> varlen = {{0, 1},   {0, 15}, {0, 16},  {0, 17},
                                               {0, 100}, {37, 5}, {500, 33}};
    std::vector<std::pair<int, int>> singles;
    for (int i = 0; i < 21; i++)
        singles.push_back({(i * 397) % 3000, 1});
    std::vector<std::pair<int, int>> mixed = {{1200, 40}, {0, 1}, {64, 70}, {3, 1}, {140, 9}};

    for (int window : {0, 128}) {
        test_case(64, 8, 64, prefill_1000, window, 16, "prefill");
        test_case(64, 8, 64, prefill_2048, window, 16, "prefill");
        test_case(64, 8, 64, chunked, window, 16, "chunked");
        test_case(64, 8, 64, chunked, window, 24, "chunked");
        test_case(64, 8, 64, varlen, window, 16, "varlen");
        test_case(64, 8, 64, varlen, window, 7, "varlen");
        test_case(64, 8, 64, singles, window, 16, "singles");
        test_case(64, 8, 64, mixed, window, 32, "mixed");
    }
    test_case(64, 8, 64, mixed, 128, 16, "mixed", true); /* through launch_pdl with PDL on */
    /* group sizes 1..8 (odd ones leave warps that only copy), other head_dims, tiny windows */
    test_case(8, 8, 64, varlen, 0, 16, "group1");
    test_case(8, 8, 64, chunked, 128, 16, "group1");
    test_case(32, 8, 64, varlen, 128, 16, "group4");
    test_case(32, 8, 64, chunked, 0, 16, "group4");
    /* the forward test's batch step: three sequences of 50, 13 and 1 tokens from position 0 */
    test_case(16, 4, 64, {{0, 50}, {0, 13}, {0, 1}}, 128, 16, "batch of 3");
    test_case(16, 4, 64, {{0, 50}, {0, 13}, {0, 1}}, 0, 16, "batch of 3");
    test_case(16, 8, 64, mixed, 0, 16, "group2");
    test_case(6, 2, 64, varlen, 16, 16, "group3");
    test_case(10, 2, 64, mixed, 0, 16, "group5");
    test_case(14, 2, 64, chunked, 5, 16, "group7");
    test_case(8, 2, 32, varlen, 16, 16, "d32");
    test_case(16, 2, 32, chunked, 0, 16, "d32");
    test_case(4, 4, 128, chunked, 0, 16, "d128");
    test_case(16, 2, 128, varlen, 128, 16, "d128");
    test_case(64, 8, 128, mixed, 0, 16, "d128");
    test_case(4, 1, 16, varlen, 0, 16, "d16");
    test_case(64, 8, 64, {{0, 1}}, 0, 16, "one token");
    test_case(64, 8, 64, {{0, 3}}, 1, 16, "window 1");

    test_refusal(64, 4, 64, "group 16");
    test_refusal(16, 2, 80, "head_dim 80");
    test_refusal(12, 8, 64, "heads not a multiple of KV heads");

    /* --no-timing: the correctness cases only (gpu-check's reruns with a forced warp count) */
    const bool timed = !(argc > 1 && strcmp(argv[1], "--no-timing") == 0);
    if (timed) {
        bench(2048, 0);
        bench(2048, 128);
    }

    int failed = 0;
    printf("\n| attention case | rel_l2 | tol | result |\n|---|---|---|---|\n");
    for (auto &r : results) {
        printf("| %s | %.2e | %.0e | %s |\n", r.name, r.rel_l2, r.tol, r.ok ? "ok" : "FAIL");
        failed += !r.ok;
    }
    if (timed)
        printf("\n| timing (%s) | tensor-core ms | TFLOP/s | scalar ms | TFLOP/s "
               "|\n|---|---|---|---|---|\n",
               prop.name);
    for (auto &t : timings)
        printf("| %s | %.3f | %.1f | %.3f | %.1f |\n", t.name, t.tc_ms, t.gflop / t.tc_ms,
               t.scalar_ms, t.gflop / t.scalar_ms);
    printf("\ngpu_test_attention: %zu cases, %d failed\n", results.size(), failed);
    return failed ? 1 : 0;
}
