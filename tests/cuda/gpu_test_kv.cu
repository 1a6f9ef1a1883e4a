/*
 * gpu_test_kv.cu - the kernels around the paged KV cache against a plain host reference: bias +
 * RoPE + the KV write (and the fused QKV + RoPE decode kernel), paged attention (split-K decode,
 * prefill, chunked and mixed steps, full and sliding windows), and the FP8 (e4m3) KV cache's
 * encode, write and attention kernels, with their timings on the gpt-oss shapes.
 *
 * Needs a GPU, so it is not a ctest test: scripts/gpu-check builds and runs it on the GPU
 * machine. Inputs are random and never zero; outputs are poisoned (NaN bytes) before each
 * launch so an unwritten element fails. References are written here from the spec (section
 * 2), in double precision, independent of the backend's code. Prints one line per case and a
 * summary table last; exits 1 on any failure.
 *
 *   gpu_test_kv [SECTION,...]   sections: rope attention kvfp8 (default: all)
 */
#include "backend/cuda/kernels/attention_tc.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/kv_fp8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#define GPU_TEST_SEED 0x6b76c0de5eedull
#include "gpu_test_util.h"

/* ---- paged KV helpers ------------------------------------------------------------------- */

typedef struct paged {
    int n_seqs, block_size, max_blocks, n_blocks;
    std::vector<int32_t> table; /* [n_seqs, max_blocks], physical ids shuffled */
} paged;

static paged make_pages(int n_seqs, int max_len, int block_size) {
    paged p;
    p.n_seqs = n_seqs;
    p.block_size = block_size;
    p.max_blocks = (max_len + block_size - 1) / block_size;
    p.n_blocks = n_seqs * p.max_blocks + 3;
    std::vector<int32_t> ids(p.n_blocks);
    for (int i = 0; i < p.n_blocks; i++)
        ids[i] = i;
    for (int i = p.n_blocks - 1; i > 0; i--)
        std::swap(ids[i], ids[rnd_int(i + 1)]);
    p.table.resize((size_t)n_seqs * p.max_blocks);
    for (size_t i = 0; i < p.table.size(); i++)
        p.table[i] = ids[i];
    return p;
}

static void yarn_inv_freq(int D, std::vector<float> &inv_freq, float &conc) {
    /* spec 2.4 with the gpt-oss constants, in double, rounded once */
    double base = 150000, f = 32, L0 = 4096, bf = 32, bs = 1;
    double low = (D / 2.0) * log(L0 / (bf * 2 * M_PI)) / log(base);
    double high = (D / 2.0) * log(L0 / (bs * 2 * M_PI)) / log(base);
    inv_freq.resize(D / 2);
    for (int j = 0; j < D / 2; j++) {
        double freq = pow(base, 2.0 * j / D);
        double ramp = fmin(fmax((j - low) / (high - low), 0.0), 1.0);
        double e = 1 - ramp;
        inv_freq[j] = (float)((1 / freq) * e + (1 / (f * freq)) * (1 - e));
    }
    conc = (float)(0.1 * log(f) + 1);
}

/* ---- bias + RoPE + KV write ------------------------------------------------------------ */

static void test_rope_kv(int NH, int NKV, int D) {
    const int bs = 16;
    int lens[3] = {5, 37, 1};
    int cached[3] = {0, 20000, 130};
    int T = 43, S = 3;
    std::vector<int32_t> pos, seq, start = {0};
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < lens[s]; i++) {
            pos.push_back(cached[s] + i);
            seq.push_back(s);
        }
        start.push_back((int)pos.size());
    }
    int max_len = 20000 + 40;
    paged pg = make_pages(S, max_len, bs);
    int W = (NH + 2 * NKV) * D;
    std::vector<float> qkv((size_t)T * W), bias(W), inv;
    float conc;
    yarn_inv_freq(D, inv, conc);
    for (auto &v : qkv)
        v = rnd_nz(1.0f);
    for (auto &v : bias)
        v = rnd_nz(0.1f);
    float *dqkv = dev_upload(qkv), *dbias = dev_upload(bias), *dinv = dev_upload(inv);
    int32_t *dpos = dev_upload(pos), *dseq = dev_upload(seq), *dtab = dev_upload(pg.table);
    size_t cache_elems = (size_t)pg.n_blocks * bs * NKV * D;
    bf16 *kc = dev_poisoned<bf16>(cache_elems), *vc = dev_poisoned<bf16>(cache_elems);
    float *dq = dev_poisoned<float>((size_t)T * NH * D);
    gptoss_cuda_rope_kv_write(dqkv, dbias, dpos, dseq, dinv, conc, T, NH, NKV, D, dtab,
                              pg.max_blocks, bs, dq, kc, vc, 0);
    std::vector<float> q = dev_download(dq, (size_t)T * NH * D);
    std::vector<bf16> kh = dev_download(kc, cache_elems), vh = dev_download(vc, cache_elems);
    std::vector<double> gq, rq, gk, rk, gv, rv;
    for (int t = 0; t < T; t++) {
        const float *row = &qkv[(size_t)t * W];
        for (int head = 0; head < NH + NKV; head++) {
            for (int j = 0; j < D / 2; j++) {
                float angle = (float)pos[t] * inv[j]; /* fp32 angle, as REF computes it */
                double c = cos((double)angle) * conc, s = sin((double)angle) * conc;
                double a = (double)row[head * D + j] + bias[head * D + j];
                double b = (double)row[head * D + j + D / 2] + bias[head * D + j + D / 2];
                double ra = a * c - b * s, rb = b * c + a * s;
                if (head < NH) {
                    double sc = 1.0 / sqrt((double)D);
                    rq.push_back(ra * sc), rq.push_back(rb * sc);
                    gq.push_back(q[((size_t)t * NH + head) * D + j]);
                    gq.push_back(q[((size_t)t * NH + head) * D + j + D / 2]);
                } else {
                    int g = head - NH;
                    int blk = pg.table[(size_t)seq[t] * pg.max_blocks + pos[t] / bs];
                    size_t off = (((size_t)blk * bs + pos[t] % bs) * NKV + g) * D;
                    uint16_t h1, h2, h3, h4;
                    memcpy(&h1, &kh[off + j], 2), memcpy(&h2, &kh[off + j + D / 2], 2);
                    memcpy(&h3, &vh[off + j], 2), memcpy(&h4, &vh[off + j + D / 2], 2);
                    rk.push_back(ra), rk.push_back(rb);
                    gk.push_back(bf2f(h1)), gk.push_back(bf2f(h2));
                    int vb = (NH + NKV + g) * D;
                    rv.push_back((double)row[vb + j] + bias[vb + j]);
                    rv.push_back((double)row[vb + j + D / 2] + bias[vb + j + D / 2]);
                    gv.push_back(bf2f(h3)), gv.push_back(bf2f(h4));
                }
            }
        }
    }
    char name[96];
    snprintf(name, sizeof name, "rope+kv NH=%d NKV=%d D=%d: q (f32)", NH, NKV, D);
    check(name, gq, rq, 2e-5); /* fp32 math; cos/sin of the same fp32 angle */
    snprintf(name, sizeof name, "rope+kv NH=%d NKV=%d D=%d: k pages (bf16)", NH, NKV, D);
    check(name, gk, rk, 4e-3);
    snprintf(name, sizeof name, "rope+kv NH=%d NKV=%d D=%d: v pages (bf16)", NH, NKV, D);
    check(name, gv, rv, 4e-3);
    cudaFree(dqkv), cudaFree(dbias), cudaFree(dinv), cudaFree(dpos), cudaFree(dseq), cudaFree(dtab);
    cudaFree(kc), cudaFree(vc), cudaFree(dq);
}

/* ---- attention ------------------------------------------------------------------------- */

/* seqs: (n_cached, n_new) pairs; window 0 = full; splits forced (1 = single pass). */
static void test_attention(int NH, int NKV, int D, std::vector<std::pair<int, int>> seqs,
                           int window, int splits, const char *label) {
    const int bs = 16;
    int S = (int)seqs.size(), max_len = 0, T = 0;
    std::vector<int32_t> pos, seq;
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < seqs[s].second; i++) {
            pos.push_back(seqs[s].first + i);
            seq.push_back(s);
        }
        max_len = std::max(max_len, seqs[s].first + seqs[s].second);
    }
    T = (int)pos.size();
    paged pg = make_pages(S, max_len, bs);
    size_t cache_elems = (size_t)pg.n_blocks * bs * NKV * D;
    std::vector<uint16_t> kc(cache_elems), vc(cache_elems);
    for (auto &v : kc)
        v = f2bf(rnd_nz(1.0f));
    for (auto &v : vc)
        v = f2bf(rnd_nz(1.0f));
    std::vector<float> q((size_t)T * NH * D), sinks(NH);
    for (auto &v : q)
        v = rnd_nz(0.6f);
    for (auto &v : sinks)
        v = rnd_nz(3.0f);
    bf16 *dk = NULL, *dv = NULL;
    CK(cudaMalloc(&dk, cache_elems * 2));
    CK(cudaMalloc(&dv, cache_elems * 2));
    CK(cudaMemcpy(dk, kc.data(), cache_elems * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, vc.data(), cache_elems * 2, cudaMemcpyHostToDevice));
    float *dq = dev_upload(q), *dsink = dev_upload(sinks);
    int32_t *dpos = dev_upload(pos), *dseq = dev_upload(seq), *dtab = dev_upload(pg.table);
    float *partial = dev_poisoned<float>((size_t)T * NH * splits * (D + 2));
    bf16 *dout = dev_poisoned<bf16>((size_t)T * NH * D),
         *dout_dec = dev_poisoned<bf16>((size_t)T * NH * D);
    int rc = gptoss_cuda_attention(dq, dk, dv, dpos, dseq, dtab, pg.max_blocks, bs, dsink, T, NH,
                                   NKV, D, window, splits, partial, dout, 0);
    if (rc != 0) {
        fprintf(stderr, "attention launcher refused the shape\n");
        exit(1);
    }
    std::vector<bf16> out = dev_download(dout, (size_t)T * NH * D);
    /* the tensor-core decode kernel on the same cut (it refuses groups over 16) */
    const bool dec = NH / NKV <= 16;
    int rc_dec =
        dec ? gptoss_cuda_attention_decode(dq, dk, dv, dpos, dseq, dtab, pg.max_blocks, bs, dsink,
                                           T, NH, NKV, D, window, splits, partial, dout_dec, 0)
            : 0;
    std::vector<bf16> out_dec = dev_download(dout_dec, (size_t)T * NH * D);
    std::vector<double> got, got_dec, ref;
    for (int t = 0; t < T; t++) {
        int p = pos[t], s = seq[t];
        int lo = window > 0 ? std::max(0, p - window + 1) : 0;
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            std::vector<double> sc;
            double m = sinks[h];
            for (int j = lo; j <= p; j++) {
                int blk = pg.table[(size_t)s * pg.max_blocks + j / bs];
                size_t off = (((size_t)blk * bs + j % bs) * NKV + g) * D;
                double d = 0;
                for (int c = 0; c < D; c++)
                    d += (double)q[((size_t)t * NH + h) * D + c] * bf2f(kc[off + c]);
                sc.push_back(d); /* q arrives pre-scaled */
                m = fmax(m, d);
            }
            double z = exp(sinks[h] - m);
            for (double v : sc)
                z += exp(v - m);
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int j = lo; j <= p; j++) {
                    int blk = pg.table[(size_t)s * pg.max_blocks + j / bs];
                    size_t off = (((size_t)blk * bs + j % bs) * NKV + g) * D;
                    o += exp(sc[j - lo] - m) / z * bf2f(vc[off + c]);
                }
                ref.push_back(o);
                uint16_t hb, hd;
                memcpy(&hb, &out[((size_t)t * NH + h) * D + c], 2);
                memcpy(&hd, &out_dec[((size_t)t * NH + h) * D + c], 2);
                got.push_back(bf2f(hb));
                got_dec.push_back(bf2f(hd));
            }
        }
    }
    char name[128];
    snprintf(name, sizeof name, "attention %s NH=%d NKV=%d D=%d T=%d win=%d splits=%d", label, NH,
             NKV, D, T, window, splits);
    check(name, got, ref, 6e-3); /* bf16 output (2^-9) plus fast exp */
    if (dec) {
        if (rc_dec != 0) got_dec[0] = NAN; /* refused: fails */
        snprintf(name, sizeof name,
                 "attention decode-tc %s NH=%d NKV=%d D=%d T=%d win=%d splits=%d", label, NH, NKV,
                 D, T, window, splits);
        check(name, got_dec, ref, 2.5e-3); /* the bf16 output rounding */
        /* as exact as the scalar kernel: the two differ only where an output sits at a bf16
         * rounding boundary (q and P with 16 bits instead of 24 flipped a few percent of the
         * outputs, about 8e-4 here, and the forward tests' strict bars failed) */
        snprintf(name, sizeof name,
                 "attention decode-tc %s NH=%d NKV=%d D=%d T=%d win=%d vs scalar", label, NH, NKV,
                 D, T, window);
        check(name, got_dec, got, 4e-4);
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dsink), cudaFree(dpos), cudaFree(dseq),
        cudaFree(dtab);
    cudaFree(partial), cudaFree(dout), cudaFree(dout_dec);
}

/* ---- FP8 KV cache (kv_fp8.h) ------------------------------------------------------------- */

/* The device side of kv_fp8.h: every code pair through the hardware decode, and encode and
 * quantize of the same floats as the host. */
static __global__ void e4m3_pairs_kernel(float2 *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 65536) out[i] = gptoss_e4m3x2_decode((uint16_t)i);
}
static __global__ void e4m3_encode_kernel(const float *x, const float *scale, int n,
                                          uint8_t *encoded, uint8_t *hardware, uint8_t *quantized) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    encoded[i] = gptoss_e4m3_encode(x[i]);
    hardware[i] = (uint8_t)__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3);
    quantized[i] = gptoss_kv_fp8_quantize(x[i], scale[i]);
}

static bool same_float(float a, float b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0;
}

/* The CPU backend's emulation and the kernels must produce the same codes: the device
 * encode and quantize (IEEE division) against the host's, bit for bit; the hardware
 * conversion (round to nearest even, saturating) against the same encode, an independent
 * implementation; and the hardware pair decode (what the attention kernels use) against the
 * host decode for all 65536 pairs. Inputs: every bf16 pattern, every e4m3 value, midpoint and
 * their float neighbours, and random floats with random scales (zero scales included). */
static void test_e4m3_device(void) {
    float2 *dpairs = dev_poisoned<float2>(65536);
    e4m3_pairs_kernel<<<256, 256>>>(dpairs);
    std::vector<float2> pairs = dev_download(dpairs, 65536);
    long bad_decode = 0;
    for (int i = 0; i < 65536; i++)
        bad_decode += !same_float(pairs[i].x, gptoss_e4m3_decode((uint8_t)(i & 255))) ||
                      !same_float(pairs[i].y, gptoss_e4m3_decode((uint8_t)(i >> 8)));
    char name[160];
    snprintf(name, sizeof name,
             "kvfp8 hardware pair decode = kv_fp8.h decode (65536 pairs): %ld differ", bad_decode);
    check_true(name, bad_decode == 0);

    std::vector<float> x, scale;
    for (uint32_t h = 0; h < 65536; h++)
        x.push_back(bf2f((uint16_t)h));
    for (int c = 0; c < 0x7e; c++) {
        float v = gptoss_e4m3_decode((uint8_t)c), w = gptoss_e4m3_decode((uint8_t)(c + 1));
        float mid = (float)(((double)v + w) / 2);
        for (float f : {v, mid}) {
            for (float g : {f, nextafterf(f, INFINITY), nextafterf(f, -INFINITY)}) {
                x.push_back(g);
                x.push_back(-g);
            }
        }
    }
    for (int i = 0; i < (1 << 20); i++) {
        uint32_t u = (uint32_t)rnd_u64();
        float f;
        memcpy(&f, &u, 4);
        x.push_back((i & 1) ? f : ldexpf(rnd_nz(1.0f), rnd_int(40) - 20));
    }
    for (size_t i = 0; i < x.size(); i++) {
        int kind = rnd_int(8); /* mostly scales of a vector around x, some arbitrary, some 0 */
        scale.push_back(kind == 0   ? 0.0f
                        : kind == 1 ? ldexpf(1.0f + (float)rnd_unit(), rnd_int(60) - 30)
                                    : fabsf(x[i]) / 448.0f * (1.0f + (float)rnd_unit()));
    }
    int n = (int)x.size();
    float *dx = dev_upload(x), *ds = dev_upload(scale);
    uint8_t *denc = dev_poisoned<uint8_t>(n), *dhw = dev_poisoned<uint8_t>(n),
            *dq = dev_poisoned<uint8_t>(n);
    e4m3_encode_kernel<<<(n + 255) / 256, 256>>>(dx, ds, n, denc, dhw, dq);
    std::vector<uint8_t> enc = dev_download(denc, n), hw = dev_download(dhw, n),
                         quant = dev_download(dq, n);
    long bad_enc = 0, bad_hw = 0, bad_quant = 0, first = -1, first_quant = -1;
    for (int i = 0; i < n; i++) {
        uint8_t want = gptoss_e4m3_encode(x[i]);
        if (enc[i] != want && bad_enc++ == 0) first = i;
        /* the hardware's NaN code may carry either sign (kv_fp8.h writes 0x7f) */
        bad_hw += isnan(x[i]) ? (hw[i] & 0x7f) != 0x7f : hw[i] != want;
        if (quant[i] != gptoss_kv_fp8_quantize(x[i], scale[i]) && bad_quant++ == 0) first_quant = i;
    }
    snprintf(name, sizeof name,
             "kvfp8 device encode = host encode (%d floats): %ld differ (first %a)", n, bad_enc,
             first >= 0 ? (double)x[first] : 0.0);
    check_true(name, bad_enc == 0);
    snprintf(name, sizeof name,
             "kvfp8 hardware cvt.rn.satfinite e4m3 = kv_fp8.h encode: %ld differ", bad_hw);
    check_true(name, bad_hw == 0);
    snprintf(name, sizeof name,
             "kvfp8 device quantize(x, scale) = host's: %ld differ (first %a / %a: 0x%02x, 0x%02x)",
             bad_quant, first_quant >= 0 ? (double)x[first_quant] : 0.0,
             first_quant >= 0 ? (double)scale[first_quant] : 0.0,
             first_quant >= 0 ? quant[first_quant] : 0,
             first_quant >= 0 ? gptoss_kv_fp8_quantize(x[first_quant], scale[first_quant]) : 0);
    check_true(name, bad_quant == 0);
    cudaFree(dpairs), cudaFree(dx), cudaFree(ds), cudaFree(denc), cudaFree(dhw), cudaFree(dq);
}

/* One decode token's QKV projection with bias + RoPE + bf16 KV write in one kernel
 * (gptoss_cuda_qkv_rope_one): q and the whole K and V page pools bit for bit those of the GEMV
 * followed by the RoPE kernel (both poisoned alike first, so a stray write shows too), and q,
 * K and V against a double reference of the projection and rotation. */
static void test_qkv_rope_one(int NH, int NKV, int D, int H, int pos) {
    const int bs = 16, W = (NH + 2 * NKV) * D;
    paged pg = make_pages(2, pos + 40, bs);
    std::vector<uint16_t> wt((size_t)W * H), x(H);
    for (auto &v : wt)
        v = f2bf(rnd_nz(0.05f));
    for (auto &v : x)
        v = f2bf(rnd_nz(2.0f));
    std::vector<float> bias(W), inv;
    float conc;
    yarn_inv_freq(D, inv, conc);
    for (auto &v : bias)
        v = rnd_nz(0.1f);
    std::vector<int32_t> posv = {pos}, seqv = {1};
    bf16 *dw, *dx;
    CK(cudaMalloc(&dw, wt.size() * 2));
    CK(cudaMalloc(&dx, x.size() * 2));
    CK(cudaMemcpy(dw, wt.data(), wt.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    float *dbias = dev_upload(bias), *dinv = dev_upload(inv);
    int32_t *dpos = dev_upload(posv), *dseq = dev_upload(seqv), *dtab = dev_upload(pg.table);
    const size_t cache_elems = (size_t)pg.n_blocks * bs * NKV * D;
    bf16 *kc1 = dev_poisoned<bf16>(cache_elems), *vc1 = dev_poisoned<bf16>(cache_elems);
    bf16 *kc2 = dev_poisoned<bf16>(cache_elems), *vc2 = dev_poisoned<bf16>(cache_elems);
    float *dq1 = dev_poisoned<float>((size_t)NH * D), *dq2 = dev_poisoned<float>((size_t)NH * D);
    float *dqkv = dev_poisoned<float>(W);
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int rc1 = gptoss_cuda_gemv_bf16(dw, dx, dqkv, 1, W, H, sms, 0);
    gptoss_cuda_rope_kv_write(dqkv, dbias, dpos, dseq, dinv, conc, 1, NH, NKV, D, dtab,
                              pg.max_blocks, bs, dq1, kc1, vc1, 0);
    int rc2 = gptoss_cuda_qkv_rope_one(dw, dx, dbias, dpos, dseq, dinv, conc, NH, NKV, D, H, dtab,
                                       pg.max_blocks, bs, dq2, kc2, vc2, 0);
    std::vector<float> q1 = dev_download(dq1, (size_t)NH * D),
                       q2 = dev_download(dq2, (size_t)NH * D);
    std::vector<bf16> k1 = dev_download(kc1, cache_elems), k2 = dev_download(kc2, cache_elems);
    std::vector<bf16> v1 = dev_download(vc1, cache_elems), v2 = dev_download(vc2, cache_elems);
    char name[112];
    snprintf(name, sizeof name,
             "qkv+rope one token NH=%d NKV=%d D=%d H=%d p=%d: = GEMV + RoPE kernel, bit for bit",
             NH, NKV, D, H, pos);
    check_true(name, rc1 == 0 && rc2 == 0 && memcmp(q1.data(), q2.data(), q1.size() * 4) == 0 &&
                         memcmp(k1.data(), k2.data(), cache_elems * 2) == 0 &&
                         memcmp(v1.data(), v2.data(), cache_elems * 2) == 0);
    /* double reference */
    std::vector<double> row(W);
    for (int r = 0; r < W; r++) {
        double a = 0;
        for (int i = 0; i < H; i++)
            a += (double)bf2f(wt[(size_t)r * H + i]) * bf2f(x[i]);
        row[r] = a + bias[r];
    }
    std::vector<double> got, ref;
    const int blk = pg.table[(size_t)1 * pg.max_blocks + pos / bs];
    for (int head = 0; head < NH + 2 * NKV; head++)
        for (int j = 0; j < D / 2; j++) {
            float angle = (float)pos * inv[j];
            double c = cos((double)angle) * conc, sn = sin((double)angle) * conc;
            double a = row[head * D + j], b = row[head * D + j + D / 2];
            bool rot = head < NH + NKV;
            double ra = rot ? a * c - b * sn : a, rb = rot ? b * c + a * sn : b;
            if (head < NH) {
                double sc = 1.0 / sqrt((double)D);
                ref.push_back(ra * sc), ref.push_back(rb * sc);
                got.push_back(q2[head * D + j]), got.push_back(q2[head * D + j + D / 2]);
            } else {
                const int g = (head - NH) % NKV;
                const size_t off = (((size_t)blk * bs + pos % bs) * NKV + g) * D;
                const std::vector<bf16> &pool = head < NH + NKV ? k2 : v2;
                uint16_t h1, h2;
                memcpy(&h1, &pool[off + j], 2), memcpy(&h2, &pool[off + j + D / 2], 2);
                ref.push_back(ra), ref.push_back(rb);
                got.push_back(bf2f(h1)), got.push_back(bf2f(h2));
            }
        }
    snprintf(name, sizeof name, "qkv+rope one token NH=%d NKV=%d D=%d H=%d p=%d: q, K, V", NH, NKV,
             D, H, pos);
    check(name, got, ref, 4e-3); /* K and V are bf16 */
    cudaFree(dw), cudaFree(dx), cudaFree(dbias), cudaFree(dinv), cudaFree(dpos), cudaFree(dseq),
        cudaFree(dtab);
    cudaFree(kc1), cudaFree(vc1), cudaFree(kc2), cudaFree(vc2), cudaFree(dq1), cudaFree(dq2),
        cudaFree(dqkv);
}

/* bias + RoPE + FP8 KV write against a double reference (as test_rope_kv) run through the
 * host's kv_fp8.h: every scale within fp32 noise of absmax / 448; every code the host's code
 * of the reference value, except where that value lies next to the midpoint between the two
 * codes (fp32 rounding of the kernel's RoPE decides such near-ties, under 1% of them); every
 * decoded value within e4m3's bound of the reference (2^-4 of itself, or 2^-10 scale below
 * e4m3's normal range). Token 0's K and V are zero vectors (qkv = -bias): scale 0, codes 0. */
static void test_rope_kv_fp8(int NH, int NKV, int D) {
    const int bs = 16;
    int lens[3] = {5, 37, 1};
    int cached[3] = {0, 20000, 130};
    int T = 43, S = 3;
    std::vector<int32_t> pos, seq;
    for (int s = 0; s < S; s++)
        for (int i = 0; i < lens[s]; i++)
            pos.push_back(cached[s] + i), seq.push_back(s);
    paged pg = make_pages(S, 20000 + 40, bs);
    int W = (NH + 2 * NKV) * D;
    std::vector<float> qkv((size_t)T * W), bias(W), inv;
    float conc;
    yarn_inv_freq(D, inv, conc);
    for (auto &v : qkv)
        v = rnd_nz(1.0f);
    for (auto &v : bias)
        v = rnd_nz(0.1f);
    for (int i = NH * D; i < W; i++)
        qkv[i] = -bias[i]; /* token 0: zero K and V */
    float *dqkv = dev_upload(qkv), *dbias = dev_upload(bias), *dinv = dev_upload(inv);
    int32_t *dpos = dev_upload(pos), *dseq = dev_upload(seq), *dtab = dev_upload(pg.table);
    size_t slots = (size_t)pg.n_blocks * bs * NKV;
    uint8_t *kc = dev_poisoned<uint8_t>(slots * D), *vc = dev_poisoned<uint8_t>(slots * D);
    float *ks = dev_poisoned<float>(slots), *vs = dev_poisoned<float>(slots);
    float *dq = dev_poisoned<float>((size_t)T * NH * D);
    gptoss_cuda_rope_kv_write_fp8(dqkv, dbias, dpos, dseq, dinv, conc, T, NH, NKV, D, dtab,
                                  pg.max_blocks, bs, dq, kc, vc, ks, vs, 0);
    std::vector<uint8_t> kh = dev_download(kc, slots * D), vh = dev_download(vc, slots * D);
    std::vector<float> ksh = dev_download(ks, slots), vsh = dev_download(vs, slots);
    std::vector<float> q = dev_download(dq, (size_t)T * NH * D);
    std::vector<double> gscale, rscale, gval, rval, gq, rq;
    long unexplained = 0, near_ties = 0, over_bound = 0;
    bool zero_ok = true;
    for (int t = 0; t < T; t++) {
        const float *row = &qkv[(size_t)t * W];
        for (int head = 0; head < NH + NKV; head++) {
            std::vector<double> k(D), v(D);
            for (int j = 0; j < D / 2; j++) {
                float angle = (float)pos[t] * inv[j];
                double c = cos((double)angle) * conc, s = sin((double)angle) * conc;
                double a = (double)row[head * D + j] + bias[head * D + j];
                double b = (double)row[head * D + j + D / 2] + bias[head * D + j + D / 2];
                k[j] = a * c - b * s, k[j + D / 2] = b * c + a * s;
            }
            if (head < NH) {
                for (int j = 0; j < D; j++) {
                    rq.push_back(k[j] / sqrt((double)D));
                    gq.push_back(q[((size_t)t * NH + head) * D + j]);
                }
                continue;
            }
            int g = head - NH, vb = (NH + NKV + g) * D;
            for (int j = 0; j < D; j++)
                v[j] = (double)row[vb + j] + bias[vb + j];
            size_t slot = ((size_t)pg.table[(size_t)seq[t] * pg.max_blocks + pos[t] / bs] * bs +
                           pos[t] % bs) *
                              NKV +
                          g;
            for (int kv = 0; kv < 2; kv++) {
                const std::vector<double> &ref = kv ? v : k;
                const uint8_t *codes = (kv ? vh.data() : kh.data()) + slot * D;
                float sc = kv ? vsh[slot] : ksh[slot];
                double absmax = 0;
                for (double e : ref)
                    absmax = fmax(absmax, fabs(e));
                if (t == 0) {
                    zero_ok = zero_ok && sc == 0.0f;
                    for (int j = 0; j < D; j++)
                        zero_ok = zero_ok && (codes[j] & 0x7f) == 0;
                    continue;
                }
                gscale.push_back(sc), rscale.push_back(absmax / 448.0);
                for (int j = 0; j < D; j++) {
                    uint8_t want = gptoss_kv_fp8_quantize((float)ref[j], sc);
                    if (codes[j] != want) {
                        double r = ref[j] / sc, a = gptoss_e4m3_decode(codes[j]),
                               b = gptoss_e4m3_decode(want);
                        bool adjacent = (codes[j] & 0x80) == (want & 0x80) &&
                                        abs((codes[j] & 0x7f) - (want & 0x7f)) == 1;
                        /* the kernel's fp32 RoPE is within about 3e-7 of the largest input of the
                         * vector, 1e-4 in units of the scale (absmax / 448): 10x that, absolute */
                        if (adjacent && fabs(r - (a + b) / 2) <= 1e-4 * fabs(r) + 1e-3)
                            near_ties++;
                        else
                            unexplained++;
                    }
                    double got = (double)gptoss_e4m3_decode(codes[j]) * sc,
                           err = fabs(got - ref[j]);
                    double bound =
                        fabs(ref[j]) >= 0x1p-6 * sc ? 0x1p-4 * fabs(ref[j]) : 0x1p-10 * sc;
                    over_bound += err > bound * 1.001 + 1e-5 * absmax;
                    gval.push_back(got), rval.push_back(ref[j]);
                }
            }
        }
    }
    char name[192];
    snprintf(name, sizeof name, "kvfp8 rope+kv NH=%d NKV=%d D=%d: q (f32)", NH, NKV, D);
    check(name, gq, rq, 2e-5);
    snprintf(name, sizeof name, "kvfp8 rope+kv NH=%d NKV=%d D=%d: scales = absmax / 448", NH, NKV,
             D);
    check(name, gscale, rscale, 2e-5); /* fp32 RoPE against double: as q */
    snprintf(name, sizeof name,
             "kvfp8 rope+kv NH=%d NKV=%d D=%d: codes = host codes (%ld near-ties, %ld not)", NH,
             NKV, D, near_ties, unexplained);
    check_true(name, unexplained == 0 && near_ties * 100 < (long)gval.size());
    snprintf(name, sizeof name,
             "kvfp8 rope+kv NH=%d NKV=%d D=%d: values within e4m3's bound (%ld over)", NH, NKV, D,
             over_bound);
    check_true(name, over_bound == 0);
    snprintf(name, sizeof name, "kvfp8 rope+kv NH=%d NKV=%d D=%d: k, v values (e4m3)", NH, NKV, D);
    check(name, gval, rval, 0.04); /* 3 mantissa bits: at most 2^-4 / sqrt(3) = 3.6% RMS */
    snprintf(name, sizeof name,
             "kvfp8 rope+kv NH=%d NKV=%d D=%d: zero K and V vectors -> scale 0, codes 0", NH, NKV,
             D);
    check_true(name, zero_ok);
    cudaFree(dqkv), cudaFree(dbias), cudaFree(dinv), cudaFree(dpos), cudaFree(dseq), cudaFree(dtab);
    cudaFree(kc), cudaFree(vc), cudaFree(ks), cudaFree(vs), cudaFree(dq);
}

/* An FP8 paged cache for attention tests: K and V head vectors of random values quantized on
 * the host (kv_fp8.h); every slot no token may read holds NaN codes and NaN scales. */
typedef struct fp8_cache {
    std::vector<uint8_t> k, v; /* [n_blocks, bs, NKV, D] codes */
    std::vector<float> ks, vs; /* [n_blocks, bs, NKV] scales */
    uint8_t *dk, *dv;
    float *dks, *dvs;
} fp8_cache;

static fp8_cache make_fp8_cache(const paged &pg, const std::vector<std::pair<int, int>> &seqs,
                                int NKV, int D) {
    fp8_cache c;
    size_t slots = (size_t)pg.n_blocks * pg.block_size * NKV;
    c.k.assign(slots * D, 0x7f), c.v.assign(slots * D, 0x7f);
    c.ks.assign(slots, NAN), c.vs.assign(slots, NAN);
    std::vector<float> x(D);
    for (size_t s = 0; s < seqs.size(); s++)
        for (int j = 0; j < seqs[s].first + seqs[s].second; j++)
            for (int g = 0; g < NKV; g++) {
                size_t slot =
                    ((size_t)pg.table[s * pg.max_blocks + j / pg.block_size] * pg.block_size +
                     j % pg.block_size) *
                        NKV +
                    g;
                for (int kv = 0; kv < 2; kv++) {
                    float mag = ldexpf(1.0f, rnd_int(7) - 3); /* vectors of different sizes */
                    for (auto &e : x)
                        e = rnd_nz(mag);
                    float sc = gptoss_kv_fp8_round_trip(x.data(), D,
                                                        (kv ? c.v.data() : c.k.data()) + slot * D);
                    (kv ? c.vs : c.ks)[slot] = sc;
                }
            }
    c.dk = dev_upload(c.k), c.dv = dev_upload(c.v), c.dks = dev_upload(c.ks),
    c.dvs = dev_upload(c.vs);
    return c;
}

static void free_fp8_cache(fp8_cache &c) {
    cudaFree(c.dk), cudaFree(c.dv), cudaFree(c.dks), cudaFree(c.dvs);
}

/* Attention over an FP8 cache: the split-K kernel (splits as given) and, when tc, the
 * tensor-core kernel, against a double reference over the dequantized cache
 * (decode(code) * scale), and the tensor-core result against the split-K one. */
static void test_attention_fp8(int NH, int NKV, int D, std::vector<std::pair<int, int>> seqs,
                               int window, int splits, bool tc, const char *label) {
    const int bs = 16;
    int S = (int)seqs.size(), max_len = 1;
    std::vector<int32_t> pos, seq;
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < seqs[s].second; i++)
            pos.push_back(seqs[s].first + i), seq.push_back(s);
        max_len = std::max(max_len, seqs[s].first + seqs[s].second);
    }
    int T = (int)pos.size();
    paged pg = make_pages(S, max_len, bs);
    fp8_cache c = make_fp8_cache(pg, seqs, NKV, D);
    std::vector<float> q((size_t)T * NH * D), sinks(NH);
    for (auto &v : q)
        v = rnd_nz(0.6f);
    for (auto &v : sinks)
        v = rnd_nz(3.0f);
    float *dq = dev_upload(q), *dsink = dev_upload(sinks);
    int32_t *dpos = dev_upload(pos), *dseq = dev_upload(seq), *dtab = dev_upload(pg.table);
    float *partial = dev_poisoned<float>((size_t)T * NH * splits * (D + 2));
    bf16 *dout = dev_poisoned<bf16>((size_t)T * NH * D),
         *dout_tc = dev_poisoned<bf16>((size_t)T * NH * D);
    bf16 *dout_dec = dev_poisoned<bf16>((size_t)T * NH * D);
    int rc =
        gptoss_cuda_attention_fp8(dq, c.dk, c.dv, c.dks, c.dvs, dpos, dseq, dtab, pg.max_blocks, bs,
                                  dsink, T, NH, NKV, D, window, splits, partial, dout, 0);
    const bool dec = NH / NKV <= 16;
    int rc_dec = dec ? gptoss_cuda_attention_decode_fp8(dq, c.dk, c.dv, c.dks, c.dvs, dpos, dseq,
                                                        dtab, pg.max_blocks, bs, dsink, T, NH, NKV,
                                                        D, window, splits, partial, dout_dec, 0)
                     : 0;
    int rc_tc = tc ? gptoss_cuda_attention_tc_fp8(dq, c.dk, c.dv, c.dks, c.dvs, dpos, dseq, dtab,
                                                  pg.max_blocks, bs, dsink, T, NH, NKV, D, window,
                                                  dout_tc, 0)
                   : 0;
    std::vector<bf16> out = dev_download(dout, (size_t)T * NH * D),
                      out_tc = dev_download(dout_tc, (size_t)T * NH * D);
    std::vector<bf16> out_dec = dev_download(dout_dec, (size_t)T * NH * D);
    std::vector<double> got, got_tc, got_dec, ref;
    for (int t = 0; t < T; t++) {
        int p = pos[t], s = seq[t], lo = window > 0 ? std::max(0, p - window + 1) : 0;
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            std::vector<double> sc;
            double m = sinks[h];
            for (int j = lo; j <= p; j++) {
                size_t slot =
                    ((size_t)pg.table[(size_t)s * pg.max_blocks + j / bs] * bs + j % bs) * NKV + g;
                double d = 0;
                for (int e = 0; e < D; e++)
                    d += (double)q[((size_t)t * NH + h) * D + e] *
                         gptoss_e4m3_decode(c.k[slot * D + e]) * c.ks[slot];
                sc.push_back(d);
                m = fmax(m, d);
            }
            double z = exp(sinks[h] - m);
            for (double v : sc)
                z += exp(v - m);
            for (int e = 0; e < D; e++) {
                double o = 0;
                for (int j = lo; j <= p; j++) {
                    size_t slot =
                        ((size_t)pg.table[(size_t)s * pg.max_blocks + j / bs] * bs + j % bs) * NKV +
                        g;
                    o += exp(sc[j - lo] - m) / z * gptoss_e4m3_decode(c.v[slot * D + e]) *
                         c.vs[slot];
                }
                size_t i = ((size_t)t * NH + h) * D + e;
                uint16_t hb, ht, hd;
                memcpy(&hb, &out[i], 2), memcpy(&ht, &out_tc[i], 2), memcpy(&hd, &out_dec[i], 2);
                ref.push_back(o), got.push_back(bf2f(hb)), got_tc.push_back(bf2f(ht)),
                    got_dec.push_back(bf2f(hd));
            }
        }
    }
    char name[160];
    snprintf(name, sizeof name, "kvfp8 attention %s NH=%d NKV=%d D=%d T=%d win=%d splits=%d", label,
             NH, NKV, D, T, window, splits);
    if (rc != 0) got[0] = NAN;   /* refused: fails */
    check(name, got, ref, 6e-3); /* as the bf16 pages: bf16 output (2^-9) plus fast exp */
    if (tc) {
        if (rc_tc != 0) got_tc[0] = NAN;
        snprintf(name, sizeof name, "kvfp8 attention tc %s NH=%d NKV=%d D=%d T=%d win=%d vs double",
                 label, NH, NKV, D, T, window);
        check(name, got_tc, ref,
              2.5e-3); /* q and P * scale as 16-bit pairs: the bf16 output rounding */
        snprintf(name, sizeof name,
                 "kvfp8 attention tc %s NH=%d NKV=%d D=%d T=%d win=%d vs split-K", label, NH, NKV,
                 D, T, window);
        check(name, got_tc, got, 2.5e-3);
    }
    if (dec) {
        if (rc_dec != 0) got_dec[0] = NAN;
        snprintf(name, sizeof name,
                 "kvfp8 attention decode-tc %s NH=%d NKV=%d D=%d T=%d win=%d splits=%d vs double",
                 label, NH, NKV, D, T, window, splits);
        check(name, got_dec, ref, 2.5e-3);
        snprintf(name, sizeof name,
                 "kvfp8 attention decode-tc %s NH=%d NKV=%d D=%d T=%d win=%d vs split-K", label, NH,
                 NKV, D, T, window);
        check(name, got_dec, got, 4e-4);
    }
    free_fp8_cache(c);
    cudaFree(dq), cudaFree(dsink), cudaFree(dpos), cudaFree(dseq), cudaFree(dtab),
        cudaFree(partial), cudaFree(dout);
    cudaFree(dout_tc), cudaFree(dout_dec);
}

/* Attention time with bf16 and FP8 pages on the 20b shape (64 heads, 8 KV heads, 64 dims):
 * one decode token at a depth (split-K) and a prefill from 0 (tensor cores). Printed, not
 * checked: decode reads about half the bytes with FP8 pages. */
static void time_attention_fp8(int depth, int prefill) {
    const int NH = 64, NKV = 8, D = 64, bs = 16;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int max_len = std::max(depth + 1, prefill), n_blocks = (max_len + bs - 1) / bs;
    std::vector<int32_t> table(n_blocks);
    for (int i = 0; i < n_blocks; i++)
        table[i] = i;
    size_t slots = (size_t)n_blocks * bs * NKV;
    bf16 *kb, *vb, *out;
    uint8_t *k8, *v8;
    float *ks, *vs, *q, *sinks, *partial;
    CK(cudaMalloc(&kb, slots * D * 2));
    CK(cudaMalloc(&vb, slots * D * 2));
    CK(cudaMalloc(&k8, slots * D));
    CK(cudaMalloc(&v8, slots * D));
    CK(cudaMalloc(&ks, slots * 4));
    CK(cudaMalloc(&vs, slots * 4));
    CK(cudaMemset(kb, 0, slots * D * 2));
    CK(cudaMemset(vb, 0, slots * D * 2));
    CK(cudaMemset(k8, 0x38, slots * D));
    CK(cudaMemset(v8, 0x38, slots * D)); /* code 1.0 */
    CK(cudaMemset(ks, 0, slots * 4));
    CK(cudaMemset(vs, 0, slots * 4));
    CK(cudaMalloc(&q, (size_t)prefill * NH * D * 4));
    CK(cudaMemset(q, 0, (size_t)prefill * NH * D * 4));
    CK(cudaMalloc(&sinks, NH * 4));
    CK(cudaMemset(sinks, 0, NH * 4));
    CK(cudaMalloc(&out, (size_t)prefill * NH * D * 2));
    int splits = gptoss_cuda_attention_splits(1, NKV, depth + 1, sms);
    CK(cudaMalloc(&partial, (size_t)NH * splits * (D + 2) * 4));
    std::vector<int32_t> pos1 = {depth}, seq1 = {0}, posp(prefill), seqp(prefill, 0);
    for (int i = 0; i < prefill; i++)
        posp[i] = i;
    int32_t *dtab = dev_upload(table), *dpos1 = dev_upload(pos1), *dseq1 = dev_upload(seq1),
            *dposp = dev_upload(posp), *dseqp = dev_upload(seqp);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double us[4];
    const int reps = 20;
    for (int kind = 0; kind < 4; kind++) {
        for (int r = -3; r < reps; r++) {
            if (r == 0) CK(cudaEventRecord(e0));
            if (kind == 0)
                gptoss_cuda_attention(q, kb, vb, dpos1, dseq1, dtab, n_blocks, bs, sinks, 1, NH,
                                      NKV, D, 0, splits, partial, out, 0);
            else if (kind == 1)
                gptoss_cuda_attention_fp8(q, k8, v8, ks, vs, dpos1, dseq1, dtab, n_blocks, bs,
                                          sinks, 1, NH, NKV, D, 0, splits, partial, out, 0);
            else if (kind == 2)
                gptoss_cuda_attention_tc(q, kb, vb, dposp, dseqp, dtab, n_blocks, bs, sinks,
                                         prefill, NH, NKV, D, 0, out, 0);
            else
                gptoss_cuda_attention_tc_fp8(q, k8, v8, ks, vs, dposp, dseqp, dtab, n_blocks, bs,
                                             sinks, prefill, NH, NKV, D, 0, out, 0);
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us[kind] = 1e3 * ms / reps;
    }
    CK(cudaGetLastError());
    printf("timing: attention 20b shape, decode at depth %d (%d splits): bf16 pages %.1f us, fp8 "
           "pages %.1f us; "
           "prefill %d tokens (tensor cores): bf16 %.1f us, fp8 %.1f us\n",
           depth, splits, us[0], us[1], prefill, us[2], us[3]);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(kb), cudaFree(vb), cudaFree(k8), cudaFree(v8), cudaFree(ks), cudaFree(vs), cudaFree(q),
        cudaFree(sinks);
    cudaFree(out), cudaFree(partial), cudaFree(dtab), cudaFree(dpos1), cudaFree(dseq1),
        cudaFree(dposp);
    cudaFree(dseqp);
}

/* Random fill of n bytes (a hash of the index); e4m3: codes with the NaN pattern cleared. */
static __global__ void fill_random_kernel(uint8_t *p, size_t n, uint32_t seed, bool e4m3) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        uint8_t b = (uint8_t)h;
        if (e4m3)
            b &= 0xf7; /* exponent field below 15: never NaN */
        else if (i & 1)
            b = (uint8_t)(0x3c | (b & 0x80)) ^
                (uint8_t)((h >> 8) & 3); /* bf16 high byte: |x| ~ 2^-7 .. 2^-4 */
        p[i] = b;
    }
}
static void fill_random(void *p, size_t n, uint32_t seed, bool e4m3) {
    fill_random_kernel<<<1024, 256>>>((uint8_t *)p, n, seed, e4m3);
    CK(cudaGetLastError());
}

/* Decode attention time on the 20b shape (64 heads, 8 KV heads, 64 dims) for B one-token
 * sequences at one depth, random pages: the scalar split-K kernel against the tensor-core
 * decode kernel, bf16 and FP8 pages, with the splits the backend would use. Printed, not
 * checked; GB/s counts the K and V bytes the step must read. */
static void time_attention_decode(int B, int depth) {
    const int NH = 64, NKV = 8, D = 64, bs = 16;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int nb = (depth + 1 + bs - 1) / bs, n_blocks = B * nb;
    std::vector<int32_t> table((size_t)n_blocks), pos(B, depth), seq(B);
    for (int i = 0; i < n_blocks; i++)
        table[i] = i;
    for (int b = 0; b < B; b++)
        seq[b] = b;
    const size_t slots = (size_t)n_blocks * bs * NKV;
    bf16 *kb, *vb, *out;
    uint8_t *k8, *v8;
    float *ks, *vs, *q, *partial;
    CK(cudaMalloc(&kb, slots * D * 2));
    CK(cudaMalloc(&vb, slots * D * 2));
    CK(cudaMalloc(&k8, slots * D));
    CK(cudaMalloc(&v8, slots * D));
    fill_random(kb, slots * D * 2, 1, false);
    fill_random(vb, slots * D * 2, 2, false);
    fill_random(k8, slots * D, 3, true);
    fill_random(v8, slots * D, 4, true);
    std::vector<float> scales(slots), qh((size_t)B * NH * D), sinks(NH);
    for (auto &v : scales)
        v = 0.01f * (1.0f + rnd_nz(0.5f));
    for (auto &v : qh)
        v = rnd_nz(0.6f);
    for (auto &v : sinks)
        v = rnd_nz(3.0f);
    ks = dev_upload(scales), vs = dev_upload(scales), q = dev_upload(qh);
    float *dsink = dev_upload(sinks);
    CK(cudaMalloc(&out, (size_t)B * NH * D * 2));
    int splits = gptoss_cuda_attention_splits(B, NKV, depth + 1, sms);
    CK(cudaMalloc(&partial, (size_t)B * NH * splits * (D + 2) * 4));
    int32_t *dtab = dev_upload(table), *dpos = dev_upload(pos), *dseq = dev_upload(seq);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double us[4];
    const int reps = 20;
    for (int kind = 0; kind < 4; kind++) {
        std::vector<float> times;
        for (int r = -3; r < reps; r++) {
            CK(cudaEventRecord(e0));
            int rc = 0;
            if (kind == 0)
                rc = gptoss_cuda_attention(q, kb, vb, dpos, dseq, dtab, nb, bs, dsink, B, NH, NKV,
                                           D, 0, splits, partial, out, 0);
            else if (kind == 1)
                rc = gptoss_cuda_attention_decode(q, kb, vb, dpos, dseq, dtab, nb, bs, dsink, B, NH,
                                                  NKV, D, 0, splits, partial, out, 0);
            else if (kind == 2)
                rc = gptoss_cuda_attention_fp8(q, k8, v8, ks, vs, dpos, dseq, dtab, nb, bs, dsink,
                                               B, NH, NKV, D, 0, splits, partial, out, 0);
            else
                rc = gptoss_cuda_attention_decode_fp8(q, k8, v8, ks, vs, dpos, dseq, dtab, nb, bs,
                                                      dsink, B, NH, NKV, D, 0, splits, partial, out,
                                                      0);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            if (rc != 0) {
                fprintf(stderr, "decode attention timing: a launcher refused the shape\n");
                exit(1);
            }
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 0) times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        us[kind] = 1e3 * times[times.size() / 2];
    }
    CK(cudaGetLastError());
    const double bytes = (double)B * (depth + 1) * NKV * D * 2;
    printf("timing: decode attention 20b shape, %d tokens at depth %d (%d splits), median of %d: "
           "bf16 pages scalar "
           "%.1f us, tensor cores %.1f us (%.0f GB/s); fp8 pages scalar %.1f us, tensor cores %.1f "
           "us (%.0f GB/s)\n",
           B, depth, splits, reps, us[0], us[1], 2 * bytes / us[1] * 1e-3, us[2], us[3],
           bytes / us[3] * 1e-3);
    if (B == 1) { /* the split count for one token: the decode kernel (bf16) over 1..64 splits, and
                     the merge alone */
        CK(cudaFree(partial));
        CK(cudaMalloc(&partial, (size_t)NH * 64 * (D + 2) * 4));
        printf("timing: decode attention 20b shape, 1 token at depth %d, tensor cores by splits:",
               depth);
        for (int sp = 1; sp <= 64; sp *= 2) {
            for (int merge_only = 0; merge_only < 2; merge_only++) {
                if (merge_only && sp == 1) continue;
                std::vector<float> times;
                for (int r = -3; r < reps; r++) {
                    CK(cudaEventRecord(e0));
                    if (merge_only)
                        gptoss_cuda_attention_merge(partial, dsink, 1, NH, D, sp, out, 0);
                    else
                        gptoss_cuda_attention_decode(q, kb, vb, dpos, dseq, dtab, nb, bs, dsink, 1,
                                                     NH, NKV, D, 0, sp, partial, out, 0);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float ms = 0;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 0) times.push_back(ms);
                }
                std::sort(times.begin(), times.end());
                if (merge_only)
                    printf(" (merge %.1f)", 1e3 * times[times.size() / 2]);
                else
                    printf(" %d: %.1f us", sp, 1e3 * times[times.size() / 2]);
            }
        }
        printf("\n");
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(kb), cudaFree(vb), cudaFree(k8), cudaFree(v8), cudaFree(ks), cudaFree(vs), cudaFree(q),
        cudaFree(dsink);
    cudaFree(out), cudaFree(partial), cudaFree(dtab), cudaFree(dpos), cudaFree(dseq);
}

static const char *const kSections[] = {"rope", "attention", "kvfp8"};

int main(int argc, char **argv) {
    int st = select_sections(argc, argv, "gpu_test_kv", kSections,
                             (int)(sizeof kSections / sizeof kSections[0]));
    if (st) return st;
    open_device();

    if (want("rope")) {
        test_rope_kv(64, 8, 64);
        test_rope_kv(8, 2, 32);
        test_qkv_rope_one(64, 8, 64, 2880, 0);     /* the gpt-oss shape (2560 pairs, 320 blocks) */
        test_qkv_rope_one(64, 8, 64, 2880, 20005); /* deep: a far page, large angles */
        test_qkv_rope_one(8, 2, 32, 256, 130);
        test_qkv_rope_one(6, 3, 16, 72, 7); /* 120 pairs: a partial last block; 9 chunks per row */
        test_rope_kv(4, 4, 128);
        test_rope_kv(4, 1, 16);
    }

    if (want("attention")) {
        /* decode at depth, prefill from empty, chunked prefill, mixed batch; full and sliding */
        std::vector<std::pair<int, int>> decode_deep = {{5000, 1}};
        std::vector<std::pair<int, int>> decode_batch = {{0, 1}, {130, 1}, {2047, 1}, {700, 1}};
        std::vector<std::pair<int, int>> prefill = {{0, 300}};
        std::vector<std::pair<int, int>> chunk = {{200, 77}};
        std::vector<std::pair<int, int>> mixed = {{0, 40}, {150, 1}, {64, 33}, {3, 1}};
        for (int window : {0, 128}) {
            test_attention(64, 8, 64, decode_deep, window, 1, "decode-deep");
            test_attention(64, 8, 64, decode_deep, window, 16, "decode-deep");
            test_attention(64, 8, 64, decode_batch, window, 4, "decode-batch");
            test_attention(64, 8, 64, prefill, window, 1, "prefill");
            test_attention(64, 8, 64, chunk, window, 1, "chunked");
            test_attention(64, 8, 64, chunk, window, 3, "chunked");
            test_attention(64, 8, 64, mixed, window, 1, "mixed");
        }
        test_attention(8, 2, 32, mixed, 16, 1, "mixed");
        test_attention(4, 4, 128, chunk, 0, 2, "chunked");
        test_attention(4, 1, 16, mixed, 0, 1, "mixed");
        test_attention(32, 1, 64, decode_batch, 0, 8, "decode-batch");
        /* the decode kernel's edges: 16 heads per KV head (both halves of its m16 rows), a
         * group of 3, and splits past the end of short ranges (empty splits) */
        test_attention(32, 2, 64, decode_batch, 0, 2, "group16");
        test_attention(6, 2, 64, decode_batch, 16, 2, "group3");
        test_attention(64, 8, 64, {{37, 1}, {5, 1}, {100, 1}}, 0, 4, "empty-splits");
        time_attention_decode(1, 8192);
        time_attention_decode(1, 2048);
        time_attention_decode(128, 512);
        time_attention_decode(256, 512);
        time_attention_decode(64, 4096);
    }

    if (want("kvfp8")) {
        /* FP8 KV cache: kv_fp8.h on the device; the KV write on the shapes of the rope section;
         * split-K attention on the attention section's cases; the tensor-core kernel on
         * prefill-shaped steps (one prompt, a chunk after a prefix, a varlen mix) for every
         * head_dim and group sizes 1 to 8 */
        test_e4m3_device();
        test_rope_kv_fp8(64, 8, 64);
        test_rope_kv_fp8(8, 2, 32);
        test_rope_kv_fp8(4, 4, 128);
        test_rope_kv_fp8(4, 1, 16);
        std::vector<std::pair<int, int>> decode_deep = {{5000, 1}};
        std::vector<std::pair<int, int>> decode_batch = {{0, 1}, {130, 1}, {2047, 1}, {700, 1}};
        std::vector<std::pair<int, int>> prefill = {{0, 300}};
        std::vector<std::pair<int, int>> chunk = {{200, 77}};
        std::vector<std::pair<int, int>> mixed = {{0, 40}, {150, 1}, {64, 33}, {3, 1}};
        std::vector<std::pair<int, int>> varlen = {{0, 1},   {0, 15}, {0, 16},  {0, 17},
                                                   {0, 100}, {37, 5}, {500, 33}};
        for (int window : {0, 128}) {
            test_attention_fp8(64, 8, 64, decode_deep, window, 1, false, "decode-deep");
            test_attention_fp8(64, 8, 64, decode_deep, window, 16, false, "decode-deep");
            test_attention_fp8(64, 8, 64, decode_batch, window, 4, false, "decode-batch");
            test_attention_fp8(64, 8, 64, prefill, window, 1, true, "prefill");
            test_attention_fp8(64, 8, 64, chunk, window, 1, true, "chunked");
            test_attention_fp8(64, 8, 64, chunk, window, 3, false, "chunked");
            test_attention_fp8(64, 8, 64, mixed, window, 1, true, "mixed");
            test_attention_fp8(64, 8, 64, varlen, window, 1, true, "varlen");
        }
        test_attention_fp8(8, 2, 32, mixed, 16, 1, true, "mixed");
        test_attention_fp8(4, 4, 128, chunk, 0, 2, false, "chunked");
        test_attention_fp8(4, 4, 128, chunk, 0, 1, true, "chunked");
        test_attention_fp8(16, 2, 128, varlen, 128, 1, true, "varlen");
        test_attention_fp8(4, 1, 16, mixed, 0, 1, true, "mixed");
        test_attention_fp8(8, 8, 64, varlen, 0, 1, true, "group1");
        test_attention_fp8(6, 2, 64, varlen, 16, 1, true, "group3");
        test_attention_fp8(32, 1, 64, decode_batch, 0, 8, false, "decode-batch");
        test_attention_fp8(32, 2, 64, decode_batch, 128, 2, false, "group16");
        test_attention_fp8(64, 8, 64, {{37, 1}, {5, 1}, {100, 1}}, 0, 4, false, "empty-splits");
        time_attention_fp8(8192, 2048);
    }

    return report_results("gpu_test_kv", "kv");
}
