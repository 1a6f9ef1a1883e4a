/*
 * gpu_test_bi_kernels.cu - the batch-invariant mode's kernels (kernels/batch_invariant.cu)
 * against host references, and each output row bitwise the same whatever the number of rows
 * launched with it.
 *
 * The GEMM (bf16 and e4m3 weights) on the real projection widths and on widths that end in a
 * partial k-step: all 300 rows in one launch against a double-precision host reference (fp32
 * accumulation of exact bf16 products: relative L2 under 1e-5), then the same rows again in
 * launches of 1, 2, 7, 63, 64, 65 and 130 rows starting at other offsets, every row equal bit
 * for bit to the 300-row launch; the skinny variant's 300-row launch bit for bit the same, and
 * the skinny, wide, split and large variants (each large tile, and the tile chosen by the
 * GPU's SMs) in launches of every size 1..300 bit for bit to that.
 *
 * The experts kernels (gptoss_cuda_bi_moe, three launch shapes) against the WMMA path on the
 * same route, h and y bit for bit, and against each other: steps of 1..512 tokens, an expert in
 * every token (passes of 16 rows, two route tiles), a token alone against its batch.
 *
 * The tensor-core attention (full and sliding windows): each query's output bitwise the same by
 * token, in chunks, beside another sequence and as a decode token. The router logits against a
 * host reference and across launch sizes. Last, timings (not checks): the dense GEMM's shapes
 * past 128 rows and cuBLAS on the 120b projection and lm_head widths. Exits 1 on failure.
 */
#include "backend/cuda/kernels/attention_tc.h"
#include "backend/cuda/kernels/batch_invariant.h"
#include "backend/kv_fp8.h"
#include "gpu_test_util.h"

#include <algorithm>
#include <cmath>
#include <cublas_v2.h>

#define ROWS 300

static const int32_t row_counts[] = {1, 2, 7, 63, 64, 65, 130};

/* Rows [r0, r0 + m) of the full launch against a launch of just those rows. */
static bool rows_equal(const std::vector<float> &full, const std::vector<float> &part, int32_t r0,
                       int32_t m, int32_t n) {
    return memcmp(full.data() + (size_t)r0 * n, part.data(), (size_t)m * n * sizeof(float)) == 0;
}

static const char *bi_variant_name(int variant) {
    switch (variant) {
    case GPTOSS_BI_GEMM_SKINNY:
        return "skinny";
    case GPTOSS_BI_GEMM_WIDE:
        return "wide";
    case GPTOSS_BI_GEMM_SPLIT:
        return "split";
    case GPTOSS_BI_GEMM_LARGE:
        return "large";
    case GPTOSS_BI_GEMM_LARGE_128:
        return "large 128x128";
    case GPTOSS_BI_GEMM_LARGE_64:
        return "large 64x128";
    case GPTOSS_BI_GEMM_LARGE_64N64:
        return "large 64x64";
    default:
        return "tile";
    }
}

static void gemm_case(int32_t n, int32_t k, bool e4m3) {
    std::vector<uint16_t> x((size_t)ROWS * k), w((size_t)n * k);
    std::vector<uint8_t> codes((size_t)n * k);
    std::vector<float> scale(n);
    for (auto &v : x)
        v = f2bf(rnd_nz(1.0f));
    for (auto &v : w)
        v = f2bf(rnd_nz(0.05f));
    for (auto &c : codes) {
        c = (uint8_t)rnd_int(256);
        if ((c & 0x7f) == 0x7f) c ^= 1; /* no NaN codes */
    }
    for (auto &s : scale)
        s = (float)(0.001 * (1.0 + rnd_unit()));
    bf16 *dx = (bf16 *)dev_upload(x), *dw = (bf16 *)dev_upload(w);
    uint8_t *dc = dev_upload(codes);
    float *ds = dev_upload(scale);
    gptoss_cuda_dense_weight wt = {};
    if (e4m3) {
        wt.w_e4m3 = dc;
        wt.row_scale = ds;
    } else {
        wt.w_bf16 = dw;
    }
    float *dy = dev_poisoned<float>((size_t)ROWS * n);
    char name[160];
    snprintf(name, sizeof name, "bi_gemm %s n %d k %d, %d rows vs host", e4m3 ? "e4m3" : "bf16",
             (int)n, (int)k, ROWS);
    if (gptoss_cuda_bi_gemm(wt, dx, dy, ROWS, n, k, 0) != 0) {
        check_true(name, false);
        return;
    }
    std::vector<float> full = dev_download(dy, (size_t)ROWS * n);
    std::vector<double> got((size_t)ROWS * n), ref((size_t)ROWS * n);
#pragma omp parallel for
    for (int32_t r = 0; r < ROWS; r++)
        for (int32_t j = 0; j < n; j++) {
            double sum = 0;
            for (int32_t i = 0; i < k; i++) {
                double wv = e4m3 ? gptoss_e4m3_decode(codes[(size_t)j * k + i])
                                 : bf2f(w[(size_t)j * k + i]);
                sum += (double)bf2f(x[(size_t)r * k + i]) * wv;
            }
            ref[(size_t)r * n + j] = e4m3 ? sum * scale[j] : sum;
            got[(size_t)r * n + j] = full[(size_t)r * n + j];
        }
    check(name, got, ref, 1e-5);
    bool same = true;
    for (int32_t m : row_counts) {
        int32_t r0 = (int32_t)((m * 37) % (ROWS - m + 1));
        CK(cudaMemset(dy, 0xff, (size_t)ROWS * n * sizeof(float)));
        if (gptoss_cuda_bi_gemm(wt, dx + (size_t)r0 * k, dy, m, n, k, 0) != 0) same = false;
        std::vector<float> part = dev_download(dy, (size_t)m * n);
        if (!rows_equal(full, part, r0, m, n)) {
            same = false;
            printf("  %d rows from row %d differ from the %d-row launch\n", (int)m, (int)r0, ROWS);
        }
    }
    snprintf(name, sizeof name, "bi_gemm %s n %d k %d, rows bitwise equal in launches of 1..130",
             e4m3 ? "e4m3" : "bf16", (int)n, (int)k);
    check_true(name, same);
    /* the skinny and wide variants (mma.sync): the skinny 300-row launch bitwise the tile
     * kernel's (WMMA), and every launch size 1..300 of either, rows from other offsets, bitwise
     * the skinny 300-row launch (so a WMMA difference alone shows as the first check only) */
    CK(cudaMemset(dy, 0xff, (size_t)ROWS * n * sizeof(float)));
    same = gptoss_cuda_bi_gemm_variant(wt, dx, dy, ROWS, n, k, GPTOSS_BI_GEMM_SKINNY, 0) == 0;
    std::vector<float> sk_full = dev_download(dy, (size_t)ROWS * n);
    snprintf(name, sizeof name, "bi_gemm skinny %s n %d k %d, %d rows bitwise the tile kernel's",
             e4m3 ? "e4m3" : "bf16", (int)n, (int)k, ROWS);
    check_true(name, same && rows_equal(full, sk_full, 0, ROWS, n));
    for (int variant :
         {GPTOSS_BI_GEMM_SKINNY, GPTOSS_BI_GEMM_WIDE, GPTOSS_BI_GEMM_SPLIT, GPTOSS_BI_GEMM_LARGE,
          GPTOSS_BI_GEMM_LARGE_128, GPTOSS_BI_GEMM_LARGE_64, GPTOSS_BI_GEMM_LARGE_64N64}) {
        const char *vname = bi_variant_name(variant);
        /* the split shape takes up to 8 rows (larger launches are the skinny one's) */
        const int32_t max_m = variant == GPTOSS_BI_GEMM_SPLIT ? 12 : ROWS;
        same = true;
        int32_t first_bad = 0;
        for (int32_t m = 1; m <= max_m; m++) {
            int32_t r0 = (int32_t)((m * 37) % (ROWS - m + 1));
            CK(cudaMemset(dy, 0xff, (size_t)ROWS * n * sizeof(float)));
            bool ok =
                gptoss_cuda_bi_gemm_variant(wt, dx + (size_t)r0 * k, dy, m, n, k, variant, 0) == 0;
            std::vector<float> part = dev_download(dy, (size_t)m * n);
            if (!ok || !rows_equal(sk_full, part, r0, m, n)) {
                if (same) first_bad = m;
                same = false;
            }
        }
        if (!same) printf("  %s: first differing launch has %d rows\n", vname, (int)first_bad);
        snprintf(name, sizeof name,
                 "bi_gemm %s %s n %d k %d, launches of 1..%d rows bitwise the skinny 300-row one",
                 vname, e4m3 ? "e4m3" : "bf16", (int)n, (int)k, (int)max_m);
        check_true(name, same);
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dc), cudaFree(ds), cudaFree(dy);
}

static void router_case(int32_t e, int32_t h) {
    std::vector<float> x((size_t)ROWS * h), w((size_t)e * h);
    for (auto &v : x)
        v = rnd_nz(1.0f);
    for (auto &v : w)
        v = rnd_nz(0.05f);
    float *dx = dev_upload(x), *dw = dev_upload(w), *dy = dev_poisoned<float>((size_t)ROWS * e);
    bool launched = gptoss_cuda_bi_router_logits(dx, dw, ROWS, e, h, dy, 0) == 0;
    std::vector<float> full = dev_download(dy, (size_t)ROWS * e);
    std::vector<double> got((size_t)ROWS * e), ref((size_t)ROWS * e);
    for (int32_t r = 0; r < ROWS; r++)
        for (int32_t j = 0; j < e; j++) {
            double sum = 0;
            for (int32_t i = 0; i < h; i++)
                sum += (double)x[(size_t)r * h + i] * w[(size_t)j * h + i];
            ref[(size_t)r * e + j] = sum;
            got[(size_t)r * e + j] = full[(size_t)r * e + j];
        }
    char name[160];
    snprintf(name, sizeof name, "bi_router_logits E %d H %d, %d rows vs host", (int)e, (int)h,
             ROWS);
    check(name, got, ref, 1e-5);
    bool same = launched;
    for (int32_t m : row_counts) {
        int32_t r0 = (int32_t)((m * 37) % (ROWS - m + 1));
        CK(cudaMemset(dy, 0xff, (size_t)ROWS * e * sizeof(float)));
        launched =
            launched && gptoss_cuda_bi_router_logits(dx + (size_t)r0 * h, dw, m, e, h, dy, 0) == 0;
        std::vector<float> part = dev_download(dy, (size_t)m * e);
        same = same && launched && rows_equal(full, part, r0, m, e);
    }
    snprintf(name, sizeof name, "bi_router_logits E %d H %d, rows bitwise equal in launches",
             (int)e, (int)h);
    check_true(name, same);
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
}

/* ---- experts: the streaming kernel against the WMMA path ------------------------------- */

struct moe_case_weights {
    gptoss_cuda_moe_weights w;
    std::vector<void *> allocs;
};

/* mma_range: every scale byte in [118, 128], where the mma GEMM's fp16 scaling is exact */
static moe_case_weights moe_weights(int32_t E, int32_t H, int32_t I, bool mma_range = false) {
    std::vector<uint8_t> gub((size_t)E * 2 * I * H / 2), gus((size_t)E * 2 * I * (H / 32));
    std::vector<uint8_t> dnb((size_t)E * H * I / 2), dns((size_t)E * H * (I / 32));
    std::vector<float> gubias((size_t)E * 2 * I), dnbias((size_t)E * H);
    for (auto &v : gub)
        v = (uint8_t)rnd_int(256);
    for (auto &v : dnb)
        v = (uint8_t)rnd_int(256);
    for (auto &v : gus) /* 2^-9 .. 2^2, and now and then 2^3 (lo != 1 there) */
        v = (uint8_t)(rnd_int(50) == 0 ? (mma_range ? 128 : 130)
                                       : 118 + rnd_int(mma_range ? 11 : 12));
    for (auto &v : dns)
        v = (uint8_t)(118 + rnd_int(10));
    for (auto &v : gubias)
        v = rnd_nz(0.5f);
    for (auto &v : dnbias)
        v = rnd_nz(0.5f);
    moe_case_weights m = {};
    uint8_t *a = dev_upload(gub), *b = dev_upload(gus), *c = dev_upload(dnb), *d = dev_upload(dns);
    float *e = dev_upload(gubias), *f = dev_upload(dnbias);
    m.allocs = {a, b, c, d, e, f};
    m.w.gate_up_blocks = a;
    m.w.gate_up_scales = b;
    m.w.gate_up_bias = e;
    m.w.down_blocks = c;
    m.w.down_scales = d;
    m.w.down_bias = f;
    m.w.n_experts = E;
    m.w.hidden = H;
    m.w.intermediate = I;
    m.w.swiglu_limit = 7.0f;
    m.w.swiglu_alpha = 1.702f;
    return m;
}

/* T tokens' top-k of K distinct experts among E (skew: expert 0 first in every token). */
static std::vector<int32_t> random_topk(int32_t T, int32_t K, int32_t E, bool skew) {
    std::vector<int32_t> topk((size_t)T * K);
    for (int32_t t = 0; t < T; t++)
        for (int32_t j = 0; j < K; j++) {
            int32_t e;
            bool dup;
            do {
                e = (skew && j == 0) ? 0 : rnd_int(E);
                dup = false;
                for (int32_t i = 0; i < j; i++)
                    dup = dup || topk[(size_t)t * K + i] == e;
            } while (dup);
            topk[(size_t)t * K + j] = e;
        }
    return topk;
}

/* Runs T tokens' experts (K distinct each; skew: every token also picks expert 0, so its tile
 * holds T rows) on the WMMA path and on gptoss_cuda_bi_moe; h and y must match bit for bit. */
static void moe_case(const moe_case_weights &mw, int32_t T, int32_t K, bool skew) {
    const gptoss_cuda_moe_weights &w = mw.w;
    const int32_t E = w.n_experts, H = w.hidden, I = w.intermediate, P = T * K;
    std::vector<int32_t> topk = random_topk(T, K, E, skew);
    std::vector<uint16_t> act((size_t)T * H);
    for (auto &v : act)
        v = f2bf(rnd_nz(1.0f));
    int32_t *d_topk = dev_upload(topk);
    bf16 *d_t = (bf16 *)dev_upload(act);
    void *route_mem = nullptr;
    CK(cudaMalloc(&route_mem, gptoss_cuda_route_bytes(P, E)));
    gptoss_cuda_route route;
    gptoss_cuda_route_bind(route_mem, P, E, &route);
    gptoss_cuda_moe_route(d_topk, T, K, E, GPTOSS_MOE_WMMA_GEMM, &route, 0);
    bf16 *d_h = dev_poisoned<bf16>((size_t)P * I);
    float *d_y = dev_poisoned<float>((size_t)P * H);
    gptoss_cuda_moe(&w, d_t, T, K, d_topk, &route, d_h, d_y, GPTOSS_MOE_WMMA_GEMM, 0);
    std::vector<bf16> h_ref = dev_download(d_h, (size_t)P * I);
    std::vector<float> y_ref = dev_download(d_y, (size_t)P * H);
    bool finite = true;
    for (float v : y_ref)
        finite = finite && std::isfinite(v);
    char name[160];
    /* h of the pair shape is by pair: row p there is row pos of the sorted order, where
     * sorted_pair[pos] = p */
    std::vector<int32_t> sorted_pair = dev_download(route.sorted_pair, (size_t)P);
    std::vector<bf16> h_ref_by_pair(h_ref.size());
    for (int32_t pos = 0; pos < P; pos++)
        memcpy(&h_ref_by_pair[(size_t)sorted_pair[pos] * I], &h_ref[(size_t)pos * I],
               (size_t)I * sizeof(bf16));
    std::vector<float> y_small; /* the bi shapes against each other too (all mma.sync) */
    bool bi_same = true;
    for (int variant : {GPTOSS_BI_MOE_SMALL, GPTOSS_BI_MOE_WIDE, GPTOSS_BI_MOE_PAIRS}) {
        CK(cudaMemset(d_h, 0xff, (size_t)P * I * sizeof(bf16)));
        CK(cudaMemset(d_y, 0xff, (size_t)P * H * sizeof(float)));
        const bool launched = gptoss_cuda_bi_moe(&w, d_t, T, K, d_topk,
                                                 variant == GPTOSS_BI_MOE_PAIRS ? nullptr : &route,
                                                 d_h, d_y, variant, 0) == 0;
        std::vector<bf16> h = dev_download(d_h, (size_t)P * I);
        std::vector<float> y = dev_download(d_y, (size_t)P * H);
        const std::vector<bf16> &h_want = variant == GPTOSS_BI_MOE_PAIRS ? h_ref_by_pair : h_ref;
        if (variant == GPTOSS_BI_MOE_SMALL)
            y_small = y;
        else
            bi_same = bi_same && launched &&
                      memcmp(y.data(), y_small.data(), y.size() * sizeof(float)) == 0;
        snprintf(name, sizeof name, "bi_moe %s E %d H %d I %d T %d K %d%s: h, y bitwise WMMA's",
                 variant == GPTOSS_BI_MOE_WIDE    ? "wide"
                 : variant == GPTOSS_BI_MOE_PAIRS ? "pairs"
                                                  : "small",
                 (int)E, (int)H, (int)I, (int)T, (int)K, skew ? " (expert 0 in every token)" : "");
        check_true(name, launched && finite &&
                             memcmp(h.data(), h_want.data(), h.size() * sizeof(bf16)) == 0 &&
                             memcmp(y.data(), y_ref.data(), y.size() * sizeof(float)) == 0);
    }
    snprintf(name, sizeof name, "bi_moe E %d T %d%s: wide and pairs y bitwise small's", (int)E,
             (int)T, skew ? " (expert 0 in every token)" : "");
    check_true(name, bi_same);
    /* token 0 alone: its rows as in the batch */
    if (T > 1) {
        gptoss_cuda_moe_route(d_topk, 1, K, E, GPTOSS_MOE_WMMA_GEMM, &route, 0);
        CK(cudaMemset(d_y, 0xff, (size_t)P * H * sizeof(float)));
        CK(gptoss_cuda_bi_moe(&w, d_t, 1, K, d_topk, &route, d_h, d_y, GPTOSS_BI_MOE_SMALL, 0) == 0
               ? cudaSuccess
               : cudaErrorInvalidValue);
        std::vector<float> y1 = dev_download(d_y, (size_t)K * H);
        snprintf(name, sizeof name, "bi_moe E %d T %d: token 0 alone bitwise as in the batch",
                 (int)E, (int)T);
        check_true(name, memcmp(y1.data(), y_ref.data(), y1.size() * sizeof(float)) == 0);
    }
    cudaFree(d_topk), cudaFree(d_t), cudaFree(route_mem), cudaFree(d_h), cudaFree(d_y);
}

/* The inputs of pair_case and dense_case: T tokens' top-k (masked: every third slot -1), their
 * activations, a route's memory, and h and y poisoned, then `reference` (the TMA or the dense
 * pair kernel) run in launches of at most 64 tokens, each pair alone in its block; h_ref and y_ref
 * what it wrote. */
typedef void (*pair_kernel_fn)(const gptoss_cuda_moe_weights *, const bf16 *, const int32_t *,
                               int32_t, int32_t, __half *, float *, cudaStream_t);
struct pair_inputs {
    std::vector<int32_t> topk;
    int32_t *d_topk;
    bf16 *d_t;
    void *route_mem;
    gptoss_cuda_route route;
    __half *d_h;
    float *d_y;
    std::vector<__half> h_ref;
    std::vector<float> y_ref;
};
static pair_inputs pair_inputs_run(const gptoss_cuda_moe_weights &w, int32_t T, int32_t K,
                                   bool skew, bool masked, pair_kernel_fn reference) {
    const int32_t E = w.n_experts, H = w.hidden, I = w.intermediate, P = T * K;
    pair_inputs in;
    in.topk = random_topk(T, K, E, skew);
    if (masked)
        for (int32_t p = 0; p < P; p += 3)
            in.topk[(size_t)p] = -1;
    std::vector<uint16_t> act((size_t)T * H);
    for (auto &v : act)
        v = f2bf(rnd_nz(1.0f));
    in.d_topk = dev_upload(in.topk);
    in.d_t = (bf16 *)dev_upload(act);
    in.route_mem = nullptr;
    CK(cudaMalloc(&in.route_mem, gptoss_cuda_route_bytes(P, E)));
    gptoss_cuda_route_bind(in.route_mem, P, E, &in.route);
    in.d_h = dev_poisoned<__half>((size_t)P * I);
    in.d_y = dev_poisoned<float>((size_t)P * H);
    for (int32_t t0 = 0; t0 < T; t0 += 64) {
        const int32_t n = std::min<int32_t>(64, T - t0);
        reference(&w, in.d_t + (size_t)t0 * H, in.d_topk + (size_t)t0 * K, n * K, K,
                  in.d_h + (size_t)t0 * K * I, in.d_y + (size_t)t0 * K * H, 0);
    }
    CK(cudaGetLastError());
    in.h_ref = dev_download(in.d_h, (size_t)P * I);
    in.y_ref = dev_download(in.d_y, (size_t)P * H);
    return in;
}
static void pair_inputs_free(pair_inputs &in) {
    cudaFree(in.d_topk), cudaFree(in.d_t), cudaFree(in.route_mem), cudaFree(in.d_h),
        cudaFree(in.d_y);
}

/* ---- experts: the grouped pair kernel against the TMA pair kernel ------------------------- */

/* A routed expert launch (the grouped pair kernel, the sliced mma GEMM) of in's tokens over a
 * route of `rows`-row tiles, into h and y poisoned first; returns both. */
template <typename Launch>
static void routed_run(Launch launch, const gptoss_cuda_moe_weights &w, pair_inputs &in, int32_t T,
                       int32_t K, int32_t rows, std::vector<__half> &h, std::vector<float> &y) {
    const int32_t P = T * K;
    gptoss_cuda_moe_route_rows(in.d_topk, T, K, w.n_experts, rows, &in.route, 0);
    CK(cudaMemset(in.d_h, 0xff, (size_t)P * w.intermediate * sizeof(__half)));
    CK(cudaMemset(in.d_y, 0xff, (size_t)P * w.hidden * sizeof(float)));
    launch(&w, in.d_t, &in.route, T, K, in.d_h, in.d_y, (cudaStream_t)0);
    CK(cudaGetLastError());
    h = dev_download(in.d_h, (size_t)P * w.intermediate);
    y = dev_download(in.d_y, (size_t)P * w.hidden);
}

/* T tokens' experts (K distinct each; skew: expert 0 in every token; masked: every third slot
 * -1, another GPU's expert under tensor parallelism) through the TMA pair kernel in launches
 * of at most 64 tokens (the reference: each pair alone in its block) and through the grouped
 * kernel over routes of 16- and 8-pair tiles: h and y bit for bit, rows of -1 slots never
 * written. */
static void pair_case(const moe_case_weights &mw, int32_t T, int32_t K, bool skew, bool masked) {
    gptoss_cuda_moe_weights w = mw.w;
    w.pair_mma_ok = true; /* scales 118..130 and inputs within 1: the fp16 form is exact */
    w.masked_slots = masked;
    char name[160];
    if (!gptoss_moe_pair_grouped_ok(&w)) {
        printf("pair_case: the TMA pair kernel does not run here, skipped\n");
        return;
    }
    const int32_t E = w.n_experts, H = w.hidden, I = w.intermediate, P = T * K;
    pair_inputs in = pair_inputs_run(w, T, K, skew, masked, gptoss_moe_pair_tma);
    const std::vector<int32_t> &topk = in.topk;
    const std::vector<__half> &h_ref = in.h_ref;
    const std::vector<float> &y_ref = in.y_ref;
    bool finite = true, untouched = true;
    for (int32_t p = 0; p < P; p++)
        for (int32_t j = 0; j < H; j++) {
            const float v = y_ref[(size_t)p * H + j];
            uint32_t bits;
            memcpy(&bits, &v, 4);
            if (topk[(size_t)p] < 0)
                untouched = untouched && bits == 0xffffffffu;
            else
                finite = finite && std::isfinite(v);
        }
    snprintf(name, sizeof name, "pair tma E %d H %d T %d%s%s: y finite, -1 slots not written",
             (int)E, (int)H, (int)T, skew ? " skew" : "", masked ? " masked" : "");
    check_true(name, finite && untouched);
    for (int32_t rows : {16, 8}) {
        std::vector<__half> h;
        std::vector<float> y;
        routed_run(gptoss_moe_pair_grouped, w, in, T, K, rows, h, y);
        bool h_same = true;
        for (int32_t p = 0; p < P; p++)
            if (topk[(size_t)p] >= 0)
                h_same = h_same && memcmp(&h[(size_t)p * I], &h_ref[(size_t)p * I],
                                          (size_t)I * sizeof(__half)) == 0;
        snprintf(name, sizeof name,
                 "pair grouped (%d-row tiles) E %d H %d I %d T %d%s%s: h, y bitwise pair tma's",
                 (int)rows, (int)E, (int)H, (int)I, (int)T, skew ? " skew" : "",
                 masked ? " masked" : "");
        check_true(name, h_same && memcmp(y.data(), y_ref.data(), y.size() * sizeof(float)) == 0);
    }
    pair_inputs_free(in);
}

/* ---- experts: the sliced mma GEMM against the dense pair kernel --------------------------- */

/* T tokens' experts (as pair_case) through the dense pair kernel in launches of at most 64
 * tokens (the reference: each pair alone in its block) and through the sliced mma GEMM over
 * routes of 8- to 128-row tiles: y bit for bit, h (by sorted row there) bit for bit, rows
 * of -1 slots never written; and y near the WMMA path's (another arithmetic: bf16 weights,
 * one sum per output), so that the two cannot agree on something wrong. */
static void dense_case(const moe_case_weights &mw, int32_t T, int32_t K, bool skew, bool masked) {
    gptoss_cuda_moe_weights w = mw.w;
    w.mma_ok = true; /* scales 118..128 and inputs within 1: the fp16 form is exact */
    w.masked_slots = masked;
    char name[160];
    if (!gptoss_moe_bi_mma_ok(&w)) {
        printf("dense_case: the TMA pair kernel does not run here, skipped\n");
        return;
    }
    const int32_t E = w.n_experts, H = w.hidden, I = w.intermediate, P = T * K;
    pair_inputs in = pair_inputs_run(w, T, K, skew, masked, gptoss_moe_pair_dense);
    const std::vector<int32_t> &topk = in.topk;
    gptoss_cuda_route &route = in.route;
    int32_t *d_topk = in.d_topk;
    bf16 *d_t = in.d_t;
    float *d_y = in.d_y;
    const std::vector<__half> &h_ref = in.h_ref;
    const std::vector<float> &y_ref = in.y_ref;
    /* the WMMA path on the unmasked pairs (its rows of -1 slots are left alone too) */
    gptoss_cuda_moe_route(d_topk, T, K, E, GPTOSS_MOE_WMMA_GEMM, &route, 0);
    bf16 *d_hw = dev_poisoned<bf16>((size_t)P * I);
    CK(cudaMemset(d_y, 0xff, (size_t)P * H * sizeof(float)));
    gptoss_cuda_moe(&w, d_t, T, K, d_topk, &route, d_hw, d_y, GPTOSS_MOE_WMMA_GEMM, 0);
    std::vector<float> y_wmma = dev_download(d_y, (size_t)P * H);
    bool finite = true, untouched = true;
    double worst = 0.0;
    for (int32_t p = 0; p < P; p++) {
        double row_max = 0.0, row_err = 0.0;
        for (int32_t j = 0; j < H; j++) {
            const float v = y_ref[(size_t)p * H + j];
            uint32_t bits;
            memcpy(&bits, &v, 4);
            if (topk[(size_t)p] < 0) {
                untouched = untouched && bits == 0xffffffffu;
                continue;
            }
            finite = finite && std::isfinite(v);
            row_max = std::max(row_max, (double)std::fabs(y_wmma[(size_t)p * H + j]));
            row_err = std::max(row_err, (double)std::fabs(v - y_wmma[(size_t)p * H + j]));
        }
        if (row_max > 0.0) worst = std::max(worst, row_err / row_max);
    }
    snprintf(name, sizeof name,
             "pair dense E %d H %d T %d%s%s: y finite, -1 slots not written, max err / row max "
             "%.2e against WMMA <= 1e-3",
             (int)E, (int)H, (int)T, skew ? " skew" : "", masked ? " masked" : "", worst);
    check_true(name, finite && untouched && worst <= 1e-3);
    /* every tile height the GEMM has (the backend caps them at bi_moe_tile) */
    gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    const int saved_cap = kc->moe_bi_max_tile, saved_stage_kb = kc->moe_mma_stage_kb;
    const bool saved_slab = kc->moe_mma_slab;
    kc->moe_bi_max_tile = 128;
    /* and each depth of its pipeline stages (1..3 K blocks; the tall tiles keep 1); depth 0
     * here: the 8-row tiles on the slab kernel (moe_mma_slab), where it runs */
    for (int kps : {1, 2, 3, 0})
        for (int32_t rows : {128, 64, 32, 16, 8}) {
            if (rows > kc->moe_mma_max_tile) continue; /* its shared memory was not granted */
            if (kps > 1 && rows > 32) continue;        /* one depth only */
            if (kps == 0 && (rows != 8 || !kc->moe_slab_ok)) continue;
            kc->moe_mma_stage_kb = kps;
            kc->moe_mma_slab = kps == 0;
            std::vector<__half> h;
            std::vector<float> y;
            routed_run(gptoss_moe_mma_gemm_sliced, w, in, T, K, rows, h, y);
            std::vector<int32_t> offsets = dev_download(route.expert_offsets, (size_t)E + 1);
            std::vector<int32_t> sorted_pair = dev_download(route.sorted_pair, (size_t)P);
            bool h_same = true, y_same = true;
            for (int32_t pos = 0; pos < offsets[(size_t)E]; pos++) {
                const int32_t p = sorted_pair[(size_t)pos];
                h_same = h_same && memcmp(&h[(size_t)pos * I], &h_ref[(size_t)p * I],
                                          (size_t)I * sizeof(__half)) == 0;
            }
            /* rows of -1 slots: the GEMM keeps its fp16 copy of t in y until down writes it, so
             * they hold that (the weighted sum skips them); only the pairs' rows are compared */
            for (int32_t p = 0; p < P; p++)
                if (topk[(size_t)p] >= 0)
                    y_same = y_same && memcmp(&y[(size_t)p * H], &y_ref[(size_t)p * H],
                                              (size_t)H * sizeof(float)) == 0;
            char how[48];
            if (kps == 0)
                snprintf(how, sizeof how, "slab kernel");
            else
                snprintf(how, sizeof how, "%d K blocks a stage", kps);
            snprintf(name, sizeof name,
                     "mma sliced (%d-row tiles, %s) E %d H %d I %d T %d%s%s: h, y bitwise pair "
                     "dense's",
                     (int)rows, how, (int)E, (int)H, (int)I, (int)T, skew ? " skew" : "",
                     masked ? " masked" : "");
            check_true(name, h_same && y_same);
        }
    kc->moe_bi_max_tile = saved_cap;
    kc->moe_mma_stage_kb = saved_stage_kb;
    kc->moe_mma_slab = saved_slab;
    cudaFree(d_hw);
    pair_inputs_free(in);
}

/* ---- attention: the tensor-core kernel, by tile and by token ------------------------------ */

/* Launches the tensor-core attention (tiles of 16 tokens, or one token per block) for the
 * queries `rows` of q (positions pos, sequences seq) and returns their outputs. */
static std::vector<uint16_t> attn_run(const std::vector<float> &q_all, const bf16 *d_k,
                                      const bf16 *d_v, const int32_t *d_tables, int32_t max_blocks,
                                      const float *d_sinks, const std::vector<int32_t> &rows,
                                      const std::vector<int32_t> &pos,
                                      const std::vector<int32_t> &seq, int32_t window, bool each,
                                      bool *ok) {
    const int32_t NH = 64, NKV = 8, D = 64, n = (int32_t)rows.size();
    std::vector<float> qs((size_t)n * NH * D);
    for (int32_t i = 0; i < n; i++)
        memcpy(&qs[(size_t)i * NH * D], &q_all[(size_t)rows[i] * NH * D], NH * D * sizeof(float));
    float *dq = dev_upload(qs);
    int32_t *dp = dev_upload(pos), *ds = dev_upload(seq);
    bf16 *dout = dev_poisoned<bf16>((size_t)n * NH * D);
    int rc = each ? gptoss_cuda_attention_tc_each(dq, d_k, d_v, dp, ds, d_tables, max_blocks, 16,
                                                  d_sinks, n, NH, NKV, D, window, dout, 0)
                  : gptoss_cuda_attention_tc(dq, d_k, d_v, dp, ds, d_tables, max_blocks, 16,
                                             d_sinks, n, NH, NKV, D, window, dout, 0);
    *ok = *ok && rc == 0;
    std::vector<uint16_t> out((size_t)n * NH * D);
    CK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
    cudaFree(dq), cudaFree(dp), cudaFree(ds), cudaFree(dout);
    return out;
}

/* Sequence 0 holds 300 keys, sequence 1 200 (16-key pages, sequence 0's in reverse order);
 * q rows 0..299 are sequence 0's positions, 300..499 sequence 1's. Every output of sequence 0
 * must equal, bit for bit, the one-launch prefill of its 300 tokens: by token, in chunks of
 * 1, 7, 64 and 100, beside another sequence's tokens in shared tiles, and as decode tokens. */
static void attention_case(int32_t window) {
    const int32_t NH = 64, NKV = 8, D = 64, BS = 16, MB = 19, NB = 32;
    std::vector<uint16_t> kc((size_t)NB * BS * NKV * D), vc(kc.size());
    for (auto &v : kc)
        v = f2bf(rnd_nz(1.0f));
    for (auto &v : vc)
        v = f2bf(rnd_nz(1.0f));
    std::vector<float> q((size_t)500 * NH * D), sinks(NH);
    for (auto &v : q)
        v = rnd_nz(0.3f);
    for (auto &v : sinks)
        v = rnd_nz(1.0f);
    std::vector<int32_t> tables((size_t)2 * MB, 0);
    for (int32_t b = 0; b < MB; b++)
        tables[b] = NB - 1 - b;
    for (int32_t b = 0; b < 13; b++)
        tables[MB + b] = b;
    bf16 *dk = (bf16 *)dev_upload(kc), *dv = (bf16 *)dev_upload(vc);
    float *dsk = dev_upload(sinks);
    int32_t *dt = dev_upload(tables);
    bool ok = true;
    auto run = [&](const std::vector<int32_t> &rows, bool each) {
        std::vector<int32_t> pos(rows.size()), seq(rows.size());
        for (size_t i = 0; i < rows.size(); i++) {
            seq[i] = rows[i] < 300 ? 0 : 1;
            pos[i] = rows[i] < 300 ? rows[i] : rows[i] - 300;
        }
        return attn_run(q, dk, dv, dt, MB, dsk, rows, pos, seq, window, each, &ok);
    };
    const size_t RW = (size_t)NH * D;
    std::vector<int32_t> all(300);
    for (int32_t i = 0; i < 300; i++)
        all[i] = i;
    std::vector<uint16_t> ref = run(all, false);
    /* every output of sequence 0 in `rows` against ref */
    auto same_as_ref = [&](const std::vector<int32_t> &rows, const std::vector<uint16_t> &out) {
        for (size_t i = 0; i < rows.size(); i++)
            if (rows[i] < 300 &&
                memcmp(&out[i * RW], &ref[(size_t)rows[i] * RW], RW * sizeof(uint16_t)) != 0)
                return false;
        return true;
    };
    char name[160];
    snprintf(name, sizeof name, "attention_tc window %d: one token per block bitwise the tiles",
             (int)window);
    check_true(name, same_as_ref(all, run(all, true)) && ok);
    bool same = true;
    for (int32_t cs : {1, 7, 64, 100})
        for (int32_t c0 = 0; c0 < 300; c0 += cs) {
            std::vector<int32_t> rows;
            for (int32_t i = c0; i < 300 && i < c0 + cs; i++)
                rows.push_back(i);
            same = same && same_as_ref(rows, run(rows, false));
        }
    snprintf(name, sizeof name, "attention_tc window %d: chunks of 1, 7, 64, 100 bitwise",
             (int)window);
    check_true(name, same && ok);
    std::vector<int32_t> mixed;
    for (int32_t i = 450; i < 470; i++)
        mixed.push_back(i);
    for (int32_t i = 100; i < 137; i++)
        mixed.push_back(i);
    mixed.push_back(470);
    for (int32_t i = 137; i < 150; i++)
        mixed.push_back(i);
    std::vector<int32_t> decode = {299, 499, 5, 333, 160, 31, 32};
    snprintf(name, sizeof name,
             "attention_tc window %d: beside another sequence in tiles, and as decode tokens",
             (int)window);
    check_true(name, same_as_ref(mixed, run(mixed, false)) &&
                         same_as_ref(decode, run(decode, true)) &&
                         same_as_ref(decode, run(decode, false)) && ok);
    cudaFree(dk), cudaFree(dv), cudaFree(dsk), cudaFree(dt);
}

/* Fills n bf16 values of magnitude up to `scale` from a hash of the index: the timings' gigabyte
 * of lm_head weights without a host loop. */
static __global__ void fill_random_bf16(bf16 *p, size_t n, float scale, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        p[i] = __float2bfloat16(scale * ((float)(h & 0xffffff) / 8388608.0f - 1.0f));
    }
}

/* Median milliseconds of 9 runs of fn (after 2 untimed ones). */
template <typename F> static float median_ms(F fn) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    fn(), fn();
    std::vector<float> ts;
    for (int r = 0; r < 9; r++) {
        CK(cudaEventRecord(a, 0));
        fn();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float t = 0;
        CK(cudaEventElapsedTime(&t, a, b));
        ts.push_back(t);
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

/* The dense GEMM's launch shapes for steps past 128 rows against cuBLAS (bf16 in, fp32 out) on
 * the 120b QKV, O and lm_head widths: printed, not checked. */
static void gemm_timing(void) {
    static const int32_t shapes[][3] = {/* n, k, rows */
                                        {5120, 2880, 32},   {2880, 4096, 32},   {5120, 2880, 64},
                                        {2880, 4096, 64},   {5120, 2880, 128},  {2880, 4096, 128},
                                        {5120, 2880, 256},  {2880, 4096, 256},  {5120, 2880, 2048},
                                        {2880, 4096, 2048}, {201088, 2880, 64}, {201088, 2880, 128},
                                        {201088, 2880, 256}};
    size_t w_max = 0, x_max = 0, y_max = 0;
    for (const auto &s : shapes) {
        w_max = std::max(w_max, (size_t)s[0] * s[1]);
        x_max = std::max(x_max, (size_t)s[2] * s[1]);
        y_max = std::max(y_max, (size_t)s[2] * s[0]);
    }
    bf16 *dw = nullptr, *dx = nullptr;
    float *dy = nullptr;
    if (cudaMalloc(&dw, w_max * 2) != cudaSuccess || cudaMalloc(&dx, x_max * 2) != cudaSuccess ||
        cudaMalloc(&dy, y_max * 4) != cudaSuccess) {
        printf("timing: skipped (no memory)\n");
        cudaFree(dw), cudaFree(dx), cudaFree(dy);
        (void)cudaGetLastError();
        return;
    }
    fill_random_bf16<<<1024, 256>>>(dw, w_max, 0.05f, 1u);
    fill_random_bf16<<<1024, 256>>>(dx, x_max, 1.0f, 2u);
    CK(cudaDeviceSynchronize());
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
    gptoss_cuda_dense_weight wt = {};
    wt.w_bf16 = dw;
    printf("timing (ms, median of 9; TFLOPS):\n");
    for (const auto &s : shapes) {
        const int32_t n = s[0], k = s[1], m = s[2];
        const double flop = 2.0 * m * n * k;
        printf("  m %5d n %6d k %4d:", (int)m, (int)n, (int)k);
        for (int v : {GPTOSS_BI_GEMM_SKINNY, GPTOSS_BI_GEMM_WIDE, GPTOSS_BI_GEMM_LARGE_128,
                      GPTOSS_BI_GEMM_LARGE_64, GPTOSS_BI_GEMM_LARGE_64N64, GPTOSS_BI_GEMM_LARGE}) {
            float ms =
                median_ms([&] { (void)gptoss_cuda_bi_gemm_variant(wt, dx, dy, m, n, k, v, 0); });
            printf("  %s %.3f (%.0f)", bi_variant_name(v), ms, flop / ms * 1e-9);
        }
        if (h) {
            const float one = 1.0f, zero = 0.0f;
            float ms = median_ms([&] {
                (void)cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, dw, CUDA_R_16BF, k,
                                   dx, CUDA_R_16BF, k, &zero, dy, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT);
            });
            printf("  cublas %.3f (%.0f)", ms, flop / ms * 1e-9);
        }
        printf("\n");
    }
    if (h) cublasDestroy(h);
    cudaFree(dw), cudaFree(dx), cudaFree(dy);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "timing") == 0) { /* the timings alone */
        open_device();
        gemm_timing();
        return 0;
    }
    open_device();
    /* 20b QKV and O (k 2880 ends in half a 128-input step, 4096 in whole ones), short partial
     * k-steps (200, 72), widths that end in a partial column tile */
    static const int32_t shapes[][2] = {{5120, 2880}, {2880, 4096}, {100, 200}, {70, 72}};
    for (const auto &s : shapes) {
        gemm_case(s[0], s[1], false);
        gemm_case(s[0], s[1], true);
    }
    /* k not a multiple of 8: refused, nothing written */
    {
        gptoss_cuda_dense_weight wt = {};
        std::vector<uint16_t> x(64 * 12, 0);
        bf16 *dx = (bf16 *)dev_upload(x);
        wt.w_bf16 = dx;
        check_true("bi_gemm refuses k = 12",
                   gptoss_cuda_bi_gemm(wt, dx, (float *)dx, 4, 4, 12, 0) != 0);
        cudaFree(dx);
    }
    /* the expert kernels' per-device set-up (the pair kernels' choice among them) */
    CK(gptoss_cuda_moe_prepare(2880, 2880));
    {
        moe_case_weights big = moe_weights(16, 2880, 2880);
        for (int32_t T : {1, 2, 3, 8, 16, 33, 64})
            moe_case(big, T, 4, false);
        for (int32_t T : {1, 3, 9, 64, 200})
            pair_case(big, T, 4, false, false);
        pair_case(big, 40, 4, true, false); /* 40 pairs of expert 0: three 16-pair tiles */
        pair_case(big, 33, 4, false, true); /* tensor parallelism: -1 slots skipped */
        moe_case(big, 40, 4, true);         /* 40 rows of expert 0: passes of 16 rows */
        moe_case(big, 100, 4, true);        /* 100: two route tiles of one expert */
        moe_case(big, 512, 4, false);       /* prefill-sized: 128 rows per expert */
        for (void *p : big.allocs)
            cudaFree(p);
        moe_case_weights small = moe_weights(16, 256, 192);
        for (int32_t T : {1, 5, 70})
            moe_case(small, T, 4, T == 70);
        pair_case(small, 70, 4, true, true);
        for (void *p : small.allocs)
            cudaFree(p);
        moe_case_weights big_mma = moe_weights(16, 2880, 2880, true);
        for (int32_t T : {1, 3, 9, 64, 200})
            dense_case(big_mma, T, 4, false, false);
        dense_case(big_mma, 40, 4, true, false); /* 40 pairs of expert 0: two 32-row tiles */
        dense_case(big_mma, 33, 4, false, true); /* tensor parallelism: -1 slots skipped */
        for (void *p : big_mma.allocs)
            cudaFree(p);
        /* widths that end in a partial window (k 2880: 90 groups), and in a partial slice */
        moe_case_weights small_mma = moe_weights(16, 256, 192, true);
        dense_case(small_mma, 70, 4, true, true);
        for (void *p : small_mma.allocs)
            cudaFree(p);
    }
    attention_case(0);
    attention_case(128);
    attention_case(40); /* a window that is no multiple of the 32-key steps */
    router_case(32, 2880);
    router_case(128, 2880);
    router_case(8, 128);
    gemm_timing();
    int failed = 0;
    for (const result &r : results)
        failed += !r.ok;
    printf("gpu_test_bi_kernels: %d of %d checks failed\n", failed, (int)results.size());
    return failed ? 1 : 0;
}
