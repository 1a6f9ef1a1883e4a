/*
 * gpu_test_sampling.cu - the GPU sampling kernels (sampling.cu) against the rule of
 * backend/sampling_rule.h, written out plainly here.
 *
 * Needs a GPU, so it is not a ctest test: scripts/gpu-check runs it on the GPU machine. For
 * every parameter combination (greedy; temperature 0.5, 1, 1.7 x top_p 1, 0.9, 0.5, tiny x
 * top_k 0, 1, 5, 50, 1000 x min_p 0, 0.05; each with no edits, with penalties / bias / masked
 * tokens, with an allowed mask, with both) over rows built to tie (quantized values, flat
 * rows, repeated maxima, NaN and -inf, rows with nothing allowed), at V = 201,088 and
 * V = 1000, in batches of several sizes through one scratch:
 *   - the drawn token equals the reference's exactly (every mismatch is counted; any fails);
 *   - the drawn token's logprob is within 1e-5 of a double log-softmax of the raw row;
 *   - the top-20 ids equal the raw row's 20 largest (ties by lower id), logprobs within 1e-5.
 * The reference sorts the whole row by (m desc, id asc), sums integer weights in that order,
 * and walks the kept tokens in id order; its float operations are sampling_rule.h's helpers,
 * which is the point: host and GPU must agree bit for bit.
 * And the backend's hook (gptoss_cuda_forward_sample) on a tiny random-weight model: the
 * tokens it returns are the reference's on the logits the step left on the device, with the
 * masks given up front or written through the batch's fill_masks while the forward runs.
 * Then timing (CUDA events, warm-up, median) for 1, 8, 64, 256 rows at V = 201,088, unless
 * --no-timing. Prints a summary table last; exits 1 on any failure.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/sampling.h"
#include "backend/sampling_rule.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define GPU_TEST_SEED 0x5a3c9e1d2b4f6071ull
#include "gpu_test_util.h"

extern "C" {
#include "model/config.h"
}

#define TOP GPTOSS_MAX_SAMPLE_LOGPROBS

static const char *g_mode = ""; /* appended to case names: how the kernels were launched */

/* ---- the reference ------------------------------------------------------------------------ */

struct ref_row {
    gptoss_sample_row p;
    std::vector<gptoss_sample_edit> edits; /* sorted by token */
    std::vector<uint32_t> allowed;         /* empty: every token allowed */
};

/* The rule for one row, step by step. */
static int32_t ref_draw(const float *l, int V, const ref_row &r) {
    const gptoss_sample_row &p = r.p;
    std::vector<float> m(V);
    std::vector<int> edit_of(V, -1);
    for (size_t e = 0; e < r.edits.size(); e++)
        edit_of[r.edits[e].token] = (int)e;
    for (int j = 0; j < V; j++) { /* step 1 */
        float x = isnan(l[j]) ? -INFINITY : l[j];
        bool allowed = r.allowed.empty() || ((r.allowed[j / 32] >> (j % 32)) & 1u);
        if (edit_of[j] >= 0) {
            const gptoss_sample_edit &e = r.edits[edit_of[j]];
            x = GPTOSS_SR_ADD(x, e.bias);
            if (e.masked) allowed = false;
            if (!allowed) x = -INFINITY;
            if (e.seen) x = gptoss_sampling_repetition(x, p.repetition_penalty);
            if (e.output_count > 0)
                x = gptoss_sampling_freq_presence(x, p.frequency_penalty, p.presence_penalty,
                                                  e.output_count);
        } else if (!allowed) {
            x = -INFINITY;
        }
        m[j] = x;
    }
    int32_t greedy = 0; /* step 2: largest m, ties to the lower id */
    for (int j = 1; j < V; j++)
        if (m[j] > m[greedy]) greedy = j;
    const float mx = m[greedy];
    if (p.temperature == 0.0f || !isfinite(mx)) return greedy; /* no finite max: every weight 0 */
    const float scale = gptoss_sampling_scale(p.temperature);  /* step 3 */
    std::vector<uint64_t> W(V);
    for (int j = 0; j < V; j++)
        W[j] = gptoss_sampling_weight(gptoss_sampling_log2_weight(m[j], mx, scale));
    std::vector<char> kept(V);
    for (int j = 0; j < V; j++)
        kept[j] = gptoss_sampling_min_p_keeps(W[j], p.min_p); /* step 4 */
    std::vector<int32_t> order(V);
    for (int j = 0; j < V; j++)
        order[j] = j;
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return gptoss_sampling_before(m[a], a, m[b], b) != 0; });
    if (p.top_k > 0) {
        int taken = 0;
        for (int32_t j : order)
            if (kept[j]) {
                if (taken < p.top_k)
                    taken++;
                else
                    kept[j] = 0;
            }
    }
    if (p.top_p < 1.0f) {
        uint64_t z1 = 0, run = 0;
        for (int j = 0; j < V; j++)
            if (kept[j]) z1 += W[j];
        bool reached = false;
        for (int32_t j : order) {
            if (!kept[j]) continue;
            if (reached) {
                kept[j] = 0;
                continue;
            }
            run += W[j];
            reached = gptoss_sampling_top_p_reached(run, z1, p.top_p);
        }
    }
    uint64_t z2 = 0; /* step 5 */
    for (int j = 0; j < V; j++)
        if (kept[j]) z2 += W[j];
    if (z2 == 0) return greedy;
    const uint64_t t =
        gptoss_sampling_target(gptoss_sampling_random(p.seed, p.position, p.choice), z2);
    uint64_t run = 0;
    for (int j = 0; j < V; j++) {
        if (!kept[j] || W[j] == 0) continue;
        run += W[j];
        if (run > t) return j;
    }
    return -1; /* unreachable: t < z2 */
}

/* Raw log-softmax of token j (double; NaN skipped) and the row's 20 largest (ties by id). */
static double ref_lse(const float *l, int V) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++)
        if (!isnan(l[j])) mx = fmax(mx, (double)l[j]);
    for (int j = 0; j < V; j++)
        if (!isnan(l[j])) s += exp((double)l[j] - mx);
    return mx + log(s);
}
static void ref_top(const float *l, int V, int32_t *ids) {
    std::vector<int32_t> idx(V);
    for (int j = 0; j < V; j++)
        idx[j] = j;
    auto val = [&](int32_t j) { return isnan(l[j]) ? -INFINITY : (l[j] == 0.0f ? 0.0f : l[j]); };
    std::partial_sort(idx.begin(), idx.begin() + TOP, idx.end(), [&](int32_t a, int32_t b) {
        return val(a) > val(b) || (val(a) == val(b) && a < b);
    });
    for (int i = 0; i < TOP; i++)
        ids[i] = idx[i];
}

/* ---- inputs ------------------------------------------------------------------------------- */

static float rnd_normal(void) { /* Box-Muller */
    double u = rnd_unit() + 1e-12, v = rnd_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* A row of logits of one of several shapes, most of them full of ties. */
static void make_logits(float *l, int V, int shape) {
    switch (shape) {
    case 0: /* realistic: a bulk and a few strong candidates */
        for (int j = 0; j < V; j++)
            l[j] = 3.0f * rnd_normal();
        for (int k = 0; k < 20; k++)
            l[rnd_int(V)] = 8.0f + 7.0f * (float)rnd_unit();
        break;
    case 1: /* quantized to quarters: ties everywhere, the maximum several times */
        for (int j = 0; j < V; j++)
            l[j] = roundf(4.0f * rnd_normal()) / 4.0f * 2.0f;
        for (int k = 0; k < 5; k++)
            l[rnd_int(V)] = 12.0f;
        break;
    case 2: /* flat: one value almost everywhere (top_k and top_p cut inside a tie) */
        for (int j = 0; j < V; j++)
            l[j] = (rnd_u64() % 16 == 0) ? 1.5f : 1.0f;
        break;
    case 3: /* NaN, -inf and signed zeros among continuous values */
        for (int j = 0; j < V; j++) {
            uint64_t u = rnd_u64() % 64;
            l[j] = u == 0   ? NAN
                   : u == 1 ? -INFINITY
                   : u == 2 ? 0.0f
                   : u == 3 ? -0.0f
                            : 2.0f * rnd_normal();
        }
        break;
    case 4: /* bf16-rounded values (as the lm_head's inputs are): coarse ties */
        for (int j = 0; j < V; j++)
            l[j] = bf2f(f2bf(4.0f * rnd_normal()));
        break;
    default: /* a narrow spread: nearly uniform weights */
        for (int j = 0; j < V; j++)
            l[j] = 0.01f * rnd_normal();
        break;
    }
}

static const float kTemps[] = {0.5f, 1.0f, 1.7f};
static const float kTopP[] = {1.0f, 0.9f, 0.5f, 1e-6f};
static const int32_t kTopK[] = {0, 1, 5, 50, 1000};
static const float kMinP[] = {0.0f, 0.05f};
#define N_SAMPLED (3 * 4 * 5 * 2)
#define N_COMBOS ((N_SAMPLED + 1) * 4) /* + greedy, x edit variants */

/* Row parameters for combination c (every value above, each with the four edit variants). */
static ref_row make_row(int c, int V, int32_t edit_start) {
    ref_row r;
    memset(&r.p, 0, sizeof r.p);
    const int variant = c % 4, s = (c / 4) % (N_SAMPLED + 1);
    gptoss_sample_row &p = r.p;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    if (s < N_SAMPLED) {
        p.temperature = kTemps[s % 3];
        p.top_p = kTopP[(s / 3) % 4];
        p.top_k = kTopK[(s / 12) % 5];
        p.min_p = kMinP[(s / 60) % 2];
    }
    p.seed = rnd_u64();
    p.position = (rnd_u64() & 1) ? (int64_t)rnd_int(100000) : (int64_t)(rnd_u64() >> 20);
    p.choice = rnd_int(4);
    static const int32_t kLogprobs[] = {-1, 0, 1, 5, 20};
    p.n_top_logprobs = kLogprobs[rnd_int(5)];
    p.edit_start = edit_start;
    p.allowed_row = -1;
    if (variant == 1 || variant == 3) { /* penalties, bias, masked tokens */
        static const float kRep[] = {1.0f, 1.3f, 0.8f};
        p.repetition_penalty = kRep[rnd_int(3)];
        p.frequency_penalty = (rnd_u64() & 1) ? 0.5f : 0.0f;
        p.presence_penalty = (rnd_u64() & 1) ? 0.7f : 0.0f;
        static const int kCounts[] = {1, 10, 300, 3000};
        int n = std::min(kCounts[rnd_int(4)], V / 4);
        std::vector<char> used(V, 0);
        for (int k = 0; k < n; k++) {
            int t = rnd_int(V);
            if (k < 3) t = k * (V / 3) + (int)(rnd_u64() % 2) * 2047; /* chunk edges */
            if (t >= V || used[t]) continue;
            used[t] = 1;
        }
        for (int t = 0; t < V; t++) {
            if (!used[t]) continue;
            gptoss_sample_edit e;
            memset(&e, 0, sizeof e);
            e.token = t;
            e.bias = (rnd_u64() % 3 == 0) ? 0.0f : rnd_nz(5.0f);
            e.output_count = (int32_t)(rnd_u64() % 4);
            e.seen = (uint8_t)(e.output_count > 0 || (rnd_u64() & 1));
            e.masked = (uint8_t)(rnd_u64() % 10 == 0);
            r.edits.push_back(e);
        }
    }
    if (variant >= 2) { /* an allowed mask: dense, sparse, a single token or nothing */
        const int kind = rnd_int(4);
        r.allowed.assign((V + 31) / 32, 0u);
        for (int j = 0; j < V; j++) {
            bool on = kind == 0 ? (rnd_u64() & 1) : kind == 1 ? (rnd_u64() % 100 == 0) : false;
            if (on) r.allowed[j / 32] |= 1u << (j % 32);
        }
        if (kind == 2) {
            int j = rnd_int(V);
            r.allowed[j / 32] |= 1u << (j % 32);
        }
    }
    p.n_edits = (int32_t)r.edits.size();
    return r;
}

/* ---- one batch through the kernels ---------------------------------------------------------- */

struct gpu_buffers {
    int32_t rows_cap, vocab;
    float *logits;
    void *scratch, *input, *output;
    size_t input_cap;
};

static gpu_buffers gpu_alloc(int32_t rows_cap, int32_t vocab) {
    gpu_buffers g;
    g.rows_cap = rows_cap;
    g.vocab = vocab;
    CK(cudaMalloc(&g.logits, (size_t)rows_cap * vocab * sizeof(float)));
    size_t sb = gptoss_cuda_sample_scratch_bytes(rows_cap, vocab);
    CK(cudaMalloc(&g.scratch, sb));
    CK(cudaMemset(g.scratch, 0, sb));
    g.input_cap = 0;
    g.input = NULL;
    CK(cudaMalloc(&g.output, gptoss_cuda_sample_output_bytes(rows_cap)));
    return g;
}
static void gpu_free(gpu_buffers &g) {
    cudaFree(g.logits);
    cudaFree(g.scratch);
    cudaFree(g.input);
    cudaFree(g.output);
}

/* Packs rows, uploads the input (logits already on the device), runs, downloads everything. */
static void gpu_run(gpu_buffers &g, const std::vector<ref_row> &rows, std::vector<int32_t> &ids,
                    std::vector<float> &lp, std::vector<int32_t> &top_ids,
                    std::vector<float> &top_lp, uint32_t *flags_out) {
    const int n = (int)rows.size(), V = g.vocab;
    std::vector<gptoss_sample_row> p(n);
    std::vector<gptoss_sample_edit> edits;
    std::vector<uint32_t> masks;
    int n_allowed = 0;
    for (int i = 0; i < n; i++) {
        p[i] = rows[i].p;
        p[i].edit_start = (int32_t)edits.size();
        edits.insert(edits.end(), rows[i].edits.begin(), rows[i].edits.end());
        if (!rows[i].allowed.empty()) {
            p[i].allowed_row = n_allowed++;
            masks.insert(masks.end(), rows[i].allowed.begin(), rows[i].allowed.end());
        }
    }
    gptoss_sample_batch b;
    memset(&b, 0, sizeof b);
    b.rows = p.data();
    b.edits = edits.data();
    b.n_edits = (int32_t)edits.size();
    b.allowed_masks = masks.empty() ? NULL : masks.data();
    b.n_allowed_rows = n_allowed;
    size_t need = gptoss_cuda_sample_input_bytes(n, b.n_edits, n_allowed, V);
    std::vector<uint64_t> host((need + 7) / 8);
    uint32_t flags = 0;
    size_t packed = gptoss_cuda_sample_pack(host.data(), &b, n, V, &flags);
    if (packed > g.input_cap) {
        cudaFree(g.input);
        CK(cudaMalloc(&g.input, packed));
        g.input_cap = packed;
    }
    CK(cudaMemcpy(g.input, host.data(), packed, cudaMemcpyHostToDevice));
    CK(cudaMemset(g.output, 0xff, gptoss_cuda_sample_output_bytes(n))); /* poisoned */
    if (gptoss_cuda_sample(g.logits, n, V, g.input, g.scratch, g.rows_cap, g.output, flags, 0) !=
        0) {
        fprintf(stderr, "gptoss_cuda_sample refused %d rows of %d\n", n, V);
        exit(2);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    std::vector<char> out(gptoss_cuda_sample_output_bytes(n));
    CK(cudaMemcpy(out.data(), g.output, out.size(), cudaMemcpyDeviceToHost));
    ids.resize(n), lp.resize(n), top_ids.resize((size_t)n * TOP), top_lp.resize((size_t)n * TOP);
    memcpy(ids.data(), out.data(), (size_t)n * 4);
    memcpy(lp.data(), out.data() + (size_t)n * 4, (size_t)n * 4);
    memcpy(top_ids.data(), out.data() + (size_t)n * 8, (size_t)n * TOP * 4);
    memcpy(top_lp.data(), out.data() + (size_t)n * (8 + 4 * TOP), (size_t)n * TOP * 4);
    *flags_out = flags;
}

/* ---- correctness -------------------------------------------------------------------------- */

struct tally {
    long rows = 0, token_mismatch = 0, logprob_bad = 0, top_bad = 0, sampled = 0, edited = 0,
         masked = 0;
    double max_lp_err = 0;
};

/* n_batches batches of the given sizes, rows cycling through every combination from `combo`. */
static void run_batches(gpu_buffers &g, const std::vector<int> &sizes, int &combo, tally &T) {
    const int V = g.vocab;
    std::vector<float> logits;
    for (int n : sizes) {
        std::vector<ref_row> rows;
        logits.resize((size_t)n * V);
        for (int i = 0; i < n; i++) {
            rows.push_back(make_row(combo++, V, 0));
            make_logits(&logits[(size_t)i * V], V, rnd_int(6));
        }
        CK(cudaMemcpy(g.logits, logits.data(), logits.size() * sizeof(float),
                      cudaMemcpyHostToDevice));
        std::vector<int32_t> ids, top_ids;
        std::vector<float> lp, top_lp;
        uint32_t flags = 0;
        gpu_run(g, rows, ids, lp, top_ids, top_lp, &flags);
        std::vector<int32_t> want(n);
        std::vector<double> lse(n);
        std::vector<int32_t> want_top((size_t)n * TOP);
#pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            const float *l = &logits[(size_t)i * V];
            want[i] = ref_draw(l, V, rows[i]);
            lse[i] = ref_lse(l, V);
            ref_top(l, V, &want_top[(size_t)i * TOP]);
        }
        for (int i = 0; i < n; i++) {
            const gptoss_sample_row &p = rows[i].p;
            const float *l = &logits[(size_t)i * V];
            T.rows++;
            T.sampled += p.temperature > 0;
            T.edited += !rows[i].edits.empty();
            T.masked += !rows[i].allowed.empty();
            if (ids[i] != want[i]) {
                if (T.token_mismatch < 10)
                    printf("  mismatch V=%d row %d: gpu %d, reference %d (T %.2f top_p %g top_k %d "
                           "min_p %.2f, %zu edits, "
                           "%s mask)\n",
                           V, i, ids[i], want[i], p.temperature, p.top_p, p.top_k, p.min_p,
                           rows[i].edits.size(), rows[i].allowed.empty() ? "no" : "a");
                T.token_mismatch++;
                continue;
            }
            if (p.n_top_logprobs >= 0) {
                const double ref = (double)l[want[i]] - lse[i];
                const double err = fabs((double)lp[i] - ref);
                if (isfinite(ref)) {
                    T.max_lp_err = fmax(T.max_lp_err, err);
                    if (!(err <= 1e-5)) T.logprob_bad++;
                }
                bool top_ok = true;
                for (int k = 0; k < TOP; k++) {
                    const int32_t id = want_top[(size_t)i * TOP + k];
                    const double ref_k = (double)(isnan(l[id]) ? -INFINITY : l[id]) - lse[i];
                    top_ok = top_ok && top_ids[(size_t)i * TOP + k] == id;
                    if (isfinite(ref_k))
                        top_ok =
                            top_ok && fabs((double)top_lp[(size_t)i * TOP + k] - ref_k) <= 1e-5;
                }
                T.top_bad += !top_ok;
            }
        }
        (void)flags;
    }
}

static void test_vocab(int V, int rounds, const std::vector<int> &sizes) {
    int cap = *std::max_element(sizes.begin(), sizes.end());
    gpu_buffers g = gpu_alloc(cap, V);
    tally T;
    int combo = 0;
    for (int r = 0; r < rounds; r++)
        run_batches(g, sizes, combo, T);
    gpu_free(g);
    printf("V=%d: %ld rows (%ld sampled, %ld with edits, %ld with an allowed mask): %ld token "
           "mismatches, %ld logprobs "
           "off (max error %.2e), %ld top-20 rows off\n",
           V, T.rows, T.sampled, T.edited, T.masked, T.token_mismatch, T.logprob_bad, T.max_lp_err,
           T.top_bad);
    char name[160];
    snprintf(name, sizeof name, "sampling V=%d%s: token equals the rule's, %ld rows", V, g_mode,
             T.rows);
    check_true(name,
               T.token_mismatch == 0 &&
                   T.rows >=
                       (g_mode[0] ? 100 : N_COMBOS)); /* the first run covers every combination */
    snprintf(name, sizeof name, "sampling V=%d%s: drawn token's logprob within 1e-5", V, g_mode);
    check_true(name, T.logprob_bad == 0);
    snprintf(name, sizeof name, "sampling V=%d%s: top-20 ids equal, logprobs within 1e-5", V,
             g_mode);
    check_true(name, T.top_bad == 0);
}

/* The same inputs twice give the same tokens (the scratch is left as it was found). */
static void test_repeatable(void) {
    const int V = 201088, n = 16;
    gpu_buffers g = gpu_alloc(n, V);
    std::vector<float> logits((size_t)n * V);
    std::vector<ref_row> rows;
    for (int i = 0; i < n; i++) {
        rows.push_back(make_row(4 * (1 + rnd_int(N_SAMPLED)) + rnd_int(4), V, 0));
        make_logits(&logits[(size_t)i * V], V, i % 6);
    }
    CK(cudaMemcpy(g.logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
    std::vector<int32_t> a, b, ta, tb;
    std::vector<float> la, lb, pa, pb;
    uint32_t f;
    gpu_run(g, rows, a, la, ta, pa, &f);
    gpu_run(g, rows, b, lb, tb, pb, &f);
    std::vector<float> after((size_t)n * V);
    CK(cudaMemcpy(after.data(), g.logits, after.size() * sizeof(float), cudaMemcpyDeviceToHost));
    char name[160];
    snprintf(name, sizeof name, "sampling%s: same batch twice, same tokens", g_mode);
    check_true(name, a == b);
    snprintf(name, sizeof name, "sampling%s: logits left unchanged", g_mode);
    check_true(name, memcmp(after.data(), logits.data(), after.size() * sizeof(float)) == 0);
    gpu_free(g);
}

/* A batch's fill_masks: copies the step's masks into the backend's buffer (or fails). */
struct fill_source {
    const std::vector<uint32_t> *masks;
    int calls;
    bool fail;
};

static gptoss_status fill_from_source(void *user, uint32_t *dst, gptoss_error *error) {
    fill_source *f = (fill_source *)user;
    f->calls++;
    if (f->fail) {
        if (error) {
            error->status = GPTOSS_ERR_BACKEND;
            snprintf(error->message, sizeof error->message, "masks refused on purpose");
        }
        return GPTOSS_ERR_BACKEND;
    }
    if (!f->masks->empty()) memcpy(dst, f->masks->data(), f->masks->size() * sizeof(uint32_t));
    return GPTOSS_OK;
}

/* The backend's forward_sample: B one-token sequences, two steps; each step's tokens against
 * the reference on the logits the step left on the device (the hook must not change them).
 * via_fill: the masks come through fill_masks, written while the forward runs; each step
 * first runs once with a hook that fails (the call's error, no token written, nothing left
 * in flight), then again with the masks. */
static void test_forward_sample(int B, bool via_fill) {
    gptoss_error err;
    gptoss_config c;
    if (gptoss_config_preset("tiny", &c, &err) != GPTOSS_OK) {
        check_true("forward_sample: tiny preset", false);
        return;
    }
    gptoss_backend_options opt = gptoss_backend_options_default();
    opt.kind = GPTOSS_BACKEND_CUDA;
    opt.kv_block_size = 16;
    opt.n_kv_blocks = B;
    opt.n_sliding_kv_blocks = B;
    gptoss_cuda_state *s = NULL;
    if (gptoss_cuda_state_create_random(&c, &opt, 7, &s, &err) != GPTOSS_OK) {
        printf("forward_sample: %s\n", err.message);
        check_true("forward_sample: random-weight state", false);
        return;
    }
    const int V = s->config.vocab_size;
    long mismatches = 0, lp_bad = 0, top_bad = 0, fill_bad = 0;
    for (int step = 0; step < 2; step++) {
        std::vector<int32_t> ids(B), pos(B, step), start(B + 1), cached(B, step), tables(B),
            logit(B);
        for (int i = 0; i < B; i++)
            ids[i] = rnd_int(V), start[i] = i, tables[i] = i, logit[i] = i;
        start[B] = B;
        gptoss_batch_plan plan;
        memset(&plan, 0, sizeof plan);
        plan.n_tokens = B;
        plan.token_ids = ids.data();
        plan.positions = pos.data();
        plan.n_seqs = B;
        plan.seq_token_start = start.data();
        plan.seq_n_cached = cached.data();
        plan.max_blocks_per_seq = 1;
        plan.block_tables = tables.data();
        plan.n_logits = B;
        plan.logit_token_index = logit.data();
        std::vector<ref_row> rows;
        std::vector<gptoss_sample_row> p(B);
        std::vector<gptoss_sample_edit> edits;
        std::vector<uint32_t> masks;
        int n_allowed = 0;
        for (int i = 0; i < B; i++) {
            rows.push_back(make_row(rnd_int(N_COMBOS), V, 0));
            p[i] = rows[i].p;
            p[i].edit_start = (int32_t)edits.size();
            edits.insert(edits.end(), rows[i].edits.begin(), rows[i].edits.end());
            if (!rows[i].allowed.empty()) {
                p[i].allowed_row = n_allowed++;
                masks.insert(masks.end(), rows[i].allowed.begin(), rows[i].allowed.end());
            }
        }
        std::vector<int32_t> out_ids(B, -1), top_ids((size_t)B * TOP, -1);
        std::vector<float> lp(B, NAN), top_lp((size_t)B * TOP, NAN);
        gptoss_sample_batch b;
        memset(&b, 0, sizeof b);
        b.rows = p.data();
        b.edits = edits.data();
        b.n_edits = (int32_t)edits.size();
        b.allowed_masks = masks.empty() ? NULL : masks.data();
        b.n_allowed_rows = n_allowed;
        b.token_ids = out_ids.data();
        b.logprobs = lp.data();
        b.top_ids = top_ids.data();
        b.top_logprobs = top_lp.data();
        fill_source source = {&masks, 0, true};
        if (via_fill) {
            b.allowed_masks = NULL;
            b.fill_masks = fill_from_source;
            b.fill_masks_user = &source;
            const gptoss_status failed = gptoss_cuda_forward_sample(s, &plan, &b, &err);
            bool untouched = true;
            for (int i = 0; i < B; i++)
                untouched = untouched && out_ids[i] == -1;
            fill_bad += failed != GPTOSS_ERR_BACKEND || !strstr(err.message, "on purpose") ||
                        !untouched || source.calls != 1;
            source.fail = false;
        }
        if (gptoss_cuda_forward_sample(s, &plan, &b, &err) != GPTOSS_OK) {
            printf("forward_sample: %s\n", err.message);
            check_true("forward_sample: the call succeeds", false);
            gptoss_cuda_state_free(s);
            return;
        }
        fill_bad += via_fill && source.calls != 2;
        std::vector<float> logits((size_t)B * V);
        CK(cudaMemcpy(logits.data(), s->ws.logits, logits.size() * sizeof(float),
                      cudaMemcpyDeviceToHost));
        for (int i = 0; i < B; i++) {
            const float *l = &logits[(size_t)i * V];
            const int32_t want = ref_draw(l, V, rows[i]);
            mismatches += out_ids[i] != want;
            if (rows[i].p.n_top_logprobs >= 0) {
                const double lse = ref_lse(l, V);
                lp_bad += !(fabs((double)lp[i] - ((double)l[want] - lse)) <= 1e-5);
                if (rows[i].p.n_top_logprobs > 0) {
                    int32_t want_top[TOP];
                    ref_top(l, V, want_top);
                    for (int k = 0; k < TOP; k++)
                        top_bad += top_ids[(size_t)i * TOP + k] != want_top[k] ||
                                   !(fabs((double)top_lp[(size_t)i * TOP + k] -
                                          ((double)l[want_top[k]] - lse)) <= 1e-5);
                }
            }
        }
    }
    gptoss_cuda_state_free(s);
    char name[160];
    snprintf(name, sizeof name,
             "forward_sample, tiny model, %d rows x 2 steps%s: tokens, logprobs, top-20", B,
             via_fill ? ", masks through fill_masks" : "");
    printf("%s: %ld token mismatches, %ld logprobs off, %ld top entries off, %ld fill_masks "
           "faults\n",
           name, mismatches, lp_bad, top_bad, fill_bad);
    check_true(name, mismatches == 0 && lp_bad == 0 && top_bad == 0 && fill_bad == 0);
}

/* ---- timing ------------------------------------------------------------------------------- */

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct timing_row {
    int n;
    double summary_us, greedy_us, default_us, top_us, logprobs_us;
};

static void time_sampling(std::vector<timing_row> &table) {
    const int V = 201088, cap = 256, reps = 20;
    gpu_buffers g = gpu_alloc(cap, V);
    {
        std::vector<float> logits((size_t)cap * V);
        for (int i = 0; i < cap; i++)
            make_logits(&logits[(size_t)i * V], V, 0);
        CK(cudaMemcpy(g.logits, logits.data(), logits.size() * sizeof(float),
                      cudaMemcpyHostToDevice));
    }
    void *sum_scratch = NULL;
    CK(cudaMalloc(&sum_scratch, gptoss_cuda_logits_summary_scratch(cap, V)));
    int32_t *sum_ids;
    float *sum_vals, *sum_lse;
    CK(cudaMalloc(&sum_ids, (size_t)cap * 64 * 4));
    CK(cudaMalloc(&sum_vals, (size_t)cap * 64 * 4));
    CK(cudaMalloc(&sum_lse, (size_t)cap * 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int n : {1, 8, 64, 256}) {
        timing_row tr;
        tr.n = n;
        auto time_it = [&](auto launch) {
            std::vector<double> us;
            for (int r = 0; r < reps + 3; r++) {
                CK(cudaEventRecord(e0, 0));
                launch();
                CK(cudaEventRecord(e1, 0));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 3) us.push_back(ms * 1e3);
            }
            CK(cudaGetLastError());
            return median(us);
        };
        tr.summary_us = time_it([&] {
            gptoss_cuda_logits_summary(g.logits, n, V, 64, sum_scratch, sum_ids, sum_vals, sum_lse,
                                       0);
        });
        /* 0: greedy, 1: temperature 1 (the default), 2: top_p 0.9 + top_k 50, 3: default + 5
         * logprobs */
        for (int mode = 0; mode < 4; mode++) {
            std::vector<gptoss_sample_row> p(n);
            for (int i = 0; i < n; i++) {
                memset(&p[i], 0, sizeof p[i]);
                p[i].temperature = mode == 0 ? 0.0f : 1.0f;
                p[i].top_p = mode == 2 ? 0.9f : 1.0f;
                p[i].top_k = mode == 2 ? 50 : 0;
                p[i].repetition_penalty = 1.0f;
                p[i].seed = 1000 + i;
                p[i].position = 77;
                p[i].n_top_logprobs = mode == 3 ? 5 : -1;
                p[i].allowed_row = -1;
            }
            gptoss_sample_batch b;
            memset(&b, 0, sizeof b);
            b.rows = p.data();
            size_t need = gptoss_cuda_sample_input_bytes(n, 0, 0, V);
            std::vector<uint64_t> host((need + 7) / 8);
            uint32_t flags = 0;
            size_t packed = gptoss_cuda_sample_pack(host.data(), &b, n, V, &flags);
            if (packed > g.input_cap) {
                cudaFree(g.input);
                CK(cudaMalloc(&g.input, packed));
                g.input_cap = packed;
            }
            CK(cudaMemcpy(g.input, host.data(), packed, cudaMemcpyHostToDevice));
            double us = time_it([&] {
                gptoss_cuda_sample(g.logits, n, V, g.input, g.scratch, cap, g.output, flags, 0);
            });
            (mode == 0   ? tr.greedy_us
             : mode == 1 ? tr.default_us
             : mode == 2 ? tr.top_us
                         : tr.logprobs_us) = us;
        }
        printf("timing: %3d rows of %d: summary (top-64) %.1f us; sampling: greedy %.1f, "
               "temperature 1 %.1f, top_p 0.9 + "
               "top_k 50 %.1f, temperature 1 + logprobs %.1f us (PDL %s)\n",
               n, V, tr.summary_us, tr.greedy_us, tr.default_us, tr.top_us, tr.logprobs_us,
               gptoss_cuda_pdl_enabled() ? "on" : "off");
        table.push_back(tr);
    }
    cudaFree(sum_scratch);
    cudaFree(sum_ids);
    cudaFree(sum_vals);
    cudaFree(sum_lse);
    gpu_free(g);
}

int main(int argc, char **argv) {
    bool timing = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-timing")) {
            timing = false;
        } else {
            fprintf(stderr, "usage: gpu_test_sampling [--no-timing]\n");
            return 2;
        }
    }
    const cudaDeviceProp prop = open_device();
    gptoss_cuda_set_pdl(false);
    /* V = 1000: every combination many times, batch sizes that reuse one scratch */
    test_vocab(1000, 6, {1, 7, 256, 64, 3, 200, 256});
    /* the real vocabulary: every combination twice over, in batches of 1 to 64 rows */
    test_vocab(201088, 1,
               {1, 64, 5, 64, 64, 33, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 2});
    /* a vocabulary not a multiple of the chunk, smaller than one chunk */
    test_vocab(2048 * 3 + 17, 1, {N_COMBOS});
    test_vocab(100, 1, {N_COMBOS});
    test_repeatable();
    if (prop.major >=
        9) { /* the launches chained by programmatic dependent launch, as the backend runs them */
        gptoss_cuda_set_pdl(true);
        g_mode = ", PDL";
        test_vocab(1000, 2, {1, 7, 256, 64, 3, 200, 256});
        test_vocab(201088, 1, {64, 1, 33, 64, 5});
        test_repeatable();
    }
    test_forward_sample(1, false);
    test_forward_sample(16, false);
    test_forward_sample(16, true);

    std::vector<timing_row> table;
    if (timing) time_sampling(table);

    int failed = 0;
    printf("\n| sampling case | result |\n|---|---|\n");
    for (auto &r : results) {
        printf("| %s | %s |\n", r.name, r.ok ? "ok" : "FAIL");
        failed += !r.ok;
    }
    if (!table.empty()) {
        printf("\n| rows (V = 201,088) | summary top-64 (us) | greedy (us) | T = 1 (us) | top_p "
               "0.9 + top_k 50 (us) | "
               "T = 1 + logprobs (us) |\n|---:|---:|---:|---:|---:|---:|\n");
        for (auto &t : table)
            printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", t.n, t.summary_us, t.greedy_us,
                   t.default_us, t.top_us, t.logprobs_us);
    }
    printf("\ngpu_test_sampling: %zu cases, %d failed\n", results.size(), failed);
    return failed ? 1 : 0;
}
