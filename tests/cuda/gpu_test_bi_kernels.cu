/*
 * gpu_test_bi_kernels.cu - the batch-invariant mode's kernels (kernels/batch_invariant.cu)
 * against host references, and each output row bitwise the same whatever the number of rows
 * launched with it.
 *
 * The GEMM (bf16 and e4m3 weights) on the real projection widths and on widths that end in a
 * partial k-step: all 300 rows in one launch against a double-precision host reference (fp32
 * accumulation of exact bf16 products: relative L2 under 1e-5), then the same rows again in
 * launches of 1, 2, 7, 63, 64, 65 and 130 rows starting at other offsets, every row equal bit
 * for bit to the 300-row launch. The router logits likewise. Exits 1 on failure.
 */
#include "backend/cuda/kernels/batch_invariant.h"
#include "backend/kv_fp8.h"
#include "gpu_test_util.h"

#define ROWS 300

static const int32_t row_counts[] = {1, 2, 7, 63, 64, 65, 130};

/* Rows [r0, r0 + m) of the full launch against a launch of just those rows. */
static bool rows_equal(const std::vector<float> &full, const std::vector<float> &part, int32_t r0,
                       int32_t m, int32_t n) {
    return memcmp(full.data() + (size_t)r0 * n, part.data(), (size_t)m * n * sizeof(float)) == 0;
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
    cudaFree(dx), cudaFree(dw), cudaFree(dc), cudaFree(ds), cudaFree(dy);
}

static void router_case(int32_t e, int32_t h) {
    std::vector<float> x((size_t)ROWS * h), w((size_t)e * h);
    for (auto &v : x)
        v = rnd_nz(1.0f);
    for (auto &v : w)
        v = rnd_nz(0.05f);
    float *dx = dev_upload(x), *dw = dev_upload(w), *dy = dev_poisoned<float>((size_t)ROWS * e);
    gptoss_cuda_bi_router_logits(dx, dw, ROWS, e, h, dy, 0);
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
    bool same = true;
    for (int32_t m : row_counts) {
        int32_t r0 = (int32_t)((m * 37) % (ROWS - m + 1));
        CK(cudaMemset(dy, 0xff, (size_t)ROWS * e * sizeof(float)));
        gptoss_cuda_bi_router_logits(dx + (size_t)r0 * h, dw, m, e, h, dy, 0);
        std::vector<float> part = dev_download(dy, (size_t)m * e);
        same = same && rows_equal(full, part, r0, m, e);
    }
    snprintf(name, sizeof name, "bi_router_logits E %d H %d, rows bitwise equal in launches",
             (int)e, (int)h);
    check_true(name, same);
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
}

int main(void) {
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
    router_case(32, 2880);
    router_case(128, 2880);
    router_case(8, 128);
    int failed = 0;
    for (const result &r : results)
        failed += !r.ok;
    printf("gpu_test_bi_kernels: %d of %d checks failed\n", failed, (int)results.size());
    return failed ? 1 : 0;
}
