/*
 * test_eagle3_draft.c - the eagle3 draft source.
 *
 * First the drafter alone over a scripted target (hidden states a function of position and
 * token): through prefill chunks, verify steps with every number of accepted drafts, steps
 * without drafting and recomputation from position 0, each proposal must equal the drafts of
 * a head run from scratch over the sequence's committed history (the head's cache keeps
 * exactly the accepted positions). Then the engine on the CPU backend with random heads:
 * greedy outputs with --draft eagle3 equal those without drafting, token for token, at batch
 * 1 and in mixed batches with chunked prompts, and a head that does not fit is refused.
 */
#include "test_support.h"

#include "backend/cpu/eagle3_forward.h"
#include "engine/draft.h"
#include "gptoss_engine.h"
#include "model/eagle3.h"
#include "tools/eagle3_writer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Under the sanitizers (several times slower) fewer requests and steps: the release pass runs
 * them all. */
static bool sanitized(void) {
    const char *v = getenv("GPTOSS_SANITIZE");
    return v && strcmp(v, "1") == 0;
}

enum { H = 64, VOCAB = 512, MAXLEN = 256, NSEQ = 3 };

static gptoss_eagle3_config head_config(int32_t hidden, int32_t vocab) {
    gptoss_eagle3_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = hidden;
    c.intermediate_size = 2 * hidden;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = hidden / 4;
    c.vocab_size = vocab;
    c.draft_vocab_size = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.aux_layer_ids[0] = 1, c.aux_layer_ids[1] = 2, c.aux_layer_ids[2] = 3;
    return c;
}

/* ---- a scripted target ---------------------------------------------------------------------- */

typedef struct fake_target {
    float *captured; /* [n_rows, 3H] */
    int32_t n_rows;
    int32_t boundaries[3];
    int32_t n_capture;
} fake_target;

static float aux_value(int32_t pos, int32_t token, int32_t i) {
    return sinf(0.013f * (float)(pos * 7 + 1) + 0.029f * (float)token * (float)(i % 5 + 1) +
                0.31f * (float)i);
}

static float embed_value(int32_t token, int32_t h) {
    return cosf(0.37f * (float)token + 0.11f * (float)h);
}

static gptoss_status fake_capture(void *user, const int32_t *b, int32_t n, gptoss_error *error) {
    (void)error;
    fake_target *t = user;
    t->n_capture = n;
    if (n) memcpy(t->boundaries, b, (size_t)n * sizeof *b);
    return GPTOSS_OK;
}

static const float *fake_captured(void *user, int32_t *n_tokens) {
    fake_target *t = user;
    *n_tokens = t->n_rows;
    return t->captured;
}

static gptoss_status fake_embed(void *user, const int32_t *tokens, int32_t n, float *out,
                                gptoss_error *error) {
    (void)user, (void)error;
    for (int32_t r = 0; r < n; r++)
        for (int32_t h = 0; h < H; h++)
            out[(size_t)r * H + h] = embed_value(tokens[r], h);
    return GPTOSS_OK;
}

/* The drafts of a head run from scratch over tokens[0..n) (positions 0..n-2 read the target's
 * states), then chained: what the drafter must propose. */
static int32_t reference_drafts(const gptoss_eagle3_head *head, gptoss_eagle3_cpu *f,
                                const int32_t *tokens, int32_t n, int32_t k, int32_t *out) {
    const gptoss_eagle3_weights *w = gptoss_eagle3_head_weights(head);
    gptoss_eagle3_kv kv = {0};
    static float aux[MAXLEN][3 * H], embed[MAXLEN][H], prenorm[MAXLEN][H];
    gptoss_eagle3_row rows[MAXLEN];
    int32_t m = 0;
    for (int32_t p = 0; p <= n - 2; p++, m++) {
        for (int32_t i = 0; i < 3 * H; i++)
            aux[p][i] = aux_value(p, tokens[p], i);
        for (int32_t h = 0; h < H; h++)
            embed[p][h] = embed_value(tokens[p + 1], h);
        rows[m] = (gptoss_eagle3_row){.kv = &kv,
                                      .position = p,
                                      .embed = embed[p],
                                      .aux = aux[p],
                                      .prenorm = prenorm[p],
                                      .want_token = p == n - 2};
    }
    gptoss_error err = {0};
    assert_int_equal(gptoss_eagle3_cpu_forward(f, rows, m, &err), GPTOSS_OK);
    int32_t n_out = 0;
    out[n_out++] = gptoss_eagle3_target_token(w, rows[m - 1].draft_token);
    for (int32_t j = 1; j < k; j++) {
        int32_t p = n - 2 + j;
        for (int32_t h = 0; h < H; h++)
            embed[p][h] = embed_value(out[j - 1], h);
        gptoss_eagle3_row row = {.kv = &kv,
                                 .position = p,
                                 .embed = embed[p],
                                 .hidden = prenorm[p - 1],
                                 .prenorm = prenorm[p],
                                 .want_token = true};
        assert_int_equal(gptoss_eagle3_cpu_forward(f, &row, 1, &err), GPTOSS_OK);
        out[n_out++] = gptoss_eagle3_target_token(w, row.draft_token);
    }
    free(kv.k), free(kv.v);
    return n_out;
}

static uint64_t rng = 99;
static uint32_t next_random(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

typedef struct sim_seq {
    int32_t tokens[MAXLEN + 16];
    int32_t n_tokens;
    int32_t n_cached; /* positions the target has computed */
    int32_t n_prompt;
} sim_seq;

static void test_drafter_matches_fresh_head(void **state) {
    (void)state;
    gptoss_eagle3_config c = head_config(H, VOCAB);
    char *dir = ts_mkdtemp();
    gptoss_error err = {0};
    assert_int_equal(gptoss_eagle3_write_random(&c, dir, 5, false, &err), GPTOSS_OK);
    gptoss_eagle3_head *head;
    assert_int_equal(gptoss_eagle3_load(dir, &head, &err), GPTOSS_OK);
    gptoss_eagle3_cpu *ref;
    assert_int_equal(gptoss_eagle3_cpu_create(head, &ref, &err), GPTOSS_OK);

    fake_target ft = {0};
    ft.captured = malloc((size_t)NSEQ * (MAXLEN + 16) * 3 * H * sizeof(float));
    gptoss_draft_target target = {.user = &ft,
                                  .n_layers = 4,
                                  .hidden_size = H,
                                  .capture_hidden = fake_capture,
                                  .captured_hidden = fake_captured,
                                  .embed_tokens = fake_embed};
    gptoss_draft_options o = gptoss_draft_options_default();
    o.kind = GPTOSS_DRAFT_EAGLE3;
    o.model_dir = dir;
    o.num_speculative_tokens = 4;
    gptoss_drafter *d;
    if (gptoss_drafter_create(&o, VOCAB, &target, &d, &err) != GPTOSS_OK)
        fail_msg("create: %s", err.message);
    assert_true(gptoss_drafter_observes(d));
    assert_int_equal(ft.n_capture, 3); /* ids 1, 2, 3: outputs of those layers */
    assert_int_equal(ft.boundaries[0], 2), assert_int_equal(ft.boundaries[2], 4);

    static sim_seq seqs[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        seqs[s].n_prompt = 20 + 7 * s;
        seqs[s].n_tokens = seqs[s].n_prompt;
        seqs[s].n_cached = 0;
        for (int i = 0; i < seqs[s].n_tokens; i++)
            seqs[s].tokens[i] = (int32_t)(next_random() % VOCAB);
    }
    int checked = 0, accepted_total = 0;
    const int steps = sanitized() ? 60 : 120;
    for (int step = 0; step < steps; step++) {
        /* Propose for the decoding sequences (some skip a step). */
        gptoss_draft_seq ds[NSEQ];
        int32_t drafts[NSEQ][8], n_ds = 0, owner[NSEQ];
        int32_t n_draft[NSEQ] = {0};
        for (int s = 0; s < NSEQ; s++) {
            sim_seq *q = &seqs[s];
            bool decoding = q->n_cached == q->n_tokens - 1;
            if (!decoding || q->n_tokens >= MAXLEN - 10 || next_random() % 5 == 0) continue;
            ds[n_ds] = (gptoss_draft_seq){.tokens = q->tokens,
                                          .n_tokens = q->n_tokens,
                                          .n_prompt = q->n_prompt,
                                          .seq_priority = 100 + (uint64_t)s,
                                          .seq_index = 0,
                                          .k = 1 + (int32_t)(next_random() % 4),
                                          .out = drafts[s]};
            owner[n_ds++] = s;
        }
        gptoss_drafter_propose(d, ds, n_ds);
        for (int i = 0; i < n_ds; i++) {
            int s = owner[i];
            sim_seq *q = &seqs[s];
            int32_t want[8];
            int32_t n_want = reference_drafts(head, ref, q->tokens, q->n_tokens, ds[i].k, want);
            /* The first decode after a prompt has every state; each later one too. */
            assert_int_equal(ds[i].n_out, n_want);
            for (int j = 0; j < n_want; j++)
                if (ds[i].out[j] != want[j])
                    fail_msg("step %d seq %d draft %d: %d, from scratch %d", step, s, j,
                             ds[i].out[j], want[j]);
            checked++;
            n_draft[s] = ds[i].n_out;
            for (int j = 0; j < n_draft[s]; j++)
                assert_true(ds[i].out[j] >= 0 && ds[i].out[j] < VOCAB);
        }
        /* The target's step: a prompt chunk, or the last token plus the drafts. */
        gptoss_draft_observed obs[NSEQ];
        int32_t rows = 0, n_obs = 0;
        int32_t step_tokens[NSEQ][MAXLEN];
        for (int s = 0; s < NSEQ; s++) {
            sim_seq *q = &seqs[s];
            if (q->n_tokens >= MAXLEN - 10) continue;
            if (next_random() % 29 == 0) q->n_cached = 0; /* preempted: recomputed from 0 */
            int32_t first = q->n_cached, n;
            const bool decode = q->n_cached == q->n_tokens - 1;
            if (!decode) {
                n = 1 + (int32_t)(next_random() % 9); /* a prompt chunk */
                if (first + n > q->n_tokens) n = q->n_tokens - first;
                for (int j = 0; j < n; j++)
                    step_tokens[s][j] = q->tokens[first + j];
            } else {
                n = 1 + n_draft[s];
                step_tokens[s][0] = q->tokens[first];
                for (int j = 0; j < n_draft[s]; j++)
                    step_tokens[s][1 + j] = drafts[s][j];
            }
            for (int j = 0; j < n; j++)
                for (int i = 0; i < 3 * H; i++)
                    ft.captured[(size_t)(rows + j) * 3 * H + i] =
                        aux_value(first + j, step_tokens[s][j], i);
            obs[n_obs++] = (gptoss_draft_observed){.seq_priority = 100 + (uint64_t)s,
                                                   .seq_index = 0,
                                                   .tokens = q->tokens,
                                                   .n_tokens = q->n_tokens,
                                                   .first_position = first,
                                                   .n_computed = n,
                                                   .first_row = rows};
            rows += n;
            /* After the step: what it commits. */
            if (first + n < q->n_tokens) {
                q->n_cached = first + n;
                continue;
            }
            /* The target's choice: each draft right with probability 1/2, and one more. */
            int32_t m = 0, n_verified = decode ? n - 1 : 0;
            while (m < n_verified && next_random() % 2 == 0)
                m++;
            for (int j = 0; j < m; j++)
                q->tokens[q->n_tokens++] = step_tokens[s][1 + j];
            int32_t y = (int32_t)(next_random() % VOCAB);
            if (m < n_verified && y == step_tokens[s][1 + m]) y = (y + 1) % VOCAB;
            q->tokens[q->n_tokens++] = y;
            q->n_cached = q->n_tokens - 1;
            accepted_total += m;
        }
        ft.n_rows = rows;
        gptoss_drafter_observe(d, obs, n_obs);
    }
    /* enough proposals and accepted drafts that the rollback was exercised (half the steps
     * under the sanitizers) */
    assert_true(checked > (sanitized() ? 50 : 100));
    assert_true(accepted_total > (sanitized() ? 10 : 20));
    gptoss_drafter_free(d);
    assert_int_equal(ft.n_capture, 0); /* freeing the drafter stops the capture */
    free(ft.captured);
    gptoss_eagle3_cpu_free(ref);
    gptoss_eagle3_free(head);
    ts_rmtree(dir);
    free(dir);
}

/* ---- the engine on the CPU backend ----------------------------------------------------------- */

enum { N_JOBS = 10, MAX_OUT = 24 };

static int n_jobs(void) {
    return sanitized() ? 4 : N_JOBS;
}

typedef struct job {
    int32_t prompt[64];
    int32_t n_prompt;
    int32_t out[MAX_OUT];
    int32_t n_out;
} job;

/* The request's tokens into the job, then the request released. */
static void collect(job *j, gptoss_request *req) {
    gptoss_engine_event ev;
    j->n_out = 0;
    while (gptoss_request_next_event(req, &ev, 60000) == 1)
        if (ev.token_id >= 0 && j->n_out < MAX_OUT) j->out[j->n_out++] = ev.token_id;
    gptoss_request_release(req);
}

static gptoss_engine_stats run_engine(gptoss_model *model, const char *head_dir, int max_seqs,
                                      job *jobs, gptoss_status *create_status, char *message) {
    const gptoss_config *c = gptoss_model_config(model);
    gptoss_backend_options bo = gptoss_backend_options_default();
    bo.kv_block_size = 16;
    bo.n_kv_blocks = 64;
    bo.n_sliding_kv_blocks = 64;
    gptoss_backend *b;
    gptoss_error err = {0};
    if (gptoss_backend_create(model, &bo, &b, &err) != GPTOSS_OK)
        fail_msg("backend: %s", err.message);
    gptoss_engine_options eo = gptoss_engine_options_default();
    gptoss_engine_options_for_backend(&eo, c, b, &bo);
    eo.max_num_seqs = max_seqs;
    eo.max_num_batched_tokens = 24; /* chunked prompts next to decodes with drafts */
    eo.n_eos_token_ids = 0;
    if (head_dir) {
        eo.draft.kind = GPTOSS_DRAFT_EAGLE3;
        eo.draft.model_dir = head_dir;
        eo.draft.num_speculative_tokens = 4;
        eo.draft.max_batch = 0;
        eo.draft.min_acceptance = 0; /* keep drafting whatever the random head gets */
        eo.draft.ignore_step_cost = true;
    }
    gptoss_engine_stats st;
    memset(&st, 0, sizeof st);
    gptoss_engine *e;
    gptoss_status cs = gptoss_engine_create(&eo, &e, &err);
    if (create_status) {
        *create_status = cs;
        snprintf(message, 512, "%s", err.message);
        if (cs != GPTOSS_OK) {
            gptoss_backend_free(b);
            return st;
        }
    }
    if (cs != GPTOSS_OK) fail_msg("engine: %s", err.message);
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    gptoss_request *req[N_JOBS];
    for (int i = 0; i < n_jobs(); i++) {
        gptoss_sampling_params p = gptoss_sampling_params_default();
        p.temperature = 0;
        p.max_tokens = MAX_OUT;
        if (gptoss_engine_submit(e, jobs[i].prompt, jobs[i].n_prompt, &p, NULL, &req[i], &err) !=
            GPTOSS_OK)
            fail_msg("submit: %s", err.message);
        if (max_seqs == 1) collect(&jobs[i], req[i]); /* batch 1: one request at a time */
    }
    for (int i = 0; i < n_jobs() && max_seqs > 1; i++)
        collect(&jobs[i], req[i]);
    for (int i = 0; i < 2000; i++) {
        gptoss_engine_get_stats(e, &st);
        if (st.n_running == 0 && st.n_waiting == 0) break;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    gptoss_engine_free(e);
    gptoss_backend_free(b);
    return st;
}

static void expect_same(const job *want, const job *got, const char *what) {
    for (int i = 0; i < n_jobs(); i++) {
        if (want[i].n_out != got[i].n_out)
            fail_msg("%s: job %d: %d tokens, without drafting %d", what, i, got[i].n_out,
                     want[i].n_out);
        for (int t = 0; t < want[i].n_out; t++)
            if (want[i].out[t] != got[i].out[t])
                fail_msg("%s: job %d token %d: %d, without drafting %d", what, i, t, got[i].out[t],
                         want[i].out[t]);
    }
}

static void test_engine_greedy_identical(void **state) {
    (void)state;
    char *dir = ts_mkdtemp(), *out = NULL;
    int rc = ts_run(&out, "'%s' make-model --config '%s/tests/support/micro_vocab.json' -o '%s/t'",
                    ts_env("GPTOSS_BIN"), ts_env("GPTOSS_SOURCE_DIR"), dir);
    if (rc != 0) fail_msg("make-model: %s", out ? out : "");
    free(out);
    char *target_dir = ts_path(dir, "t"), *head_a = ts_path(dir, "a"), *head_b = ts_path(dir, "b"),
         *head_bad = ts_path(dir, "bad");
    gptoss_error err = {0};
    /* a: the target's embedding, ids naming layer outputs; b: its own embedding, ids naming
     * boundaries (0: the embeddings, 4: the last layer's output) */
    gptoss_eagle3_config ca = head_config(128, 512), cb = ca, cbad = head_config(64, 512);
    cb.aux_layer_ids[0] = 0, cb.aux_layer_ids[1] = 2, cb.aux_layer_ids[2] = 4;
    assert_int_equal(gptoss_eagle3_write_random(&ca, head_a, 1, false, &err), GPTOSS_OK);
    assert_int_equal(gptoss_eagle3_write_random(&cb, head_b, 2, true, &err), GPTOSS_OK);
    assert_int_equal(gptoss_eagle3_write_random(&cbad, head_bad, 3, false, &err), GPTOSS_OK);
    gptoss_model *model;
    if (gptoss_model_load(target_dir, &model, &err) != GPTOSS_OK) fail_msg("load: %s", err.message);

    static job base[N_JOBS], got[N_JOBS];
    for (int i = 0; i < n_jobs(); i++) {
        base[i].n_prompt = 3 + (i * 13) % 40;
        for (int t = 0; t < base[i].n_prompt; t++) /* some repetition, some noise */
            base[i].prompt[t] = (int32_t)((t % (3 + i) * 37 + i * 11 + (t > 20 ? t : 0)) % 512);
    }
    for (int batch = 0; batch < 2; batch++) {
        const int max_seqs = batch ? 6 : 1;
        run_engine(model, NULL, max_seqs, base, NULL, NULL);
        for (int h = 0; h < 2; h++) {
            memcpy(got, base, sizeof got);
            gptoss_engine_stats st =
                run_engine(model, h ? head_b : head_a, max_seqs, got, NULL, NULL);
            char what[64];
            snprintf(what, sizeof what, "head %c, batch %d", h ? 'b' : 'a', max_seqs);
            expect_same(base, got, what);
            if (st.draft_tokens == 0) fail_msg("%s: nothing was drafted", what);
            print_message("%s: %llu drafts, %llu accepted\n", what,
                          (unsigned long long)st.draft_tokens,
                          (unsigned long long)st.draft_accepted_tokens);
        }
    }
    /* A head whose hidden size is not the target's is refused, naming both. */
    gptoss_status cs;
    char message[512];
    run_engine(model, head_bad, 1, got, &cs, message);
    assert_int_not_equal(cs, GPTOSS_OK);
    if (!strstr(message, "64") || !strstr(message, "128")) fail_msg("message: %s", message);
    gptoss_model_free(model);
    ts_rmtree(dir);
    free(dir), free(target_dir), free(head_a), free(head_b), free(head_bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drafter_matches_fresh_head),
        cmocka_unit_test(test_engine_greedy_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
