/*
 * test_eagle3.c - EAGLE3 draft heads: the loader refuses every malformed head with a message
 * (never a crash), the CPU forward matches a naive double-precision reference written here
 * from the EAGLE3 design, and d2t maps draft ids to the target ids the file says.
 */
#include "test_support.h"

#include "backend/cpu/eagle3_forward.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "model/eagle3.h"
#include "tools/eagle3_writer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gptoss_eagle3_config small_config(void) {
    gptoss_eagle3_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 512;
    c.draft_vocab_size = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.aux_layer_ids[0] = 1, c.aux_layer_ids[1] = 2, c.aux_layer_ids[2] = 3;
    return c;
}

static char *write_head(const gptoss_eagle3_config *c, uint64_t seed, bool with_embed) {
    char *dir = ts_mkdtemp();
    gptoss_error err = {0};
    if (gptoss_eagle3_write_random(c, dir, seed, with_embed, &err) != GPTOSS_OK)
        fail_msg("write: %s", err.message);
    return dir;
}

/* Loading dir must fail with a message containing `needle`. */
static void expect_load_error(const char *dir, const char *needle) {
    gptoss_eagle3_head *h = NULL;
    gptoss_error err = {0};
    gptoss_status st = gptoss_eagle3_load(dir, &h, &err);
    if (st == GPTOSS_OK) fail_msg("loaded a bad head (expected \"%s\")", needle);
    assert_null(h);
    if (!strstr(err.message, needle)) fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
}

/* ---- rewriting a head's safetensors with one tensor changed ------------------------------- */

typedef struct rewrite {
    const gptoss_st_file *src;
    const char *name;   /* the tensor to change (NULL: none) */
    bool drop;          /* leave it out */
    gptoss_dtype dtype; /* else its new dtype (UNKNOWN: same) */
    int64_t shape[2];   /* and shape (shape[0] == 0: same) */
    int64_t d2t_poke;   /* != 0: d2t[5] becomes this */
    gptoss_st_write_tensor out[32];
    int64_t shapes[32][GPTOSS_MAX_DIMS];
    const gptoss_st_tensor *from[32];
    size_t n;
} rewrite;

static void rewrite_fill(void *user, size_t index, uint64_t offset, uint8_t *out, size_t len) {
    const rewrite *r = user;
    const gptoss_st_tensor *t = r->from[index];
    uint64_t have = t->end - t->begin;
    for (size_t b = 0; b < len; b++) {
        uint64_t at = offset + b;
        out[b] = at < have ? t->data[at] : 0;
        if (r->d2t_poke && strcmp(t->name, "d2t") == 0 && at >= 40 && at < 48)
            out[b] = (uint8_t)((uint64_t)r->d2t_poke >> (8 * (at - 40)));
    }
}

static void rewrite_written(void *user, uint64_t bytes) {
    (void)user, (void)bytes;
}

static void rewrite_head(const char *good, const char *bad_dir, rewrite *r) {
    char *src_path = ts_path(good, "model.safetensors");
    gptoss_st_file *f;
    gptoss_error err = {0};
    if (gptoss_st_open(src_path, &f, &err) != GPTOSS_OK) fail_msg("open: %s", err.message);
    r->n = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const gptoss_st_tensor *t = &f->tensors[i];
        bool target = r->name && strcmp(t->name, r->name) == 0;
        if (target && r->drop) continue;
        size_t k = r->n++;
        r->from[k] = t;
        memcpy(r->shapes[k], t->shape, sizeof t->shape);
        r->out[k] = (gptoss_st_write_tensor){t->name, t->dtype, t->n_dims, r->shapes[k]};
        if (target && r->dtype != GPTOSS_DTYPE_UNKNOWN) r->out[k].dtype = r->dtype;
        if (target && r->shape[0]) {
            r->out[k].n_dims = r->shape[1] ? 2 : 1;
            r->shapes[k][0] = r->shape[0];
            r->shapes[k][1] = r->shape[1];
        }
    }
    char *dst = ts_path(bad_dir, "model.safetensors");
    if (gptoss_st_write(dst, r->out, r->n, rewrite_fill, rewrite_written, r, &err) != GPTOSS_OK)
        fail_msg("rewrite: %s", err.message);
    gptoss_st_close(f);
    free(src_path);
    free(dst);
}

static char *copy_config(const char *good) {
    char *dir = ts_mkdtemp();
    char *from = ts_path(good, "config.json"), *to = ts_path(dir, "config.json");
    size_t len;
    char *text = ts_read_file(from, &len);
    assert_non_null(text);
    ts_write_file(to, text, len);
    free(text), free(from), free(to);
    return dir;
}

static void expect_tensor_error(const char *good, rewrite r, const char *needle) {
    char *dir = copy_config(good);
    rewrite_head(good, dir, &r);
    expect_load_error(dir, needle);
    ts_rmtree(dir);
    free(dir);
}

static void expect_config_error(const char *good, const char *from, const char *to,
                                const char *needle) {
    char *dir = ts_mkdtemp();
    char *src = ts_path(good, "config.json"), *dst = ts_path(dir, "config.json");
    size_t len;
    char *text = ts_read_file(src, &len);
    assert_non_null(text);
    char *at = strstr(text, from);
    if (!at) fail_msg("config.json lacks %s", from);
    size_t n_from = strlen(from), n_to = strlen(to);
    char *edited = malloc(len + n_to + 1);
    memcpy(edited, text, (size_t)(at - text));
    memcpy(edited + (at - text), to, n_to);
    strcpy(edited + (at - text) + n_to, at + n_from);
    ts_write_file(dst, edited, strlen(edited));
    rewrite r = {0};
    rewrite_head(good, dir, &r);
    if (needle) {
        expect_load_error(dir, needle);
    } else { /* the edit is one the loader accepts */
        gptoss_eagle3_head *h = NULL;
        gptoss_error err = {0};
        if (gptoss_eagle3_load(dir, &h, &err) != GPTOSS_OK) fail_msg("%s: %s", to, err.message);
        gptoss_eagle3_free(h);
    }
    ts_rmtree(dir);
    free(dir), free(src), free(dst), free(text), free(edited);
}

static void test_loader_refuses_bad_heads(void **state) {
    (void)state;
    gptoss_eagle3_config c = small_config();
    char *good = write_head(&c, 7, false);
    gptoss_eagle3_head *h;
    gptoss_error err = {0};
    if (gptoss_eagle3_load(good, &h, &err) != GPTOSS_OK) fail_msg("load: %s", err.message);
    assert_null(gptoss_eagle3_head_weights(h)->embed.data); /* none written: the target's */
    int32_t b[3];
    assert_int_equal(gptoss_eagle3_check_target(h, 64, 512, 4, b, &err), GPTOSS_OK);
    /* first id 1: ids name layers whose output is read */
    assert_int_equal(b[0], 2), assert_int_equal(b[1], 3), assert_int_equal(b[2], 4);
    assert_int_not_equal(gptoss_eagle3_check_target(h, 128, 512, 4, b, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "64")), assert_non_null(strstr(err.message, "128"));
    assert_int_not_equal(gptoss_eagle3_check_target(h, 64, 201088, 4, b, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "512")), assert_non_null(strstr(err.message, "201088"));
    assert_int_not_equal(gptoss_eagle3_check_target(h, 64, 512, 3, b, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "3 layers"));
    gptoss_eagle3_free(h);

    /* missing files */
    char *empty = ts_mkdtemp();
    expect_load_error(empty, "config.json");
    char *cfg = copy_config(good);
    expect_load_error(cfg, "no *.safetensors");
    /* a truncated safetensors file */
    char *src = ts_path(good, "model.safetensors"), *dst = ts_path(cfg, "model.safetensors");
    size_t len;
    char *bytes = ts_read_file(src, &len);
    ts_write_file(dst, bytes, len / 2);
    gptoss_eagle3_head *none = NULL;
    assert_int_not_equal(gptoss_eagle3_load(cfg, &none, &err), GPTOSS_OK);
    assert_null(none);
    ts_write_file(dst, bytes, 5);
    assert_int_not_equal(gptoss_eagle3_load(cfg, &none, &err), GPTOSS_OK);
    free(bytes), free(src), free(dst);

    /* config.json */
    expect_config_error(good, "LlamaForCausalLMEagle3", "LlamaForCausalLM", "architectures");
    expect_config_error(good, "\"num_hidden_layers\": 1", "\"num_hidden_layers\": 2",
                        "num_hidden_layers");
    expect_config_error(good, "\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 8}",
                        "rope_scaling");
    expect_config_error(good, "\"rope_scaling\": null",
                        "\"rope_scaling\": {\"rope_type\": \"default\"}", NULL);
    expect_config_error(good, "\"rope_scaling\": null", "\"rope_theta\": 10000.0", NULL);
    expect_config_error(good, "\"hidden_size\": 64", "\"hidden_size\": \"64\"", "hidden_size");
    expect_config_error(good, "\"draft_vocab_size\": 64", "\"draft_vocab_size\": 100000",
                        "draft_vocab_size");
    expect_config_error(good, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3",
                        "num_key_value_heads");
    /* head_dim absent: its default, hidden_size / num_attention_heads (64 / 64 = 1), is held
     * to head_dim's range like a written one (the later key wins in the parser) */
    expect_config_error(good, "\"head_dim\": 16", "\"head_dim\": null, \"num_attention_heads\": 64",
                        "\"head_dim\" is absent and its default from the other fields, 1");
    expect_config_error(good, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act");
    expect_config_error(good, "\"hidden_act\": \"silu\"",
                        "\"hidden_act\": \"silu\", \"norm_before_fc\": true", "norm_before_fc");
    expect_config_error(good, "\"use_aux_hidden_state\": true", "\"use_aux_hidden_state\": tru",
                        "config.json: line");
    expect_config_error(good, "1,\n      2,\n      3\n", "1, 2\n", "eagle_aux_hidden_state");
    /* a config whose shapes no longer match the tensors */
    expect_config_error(good, "\"intermediate_size\": 96", "\"intermediate_size\": 95",
                        "expected shape [95,64]");

    /* tensors: missing, wrong shape, wrong dtype, d2t out of range */
    expect_tensor_error(good, (rewrite){.name = "fc.weight", .drop = true}, "fc.weight is missing");
    expect_tensor_error(good, (rewrite){.name = "t2d", .drop = true}, "t2d is missing");
    expect_tensor_error(good, (rewrite){.name = "midlayer.self_attn.q_proj.weight", .drop = true},
                        "q_proj.weight is missing");
    expect_tensor_error(good, (rewrite){.name = "fc.weight", .shape = {64, 128}},
                        "fc.weight: expected shape [64,192], file has [64,128]");
    expect_tensor_error(good, (rewrite){.name = "lm_head.weight", .shape = {63, 64}},
                        "lm_head.weight: expected shape [64,64], file has [63,64]");
    expect_tensor_error(good, (rewrite){.name = "norm.weight", .shape = {65}},
                        "norm.weight: expected shape [64]");
    expect_tensor_error(good, (rewrite){.name = "d2t", .dtype = GPTOSS_DTYPE_I32, .shape = {128}},
                        "d2t: expected dtype I64");
    expect_tensor_error(
        good, (rewrite){.name = "lm_head.weight", .dtype = GPTOSS_DTYPE_F16, .shape = {64, 64}},
        "expected dtype BF16");
    expect_tensor_error(good, (rewrite){.d2t_poke = 100000}, "outside the vocabulary of 512");
    expect_tensor_error(good, (rewrite){.d2t_poke = -6}, "outside the vocabulary");
    /* a head over the whole vocabulary may leave d2t and t2d out (identity) */
    gptoss_eagle3_config full = small_config();
    full.draft_vocab_size = full.vocab_size;
    char *whole = write_head(&full, 9, false), *bare = copy_config(whole);
    rewrite_head(whole, bare, &(rewrite){.name = "d2t", .drop = true});
    char *bare2 = copy_config(whole);
    rewrite_head(bare, bare2, &(rewrite){.name = "t2d", .drop = true});
    if (gptoss_eagle3_load(bare2, &h, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    for (int32_t d = 0; d < full.vocab_size; d++)
        assert_int_equal(gptoss_eagle3_target_token(gptoss_eagle3_head_weights(h), d), d);
    gptoss_eagle3_free(h);
    ts_rmtree(whole), ts_rmtree(bare), ts_rmtree(bare2);
    free(whole), free(bare), free(bare2);
    ts_rmtree(empty), ts_rmtree(cfg), ts_rmtree(good);
    free(empty), free(cfg), free(good);
}

/* ---- the forward against a double-precision reference ------------------------------------ */

static double w_at(const gptoss_tensor *t, int64_t r, int64_t c) {
    const uint8_t *p = (const uint8_t *)t->data + 2 * (r * t->shape[1] + c);
    return gptoss_bf16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static double v_at(const gptoss_tensor *t, int64_t i) {
    const uint8_t *p = (const uint8_t *)t->data + 2 * i;
    return gptoss_bf16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static void ref_linear(double *y, const gptoss_tensor *w, const double *x) {
    for (int64_t r = 0; r < w->shape[0]; r++) {
        double s = 0;
        for (int64_t c = 0; c < w->shape[1]; c++)
            s += w_at(w, r, c) * x[c];
        y[r] = s;
    }
}

static void ref_norm(double *y, const double *x, const gptoss_tensor *g, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = v_at(g, i) * x[i] * inv;
}

static void ref_rope(double *v, int d, int pos, double theta) {
    for (int j = 0; j < d / 2; j++) {
        double f = pow(theta, -2.0 * j / d), a = pos * f;
        double x = v[j], y = v[j + d / 2];
        v[j] = x * cos(a) - y * sin(a);
        v[j + d / 2] = y * cos(a) + x * sin(a);
    }
}

/* One sequence's reference state: K, V of every position so far. */
typedef struct ref_seq {
    double k[64][32], v[64][32]; /* [position][NKV*D] (small config: 2 * 16) */
    int n;
} ref_seq;

/* The head at the next position of s: input embed[H] and either aux[3H] or hidden[H]. */
static void ref_step(const gptoss_eagle3_head *head, ref_seq *s, int pos, const float *embed,
                     const float *aux, const float *hidden_in, double *prenorm, double *logits) {
    const gptoss_eagle3_config *c = gptoss_eagle3_head_config(head);
    const gptoss_eagle3_weights *w = gptoss_eagle3_head_weights(head);
    enum { H = 64, I = 96, NH = 4, NKV = 2, D = 16, DV = 64 };
    double hidden[H], x[2 * H], q[NH * D], k[NKV * D], v[NKV * D], attn[NH * D], h[H], t[H];
    double gate[I], up[I], act[I], down[H];
    if (aux) {
        double a[3 * H];
        for (int i = 0; i < 3 * H; i++)
            a[i] = aux[i];
        ref_linear(hidden, &w->fc, a);
    } else {
        for (int i = 0; i < H; i++)
            hidden[i] = hidden_in[i];
    }
    double e[H];
    for (int i = 0; i < H; i++)
        e[i] = embed[i];
    ref_norm(x, e, &w->input_norm, H, c->rms_norm_eps);           /* embeds first, */
    ref_norm(x + H, hidden, &w->hidden_norm, H, c->rms_norm_eps); /* then the hidden state */
    ref_linear(q, &w->q, x);
    ref_linear(k, &w->k, x);
    ref_linear(v, &w->v, x);
    for (int hh = 0; hh < NH; hh++)
        ref_rope(q + hh * D, D, pos, c->rope_theta);
    for (int g = 0; g < NKV; g++)
        ref_rope(k + g * D, D, pos, c->rope_theta);
    memcpy(s->k[s->n], k, sizeof k);
    memcpy(s->v[s->n], v, sizeof v);
    s->n++;
    for (int hh = 0; hh < NH; hh++) {
        int g = hh / (NH / NKV);
        double sc[64], mx = -1e300, sum = 0;
        for (int j = 0; j < s->n; j++) {
            double d = 0;
            for (int i = 0; i < D; i++)
                d += q[hh * D + i] * s->k[j][g * D + i];
            sc[j] = d / sqrt((double)D);
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = 0; j < s->n; j++)
            sum += (sc[j] = exp(sc[j] - mx));
        for (int i = 0; i < D; i++) {
            double o = 0;
            for (int j = 0; j < s->n; j++)
                o += sc[j] / sum * s->v[j][g * D + i];
            attn[hh * D + i] = o;
        }
    }
    ref_linear(h, &w->o, attn);
    for (int i = 0; i < H; i++)
        h[i] += hidden[i]; /* the residual is the fc output (or the fed-back state) */
    ref_norm(t, h, &w->post_norm, H, c->rms_norm_eps);
    ref_linear(gate, &w->gate, t);
    ref_linear(up, &w->up, t);
    for (int i = 0; i < I; i++)
        act[i] = gate[i] / (1 + exp(-gate[i])) * up[i];
    ref_linear(down, &w->down, act);
    for (int i = 0; i < H; i++)
        prenorm[i] = h[i] + down[i];
    ref_norm(t, prenorm, &w->final_norm, H, c->rms_norm_eps);
    ref_linear(logits, &w->lm_head, t);
    (void)DV;
}

static float uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void expect_close(const float *got, const double *want, int n, double tol,
                         const char *what) {
    double max_err = 0, max_ref = 0;
    for (int i = 0; i < n; i++) {
        max_err = fmax(max_err, fabs(got[i] - want[i]));
        max_ref = fmax(max_ref, fabs(want[i]));
    }
    if (!(max_err <= tol * fmax(1.0, max_ref)))
        fail_msg("%s: max error %g (reference max %g)", what, max_err, max_ref);
}

static void test_forward_matches_reference(void **state) {
    (void)state;
    gptoss_eagle3_config c = small_config();
    char *dir = write_head(&c, 11, true);
    gptoss_eagle3_head *head;
    gptoss_error err = {0};
    if (gptoss_eagle3_load(dir, &head, &err) != GPTOSS_OK) fail_msg("load: %s", err.message);
    gptoss_eagle3_cpu *f;
    assert_int_equal(gptoss_eagle3_cpu_create(head, &f, &err), GPTOSS_OK);
    enum { H = 64, DV = 64, NSEQ = 3, STEPS = 3 };
    static float aux[NSEQ][40][3 * H], embed[NSEQ][40][H], prenorm[NSEQ][40][H];
    static float logits[NSEQ][40][DV];
    uint64_t rng = 42;
    for (int s = 0; s < NSEQ; s++)
        for (int p = 0; p < 40; p++) {
            for (int i = 0; i < 3 * H; i++)
                aux[s][p][i] = 2.0f * uniform(&rng);
            for (int i = 0; i < H; i++)
                embed[s][p][i] = uniform(&rng);
        }
    gptoss_eagle3_kv kv[NSEQ];
    memset(kv, 0, sizeof kv);
    static ref_seq ref[NSEQ];
    memset(ref, 0, sizeof ref);
    kv[2].start = 5; /* a cache that starts later (prefix-cache hit): positions from 5 */
    int next[NSEQ] = {0, 0, 5};
    /* Steps: several target rows per sequence interleaved in one call, then chained rows
     * that feed back the head's own prenorm. */
    const int n_target[STEPS][NSEQ] = {{4, 1, 3}, {2, 3, 0}, {1, 1, 1}};
    for (int step = 0; step < STEPS; step++) {
        for (int chained = 0; chained < 2; chained++) {
            gptoss_eagle3_row rows[16];
            int n = 0, owner[16];
            for (int round = 0; round < 4; round++)
                for (int s = 0; s < NSEQ; s++) {
                    int want = chained ? (round == 0 && step > 0) : n_target[step][s];
                    if (round >= want) continue;
                    int p = next[s]++;
                    rows[n] = (gptoss_eagle3_row){.kv = &kv[s],
                                                  .position = p,
                                                  .embed = embed[s][p],
                                                  .aux = chained ? NULL : aux[s][p],
                                                  .hidden = chained ? prenorm[s][p - 1] : NULL,
                                                  .prenorm = prenorm[s][p],
                                                  .logits = logits[s][p],
                                                  .want_token = true};
                    owner[n++] = s;
                }
            if (n == 0) continue;
            assert_int_equal(gptoss_eagle3_cpu_forward(f, rows, n, &err), GPTOSS_OK);
            for (int r = 0; r < n; r++) {
                int s = owner[r], p = rows[r].position;
                double want_pre[H], want_logits[DV];
                ref[s].n = p - kv[s].start;
                ref_step(head, &ref[s], p, embed[s][p], rows[r].aux, rows[r].hidden, want_pre,
                         want_logits);
                expect_close(prenorm[s][p], want_pre, H, 2e-5, "prenorm");
                expect_close(logits[s][p], want_logits, DV, 2e-5, "logits");
                int best = 0;
                for (int d = 1; d < DV; d++)
                    if (want_logits[d] > want_logits[best]) best = d;
                if (fabs(want_logits[best] - logits[s][p][rows[r].draft_token]) > 1e-4)
                    fail_msg("draft token %d, reference argmax %d", rows[r].draft_token, best);
            }
        }
    }
    /* A row that does not continue its cache is refused. */
    gptoss_eagle3_row bad = {.kv = &kv[0],
                             .position = 0,
                             .embed = embed[0][0],
                             .aux = aux[0][0],
                             .prenorm = prenorm[0][0]};
    assert_int_equal(gptoss_eagle3_cpu_forward(f, &bad, 1, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    for (int s = 0; s < NSEQ; s++)
        free(kv[s].k), free(kv[s].v);
    gptoss_eagle3_cpu_free(f);
    gptoss_eagle3_free(head);
    ts_rmtree(dir);
    free(dir);
}

/* ---- d2t ---------------------------------------------------------------------------------- */

static void test_draft_to_target(void **state) {
    (void)state;
    gptoss_eagle3_config c = small_config();
    char *dir = write_head(&c, 3, false);
    gptoss_eagle3_head *head;
    gptoss_error err = {0};
    if (gptoss_eagle3_load(dir, &head, &err) != GPTOSS_OK) fail_msg("load: %s", err.message);
    const gptoss_eagle3_weights *w = gptoss_eagle3_head_weights(head);
    /* Read d2t and t2d straight from the file. */
    char *path = ts_path(dir, "model.safetensors");
    gptoss_st_file *file;
    assert_int_equal(gptoss_st_open(path, &file, &err), GPTOSS_OK);
    const gptoss_st_tensor *d2t = gptoss_st_find(file, "d2t"), *t2d = gptoss_st_find(file, "t2d");
    assert_non_null(d2t), assert_non_null(t2d);
    assert_int_equal(d2t->dtype, GPTOSS_DTYPE_I64);
    assert_int_equal(t2d->dtype, GPTOSS_DTYPE_BOOL);
    int n_marked = 0;
    for (int64_t id = 0; id < c.vocab_size; id++)
        n_marked += t2d->data[id] != 0;
    assert_int_equal(n_marked, c.draft_vocab_size);
    int32_t previous = -1;
    for (int32_t d = 0; d < c.draft_vocab_size; d++) {
        int64_t offset;
        memcpy(&offset, d2t->data + 8 * d, 8);
        int32_t target = gptoss_eagle3_target_token(w, d);
        assert_int_equal(target, d + offset); /* the published rule: target = d + d2t[d] */
        assert_true(t2d->data[target]);
        assert_true(target > previous); /* the draft vocabulary keeps the target's order */
        assert_int_equal(target, gptoss_eagle3_random_draft_target(&c, 3, d));
        previous = target;
    }
    assert_true(gptoss_eagle3_target_token(w, c.draft_vocab_size - 1) != c.draft_vocab_size - 1);
    gptoss_st_close(file);
    gptoss_eagle3_free(head);
    ts_rmtree(dir);
    free(dir), free(path);
}

/* The make-model presets write heads the loader takes, with the published config fields. */
static void test_make_model_presets(void **state) {
    (void)state;
    char *dir = ts_mkdtemp(), *out = NULL;
    int rc =
        ts_run(&out, "'%s' make-model --preset eagle3-tiny -o '%s/h'", ts_env("GPTOSS_BIN"), dir);
    if (rc != 0) fail_msg("make-model: %s", out ? out : "");
    free(out);
    char *head_dir = ts_path(dir, "h");
    gptoss_eagle3_head *head;
    gptoss_error err = {0};
    if (gptoss_eagle3_load(head_dir, &head, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    const gptoss_eagle3_config *c = gptoss_eagle3_head_config(head);
    assert_int_equal(c->hidden_size, 128);
    assert_int_equal(c->vocab_size, 201088);
    int32_t b[3];
    assert_int_equal(gptoss_eagle3_check_target(head, 128, 201088, 4, b, &err), GPTOSS_OK);
    gptoss_eagle3_free(head);
    gptoss_eagle3_config big;
    assert_int_equal(gptoss_eagle3_preset("eagle3-120b", &big, &err), GPTOSS_OK);
    assert_int_equal(big.hidden_size, 2880), assert_int_equal(big.intermediate_size, 17280);
    assert_int_equal(big.draft_vocab_size, 32000), assert_int_equal(big.aux_layer_ids[2], 33);
    assert_int_equal(gptoss_eagle3_boundaries(&big, 36, b, &err), GPTOSS_OK);
    assert_int_equal(b[0], 2), assert_int_equal(b[1], 18), assert_int_equal(b[2], 34);
    /* the other convention: ids are boundaries (e.g. [24, 30, 36] of 36 layers) */
    big.aux_layer_ids[0] = 24, big.aux_layer_ids[1] = 30, big.aux_layer_ids[2] = 36;
    assert_int_equal(gptoss_eagle3_boundaries(&big, 36, b, &err), GPTOSS_OK);
    assert_int_equal(b[0], 24), assert_int_equal(b[2], 36);
    assert_int_not_equal(gptoss_eagle3_preset("eagle3-7b", &big, &err), GPTOSS_OK);
    ts_rmtree(dir);
    free(dir), free(head_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_refuses_bad_heads),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_draft_to_target),
        cmocka_unit_test(test_make_model_presets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
