/*
 * gpu_test_kernels.cu - the CUDA backend's norm, router, dense GEMV/GEMM (bf16 and FP8) and
 * logits-summary kernels against a plain host reference.
 *
 * Needs a GPU, so it is not a ctest test: scripts/gpu-check builds and runs it on the GPU
 * machine. Inputs are random and never zero; outputs are poisoned (NaN bytes) before each
 * launch so an unwritten element fails. References are written here from the spec (section
 * 2), in double precision, independent of the backend's code. Tolerances follow from the
 * storage precision of each output and are stated next to each check. Prints one line per
 * case and a summary table last; exits 1 on any failure.
 *
 *   gpu_test_kernels [SECTION,...]   sections: norm router gemv fp8 summary (default: all; a
 * subset re-checks one kernel family in less time). The kernels around the KV cache (RoPE,
 * paged attention, FP8 KV) have a program of their own, gpu_test_kv.cu, and so do the MoE
 * experts', gpu_test_moe.cu.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/dense_lowp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#include "gpu_test_util.h"

/* ---- residual + RMSNorm ----------------------------------------------------------------- */

static void test_rmsnorm(int T, int H, int mode) {
    const int K = 4;
    std::vector<float> x(T * H), add(T * H), bias(H), y((size_t)T * K * H), w(T * K), gain(H);
    for (auto &v : x)
        v = rnd_nz(2.0f);
    for (auto &v : add)
        v = rnd_nz(1.0f);
    for (auto &v : bias)
        v = rnd_nz(0.1f);
    for (auto &v : y)
        v = rnd_nz(1.0f);
    for (auto &v : w)
        v = rnd_nz(1.0f);
    for (auto &v : gain)
        v = 1.0f + rnd_nz(0.1f);
    /* mode 0: plain, 1: + add + bias, 2: + weighted expert rows, 3: mode 2 through a row map */
    int n_rows = mode == 3 ? (T + 1) / 2 : T;
    std::vector<int32_t> map(n_rows);
    for (int i = 0; i < n_rows; i++)
        map[i] = (mode == 3) ? (T - 1 - 2 * i) : i;
    float *dx = dev_upload(x), *dadd = dev_upload(add), *dbias = dev_upload(bias),
          *dy = dev_upload(y), *dw = dev_upload(w), *dg = dev_upload(gain);
    int32_t *dmap = dev_upload(map);
    bf16 *dout = dev_poisoned<bf16>((size_t)n_rows * H);
    float *dout32 = dev_poisoned<float>((size_t)n_rows * H);
    gptoss_cuda_residual_rmsnorm(dx, mode == 1 ? dadd : NULL, mode == 1 ? dbias : NULL,
                                 mode >= 2 ? dy : NULL, mode >= 2 ? dw : NULL, K, dg, 1e-5f,
                                 mode == 3 ? dmap : NULL, n_rows, H, dout, dout32, 0);
    std::vector<bf16> out = dev_download(dout, (size_t)n_rows * H);
    std::vector<float> out32 = dev_download(dout32, (size_t)n_rows * H);
    std::vector<double> got32;
    std::vector<float> xo = dev_download(dx, (size_t)T * H);
    std::vector<double> got, ref, gotx, refx;
    for (int i = 0; i < n_rows; i++) {
        int r = map[i];
        std::vector<double> v(H);
        double ss = 0;
        for (int j = 0; j < H; j++) {
            double a = x[(size_t)r * H + j];
            if (mode == 1) a += add[(size_t)r * H + j] + bias[j];
            if (mode >= 2)
                for (int k = 0; k < K; k++)
                    a += (double)w[r * K + k] * y[((size_t)r * K + k) * H + j];
            v[j] = a;
            ss += a * a;
            gotx.push_back(xo[(size_t)r * H + j]);
            refx.push_back(a);
        }
        double inv = 1.0 / sqrt(ss / H + 1e-5);
        for (int j = 0; j < H; j++) {
            ref.push_back(gain[j] * v[j] * inv);
            uint16_t hb;
            memcpy(&hb, &out[(size_t)i * H + j], 2);
            got.push_back(bf2f(hb));
            got32.push_back(out32[(size_t)i * H + j]);
        }
    }
    char name[96];
    snprintf(name, sizeof name, "rmsnorm mode=%d T=%d H=%d: normalized (f32)", mode, T, H);
    check(name, got32, ref, 1e-6);
    snprintf(name, sizeof name, "rmsnorm mode=%d T=%d H=%d: normalized (bf16)", mode, T, H);
    check(name, got, ref, 4e-3); /* bf16 output: 2^-9 relative rounding */
    if (mode >= 1) {
        snprintf(name, sizeof name, "rmsnorm mode=%d T=%d H=%d: residual (f32)", mode, T, H);
        check(name, gotx, refx, 1e-6);
    }
    cudaFree(dx), cudaFree(dadd), cudaFree(dbias), cudaFree(dy), cudaFree(dw), cudaFree(dg),
        cudaFree(dmap), cudaFree(dout), cudaFree(dout32);
}

/* ---- router top-k ---------------------------------------------------------------------- */

/* Router reference for one token: top-k of logits (+ bias) by value, ties to the lower index,
 * softmax over the k. Appends reference and kernel weights; returns wrong expert indices. */
static int ref_topk(const float *logits, const float *bias, int E, int K, const int32_t *idx,
                    const float *wts, std::vector<double> &ref, std::vector<double> &got) {
    std::vector<std::pair<double, int>> v(E);
    for (int e = 0; e < E; e++)
        v[e] = {-((double)logits[e] + (bias ? bias[e] : 0.0)), e};
    std::sort(v.begin(), v.end());
    double mx = -v[0].first, z = 0;
    int mismatched = 0;
    for (int k = 0; k < K; k++)
        z += exp(-v[k].first - mx);
    for (int k = 0; k < K; k++) {
        if (idx[k] != v[k].second) mismatched++;
        ref.push_back(exp(-v[k].first - mx) / z);
        got.push_back(wts[k]);
    }
    return mismatched;
}

static void test_router(int T, int E, int K) {
    std::vector<float> logits((size_t)T * E), bias(E);
    for (auto &v : logits)
        v = rnd_nz(2.0f);
    for (auto &v : bias)
        v = rnd_nz(0.5f);
    float *dl = dev_upload(logits), *db = dev_upload(bias);
    int32_t *di = dev_poisoned<int32_t>((size_t)T * K);
    float *dw = dev_poisoned<float>((size_t)T * K);
    gptoss_cuda_router_topk(dl, db, T, E, K, di, dw, 0);
    std::vector<int32_t> idx = dev_download(di, (size_t)T * K);
    std::vector<float> wts = dev_download(dw, (size_t)T * K);
    std::vector<double> got, ref;
    int mismatched = 0;
    for (int t = 0; t < T; t++) {
        mismatched += ref_topk(&logits[(size_t)t * E], bias.data(), E, K, &idx[(size_t)t * K],
                               &wts[(size_t)t * K], ref, got);
    }
    char name[96];
    snprintf(name, sizeof name, "router top-%d T=%d E=%d: %d index mismatches", K, T, E,
             mismatched);
    if (mismatched) got[0] = NAN; /* any wrong expert fails the case */
    check(name, got, ref, 1e-5);
    cudaFree(dl), cudaFree(db), cudaFree(di), cudaFree(dw);
}

static void test_router_logits(int T, int E, int H) {
    std::vector<float> t((size_t)T * H), bias(E);
    std::vector<uint16_t> w((size_t)E * H);
    for (auto &v : t)
        v = rnd_nz(1.0f);
    for (auto &v : bias)
        v = rnd_nz(0.1f);
    for (auto &v : w)
        v = f2bf(rnd_nz(0.05f));
    float *dt = dev_upload(t), *db = dev_upload(bias);
    bf16 *dw;
    CK(cudaMalloc(&dw, w.size() * 2));
    CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    float *dl = dev_poisoned<float>((size_t)T * E);
    CK(gptoss_cuda_router_prepare(H));
    gptoss_cuda_router_logits(dt, dw, db, T, E, H, dl, 0);
    std::vector<float> l = dev_download(dl, (size_t)T * E);
    std::vector<double> got(l.begin(), l.end()), ref;
    for (int i = 0; i < T; i++)
        for (int e = 0; e < E; e++) {
            double a = bias[e];
            for (int j = 0; j < H; j++)
                a += (double)t[(size_t)i * H + j] * bf2f(w[(size_t)e * H + j]);
            ref.push_back(a);
        }
    char name[96];
    snprintf(name, sizeof name, "router logits f32 T=%d E=%d H=%d", T, E, H);
    check(name, got, ref, 1e-5); /* fp32 accumulation of exact products */
    cudaFree(dt), cudaFree(db), cudaFree(dw), cudaFree(dl);
}

/* ---- dense bf16 GEMV (decode projections) ------------------------------------------------- */

static void test_gemv(int M, int N, int K) {
    std::vector<uint16_t> w((size_t)N * K), x((size_t)M * K);
    for (auto &v : w)
        v = f2bf(rnd_nz(0.05f));
    for (auto &v : x)
        v = f2bf(rnd_nz(2.0f));
    bf16 *dw, *dx;
    CK(cudaMalloc(&dw, w.size() * 2));
    CK(cudaMalloc(&dx, x.size() * 2));
    CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    float *dy = dev_poisoned<float>((size_t)M * N);
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int rc = gptoss_cuda_gemv_bf16(dw, dx, dy, M, N, K, sms, 0);
    std::vector<float> y = dev_download(dy, (size_t)M * N);
    std::vector<double> got(y.begin(), y.end()), ref((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int n = 0; n < N; n++) {
            double a = 0;
            for (int k = 0; k < K; k++)
                a += (double)bf2f(x[(size_t)i * K + k]) * bf2f(w[(size_t)n * K + k]);
            ref[(size_t)i * N + n] = a;
        }
    char name[96];
    const bool tma = gptoss_cuda_gemv_kernel(M, N, K) == 2;
    snprintf(name, sizeof name, "gemv bf16 (%s) M=%d N=%d K=%d%s", tma ? "tma" : "ld", M, N, K,
             rc ? " (refused)" : "");
    if (rc) got[0] = NAN;        /* every shape here is one the GEMV must take */
    check(name, got, ref, 1e-5); /* fp32 accumulation of exact bf16 products */
    if (tma) {                   /* the bulk-copy kernel sums in the load kernel's order */
        float *dy1 = dev_poisoned<float>((size_t)M * N);
        gptoss_cuda_gemv_set_kernel(1);
        rc = gptoss_cuda_gemv_bf16(dw, dx, dy1, M, N, K, sms, 0);
        gptoss_cuda_gemv_set_kernel(2);
        std::vector<float> y1 = dev_download(dy1, (size_t)M * N);
        snprintf(name, sizeof name, "gemv bf16 M=%d N=%d K=%d: tma and ld bit-identical", M, N, K);
        check_true(name, rc == 0 && memcmp(y.data(), y1.data(), y.size() * sizeof(float)) == 0);
        cudaFree(dy1);
    }
    cudaFree(dw), cudaFree(dx), cudaFree(dy);
}

/* ---- FP8 (e4m3, per-row scale) dense matrices ------------------------------------------- */

/* e4m3 from its definition (1 sign, 4 exponent bits with bias 7, 3 mantissa bits, exponent
 * field 0 subnormal), written here independently of dense_lowp.cu: the value of a code, and
 * the code of a float rounded to the nearest finite value (ties to the even code, i.e. mantissa
 * bit 0 clear), saturated at +-448. The non-negative finite codes 0x00..0x7e increase with
 * their value, so a binary search finds the two neighbours. */
static double e4m3_value(int code) {
    int e = (code >> 3) & 15, mant = code & 7;
    double v = e ? ldexp(1.0 + mant / 8.0, e - 7) : ldexp(mant / 8.0, -6);
    return (code & 0x80) ? -v : v;
}
static int e4m3_encode(float v) {
    int sign = signbit(v) ? 0x80 : 0;
    double a = fabs((double)v);
    if (a >= 448.0) return sign | 0x7e;
    int lo = 0, hi = 126; /* largest code whose value is <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (e4m3_value(mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double below = a - e4m3_value(lo), above = e4m3_value(lo + 1) - a; /* exact in double */
    if (above < below || (above == below && (lo & 1))) lo++;
    return sign | lo;
}

/* The quantizer against the host rule (dense_lowp.h): scale = fp32(absmax / 448), code =
 * e4m3(fp32(w / scale)), both divisions IEEE fp32 on both sides, so scales must match bit for
 * bit and codes by value (+0 and -0 alike). Rows: random, each with its own magnitude
 * (2^-30 .. 2^20); pattern 1 also has a zero row, a row of exact ties and e4m3 subnormals
 * (absmax 448, so scale 1 and w / scale = w), and rows spanning 2^-24 of their absmax. */
static void test_quantize_e4m3(int N, int K, int pattern) {
    std::vector<uint16_t> w((size_t)N * K);
    for (int r = 0; r < N; r++) {
        float mag = ldexpf(1.0f, rnd_int(51) - 30);
        for (int j = 0; j < K; j++)
            w[(size_t)r * K + j] = f2bf(rnd_nz(mag));
    }
    if (pattern == 1 && N >= 4 && K >= 16) {
        for (int j = 0; j < K; j++)
            w[j] = f2bf(0.0f);
        /* row 1: 448, then ties (1.0625 between 1 and 1.125 -> 1; 1.1875 -> 1.25; 2^-10 between
         * 0 and 2^-9 -> 0; 3 * 2^-10 between 2^-9 and 2^-8 -> 2^-8; 2^-6 - 2^-10 between the
         * largest subnormal and 2^-6 -> 2^-6), a value past 448 cannot occur (it is the max) */
        const float special[] = {448.0f,
                                 1.0625f,
                                 -1.1875f,
                                 ldexpf(1, -10),
                                 -3 * ldexpf(1, -10),
                                 ldexpf(1, -6) - ldexpf(1, -10),
                                 ldexpf(1, -12),
                                 -ldexpf(1, -9),
                                 232.0f /* 224 | 240: -> 224 */,
                                 -240.0f,
                                 0.0f,
                                 -0.0f,
                                 17.0f /* -> 16 */,
                                 19.0f /* -> 20 */,
                                 3.0f,
                                 1.0f};
        for (int j = 0; j < K; j++)
            w[(size_t)K + j] = f2bf(j < 16 ? special[j] : rnd_nz(448.0f));
        for (int r = 2; r < 4; r++) /* wide range: the small ones land on e4m3 subnormals or 0 */
            for (int j = 0; j < K; j++)
                w[(size_t)r * K + j] = f2bf(ldexpf(rnd_nz(1.0f), -rnd_int(25)));
    }
    bf16 *dw;
    CK(cudaMalloc(&dw, w.size() * 2));
    CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    uint8_t *dq = dev_poisoned<uint8_t>((size_t)N * K);
    float *ds = dev_poisoned<float>(N);
    gptoss_cuda_quantize_e4m3_rows(dw, N, K, dq, ds, 0);
    std::vector<uint8_t> q = dev_download(dq, (size_t)N * K);
    std::vector<float> sc = dev_download(ds, N);
    long bad_codes = 0, bad_scales = 0, first_bad = -1;
    std::vector<double> deq((size_t)N * K), orig((size_t)N * K);
    for (int r = 0; r < N; r++) {
        float amax = 0.0f;
        for (int j = 0; j < K; j++)
            amax = fmaxf(amax, fabsf(bf2f(w[(size_t)r * K + j])));
        float scale = amax / 448.0f;
        uint32_t a, b;
        memcpy(&a, &scale, 4), memcpy(&b, &sc[r], 4);
        if (a != b) bad_scales++;
        for (int j = 0; j < K; j++) {
            size_t i = (size_t)r * K + j;
            int want = scale > 0.0f ? e4m3_encode(bf2f(w[i]) / scale) : 0;
            if (e4m3_value(want) != e4m3_value(q[i]) || (q[i] & 0x7f) == 0x7f) {
                if (bad_codes++ == 0) first_bad = (long)i;
            }
            deq[i] = e4m3_value(q[i]) * (double)sc[r];
            orig[i] = bf2f(w[i]);
        }
    }
    char name[160];
    snprintf(name, sizeof name,
             "quantize e4m3 N=%d K=%d pattern %d: %ld codes, %ld scales differ (first code %ld)", N,
             K, pattern, bad_codes, bad_scales, first_bad);
    check_true(name, bad_codes == 0 && bad_scales == 0);
    /* what the format costs: every weight within 2^-4 of itself (half a step of 3 mantissa
     * bits) where it is in e4m3's normal range, which holds the bulk of each row's norm */
    snprintf(name, sizeof name, "quantize e4m3 N=%d K=%d pattern %d: dequantized vs bf16 weights",
             N, K, pattern);
    check(name, deq, orig, 0.0625);
    cudaFree(dw), cudaFree(dq), cudaFree(ds);
}

/* Random e4m3 codes (every finite code, both signs, subnormals; never the NaN codes), random
 * row scales, bf16 inputs. */
static void make_e4m3_case(int N, int K, int M, std::vector<uint8_t> &codes,
                           std::vector<float> &scale, std::vector<uint16_t> &x) {
    codes.resize((size_t)N * K);
    for (auto &c : codes) {
        c = (uint8_t)(rnd_u64() >> 24);
        if ((c & 0x7f) == 0x7f) c ^= 1;
    }
    scale.resize(N);
    for (auto &v : scale)
        v = ldexpf(1.0f + (float)rnd_unit(), -4 - rnd_int(12));
    x.resize((size_t)M * K);
    for (auto &v : x)
        v = f2bf(rnd_nz(2.0f));
}

/* y[m, n] = scale[n] * sum_k x[m, k] * value(codes[n, k]), in double. */
static std::vector<double> ref_e4m3_product(const std::vector<uint8_t> &codes,
                                            const std::vector<float> &scale,
                                            const std::vector<uint16_t> &x, int M, int N, int K) {
    double table[256];
    for (int c = 0; c < 256; c++)
        table[c] = e4m3_value(c);
    std::vector<double> xd((size_t)M * K), ref((size_t)M * N);
    for (size_t i = 0; i < xd.size(); i++)
        xd[i] = bf2f(x[i]);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint8_t *row = &codes[(size_t)n * K];
        for (int i = 0; i < M; i++) {
            double a = 0;
            for (int k = 0; k < K; k++)
                a += xd[(size_t)i * K + k] * table[row[k]];
            ref[(size_t)i * N + n] = a * scale[n];
        }
    }
    return ref;
}

/* The decode GEMV for each M of ms on one random matrix (M <= 4; a shape the GEMV must refuse
 * is marked by want_refused and must enqueue nothing). */
static void test_gemv_e4m3(int N, int K, std::vector<int> ms, bool want_refused = false) {
    int max_m = *std::max_element(ms.begin(), ms.end());
    std::vector<uint8_t> codes;
    std::vector<float> scale;
    std::vector<uint16_t> x;
    make_e4m3_case(N, K, max_m, codes, scale, x);
    uint8_t *dq = dev_upload(codes);
    float *ds = dev_upload(scale);
    bf16 *dx;
    CK(cudaMalloc(&dx, x.size() * 2));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    std::vector<double> full =
        want_refused ? std::vector<double>() : ref_e4m3_product(codes, scale, x, max_m, N, K);
    for (int M : ms) {
        float *dy = dev_poisoned<float>((size_t)M * N);
        int rc = gptoss_cuda_gemv_e4m3(dq, ds, dx, dy, M, N, K, sms, 0);
        std::vector<float> y = dev_download(dy, (size_t)M * N);
        char name[128];
        if (want_refused) {
            bool untouched = true; /* still the poison: nothing was enqueued */
            for (float v : y)
                untouched = untouched && isnan(v);
            snprintf(name, sizeof name,
                     "gemv e4m3 M=%d N=%d K=%d: refused (rc %d), output untouched", M, N, K, rc);
            check_true(name, rc != 0 && untouched);
        } else {
            std::vector<double> got(y.begin(), y.end()),
                ref(full.begin(), full.begin() + (size_t)M * N);
            snprintf(name, sizeof name, "gemv e4m3 M=%d N=%d K=%d%s", M, N, K,
                     rc ? " (refused)" : "");
            if (rc) got[0] = NAN; /* every shape here is one the GEMV must take */
            check(name, got, ref,
                  1e-5); /* exact products (bf16 x e4m3 fit fp32), fp32 sums, one scale */
        }
        cudaFree(dy);
    }
    cudaFree(dq), cudaFree(ds), cudaFree(dx);
}

/* The prefill path: blocks of block_rows rows decoded to bf16 in scratch, cuBLAS, columns
 * scaled. block_rows < N makes several blocks (the last one partial). */
static void test_gemm_e4m3(cublasHandle_t cublas, int M, int N, int K, int block_rows) {
    std::vector<uint8_t> codes;
    std::vector<float> scale;
    std::vector<uint16_t> x;
    make_e4m3_case(N, K, M, codes, scale, x);
    uint8_t *dq = dev_upload(codes);
    float *ds = dev_upload(scale);
    bf16 *dx, *scratch;
    CK(cudaMalloc(&dx, x.size() * 2));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    size_t scratch_elems = (size_t)block_rows * K + K / 2; /* not a whole number of rows */
    CK(cudaMalloc(&scratch, scratch_elems * 2));
    float *dy = dev_poisoned<float>((size_t)M * N);
    cublasStatus_t st =
        gptoss_cuda_gemm_e4m3(cublas, dq, ds, dx, dy, M, N, K, scratch, scratch_elems, 0);
    std::vector<float> y = dev_download(dy, (size_t)M * N);
    std::vector<double> got(y.begin(), y.end()), ref = ref_e4m3_product(codes, scale, x, M, N, K);
    char name[128];
    snprintf(name, sizeof name, "gemm e4m3 (bf16 blocks of %d rows + cuBLAS) M=%d N=%d K=%d%s",
             block_rows, M, N, K, st != CUBLAS_STATUS_SUCCESS ? " (failed)" : "");
    if (st != CUBLAS_STATUS_SUCCESS) got[0] = NAN;
    /* exact products (e4m3 values are bf16 values), fp32 accumulation in cuBLAS's order on the
     * tensor cores, one scale */
    check(name, got, ref, 1e-4);
    /* rows of 8 weights (not a multiple of 16) are refused before anything is enqueued */
    st = gptoss_cuda_gemm_e4m3(cublas, dq, ds, dx, dy, M, 1, 8, scratch, scratch_elems, 0);
    snprintf(name, sizeof name, "gemm e4m3 K=8: refused (status %d)", (int)st);
    check_true(name, st == CUBLAS_STATUS_INVALID_VALUE);
    cudaFree(dq), cudaFree(ds), cudaFree(dx), cudaFree(scratch), cudaFree(dy);
}

/* How close the decode GEMVs come to streaming their weights at the copy bandwidth, on the
 * 20b shapes, one token (printed, not checked: a number for bench/RESULTS.md). */
static void time_dense_gemv(int N, int K) {
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    uint8_t *dq;
    bf16 *dw, *dx;
    float *ds, *dy;
    CK(cudaMalloc(&dq, (size_t)N * K));
    CK(cudaMalloc(&dw, (size_t)N * K * 2));
    CK(cudaMalloc(&ds, (size_t)N * 4));
    CK(cudaMalloc(&dx, (size_t)K * 2));
    CK(cudaMalloc(&dy, (size_t)N * 4));
    CK(cudaMemset(dq, 0x38, (size_t)N * K)); /* 1.0 */
    CK(cudaMemset(dw, 0, (size_t)N * K * 2));
    CK(cudaMemset(ds, 0, (size_t)N * 4));
    CK(cudaMemset(dx, 0, (size_t)K * 2));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[2] = {0, 0};
    const int reps = 50;
    for (int kind = 0; kind < 2; kind++) {
        for (int r = -5; r < reps; r++) {
            if (r == 0) CK(cudaEventRecord(e0));
            if (kind == 0)
                gptoss_cuda_gemv_e4m3(dq, ds, dx, dy, 1, N, K, sms, 0);
            else
                gptoss_cuda_gemv_bf16(dw, dx, dy, 1, N, K, sms, 0);
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms[kind], e0, e1));
    }
    CK(cudaGetLastError());
    double us8 = 1e3 * ms[0] / reps, us16 = 1e3 * ms[1] / reps;
    printf("timing: decode GEMV N=%d K=%d M=1: e4m3 %.1f us (%.0f GB/s of weights), bf16 %.1f us "
           "(%.0f GB/s)\n",
           N, K, us8, (double)N * (K + 4) / (us8 * 1e3), us16, (double)N * K * 2 / (us16 * 1e3));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(dq), cudaFree(dw), cudaFree(ds), cudaFree(dx), cudaFree(dy);
}

/* Fused router (logits + top-k by the last block): logits against a double reference, the
 * selection against a host top-k of the logits the kernel wrote (so near-ties between fp32
 * and double cannot fail it). Runs twice on one counter: the second launch must re-arm. */
static void test_router_fused(int T, int E, int H, int K) {
    unsigned *counter;
    CK(cudaMalloc(&counter, sizeof(unsigned)));
    CK(cudaMemset(counter, 0, sizeof(unsigned)));
    CK(gptoss_cuda_router_prepare(H));
    for (int rep = 0; rep < 2; rep++) {
        std::vector<float> t((size_t)T * H), bias(E);
        std::vector<uint16_t> w((size_t)E * H);
        for (auto &v : t)
            v = rnd_nz(1.0f);
        for (auto &v : bias)
            v = rnd_nz(0.1f);
        for (auto &v : w)
            v = f2bf(rnd_nz(0.05f));
        float *dt = dev_upload(t), *db = dev_upload(bias);
        bf16 *dw;
        CK(cudaMalloc(&dw, w.size() * 2));
        CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
        float *dl = dev_poisoned<float>((size_t)T * E), *dwt = dev_poisoned<float>((size_t)T * K);
        int32_t *di = dev_poisoned<int32_t>((size_t)T * K);
        gptoss_cuda_router(dt, dw, db, T, E, H, K, dl, counter, di, dwt, 0);
        std::vector<float> l = dev_download(dl, (size_t)T * E),
                           wts = dev_download(dwt, (size_t)T * K);
        std::vector<int32_t> idx = dev_download(di, (size_t)T * K);
        std::vector<unsigned> cnt = dev_download(counter, 1);
        std::vector<double> got, ref;
        int mismatched = 0;
        for (int i = 0; i < T; i++) {
            for (int e = 0; e < E; e++) {
                double a = bias[e];
                for (int j = 0; j < H; j++)
                    a += (double)t[(size_t)i * H + j] * bf2f(w[(size_t)e * H + j]);
                ref.push_back(a);
                got.push_back(l[(size_t)i * E + e]);
            }
            mismatched += ref_topk(&l[(size_t)i * E], nullptr, E, K, &idx[(size_t)i * K],
                                   &wts[(size_t)i * K], ref, got);
        }
        char name[96];
        snprintf(name, sizeof name,
                 "router fused T=%d E=%d H=%d top-%d run %d: %d mismatches, counter %u", T, E, H, K,
                 rep, mismatched, cnt[0]);
        if (mismatched || cnt[0] != 0) got[0] = NAN;
        check(name, got, ref, 1e-5);
        cudaFree(dt), cudaFree(db), cudaFree(dw), cudaFree(dl), cudaFree(dwt), cudaFree(di);
    }
    cudaFree(counter);
}

/* One decode token's residual + RMSNorm + router in one kernel: the new residual row and the
 * bf16 normalized row against double references, the logits against a double reference
 * computed from the exact normalized row, the selection against a host top-k of the logits
 * the kernel wrote. Twice on one counter (the second launch must re-arm). Shapes it does not
 * take must be refused without writing anything. */
static void test_norm_router(int E, int H, int K) {
    unsigned *counter;
    CK(cudaMalloc(&counter, sizeof(unsigned)));
    CK(cudaMemset(counter, 0, sizeof(unsigned)));
    for (int rep = 0; rep < 2; rep++) {
        std::vector<float> x(H), add(H), abias(H), gain(H), rbias(E);
        std::vector<uint16_t> w((size_t)E * H);
        for (auto &v : x)
            v = rnd_nz(2.0f);
        for (auto &v : add)
            v = rnd_nz(1.0f);
        for (auto &v : abias)
            v = rnd_nz(0.1f);
        for (auto &v : gain)
            v = 1.0f + rnd_nz(0.1f);
        for (auto &v : rbias)
            v = rnd_nz(0.1f);
        for (auto &v : w)
            v = f2bf(rnd_nz(0.05f));
        float *dx = dev_upload(x), *dadd = dev_upload(add), *dab = dev_upload(abias),
              *dg = dev_upload(gain), *drb = dev_upload(rbias);
        bf16 *dw;
        CK(cudaMalloc(&dw, w.size() * 2));
        CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
        bf16 *dout = dev_poisoned<bf16>(H);
        float *dl = dev_poisoned<float>(E), *dwt = dev_poisoned<float>(K);
        int32_t *di = dev_poisoned<int32_t>(K);
        int rc = gptoss_cuda_norm_router_one(dx, dadd, dab, dg, 1e-5f, H, dout, dw, drb, E, K, dl,
                                             counter, di, dwt, 0);
        CK(cudaGetLastError());
        std::vector<float> xo = dev_download(dx, H), l = dev_download(dl, E),
                           wts = dev_download(dwt, K);
        std::vector<bf16> out = dev_download(dout, H);
        std::vector<int32_t> idx = dev_download(di, K);
        std::vector<unsigned> cnt = dev_download(counter, 1);
        std::vector<double> v(H), gx(xo.begin(), xo.end()), gn, rn, gl(l.begin(), l.end()), rl, gw,
            rw;
        double ss = 0;
        for (int j = 0; j < H; j++) {
            v[j] = (double)x[j] + add[j] + abias[j];
            ss += v[j] * v[j];
        }
        double inv = 1.0 / sqrt(ss / H + 1e-5);
        for (int j = 0; j < H; j++) {
            uint16_t hb;
            memcpy(&hb, &out[j], 2);
            gn.push_back(bf2f(hb));
            rn.push_back(gain[j] * v[j] * inv);
        }
        for (int e = 0; e < E; e++) {
            double a = rbias[e];
            for (int j = 0; j < H; j++)
                a += rn[j] * bf2f(w[(size_t)e * H + j]);
            rl.push_back(a);
        }
        int mismatched = ref_topk(l.data(), nullptr, E, K, idx.data(), wts.data(), rw, gw);
        char name[128];
        snprintf(name, sizeof name, "norm+router E=%d H=%d top-%d run %d: residual", E, H, K, rep);
        if (rc) gx[0] = NAN; /* a shape it takes must not be refused */
        check(name, gx, v, 1e-6);
        snprintf(name, sizeof name, "norm+router E=%d H=%d top-%d run %d: normalized (bf16)", E, H,
                 K, rep);
        check(name, gn, rn, 4e-3);
        snprintf(name, sizeof name, "norm+router E=%d H=%d top-%d run %d: logits", E, H, K, rep);
        check(name, gl, rl, 1e-5);
        snprintf(name, sizeof name,
                 "norm+router E=%d H=%d top-%d run %d: %d mismatches, counter %u", E, H, K, rep,
                 mismatched, cnt[0]);
        if (mismatched || cnt[0] != 0) gw[0] = NAN;
        check(name, gw, rw, 1e-5);
        cudaFree(dx), cudaFree(dadd), cudaFree(dab), cudaFree(dg), cudaFree(drb), cudaFree(dw),
            cudaFree(dout);
        cudaFree(dl), cudaFree(dwt), cudaFree(di);
    }
    cudaFree(counter);
}

/* Shapes the fused kernel must refuse, leaving every output untouched. */
static void test_norm_router_refused(int E, int H, int K, bool no_bias) {
    float *dx = dev_poisoned<float>(H + 8), *dl = dev_poisoned<float>(E),
          *dwt = dev_poisoned<float>(K);
    bf16 *dout = dev_poisoned<bf16>(H + 8), *dw = dev_poisoned<bf16>((size_t)E * (H + 8));
    int32_t *di = dev_poisoned<int32_t>(K);
    unsigned *counter;
    CK(cudaMalloc(&counter, sizeof(unsigned)));
    CK(cudaMemset(counter, 0, sizeof(unsigned)));
    std::vector<float> before = dev_download(dx, H);
    int rc = gptoss_cuda_norm_router_one(dx, dx, no_bias ? nullptr : dx, dx, 1e-5f, H, dout, dw, dl,
                                         E, K, dl, counter, di, dwt, 0);
    CK(cudaDeviceSynchronize());
    std::vector<float> after = dev_download(dx, H);
    char name[128];
    snprintf(name, sizeof name, "norm+router E=%d H=%d top-%d%s refused, nothing written", E, H, K,
             no_bias ? " (no bias)" : "");
    check_true(name,
               rc != 0 && memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0);
    cudaFree(dx), cudaFree(dl), cudaFree(dwt), cudaFree(dout), cudaFree(dw), cudaFree(di),
        cudaFree(counter);
}

/* ---- logits summary (top-n, log-sum-exp) ------------------------------------------------ */

/* Prints the time of one summary call (median of 101, random logits; not a check). */
static void time_logits_summary(int rows, int V, int n_top) {
    std::vector<float> x((size_t)rows * V);
    for (auto &v : x)
        v = rnd_nz(8.0f);
    float *d_x, *d_out;
    void *d_scratch;
    CK(cudaMalloc(&d_x, x.size() * 4));
    CK(cudaMalloc(&d_out, (size_t)rows * (2 * n_top + 1) * 4));
    CK(cudaMalloc(&d_scratch, gptoss_cuda_logits_summary_scratch(rows, V)));
    CK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int rep = 0; rep < 102; rep++) {
        CK(cudaEventRecord(e0, 0));
        gptoss_cuda_logits_summary(d_x, rows, V, n_top, d_scratch, (int32_t *)d_out,
                                   d_out + (size_t)rows * n_top, d_out + (size_t)rows * 2 * n_top,
                                   0);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (rep > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    printf("logits summary %dx%d top %d: %.1f us per call (median of %zu)\n", rows, V, n_top,
           ms[ms.size() / 2] * 1e3, ms.size());
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(d_x), cudaFree(d_out), cudaFree(d_scratch);
}

/* rows of random logits; mode 1 coarse (ties across the cut), 2 sprinkled NaN / -inf / +-0,
 * 3 all equal, 4 sorted in decreasing order and 5 increasing (the largest crowd into a few
 * groups of 512: the candidates overflow and the select kernel scans the whole row), 6 the
 * 300 largest in one run of 300 ids. Ids and values must match a host stable sort exactly;
 * lse within 1e-5. */
static void test_logits_summary(int rows, int V, int n_top, int mode) {
    std::vector<float> x((size_t)rows * V);
    for (size_t i = 0; i < x.size(); i++) {
        float &v = x[i];
        const int j = (int)(i % (size_t)V);
        v = rnd_nz(8.0f);
        if (mode == 1) v = roundf(v * 2.0f) / 2.0f;
        if (mode == 3) v = 1.25f;
        if (mode == 4) v = 10.0f - 20.0f * (float)j / (float)V;
        if (mode == 5) v = -10.0f + 20.0f * (float)j / (float)V;
        if (mode == 6 && j >= V / 3 && j < V / 3 + 300) v += 20.0f;
    }
    if (mode == 2)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < 40; j++) {
                float special[4] = {NAN, -INFINITY, -0.0f, 0.0f};
                x[(size_t)r * V + rnd_int(V)] = special[j % 4];
            }
    float *d_x, *d_vals, *d_lse;
    int32_t *d_ids;
    CK(cudaMalloc(&d_x, x.size() * 4));
    CK(cudaMalloc(&d_ids, (size_t)rows * n_top * 4));
    CK(cudaMalloc(&d_vals, (size_t)rows * n_top * 4));
    CK(cudaMalloc(&d_lse, (size_t)rows * 4));
    CK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(d_ids, 0xff, (size_t)rows * n_top * 4));
    CK(cudaMemset(d_vals, 0xff, (size_t)rows * n_top * 4));
    CK(cudaMemset(d_lse, 0xff, (size_t)rows * 4));
    void *d_scratch;
    size_t scratch_bytes = gptoss_cuda_logits_summary_scratch(rows, V);
    CK(cudaMalloc(&d_scratch, scratch_bytes));
    CK(cudaMemset(d_scratch, 0xff, scratch_bytes)); /* garbage: no initial contents needed */
    for (int rep = 0; rep < 2; rep++) /* twice: a second run over the first one's scratch */
        if (gptoss_cuda_logits_summary(d_x, rows, V, n_top, d_scratch, d_ids, d_vals, d_lse, 0) !=
            0) {
            printf("logits summary: launcher refused %dx%d top %d\n", rows, V, n_top);
            exit(1);
        }
    CK(cudaGetLastError());
    CK(cudaFree(d_scratch));
    std::vector<int32_t> ids((size_t)rows * n_top);
    std::vector<float> vals((size_t)rows * n_top), lse(rows);
    CK(cudaMemcpy(ids.data(), d_ids, ids.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vals.data(), d_vals, vals.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost));
    int mismatches = 0;
    std::vector<double> out_lse, ref_lse;
    for (int r = 0; r < rows; r++) {
        const float *row = x.data() + (size_t)r * V;
        std::vector<int> order(V);
        for (int i = 0; i < V; i++)
            order[i] = i;
        auto val = [&](int i) { return isnan(row[i]) ? -INFINITY : (double)row[i]; };
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return val(a) > val(b); });
        for (int j = 0; j < n_top; j++) {
            int32_t gi = ids[(size_t)r * n_top + j];
            if (gi != order[j] || (double)vals[(size_t)r * n_top + j] != val(order[j]))
                mismatches++;
        }
        double m = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++)
            if (!isnan(row[i])) m = fmax(m, (double)row[i]);
        for (int i = 0; i < V; i++)
            if (!isnan(row[i])) sum += exp((double)row[i] - m);
        ref_lse.push_back(m + log(sum));
        out_lse.push_back(lse[r]);
    }
    char name[96];
    snprintf(name, sizeof name, "logits summary %dx%d top %d mode %d (%d wrong ids)", rows, V,
             n_top, mode, mismatches);
    std::vector<double> out_m = out_lse, ref_m = ref_lse;
    if (mismatches) out_m[0] = NAN; /* any wrong id or value fails the case */
    check(name, out_m, ref_m, 1e-5);
    cudaFree(d_x);
    cudaFree(d_ids);
    cudaFree(d_vals);
    cudaFree(d_lse);
}

static const char *const kSections[] = {"norm", "router", "gemv", "fp8", "summary"};

int main(int argc, char **argv) {
    int st = select_sections(argc, argv, "gpu_test_kernels", kSections,
                             (int)(sizeof kSections / sizeof kSections[0]));
    if (st) return st;
    open_device();

    if (want("norm")) {
        for (int mode = 0; mode < 4; mode++) {
            test_rmsnorm(1, 2880, mode);
            test_rmsnorm(37, 2880, mode);
            test_rmsnorm(300, 64, mode);
        }
    }

    if (want("router")) {
        test_router_logits(1, 32, 2880);
        test_router_logits(7, 128, 2880);
        test_router_logits(301, 16, 512);
        test_router(1, 32, 4);
        test_router(300, 128, 4);
        test_router(77, 8, 2);
        /* every register width of the selection (1, 2, 4, 8, 32 logits per lane), rows that
         * end inside a lane's range, and k up to 32 */
        test_router(5, 64, 4);
        test_router(9, 200, 8);
        test_router(3, 256, 32);
        test_router(4, 1000, 4);
        test_router(2, 1024, 32);
        test_router(6, 40, 32);
        test_router_fused(1, 32, 2880, 4);
        test_router_fused(1, 128, 2880, 4);
        test_router_fused(1, 6, 160, 2); /* one token: a block with a warp past the last expert */
        test_router_fused(1, 128, 4096, 4); /* one token, widest row: 16 chunks per lane */
        test_router_fused(7, 128, 2880, 4);
        test_router_fused(301, 16, 512, 2);
        test_norm_router(32, 2880, 4);
        test_norm_router(128, 2880, 4);
        test_norm_router(6, 160,
                         2); /* a block with warps past the last expert, threads past the row */
        test_norm_router(128, 4096,
                         4);        /* the widest row: 4 float4 per thread, 16 chunks per lane */
        test_norm_router(8, 64, 8); /* k = E */
        test_norm_router_refused(32, 4104, 4, false); /* over 4096 */
        test_norm_router_refused(32, 100, 4, false);  /* not a multiple of 8 */
        test_norm_router_refused(32, 2880, 4, true);
        test_norm_router_refused(4, 64, 5, false); /* k > E */
    }

    if (want("gemv")) {
        /* both kernels: bulk copies (the default from compute capability 9.0) and loads */
        CK(gptoss_cuda_gemv_prepare());
        const gptoss_cuda_caps *caps = gptoss_cuda_caps_current();
        gptoss_cuda_gemv_set_kernel(0);
        /* by default the bulk-copy kernel where the capabilities have TMA (sm_90 and newer, not
         * under the ampere or ada profile) and one wave holds the grid: on an H100 or H200
         * (132 SMs) the 20b/120b O projection, not QKV */
        const bool sm90 = caps->tma;
        char nm[128];
        snprintf(nm, sizeof nm, "gemv kernel by default on sm_%d: O %s, QKV %s", (int)caps->sm,
                 gptoss_cuda_gemv_kernel(1, 2880, 4096) == 2 ? "tma" : "ld",
                 gptoss_cuda_gemv_kernel(1, 5120, 2880) == 2 ? "tma" : "ld");
        check_true(nm, gptoss_cuda_gemv_kernel(1, 2880, 4096) == (sm90 ? 2 : 1) &&
                           (caps->sm / 10 != 9 || gptoss_cuda_gemv_kernel(1, 5120, 2880) == 1));
        for (int kernel : {2, 1}) {
            gptoss_cuda_gemv_set_kernel(kernel);
            if (gptoss_cuda_gemv_kernel(1, 1, 8) != kernel)
                continue; /* no bulk-copy kernel on this GPU */
            for (int M = 1; M <= 4; M++)
                test_gemv(M, 5120, 2880);
            test_gemv(1, 2880, 4096);
            test_gemv(3, 2880, 4096);
            test_gemv(
                4, 4100,
                4096); /* widest rows, 4 tokens: 96 KB of shared memory; a partial last block */
            test_gemv(2, 37, 64);
            test_gemv(1, 1, 8);
        }
        gptoss_cuda_gemv_set_kernel(0);
    }

    if (want("fp8")) {
        /* FP8 dense layers: the quantizer on the 20b QKV and O shapes and odd ones; the GEMV on the
         * 20b QKV, O and lm_head shapes for 1..4 tokens and odd shapes; the prefill GEMM in one
         * block and in several */
        CK(gptoss_cuda_dense_lowp_prepare());
        test_quantize_e4m3(5120, 2880, 1);
        test_quantize_e4m3(2880, 4096, 0);
        test_quantize_e4m3(37, 48, 1);
        test_quantize_e4m3(5, 2888, 0); /* rows not a multiple of 16 (the quantizer takes any) */
        test_quantize_e4m3(1, 1, 0);
        test_gemv_e4m3(5120, 2880, {1, 2, 3, 4});
        test_gemv_e4m3(2880, 4096, {1, 2, 3, 4});
        test_gemv_e4m3(201088, 2880, {1, 2, 3, 4});
        test_gemv_e4m3(37, 64, {1, 2, 3});
        test_gemv_e4m3(5121, 2880, {3});
        test_gemv_e4m3(1, 16, {1, 4});
        test_gemv_e4m3(33, 4080, {2});
        test_gemv_e4m3(64, 2888, {1}, true); /* rows not a multiple of 16 */
        test_gemv_e4m3(64, 4112, {1}, true); /* rows wider than 4096 */
        {
            cublasHandle_t cublas;
            if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
                fprintf(stderr, "cublasCreate failed\n");
                return 2;
            }
            test_gemm_e4m3(cublas, 17, 5120, 2880, 5120);
            test_gemm_e4m3(cublas, 64, 2880, 4096, 1000);
            test_gemm_e4m3(cublas, 5, 201088, 2880, 5120);
            test_gemm_e4m3(cublas, 300, 37, 64, 7);
            test_gemm_e4m3(cublas, 33, 1, 16, 1);
            test_gemm_e4m3(cublas, 2000, 513, 2880, 256);
            cublasDestroy(cublas);
        }
        time_dense_gemv(5120, 2880);
        time_dense_gemv(2880, 4096);
        time_dense_gemv(201088, 2880);
    }

    if (want("summary")) {
        test_logits_summary(3, 201088, 64, 0);
        test_logits_summary(5, 201088, 64, 1);
        test_logits_summary(4, 201088, 20, 2);
        test_logits_summary(2, 201088, 64, 3);
        test_logits_summary(64, 1000, 64, 1);
        test_logits_summary(7, 64, 64, 2);
        test_logits_summary(9, 3000, 1, 0);
        test_logits_summary(3, 4096 * 3 + 17, 64, 2); /* a last chunk shorter than n_top */
        test_logits_summary(2, 100, 64, 0);           /* one chunk, fewer logits than a chunk */
        test_logits_summary(1, 1 << 20, 64, 1);       /* the largest vocabulary supported */
        test_logits_summary(2, 201088, 64, 4);
        test_logits_summary(2, 201088, 64, 5);
        test_logits_summary(3, 201088, 64, 6);
        test_logits_summary(2, 4096 * 2 + 300, 64,
                            4); /* fewer groups than n_top: every logit a candidate */
        time_logits_summary(1, 201088, 64);
        time_logits_summary(64, 201088, 64);
    }

    return report_results("gpu_test_kernels", "kernel");
}
