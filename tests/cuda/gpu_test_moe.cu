/*
 * gpu_test_moe.cu - the MoE expert kernels (every path of gptoss_cuda_moe: GEMV, GEMM, the pair
 * GEMV, the mma route tiles and their slab kernel, the pair tensor-core kernels, wgmma)
 * against a plain host reference.
 *
 * Needs a GPU, so it is not a ctest test: scripts/gpu-check builds and runs it on the GPU
 * machine. Inputs are random and never zero; outputs are poisoned (NaN bytes) before each
 * launch so an unwritten element fails. The reference dequantizes the MXFP4 experts exactly
 * from the spec (section 2) and multiplies in double precision, independent of the backend's
 * code. Prints one line per case and a summary table last; exits 1 on any failure.
 *
 *   gpu_test_moe [SECTION,...]   sections: paths slab pair wgmma (default: all)
 *     paths: every path forced and the default choice, at decode and prefill sizes, with each
 *            stage depth of the mma path; slab: the 8-row tiles on the slab kernel; pair: path
 *            5 with each of its kernels; wgmma: path 6
 */
#include "backend/cuda/cuda_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#define GPU_TEST_SEED 0x5eed0fe4e4de57ull
#include "gpu_test_util.h"

static const double kFp4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

/* pattern: 0 random distinct experts, 1 every token's first slot is expert 0 (one expert
 * gets all tokens), 2 only experts {1, 3, 4, 6, 7} are used (others empty). */
static void test_moe(int T, int H, int I, int E, int K, int pattern, int path,
                     bool wide_scales = false) {
    size_t gu_rows = (size_t)E * 2 * I, dn_rows = (size_t)E * H;
    std::vector<uint8_t> gub(gu_rows * (H / 32) * 16), gus(gu_rows * (H / 32)),
        dnb(dn_rows * (I / 32) * 16), dns(dn_rows * (I / 32));
    for (auto &v : gub)
        v = (uint8_t)rnd_u64();
    for (auto &v : dnb)
        v = (uint8_t)rnd_u64();
    int s0h = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)H))));
    int s0i = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)I))));
    for (auto &v : gus)
        v = (uint8_t)(wide_scales ? 110 + rnd_int(31) : s0h - 1 + rnd_int(3));
    for (auto &v : dns)
        v = (uint8_t)(wide_scales ? 110 + rnd_int(31) : s0i - 1 + rnd_int(3));
    std::vector<float> gubias(gu_rows), dnbias(dn_rows);
    for (auto &v : gubias)
        v = rnd_nz(0.1f);
    for (auto &v : dnbias)
        v = rnd_nz(0.1f);
    std::vector<uint16_t> t((size_t)T * H);
    for (auto &v : t)
        v = f2bf(rnd_nz(2.0f));
    std::vector<int32_t> topk((size_t)T * K);
    int allowed[5] = {1, 3, 4, 6, 7};
    for (int i = 0; i < T; i++) {
        std::vector<int> pool;
        if (pattern == 2 && E >= 8)
            for (int a : allowed)
                pool.push_back(a);
        else
            for (int e = 0; e < E; e++)
                pool.push_back(e);
        for (int k = 0; k < K; k++) {
            int j = k + rnd_int((int)pool.size() - k);
            std::swap(pool[k], pool[j]);
        }
        if (pattern == 1) {
            auto it = std::find(pool.begin(), pool.end(), 0);
            std::swap(pool[0], *it);
        }
        for (int k = 0; k < K; k++)
            topk[(size_t)i * K + k] = pool[k];
    }
    /* device */
    uint8_t *d_gub = dev_upload(gub), *d_gus = dev_upload(gus), *d_dnb = dev_upload(dnb),
            *d_dns = dev_upload(dns);
    float *d_gubias = dev_upload(gubias), *d_dnbias = dev_upload(dnbias);
    bf16 *d_t;
    CK(cudaMalloc(&d_t, t.size() * 2));
    CK(cudaMemcpy(d_t, t.data(), t.size() * 2, cudaMemcpyHostToDevice));
    int32_t *d_topk = dev_upload(topk);
    void *route_mem;
    CK(cudaMalloc(&route_mem, gptoss_cuda_route_bytes(T * K, E)));
    gptoss_cuda_route route;
    gptoss_cuda_route_bind(route_mem, T * K, E, &route);
    CK(gptoss_cuda_moe_prepare(H, I));
    bf16 *d_h = dev_poisoned<bf16>((size_t)T * K * I);
    float *d_y = dev_poisoned<float>((size_t)T * K * H);
    gptoss_cuda_moe_weights w = {d_gub, d_gus, d_gubias, d_dnb, d_dns, d_dnbias, E,    H,
                                 I,     7.0f,  1.702f,   false, false, false,    false};
    unsigned *d_scratch = dev_poisoned<unsigned>(4);
    CK(gptoss_cuda_moe_check_mma(&w, nullptr, d_scratch, 0));
    /* path 4 is exact only for scale bytes in [104, 128]: wide scales must turn it down */
    if (w.mma_ok == wide_scales) {
        char nm[96];
        snprintf(nm, sizeof nm, "moe mma check H=%d I=%d%s: mma_ok=%d", H, I,
                 wide_scales ? " wide" : "", (int)w.mma_ok);
        check_true(nm, false);
    }
    /* the pair path (3) must not need the route: leave it unbuilt (garbage) then */
    /* path 5 scales in fp32: any byte up to 240 is fine, so wide scales must not turn it down */
    if (!w.pair_mma_ok) {
        char nm[96];
        snprintf(nm, sizeof nm, "moe pair-mma check H=%d I=%d%s: pair_mma_ok=0", H, I,
                 wide_scales ? " wide" : "");
        check_true(nm, false);
    }
    /* path 6 runs wherever the capabilities (the device's, or the forced profile's) have wgmma,
     * for widths that are multiples of 64 */
    if (path == 6 && H % 64 == 0 && I % 64 == 0 && !wide_scales) {
        const gptoss_cuda_caps *caps = gptoss_cuda_caps_current();
        if (caps->wgmma != w.wg_ok) {
            char nm[96];
            snprintf(nm, sizeof nm, "moe wgmma check H=%d I=%d: wg_ok=%d on sm_%d", H, I,
                     (int)w.wg_ok, (int)caps->sm);
            check_true(nm, false);
        }
    }
    int used_path = gptoss_cuda_moe_choose_path(path, T, K, &w);
    if (path == 0 && T == 1 && used_path != 5)
        check_true("moe: one token must choose path 5", false);
    /* several tokens: path 5 while the pairs are at most 7/8 of the experts, never above */
    if (path == 0 && T > 1 && w.pair_mma_ok && (used_path == 5) != (8 * T * K <= 7 * E)) {
        char nm[96];
        snprintf(nm, sizeof nm, "moe: T=%d K=%d E=%d chose path %d", T, K, E, used_path);
        check_true(nm, false);
    }
    if (used_path != 3 && used_path != 5)
        gptoss_cuda_moe_route(d_topk, T, K, E, used_path, &route, 0);
    gptoss_cuda_moe(&w, d_t, T, K, d_topk, &route, d_h, d_y, path, 0);
    std::vector<float> y = dev_download(d_y, (size_t)T * K * H);
    /* reference: double math from the spec; h rounded to bf16 as the backend stores it.
     * Expert by expert: its weights are dequantized once (exactly, into floats), then
     * every pair routed to it. */
    std::vector<double> ref((size_t)T * K * H);
    std::vector<std::vector<int>> pairs_of(E);
    for (int pr = 0; pr < T * K; pr++)
        pairs_of[topk[pr]].push_back(pr);
    std::vector<float> wgu((size_t)2 * I * H), wdn((size_t)H * I);
    for (int e = 0; e < E; e++) {
        if (pairs_of[e].empty()) continue;
#pragma omp parallel for
        for (int r = 0; r < 2 * I; r++) {
            size_t row = (size_t)e * 2 * I + r;
            for (int j = 0; j < H; j++) {
                uint8_t byte = gub[row * (H / 32) * 16 + (j / 32) * 16 + (j % 32) / 2];
                int code = (j % 2) ? byte >> 4 : byte & 15;
                wgu[(size_t)r * H + j] =
                    (float)(kFp4[code] * ldexp(1.0, gus[row * (H / 32) + j / 32] - 127));
            }
        }
#pragma omp parallel for
        for (int n = 0; n < H; n++) {
            size_t row = (size_t)e * H + n;
            for (int i = 0; i < I; i++) {
                uint8_t byte = dnb[row * (I / 32) * 16 + (i / 32) * 16 + (i % 32) / 2];
                int code = (i % 2) ? byte >> 4 : byte & 15;
                wdn[(size_t)n * I + i] =
                    (float)(kFp4[code] * ldexp(1.0, dns[row * (I / 32) + i / 32] - 127));
            }
        }
        const std::vector<int> &prs = pairs_of[e];
#pragma omp parallel for schedule(dynamic)
        for (size_t pi = 0; pi < prs.size(); pi++) {
            int pr = prs[pi], tok = pr / K;
            std::vector<double> x(H), h(I);
            for (int j = 0; j < H; j++)
                x[j] = bf2f(t[(size_t)tok * H + j]);
            for (int i = 0; i < I; i++) {
                double u[2];
                for (int r = 0; r < 2; r++) {
                    const float *wr = &wgu[(size_t)(2 * i + r) * H];
                    double acc = 0;
                    for (int j = 0; j < H; j++)
                        acc += (double)wr[j] * x[j];
                    u[r] = acc + gubias[(size_t)e * 2 * I + 2 * i + r];
                }
                double a = fmin(u[0], 7.0), c = fmin(fmax(u[1], -7.0), 7.0);
                h[i] = bfround(a / (1 + exp(-1.702 * a)) * (c + 1));
            }
            for (int n = 0; n < H; n++) {
                const float *wr = &wdn[(size_t)n * I];
                double acc = 0;
                for (int i = 0; i < I; i++)
                    acc += (double)wr[i] * h[i];
                ref[(size_t)pr * H + n] = acc + dnbias[(size_t)e * H + n];
            }
        }
    }
    std::vector<double> got(y.begin(), y.end());
    char name[96];
    snprintf(name, sizeof name, "moe %s T=%d H=%d I=%d E=%d pattern=%d%s",
             used_path == 6   ? "wgmma"
             : used_path == 5 ? (gptoss_cuda_moe_pair_kernel() == 4   ? "pair-dense"
                                 : gptoss_cuda_moe_pair_kernel() == 3 ? "pair-fp8"
                                 : gptoss_cuda_moe_pair_kernel() == 2 ? "pair-tma"
                                                                      : "pair-wide")
             : used_path == 4 ? "mma"
             : used_path == 3 ? "pair-gemv"
             : used_path == 1 ? "gemv"
                              : "gemm",
             T, H, I, E, pattern, wide_scales ? " scales 110..140" : "");
    check(name, got, ref, 2e-3); /* fp32 accumulation; h is bf16 on both sides, rare 1-ulp flips */
    cudaFree(d_gub), cudaFree(d_gus), cudaFree(d_dnb), cudaFree(d_dns), cudaFree(d_gubias),
        cudaFree(d_dnbias);
    cudaFree(d_t), cudaFree(d_topk), cudaFree(route_mem), cudaFree(d_h), cudaFree(d_y),
        cudaFree(d_scratch);
}

static const char *const kSections[] = {"paths", "slab", "pair", "wgmma"};

int main(int argc, char **argv) {
    int st = select_sections(argc, argv, "gpu_test_moe", kSections,
                             (int)(sizeof kSections / sizeof kSections[0]));
    if (st) return st;
    open_device();

    if (want("paths")) {
        /* MoE: real widths at decode-sized batches, small widths at prefill sizes (host cost) */
        for (int T : {1, 2, 5, 8, 16})
            test_moe(T, 2880, 2880, 32, 4, 0, 1);
        test_moe(13, 2880, 2880, 32, 4, 1, 1);
        test_moe(40, 2880, 2880, 32, 4, 0, 1); /* more than 8 tokens for one expert: chunked GEMV */
        test_moe(3, 2880, 2880, 128, 4, 0, 2);
        test_moe(33, 2880, 2880, 32, 4, 0, 2);
        test_moe(100, 2880, 2880, 32, 4, 1, 2);
        for (int T : {1, 7, 64, 65, 100, 333, 1000, 4096})
            test_moe(T, 256, 192, 16, 4, T % 3, 2);
        for (int T : {1, 6, 20})
            test_moe(T, 160, 96, 8, 2, 2, 1);
        for (int T : {3, 129, 500})
            test_moe(T, 160, 96, 8, 2, 2, 2);
        test_moe(4096, 64, 64, 4, 4, 1, 2);
        test_moe(5, 256, 192, 16, 4, 0, 1, true);
        test_moe(300, 256, 192, 16, 4, 0, 2, true);
        /* pair path (single decode token; forced for up to 8 pairs, falls back to 1 above) */
        test_moe(1, 2880, 2880, 32, 4, 0, 0); /* the default choice for one token */
        /* the default for several tokens: path 5 up to 7/8 as many pairs as experts */
        test_moe(28, 2880, 2880, 128, 4, 0, 0); /* 112 of 128: path 5 */
        test_moe(29, 2880, 2880, 128, 4, 0, 0); /* 116: path 4 */
        test_moe(7, 2880, 2880, 32, 4, 2, 0);   /* 28 of 32, skewed: path 5 */
        test_moe(8, 2880, 2880, 32, 4, 0, 0);   /* 32: path 4 */
        test_moe(1, 2880, 2880, 128, 4, 0, 3);
        test_moe(2, 2880, 2880, 32, 4, 1, 3); /* 8 pairs, expert 0 in both tokens */
        test_moe(3, 160, 96, 8, 2, 2, 3);
        test_moe(1, 256, 192, 16, 4, 0, 3, true);
        test_moe(1, 4096, 4096, 8, 4, 0, 3); /* widest supported rows: 4 groups per lane */
        test_moe(5, 256, 192, 16, 4, 0, 3);  /* 20 pairs: forced path 3 falls back */
        /* mma path: tile heights 8..128 (rows per expert), partial K blocks (H = 160: 5 groups,
         * I = 96: 3), partial row blocks (96 units, 160 rows), skewed and sparse expert loads */
        for (int T : {1, 2, 3, 8, 16, 33, 111, 300, 1000})
            test_moe(T, 2880, 2880, 32, 4, T % 3, 4);
        for (int T : {1, 5, 87, 500, 2048})
            test_moe(T, 2880, 2880, 128, 4, T % 2, 4);
        for (int T : {1, 7, 64, 65, 100, 333, 1000, 4096})
            test_moe(T, 256, 192, 16, 4, T % 3, 4);
        for (int T : {1, 3, 129, 500})
            test_moe(T, 160, 96, 8, 2, 2, 4);
        test_moe(4096, 64, 64, 4, 4, 1, 4);
        test_moe(1, 4096, 4096, 8, 4, 0, 4);
        /* the decode-sized tiles (8 to 32 rows) with each depth of stage forced: 1, 2 and 3 K
         * blocks (the moe_mma_stage_kb knob; above, the rule's), with a last stage partly or
         * wholly past K (H = 160: 2 K blocks, I = 96: 1) */
        gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
        const int saved_stage_kb = kc->moe_mma_stage_kb;
        for (int kps : {1, 2, 3}) {
            kc->moe_mma_stage_kb = kps;
            printf("  mma path, %d K blocks per stage:\n", kps);
            for (int T : {8, 64, 111}) /* 8-, 16- and 32-row tiles */
                test_moe(T, 2880, 2880, 32, 4, T % 3, 4);
            for (int T : {7, 40, 65, 333}) /* 8, 16, 32, 64 */
                test_moe(T, 256, 192, 16, 4, T % 3, 4);
            for (int T : {3, 129})
                test_moe(T, 160, 96, 8, 2, 2, 4);
        }
        kc->moe_mma_stage_kb = saved_stage_kb;
        test_moe(300, 256, 192, 16, 4, 0, 4,
                 true); /* scales past 2^1: path 4 declines, another runs */
    }

    if (want("slab")) {
        /* the 8-row tiles on the slab kernel (moe_mma_slab, sm_90): a few rows per expert at
         * the real widths (T 87 of 128 experts is the 120b 64-sequence step's load), partial
         * K windows (H = 160: 5 groups, I = 96: 3), a last block of fewer slabs (160 rows: 10
         * of 12; 2880: 180 = 15 x 12), and the widest rows (4096) */
        gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
        const bool saved_slab = kc->moe_mma_slab;
        kc->moe_mma_slab = true;
        const gptoss_cuda_caps *caps = gptoss_cuda_caps_current();
        test_moe(1, 64, 64, 4, 4, 0, 4); /* prepares the MoE kernels */
        char nm[96];
        snprintf(nm, sizeof nm, "moe slab kernel runs on sm_%d: %s (expected where TMA is)",
                 (int)caps->sm, kc->moe_slab_ok ? "yes" : "no");
        check_true(nm, kc->moe_slab_ok == caps->tma);
        printf("  mma path, 8-row tiles on the slab kernel:\n");
        for (int T : {1, 2, 3, 8, 13})
            test_moe(T, 2880, 2880, 32, 4, T % 3, 4);
        for (int T : {5, 64, 87})
            test_moe(T, 2880, 2880, 128, 4, T % 2, 4);
        for (int T : {1, 7, 9})
            test_moe(T, 256, 192, 16, 4, T % 3, 4);
        for (int T : {1, 3, 6})
            test_moe(T, 160, 96, 8, 2, 2, 4);
        test_moe(1, 4096, 4096, 8, 4, 0, 4);
        kc->moe_mma_slab = saved_slab;
    }

    if (want("pair")) {
        /* path 5: one decode token on the tensor cores (the default for one token), with each
         * of its kernels: dense TMA (the default from compute capability 9.0; its sparse form
         * for the case whose scales pass 2^1), TMA, FP8 and wide
         * (elsewhere) */
        const gptoss_cuda_caps *caps = gptoss_cuda_caps_current();
        gptoss_cuda_moe_set_pair_kernel(0);
        test_moe(1, 64, 64, 4, 4, 0, 5); /* prepares the MoE kernels, which decides the default */
        char nm[96];
        snprintf(nm, sizeof nm, "moe pair kernel by default on sm_%d: %s", (int)caps->sm,
                 gptoss_cuda_moe_pair_kernel() == 4 ? "dense" : "wide");
        check_true(nm, gptoss_cuda_moe_pair_kernel() == (caps->tma ? 4 : 1));
        for (int kernel : {4, 3, 2, 1}) {
            gptoss_cuda_moe_set_pair_kernel(kernel);
            if (gptoss_cuda_moe_pair_kernel() != kernel)
                continue; /* not on this GPU (FP8: sm_90a; TMA: sm_90+) */
            test_moe(1, 2880, 2880, 128, 4, 0,
                     5); /* 90 groups: TMA 6 K slices of 4,4,4,4,4,3 windows; wide 4 of 6,6,6,5 */
            test_moe(2, 2880, 2880, 32, 4, 1, 5); /* 8 pairs, expert 0 in both tokens */
            test_moe(3, 160, 96, 8, 2, 2,
                     5); /* 3 groups: one window, the other slices stay empty */
            test_moe(1, 256, 192, 16, 4, 0, 5, true); /* scales 110..140: exact in fp32 */
            test_moe(1, 4096, 4096, 8, 4, 0, 5); /* widest rows: 43 KB of shared memory per block */
            test_moe(2, 64, 64, 4, 4, 2, 5);     /* 2 groups: half a window */
            test_moe(1, 1056, 800, 16, 4, 1, 5); /* 33 and 25 groups: partial last windows */
            test_moe(1, 2880, 2880, 32, 8, 0, 5); /* top-8: 8 pairs, the most path 5 takes */
            /* several tokens (the default up to 7/8 as many pairs as experts) */
            test_moe(28, 2880, 2880, 128, 4, 0, 5); /* 112 pairs: 120b's largest default step */
            test_moe(16, 2880, 2880, 128, 4, 1, 5); /* expert 0 in every token */
            test_moe(6, 2880, 2880, 32, 4, 2, 5);   /* 24 pairs on 5 experts */
            test_moe(5, 256, 192, 16, 4, 0, 5);     /* 20 pairs */
            test_moe(65, 256, 192, 16, 4, 0, 5);    /* 260 pairs: forced path 5 falls back */
        }
        gptoss_cuda_moe_set_pair_kernel(0);
    }

    if (want("wgmma")) {
        /* path 6 (wgmma): 128-row route tiles multiplied 32, 64, 96 or 128 columns wide (the
         * tile's rows rounded up to 32; loads from 1 to 1000 rows per expert), a partial last
         * stage (H = 256: 4 atoms in stages of 3), a partial row block (256 down rows in blocks
         * of 192), skewed and sparse loads, one expert with every token, experts with none;
         * widths that are not multiples of 64 (160) and wide scales fall back */
        for (int T : {1, 16, 100, 1000})
            test_moe(T, 2880, 2880, 32, 4, T % 3, 6);
        for (int T : {33, 500, 2048})
            test_moe(T, 2880, 2880, 128, 4, T % 2, 6);
        for (int T : {1, 7, 64, 65, 100, 333, 1000, 4096})
            test_moe(T, 256, 192, 16, 4, T % 3, 6);
        test_moe(4096, 64, 64, 4, 4, 1, 6);
        test_moe(200, 4096, 4096, 8, 4, 0, 6); /* widest rows: the largest shared-memory request */
        test_moe(500, 160, 96, 8, 2, 2, 6);    /* not multiples of 64: path 4 runs */
        test_moe(300, 256, 192, 16, 4, 0, 6, true);
        test_moe(1000, 2880, 2880, 32, 4, 0, 0); /* the default choice for a prefill step */
    }

    return report_results("gpu_test_moe", "moe");
}
