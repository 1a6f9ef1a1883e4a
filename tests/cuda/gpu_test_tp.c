/*
 * gpu_test_tp.c - tensor parallelism (gptoss_backend_options.tensor_parallel_size) against
 * the same model on one GPU.
 *
 * Needs 2 GPUs (4 for the size-4 pass, run when that many are visible), so it is not a ctest
 * test: `scripts/gpu-check --multi` runs it on checkpoints written by `gptoss make-model`.
 * Usage: gpu_test_tp MODEL_DIR|--random SHAPE [NAME [SIZE...]] (sizes default to 2, and 4 when
 * 4 GPUs are visible; a size that does not divide the model's heads, KV heads and experts is
 * skipped). --random SHAPE (tiny, 20b, 120b) generates the weights on the GPU from one seed:
 * over several GPUs each rank generates its slices of the same whole model (tp.cu).
 *
 * Three CUDA backends, one after the other (120b fits one GPU once), get the same model and the
 * same plans: the reference (one GPU), its noise floor (one GPU, every GEMM on the GEMV kernel,
 * experts on the route GEMV, attention on the scalar kernel, decode norm and router as two
 * kernels: the same roundings in another summation order, as in gpu_test_forward.c), and the
 * tensor-parallel backend. Tensor
 * parallelism also changes only summation order (each rank sums its heads' share of the
 * o-projection and its experts' share of the MoE, then the ranks' sums are added), so it must
 * sit within the floor's distance of the reference:
 *   - median per-row relative L2 error under 2^-8 (one bf16 ulp) or twice the floor's;
 *   - top-1 disagreements at most 2n + 1 where the floor disagrees on n rows;
 *   - rows over 3e-2 (routing flips) at most twice the floor's count plus 5% of the rows.
 * A wrong head slice, a missing or doubled bias, an expert counted on two ranks or on none
 * gives errors of order 1 on most rows.
 *
 * Plans: three prompts of 37, 80 and 5 tokens in one step (more than 64 tokens: the path that
 * reorders short runs before long ones), then 8 decode steps of the three (captured graphs);
 * and a fourth sequence alone, a 21-token prompt and 8 one-token steps (the fused decode
 * kernels). Decode feeds the reference's top-1 to every backend. Every plan also goes through
 * forward_summary on the tensor-parallel backend, whose top-1 must be the argmax of its own
 * forward rows.
 *
 * Prints one line per size and exits 1 on failure. Before it, progress lines starting with ".. "
 * (each backend, each plan and call), flushed at once, show where a run that hangs stopped.
 */
#include "gptoss.h"
#include "model/config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 1024
#define NS 4
#define BPS 16 /* pages per sequence */
#define DECODE_STEPS 8

typedef struct stats {
    int rows, top1_disagree, over;
    double rel[MAX_ROWS];
    double max_rel;
} stats;

static int argmax(const float *x, int32_t n) {
    int best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int)i;
    return best;
}

static void compare(stats *s, const float *ref, const float *got, int32_t rows, int32_t V) {
    for (int32_t r = 0; r < rows && s->rows < MAX_ROWS; r++) {
        const float *a = ref + (size_t)r * V, *b = got + (size_t)r * V;
        double num = 0, den = 0;
        for (int32_t i = 0; i < V; i++) {
            double d = (double)b[i] - a[i];
            num += d * d;
            den += (double)a[i] * a[i];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (!isfinite(rel)) rel = 1e30;
        s->rel[s->rows++] = rel;
        if (rel > s->max_rel) s->max_rel = rel;
        if (rel > 3e-2) s->over++;
        if (argmax(a, V) != argmax(b, V)) s->top1_disagree++;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(stats *s) {
    if (!s->rows) return 0;
    qsort(s->rel, (size_t)s->rows, sizeof(double), cmp_double);
    return s->rel[s->rows / 2];
}

static uint64_t rng = 88172645463325252ull;
static int32_t next_token(int32_t vocab) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int32_t)(rng % (uint64_t)vocab);
}

enum { B_REF = 0, B_FLOOR, B_TP, N_BACKENDS };
static const char *const backend_names[N_BACKENDS] = {"reference (one GPU)", "floor (one GPU)",
                                                      "tensor parallel"};

/* One progress line, on stdout at once (stdout may be a file: it is fully buffered then). */
static void progress(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs(".. ", stdout);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
}
#define MAX_LOGIT_ROWS (NS * (DECODE_STEPS + 1))

/* What a backend is made from: a loaded checkpoint, or a shape with weights generated on the
 * GPU from a seed (the same model on one GPU and over several: tp.cu). */
typedef struct source {
    const gptoss_model *model;
    gptoss_config config;
} source;

/* Runs every plan on one backend and keeps its logit rows in rows [MAX_LOGIT_ROWS, V]. With
 * choose (the reference), each decode step feeds the argmax of this backend's rows and records
 * it in tokens; otherwise it feeds the recorded tokens. Returns the number of rows, or -1
 * (printed). */
/* The size arguments' "r" suffix: the MoE split by intermediate rows (--moe-parallel tp). */
static bool g_moe_rows = false;

static int run_backend(const source *src, int kind, int32_t tp, bool choose,
                       int32_t tokens[NS][DECODE_STEPS + 1], float *rows, int *summary_bad) {
    const gptoss_config *c = &src->config;
    const int32_t V = c->vocab_size;
    gptoss_backend_options o = gptoss_backend_options_default();
    o.kind = GPTOSS_BACKEND_CUDA;
    o.kv_block_size = 16;
    o.n_kv_blocks = NS * BPS;
    o.n_sliding_kv_blocks = NS * BPS;
    if (kind == B_FLOOR)
        o.cuda_tuning = "gemv=all,norm_router=0,moe_path=1,attn_tc=0,attn_decode=0";
    if (kind == B_TP) o.tensor_parallel_size = tp;
    if (kind == B_TP && g_moe_rows) o.moe_parallel = GPTOSS_MOE_PARALLEL_TP;
    gptoss_backend *bk = NULL;
    gptoss_error err = {0};
    if (kind == B_TP)
        progress("backend %s over %d GPUs: creating", backend_names[kind], (int)tp);
    else
        progress("backend %s: creating", backend_names[kind]);
    gptoss_status st = src->model ? gptoss_backend_create(src->model, &o, &bk, &err)
                                  : gptoss_backend_create_random(c, &o, 1, &bk, &err);
    if (st) {
        fprintf(stderr, "backend %d (tensor parallel %d): %s\n", kind, kind == B_TP ? (int)tp : 1,
                err.message);
        return -1;
    }
    rng = 88172645463325252ull; /* the same prompts for every backend */
    const int32_t prompt[NS] = {37, 80, 5, 21};
    int32_t n_cached[NS] = {0, 0, 0, 0};
    enum { MAX_T = 160 };
    int32_t ids[MAX_T], pos[MAX_T], start[NS + 1], logit_idx[NS], seq_cached[NS], tables[NS * BPS];
    int n_rows = 0;
    /* two groups: sequences 0..2 together, then sequence 3 alone */
    for (int group = 0; group < 2; group++) {
        const int32_t s0 = group ? 3 : 0, s1 = group ? 4 : 3, ns = s1 - s0;
        for (int step = 0; step <= DECODE_STEPS; step++) {
            int32_t T = 0;
            for (int32_t q = 0; q < ns; q++) {
                int32_t sq = s0 + q, len = step ? 1 : prompt[sq];
                start[q] = T;
                seq_cached[q] = n_cached[sq];
                for (int32_t i = 0; i < len; i++) {
                    ids[T] = step ? tokens[sq][step - 1] : next_token(V);
                    pos[T] = n_cached[sq] + i;
                    T++;
                }
                logit_idx[q] = T - 1;
                for (int32_t b = 0; b < BPS; b++)
                    tables[q * BPS + b] = sq * BPS + b;
            }
            start[ns] = T;
            gptoss_batch_plan plan = {.n_tokens = T,
                                      .token_ids = ids,
                                      .positions = pos,
                                      .n_seqs = ns,
                                      .seq_token_start = start,
                                      .seq_n_cached = seq_cached,
                                      .max_blocks_per_seq = BPS,
                                      .block_tables = tables,
                                      .sliding_block_tables = NULL,
                                      .n_logits = ns,
                                      .logit_token_index = logit_idx};
            float *out = rows + (size_t)n_rows * V;
            progress("backend %s: sequences %d..%d, %s %d (%d tokens): forward",
                     backend_names[kind], (int)s0, (int)(s1 - 1),
                     step ? "decode step" : "prompt, step", step, (int)T);
            if (gptoss_backend_forward(bk, &plan, out, &err)) {
                fprintf(stderr, "forward on backend %d: %s\n", kind, err.message);
                gptoss_backend_free(bk);
                return -1;
            }
            if (kind == B_TP) {
                /* the summary path (rank 0 reduces the rows on its GPU); the step writes the
                 * same pages again with the same values */
                int32_t top[NS];
                float val[NS];
                gptoss_logits_summary sum = {.n_top = 1, .top_ids = top, .top_logits = val};
                progress("backend %s: the same plan: forward_summary", backend_names[kind]);
                if (gptoss_backend_forward_summary(bk, &plan, &sum, &err)) {
                    fprintf(stderr, "forward_summary (tensor parallel): %s\n", err.message);
                    gptoss_backend_free(bk);
                    return -1;
                }
                for (int32_t q = 0; q < ns; q++) {
                    const float *row = out + (size_t)q * V;
                    if (row[top[q]] != row[argmax(row, V)]) ++*summary_bad;
                }
            }
            for (int32_t q = 0; q < ns; q++) {
                int32_t sq = s0 + q;
                n_cached[sq] += step ? 1 : prompt[sq];
                if (choose) tokens[sq][step] = argmax(out + (size_t)q * V, V);
            }
            n_rows += ns;
        }
    }
    progress("backend %s: done, freeing", backend_names[kind]);
    gptoss_backend_free(bk);
    return n_rows;
}

static int run_size(const source *src, const char *name, int32_t tp) {
    const gptoss_config *c = &src->config;
    if (c->n_heads % tp || c->n_kv_heads % tp || c->n_experts % tp) {
        printf("%s, tensor parallel %d: skipped (%d heads, %d KV heads, %d experts)\n", name,
               (int)tp, (int)c->n_heads, (int)c->n_kv_heads, (int)c->n_experts);
        return 0;
    }
    const int32_t V = c->vocab_size;
    float *rows[N_BACKENDS];
    int n_rows[N_BACKENDS], summary_bad = 0, failed = 0;
    int32_t tokens[NS][DECODE_STEPS + 1];
    memset(tokens, 0, sizeof tokens);
    /* one backend at a time: 120b fits one GPU once, not three times */
    for (int b = 0; b < N_BACKENDS; b++) {
        rows[b] = malloc((size_t)MAX_LOGIT_ROWS * V * sizeof(float));
        n_rows[b] =
            rows[b] ? run_backend(src, b, tp, b == B_REF, tokens, rows[b], &summary_bad) : -1;
        failed |= n_rows[b] < 0;
    }
    if (!failed) {
        stats floor_st, tp_st;
        memset(&floor_st, 0, sizeof floor_st);
        memset(&tp_st, 0, sizeof tp_st);
        compare(&floor_st, rows[B_REF], rows[B_FLOOR], n_rows[B_REF], V);
        compare(&tp_st, rows[B_REF], rows[B_TP], n_rows[B_REF], V);
        const double fm = median(&floor_st), tm = median(&tp_st);
        const double median_bar = fm * 2 > 3.90625e-3 ? fm * 2 : 3.90625e-3;
        const int top1_bar = 2 * floor_st.top1_disagree + 1;
        const int over_bar = 2 * floor_st.over + tp_st.rows / 20;
        const bool ok = tm <= median_bar && tp_st.top1_disagree <= top1_bar &&
                        tp_st.over <= over_bar && summary_bad == 0;
        printf("%s, tensor parallel %d: %d rows, median %.2e (floor %.2e, bar %.2e), max %.2e, "
               "top-1 disagree %d (floor %d, bar %d), rows > 3e-2 %d (floor %d, bar %d), "
               "summary top-1 wrong %d: %s\n",
               name, (int)tp, tp_st.rows, tm, fm, median_bar, tp_st.max_rel, tp_st.top1_disagree,
               floor_st.top1_disagree, top1_bar, tp_st.over, floor_st.over, over_bar, summary_bad,
               ok ? "ok" : "FAIL");
        printf("| %s | TP%d | %d | %.2e | %.2e | %.2e | %d (%d) | %s |\n", name, (int)tp,
               tp_st.rows, tm, fm, tp_st.max_rel, tp_st.top1_disagree, floor_st.top1_disagree,
               ok ? "ok" : "FAIL");
        failed = !ok;
    } else {
        printf("%s, tensor parallel %d: FAIL (a backend did not run)\n", name, (int)tp);
    }
    for (int b = 0; b < N_BACKENDS; b++)
        free(rows[b]);
    return failed;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_test_tp MODEL_DIR|--random SHAPE [NAME [SIZE[r]...]]\n"
                        "(SIZEr: the experts split by intermediate rows)\n");
        return 2;
    }
    source src;
    memset(&src, 0, sizeof src);
    int arg = 1;
    gptoss_model *model = NULL;
    gptoss_error err = {0};
    const char *what = argv[1];
    if (!strcmp(argv[1], "--random")) {
        if (argc < 3) {
            fprintf(stderr, "gpu_test_tp: --random needs a shape (tiny, 20b, 120b)\n");
            return 2;
        }
        if (gptoss_config_preset(argv[2], &src.config, &err)) {
            fprintf(stderr, "%s\n", err.message);
            return 2;
        }
        what = argv[2];
        arg = 3;
    } else {
        if (gptoss_model_load(argv[1], &model, &err)) {
            fprintf(stderr, "%s: %s\n", argv[1], err.message);
            return 1;
        }
        src.model = model;
        src.config = *gptoss_model_config(model);
        arg = 2;
    }
    const char *name = argc > arg ? argv[arg] : what;
    int32_t sizes[8], n_sizes = 0;
    bool rows[8] = {false};
    for (int i = arg + 1; i < argc && n_sizes < 8; i++) {
        rows[n_sizes] = argv[i][0] && argv[i][strlen(argv[i]) - 1] == 'r';
        sizes[n_sizes++] = (int32_t)atoi(argv[i]);
    }
    const int32_t visible = gptoss_cuda_device_count();
    if (n_sizes == 0) {
        sizes[n_sizes++] = 2;
        if (visible >= 4) sizes[n_sizes++] = 4;
    }
    int failed = 0;
    for (int32_t i = 0; i < n_sizes; i++) {
        if (sizes[i] > visible) {
            printf("%s, tensor parallel %d: FAIL (%d GPUs visible)\n", name, (int)sizes[i],
                   (int)visible);
            failed = 1;
            continue;
        }
        g_moe_rows = rows[i];
        if (rows[i] && src.config.intermediate_size % (32 * sizes[i])) {
            printf("%s, tensor parallel %d, experts by rows: skipped (%d intermediate rows)\n",
                   name, (int)sizes[i], (int)src.config.intermediate_size);
            continue;
        }
        failed |= run_size(&src, name, sizes[i]);
    }
    gptoss_model_free(model);
    return failed;
}
