/*
 * test_engine_fake.c - the engine end to end (thread, scheduler, KV pages, prefix cache,
 * sampler) against fake_backend.h, whose logits depend on the KV pages actually read. Every
 * greedy output is compared with fake_reference_greedy(), computed from token lists alone.
 */
#include "test_support.h"

#include "backend/sampling_ref.h"
#include "gptoss_engine.h"
#include "fake_backend.h"

#include <stdatomic.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define VOCAB 64
#define MAX_CHOICES 4
#define MAX_OUT 128
#define NO_EOS (-1)

typedef struct job {
    int32_t prompt[256];
    int32_t n_prompt;
    gptoss_sampling_params params;
    gptoss_request_options ropts;
    gptoss_request *request;
    int32_t out[MAX_CHOICES][MAX_OUT];
    float logprob[MAX_CHOICES][MAX_OUT];
    gptoss_token_logprob top[MAX_CHOICES][MAX_OUT][5];
    int32_t n_out[MAX_CHOICES];
    gptoss_finish_reason finish[MAX_CHOICES];
    int32_t stop_token[MAX_CHOICES];
} job;

static uint64_t lcg_state = 12345;
static uint32_t lcg(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(lcg_state >> 33);
}

/* Second pass of every test: a backend that runs the batch's while_running hook (the engine
 * pushes the last step's tokens there) before it computes, as the CUDA backend runs it while
 * the device computes. */
static bool hook_pass;

static gptoss_engine_options fake_options(fake_backend *f) {
    gptoss_engine_options o = gptoss_engine_options_default();
    f->run_hook = hook_pass;
    o.forward_sample = fake_forward_sample;
    o.forward_user = f;
    o.vocab_size = f->vocab;
    o.sliding_window = f->window;
    o.kv_block_size = f->block_size;
    o.n_kv_blocks = f->n_blocks;
    o.n_sliding_kv_blocks = f->n_sliding;
    o.max_model_len = 4096;
    return o;
}

static void submit(gptoss_engine *e, job *j) {
    gptoss_error err = {0};
    gptoss_status st =
        gptoss_engine_submit(e, j->prompt, j->n_prompt, &j->params, &j->ropts, &j->request, &err);
    if (st != GPTOSS_OK) fail_msg("submit failed: %s", err.message);
}

static int32_t last_cached_prompt_tokens;

/* Reads every event of a job until all choices finished. */
static void collect(job *j) {
    gptoss_engine_event ev;
    int rc;
    while ((rc = gptoss_request_next_event(j->request, &ev, 20000)) == 1) {
        assert_in_range(ev.index, 0, MAX_CHOICES - 1);
        if (ev.token_id >= 0) {
            int32_t k = j->n_out[ev.index];
            assert_true(k < MAX_OUT);
            j->out[ev.index][k] = ev.token_id;
            j->logprob[ev.index][k] = ev.logprob;
            for (int i = 0; i < ev.n_top_logprobs && i < 5; i++)
                j->top[ev.index][k][i] = ev.top_logprobs[i];
            j->n_out[ev.index]++;
        }
        if (ev.finish != GPTOSS_FINISH_NONE) {
            j->finish[ev.index] = ev.finish;
            j->stop_token[ev.index] = ev.stop_token_id;
        }
    }
    assert_int_equal(rc, -1); /* 0 would mean a 20 s stall */
    last_cached_prompt_tokens = gptoss_request_cached_prompt_tokens(j->request);
    gptoss_request_release(j->request);
    j->request = NULL;
}

static void random_prompt(job *j, int32_t n) {
    j->n_prompt = n;
    for (int32_t i = 0; i < n; i++)
        j->prompt[i] = (int32_t)(lcg() % VOCAB);
}

static void greedy_job(job *j, int32_t max_tokens) {
    memset(j, 0, sizeof *j);
    j->params = gptoss_sampling_params_default();
    j->params.temperature = 0.0f;
    j->params.max_tokens = max_tokens;
    j->params.ignore_eos = true;
}

static void expect_reference(const job *j, int32_t choice, const fake_backend *f) {
    int32_t ref[MAX_OUT];
    int32_t n_ref = fake_reference_greedy(j->prompt, j->n_prompt, j->params.max_tokens, NO_EOS,
                                          f->window, f->vocab, ref);
    assert_int_equal(j->n_out[choice], n_ref);
    for (int32_t i = 0; i < n_ref; i++)
        if (j->out[choice][i] != ref[i])
            fail_msg("prompt of %d tokens, choice %d: token %d is %d, reference %d", j->n_prompt,
                     choice, i, j->out[choice][i], ref[i]);
    assert_int_equal(j->finish[choice], GPTOSS_FINISH_LENGTH);
}

static void wait_idle_stats(gptoss_engine *e, gptoss_engine_stats *s) {
    for (int i = 0; i < 400; i++) {
        gptoss_engine_get_stats(e, s);
        if (s->n_running == 0 && s->n_waiting == 0 && s->kv_blocks_used == 0) return;
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
}

/* Runs jobs[0..n) through one engine: all submitted before the thread starts. */
static void run_jobs(const gptoss_engine_options *o, job *jobs, int n, gptoss_engine_stats *stats) {
    gptoss_engine *e;
    gptoss_error err = {0};
    if (gptoss_engine_create(o, &e, &err) != GPTOSS_OK) fail_msg("engine: %s", err.message);
    for (int i = 0; i < n; i++)
        submit(e, &jobs[i]);
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    for (int i = 0; i < n; i++)
        collect(&jobs[i]);
    gptoss_engine_stats s;
    wait_idle_stats(e, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(s.sliding_blocks_used, 0);
    if (stats) *stats = s;
    gptoss_engine_free(e);
}

/* One request alone, and the same among 30 others of different lengths with a small token
 * budget (chunked prefill mixed with decodes): identical greedy output, equal to the reference. */
static void test_alone_vs_batched(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 512, 0, 16);
    job *jobs = calloc(31, sizeof *jobs);
    for (int i = 0; i < 31; i++) {
        greedy_job(&jobs[i], 10 + i % 7);
        random_prompt(&jobs[i], 1 + (int32_t)(lcg() % 120));
    }
    gptoss_engine_options o = fake_options(f);
    o.max_num_batched_tokens = 64;
    o.max_num_seqs = 16;
    run_jobs(&o, jobs, 1, NULL);
    expect_reference(&jobs[0], 0, f);
    int32_t alone[MAX_OUT];
    int32_t n_alone = jobs[0].n_out[0];
    memcpy(alone, jobs[0].out[0], sizeof alone);
    jobs[0].n_out[0] = 0;
    gptoss_engine_stats s;
    run_jobs(&o, jobs, 31, &s);
    for (int i = 0; i < 31; i++)
        expect_reference(&jobs[i], 0, f);
    assert_int_equal(jobs[0].n_out[0], n_alone);
    assert_memory_equal(jobs[0].out[0], alone, (size_t)n_alone * sizeof(int32_t));
    assert_int_equal(f->bad_reads, 0);
    assert_true(f->max_tokens_in_plan <= 64);
    assert_true(f->max_seqs_in_plan <= 16 && f->max_seqs_in_plan > 1);
    assert_int_equal(s.ttft.count, 31);
    assert_true(s.itl.count > 0);
    assert_true(s.generation_tokens > 0);
    free(jobs);
    fake_free(f);
}

/* Requests sharing prefixes (and some repeated whole prompts), in two waves, with the prefix
 * cache off, on, and on with the block hash cut to 2 bits (every lookup collides). */
static void run_prefix_mix(int enable, int hash_bits, int block_size,
                           gptoss_engine_stats *out_stats, uint64_t *sequential_hits) {
    fake_backend *f = fake_create(VOCAB, block_size, 400, 0, 12);
    enum { N = 24 };
    job *jobs = calloc(N, sizeof *jobs);
    int32_t shared[3][80];
    lcg_state = 777;
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < 80; i++)
            shared[p][i] = (int32_t)(lcg() % VOCAB);
    for (int i = 0; i < N; i++) {
        greedy_job(&jobs[i], 8);
        if (i % 6 == 5) {
            random_prompt(&jobs[i], 20 + (int32_t)(lcg() % 40));
        } else if (i % 6 == 3) {
            /* The same blocks after a different first block: equal tokens, other parent. */
            int32_t p = (int32_t)(lcg() % 3), len = 40 + (int32_t)(lcg() % 20);
            memcpy(jobs[i].prompt, shared[p], (size_t)len * sizeof(int32_t));
            for (int32_t k = 0; k < block_size; k++)
                jobs[i].prompt[k] = (int32_t)(lcg() % VOCAB);
            jobs[i].n_prompt = len;
        } else if (i % 6 == 4 && i >= 6) {
            jobs[i].n_prompt = jobs[i - 6].n_prompt; /* an exact repeat */
            memcpy(jobs[i].prompt, jobs[i - 6].prompt, sizeof jobs[i].prompt);
        } else {
            int32_t p = (int32_t)(lcg() % 3), len = 30 + (int32_t)(lcg() % 50);
            memcpy(jobs[i].prompt, shared[p], (size_t)len * sizeof(int32_t));
            int32_t extra = (int32_t)(lcg() % 20);
            for (int32_t k = 0; k < extra; k++)
                jobs[i].prompt[len + k] = (int32_t)(lcg() % VOCAB);
            jobs[i].n_prompt = len + extra;
        }
    }
    gptoss_engine_options o = fake_options(f);
    o.enable_prefix_cache = enable;
    o.testing.prefix_hash_bits = hash_bits;
    o.max_num_batched_tokens = 96;
    gptoss_engine_stats s2;
    /* Two waves on one engine: the second finds the first's prefixes cached. */
    gptoss_engine *e;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    /* One at a time first, so the hit counts do not depend on thread timing. */
    for (int i = 0; i < N; i++) {
        memset(jobs[i].n_out, 0, sizeof jobs[i].n_out);
        submit(e, &jobs[i]);
        collect(&jobs[i]);
        expect_reference(&jobs[i], 0, f);
    }
    wait_idle_stats(e, &s2);
    *sequential_hits = s2.prefix_cache_hits;
    /* And everything again, concurrently, now that the cache is warm. */
    for (int i = 0; i < N; i++) {
        memset(jobs[i].n_out, 0, sizeof jobs[i].n_out);
        submit(e, &jobs[i]);
    }
    for (int i = 0; i < N; i++)
        collect(&jobs[i]);
    wait_idle_stats(e, &s2);
    for (int i = 0; i < N; i++)
        expect_reference(&jobs[i], 0, f);
    assert_int_equal(f->bad_reads, 0);
    assert_int_equal(s2.kv_blocks_used, 0);
    *out_stats = s2;
    gptoss_engine_free(e);
    free(jobs);
    fake_free(f);
}

static void test_prefix_cache_off_on_collisions(void **state) {
    (void)state;
    gptoss_engine_stats off, on, collide, collide_small;
    uint64_t seq_off, seq_on, seq_collide, seq_collide_small;
    run_prefix_mix(0, 0, 8, &off, &seq_off);
    run_prefix_mix(1, 0, 8, &on, &seq_on);
    run_prefix_mix(1, 2, 8, &collide, &seq_collide);
    run_prefix_mix(1, 1, 4, &collide_small, &seq_collide_small);
    assert_int_equal(off.prefix_cache_hits, 0);
    assert_true(seq_on > 0 && on.prefix_cache_hits > seq_on);
    assert_true(on.prefix_cache_hits <= on.prefix_cache_queries);
    /* Collisions must not lose correct hits either: identity is checked on every entry. */
    assert_int_equal(seq_collide, seq_on);
    assert_true(seq_collide_small > 0);
}

/* A request's cache salt isolates its prefixes from other tenants, also when every lookup
 * collides (hash cut to 1 bit). */
static void test_cache_salt(void **state) {
    (void)state;
    for (int bits = 0; bits <= 1; bits++) {
        fake_backend *f = fake_create(VOCAB, 8, 128, 0, 0);
        gptoss_engine_options o = fake_options(f);
        o.testing.prefix_hash_bits = bits;
        gptoss_engine *e;
        gptoss_error err = {0};
        assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
        assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
        job j;
        const char *salts[4] = {"tenant-a", "tenant-b", "tenant-a", NULL};
        int32_t cached[4];
        lcg_state = 99;
        int32_t prompt[64];
        for (int i = 0; i < 64; i++)
            prompt[i] = (int32_t)(lcg() % VOCAB);
        for (int k = 0; k < 4; k++) {
            greedy_job(&j, 4);
            j.n_prompt = 64;
            memcpy(j.prompt, prompt, sizeof prompt);
            if (salts[k]) {
                j.ropts.cache_salt = (const uint8_t *)salts[k];
                j.ropts.cache_salt_len = strlen(salts[k]);
            }
            submit(e, &j);
            gptoss_request *r = j.request;
            collect(&j);
            (void)r;
            expect_reference(&j, 0, f);
            cached[k] = last_cached_prompt_tokens;
        }
        assert_int_equal(cached[0], 0);
        assert_int_equal(cached[1], 0);  /* other tenant */
        assert_int_equal(cached[2], 56); /* same tenant: 7 full blocks, the last token recomputed */
        assert_int_equal(cached[3], 0);  /* no salt is its own tenant */
        gptoss_engine_free(e);
        fake_free(f);
    }
}

/* KV far too small for the load: sequences are preempted and recomputed, answers unchanged. */
static void test_preemption_keeps_greedy_outputs(void **state) {
    (void)state;
    for (int cache = 0; cache < 2; cache++) {
        fake_backend *f = fake_create(VOCAB, 4, 40, 12, 8);
        enum { N = 8 };
        job jobs[N];
        lcg_state = 4242;
        for (int i = 0; i < N; i++) {
            greedy_job(&jobs[i], 30);
            random_prompt(&jobs[i], 20 + (int32_t)(lcg() % 20));
        }
        jobs[2].params.n = 2; /* forked choices under pressure too */
        gptoss_engine_options o = fake_options(f);
        o.enable_prefix_cache = cache;
        o.max_num_batched_tokens = 32;
        o.admit_headroom = 0; /* start sequences in the last free pages: preemption follows */
        gptoss_engine_stats s;
        run_jobs(&o, jobs, N, &s);
        for (int i = 0; i < N; i++)
            expect_reference(&jobs[i], 0, f);
        expect_reference(&jobs[2], 1, f);
        assert_true(s.preemptions > 0);
        assert_int_equal(f->bad_reads, 0);
        fake_free(f);
    }
}

/* Shared pages: sliding pages live in the full pages' memory (one id space), KV far too
 * small for the load, with and without the prefix cache: answers equal the reference and no
 * page is ever read after another sequence (or the other pool) overwrote it. Control: the same
 * memory with the engine told nothing (separate id spaces over aliased memory) corrupts. */
static void test_shared_pages(void **state) {
    (void)state;
    for (int pass = 0; pass < 3; pass++) {
        const bool shared = pass < 2, cache = pass == 1;
        fake_backend *f = fake_create(VOCAB, 4, 52, 0, 8);
        fake_share_pages(f);
        enum { N = 8 };
        job jobs[N];
        lcg_state = 777;
        for (int i = 0; i < N; i++) {
            greedy_job(&jobs[i], 30);
            random_prompt(&jobs[i], 20 + (int32_t)(lcg() % 20));
        }
        jobs[5].params.n = 2;
        /* a shared prefix, so the cache hits (and evicts) pages of both pools */
        memcpy(jobs[7].prompt, jobs[6].prompt, 16 * sizeof(int32_t));
        gptoss_engine_options o = fake_options(f);
        o.kv_shared_pages = shared;
        o.enable_prefix_cache = cache;
        o.max_num_batched_tokens = 32;
        o.admit_headroom = 0; /* start sequences in the last free pages: preemption follows */
        gptoss_engine_stats s;
        run_jobs(&o, jobs, N, &s);
        if (shared) {
            for (int i = 0; i < N; i++)
                expect_reference(&jobs[i], 0, f);
            expect_reference(&jobs[5], 1, f);
            assert_true(s.preemptions > 0);
            assert_int_equal(f->bad_reads, 0);
            assert_int_equal(s.kv_blocks_total, 52);
        } else {
            assert_true(f->bad_reads > 0);
        }
        fake_free(f);
    }
}

/* n > 1 shares the prompt: greedy choices all equal the reference, with the prompt ending
 * mid-block (copy-on-write by recompute) and exactly on a block boundary. */
static void test_n_choices_share_prompt(void **state) {
    (void)state;
    int32_t lengths[3] = {21, 24, 3};
    for (int t = 0; t < 3; t++) {
        fake_backend *f = fake_create(VOCAB, 8, 64, 0, 6);
        job j;
        greedy_job(&j, 12);
        random_prompt(&j, lengths[t]);
        j.params.n = 4;
        gptoss_engine_options o = fake_options(f);
        run_jobs(&o, &j, 1, NULL);
        for (int c = 0; c < 4; c++)
            expect_reference(&j, c, f);
        assert_int_equal(f->bad_reads, 0);
        fake_free(f);
    }
}

/* Seeded sampling: the same seed gives the same tokens alone and inside a busy batch. */
static void test_seed_reproducible_across_batches(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 512, 0, 16);
    gptoss_engine_options o = fake_options(f);
    o.max_num_batched_tokens = 48;
    job *jobs = calloc(12, sizeof *jobs);
    lcg_state = 31337;
    for (int i = 0; i < 12; i++) {
        greedy_job(&jobs[i], 20);
        random_prompt(&jobs[i], 5 + (int32_t)(lcg() % 60));
        jobs[i].params.temperature = 1.0f;
        jobs[i].params.top_p = 0.9f;
        jobs[i].params.has_seed = true;
        jobs[i].params.seed = 1000 + (uint64_t)i;
    }
    jobs[0].params.n = 3;
    run_jobs(&o, jobs, 1, NULL);
    job first = jobs[0];
    memset(jobs[0].n_out, 0, sizeof jobs[0].n_out);
    run_jobs(&o, jobs, 12, NULL);
    for (int c = 0; c < 3; c++) {
        assert_int_equal(jobs[0].n_out[c], 20);
        assert_memory_equal(jobs[0].out[c], first.out[c], 20 * sizeof(int32_t));
    }
    /* Different choices draw from different streams. */
    assert_true(memcmp(jobs[0].out[0], jobs[0].out[1], 20 * sizeof(int32_t)) != 0 ||
                memcmp(jobs[0].out[1], jobs[0].out[2], 20 * sizeof(int32_t)) != 0);
    free(jobs);
    fake_free(f);
}

/* eos, stop_token_ids, min_tokens, ignore_eos, max_tokens and the stop-string hook. */
static void test_stop_conditions(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 256, 0, 0);
    job j;
    greedy_job(&j, 40);
    random_prompt(&j, 10);
    int32_t ref[40];
    fake_reference_greedy(j.prompt, j.n_prompt, 40, NO_EOS, 0, VOCAB, ref);
    int32_t eos = ref[3];
    int32_t first_eos = 0;
    while (ref[first_eos] != eos)
        first_eos++;
    gptoss_engine_options o = fake_options(f);
    o.eos_token_ids[0] = eos;
    o.n_eos_token_ids = 1;

    job a = j; /* eos stops, the eos token is the last one delivered */
    a.params.ignore_eos = false;
    run_jobs(&o, &a, 1, NULL);
    assert_int_equal(a.finish[0], GPTOSS_FINISH_STOP);
    assert_int_equal(a.stop_token[0], eos);
    assert_int_equal(a.n_out[0], first_eos + 1);
    assert_memory_equal(a.out[0], ref, (size_t)(first_eos + 1) * sizeof(int32_t));

    job b = j; /* ignore_eos runs to max_tokens */
    run_jobs(&o, &b, 1, NULL);
    assert_int_equal(b.finish[0], GPTOSS_FINISH_LENGTH);
    assert_int_equal(b.n_out[0], 40);

    job c = j; /* stop_token_ids, eos ignored */
    c.params.stop_token_ids[0] = ref[5];
    c.params.n_stop_token_ids = 1;
    run_jobs(&o, &c, 1, NULL);
    int32_t first_stop = 0;
    while (ref[first_stop] != ref[5])
        first_stop++;
    assert_int_equal(c.finish[0], GPTOSS_FINISH_STOP);
    assert_int_equal(c.stop_token[0], ref[5]);
    assert_int_equal(c.n_out[0], first_stop + 1);

    job d = j; /* min_tokens masks eos for the first 8 tokens: reference with eos forbidden */
    d.params.ignore_eos = false;
    d.params.min_tokens = 8;
    run_jobs(&o, &d, 1, NULL);
    {
        int32_t ctx[64];
        float row[VOCAB];
        memcpy(ctx, j.prompt, (size_t)j.n_prompt * sizeof(int32_t));
        int32_t n = j.n_prompt, made = 0;
        for (;;) {
            fake_reference_logits(ctx, n, 0, VOCAB, row);
            if (made < 8) row[eos] = -INFINITY;
            int32_t best = 0;
            for (int32_t v = 1; v < VOCAB; v++)
                if (row[v] > row[best]) best = v;
            assert_true(made < d.n_out[0]);
            assert_int_equal(d.out[0][made], best);
            ctx[n++] = best;
            made++;
            if (best == eos || made == 40) break;
        }
        assert_int_equal(d.n_out[0], made);
        assert_true(made > 8);
    }

    /* Stop string reported by the caller. */
    gptoss_engine *e;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    job s = j;
    s.params.max_tokens = 1000;
    f->delay_us = 2000; /* ~2 ms per token: the stop lands long before 1000 tokens */
    submit(e, &s);
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    gptoss_engine_event ev;
    assert_int_equal(gptoss_request_next_event(s.request, &ev, 20000), 1);
    gptoss_request_stop_choice(s.request, 0);
    int n_events = 1;
    while (gptoss_request_next_event(s.request, &ev, 20000) == 1) {
        n_events++;
        if (ev.finish != GPTOSS_FINISH_NONE) break;
    }
    assert_int_equal(ev.finish, GPTOSS_FINISH_STOP);
    assert_true(n_events < 1000);
    assert_int_equal(gptoss_request_next_event(s.request, &ev, 1000), -1);
    gptoss_request_release(s.request);
    gptoss_engine_free(e);
    fake_free(f);
}

/* Cancellation (by handle, by id, by release) frees every KV block. */
static void test_cancel_frees_blocks(void **state) {
    (void)state;
    for (int cache = 0; cache < 2; cache++) {
        fake_backend *f = fake_create(VOCAB, 8, 256, 0, 16);
        f->delay_us = 1000; /* requests must still be running when cancelled */
        gptoss_engine_options o = fake_options(f);
        o.enable_prefix_cache = cache;
        gptoss_engine *e;
        gptoss_error err = {0};
        assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
        job jobs[3];
        for (int i = 0; i < 3; i++) {
            greedy_job(&jobs[i], 1500);
            random_prompt(&jobs[i], 30 + 10 * i);
            jobs[i].params.n = i == 2 ? 3 : 1;
            submit(e, &jobs[i]);
        }
        assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
        gptoss_engine_event ev;
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 3; k++)
                assert_int_equal(gptoss_request_next_event(jobs[i].request, &ev, 20000), 1);
        gptoss_engine_stats s;
        gptoss_engine_get_stats(e, &s);
        assert_true(s.kv_blocks_used > 0);
        gptoss_request_cancel(jobs[0].request);
        assert_true(gptoss_engine_cancel(e, gptoss_request_id(jobs[1].request)));
        gptoss_request_release(jobs[2].request); /* a client that went away */
        for (int i = 0; i < 2; i++) {
            int rc;
            gptoss_finish_reason last = GPTOSS_FINISH_NONE;
            while ((rc = gptoss_request_next_event(jobs[i].request, &ev, 20000)) == 1)
                last = ev.finish;
            assert_int_equal(rc, -1);
            assert_int_equal(last, GPTOSS_FINISH_CANCELLED);
            gptoss_request_release(jobs[i].request);
        }
        wait_idle_stats(e, &s);
        assert_int_equal(s.kv_blocks_used, 0);
        assert_int_equal(s.sliding_blocks_used, 0);
        assert_int_equal(s.n_running + s.n_waiting, 0);
        assert_true(s.requests_finished[GPTOSS_FINISH_CANCELLED] >= 5);
        assert_false(gptoss_engine_cancel(e, 424242));
        gptoss_engine_free(e);
        fake_free(f);
    }
}

/* Validation at submit, the queue limit, and drain. */
static void test_submit_limits_and_drain(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 16, 0, 0);
    gptoss_engine_options o = fake_options(f);
    o.max_queue_len = 2;
    o.max_model_len = 100;
    gptoss_engine *e;
    gptoss_error err = {0};
    o.admit_headroom = -1;
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "admit_headroom"));
    o.admit_headroom = 1;
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.max_tokens = 4;
    int32_t prompt[200] = {0};
    gptoss_request *r = NULL;
    prompt[1] = VOCAB;
    assert_int_equal(gptoss_engine_submit(e, prompt, 3, &p, NULL, &r, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "vocabulary"));
    prompt[1] = 1;
    assert_int_equal(gptoss_engine_submit(e, prompt, 0, &p, NULL, &r, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_int_equal(gptoss_engine_submit(e, prompt, 100, &p, NULL, &r, &err), GPTOSS_ERR_CAPACITY);
    assert_non_null(strstr(err.message, "max_model_len"));
    p.max_tokens = 60; /* 50 + 60 > 100 */
    assert_int_equal(gptoss_engine_submit(e, prompt, 50, &p, NULL, &r, &err), GPTOSS_ERR_CAPACITY);
    o.max_model_len = 4096;
    gptoss_engine_free(e);
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    p.max_tokens = 100; /* 16 blocks of 8 = 128 KV tokens; 50 + 100 - 1 > 128 */
    assert_int_equal(gptoss_engine_submit(e, prompt, 50, &p, NULL, &r, &err), GPTOSS_ERR_CAPACITY);
    assert_non_null(strstr(err.message, "KV"));
    p.max_tokens = 4;
    p.temperature = -1.0f;
    assert_int_equal(gptoss_engine_submit(e, prompt, 5, &p, NULL, &r, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "temperature"));
    p.temperature = 1.0f;
    p.top_p = NAN;
    assert_int_equal(gptoss_engine_submit(e, prompt, 5, &p, NULL, &r, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    p.top_p = 1.0f;
    p.n = 1000;
    assert_int_equal(gptoss_engine_submit(e, prompt, 5, &p, NULL, &r, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    p.n = 1;
    /* max_tokens 0 = as many as fit the KV: 128 - 5 + 1 */
    gptoss_request *q[3];
    assert_int_equal(gptoss_engine_submit(e, prompt, 5, &p, NULL, &q[0], &err), GPTOSS_OK);
    assert_int_equal(gptoss_engine_submit(e, prompt, 5, &p, NULL, &q[1], &err), GPTOSS_OK);
    assert_true(gptoss_engine_queue_full(e));
    assert_int_equal(gptoss_engine_submit(e, prompt, 5, &p, NULL, &q[2], &err),
                     GPTOSS_ERR_CAPACITY);
    assert_non_null(strstr(err.message, "queue is full"));
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    assert_true(gptoss_engine_drain(e, 20000));
    assert_int_equal(gptoss_engine_submit(e, prompt, 5, &p, NULL, &q[2], &err),
                     GPTOSS_ERR_CAPACITY);
    assert_non_null(strstr(err.message, "shutting down"));
    for (int i = 0; i < 2; i++) {
        gptoss_engine_event ev;
        int n = 0;
        while (gptoss_request_next_event(q[i], &ev, 1000) == 1)
            n++;
        assert_int_equal(n, 4);
        gptoss_request_release(q[i]);
    }
    gptoss_engine_stats s;
    gptoss_engine_get_stats(e, &s);
    assert_true(s.draining);
    gptoss_engine_free(e);
    fake_free(f);
}

/* A backend failure ends the requests of that step with an error, frees their blocks, and
 * the engine keeps serving. */
static void test_backend_error(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 64, 0, 0);
    atomic_store(&f->fail_at_call, 3);
    gptoss_engine_options o = fake_options(f);
    job a, b;
    greedy_job(&a, 10);
    random_prompt(&a, 12);
    gptoss_engine *e;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    submit(e, &a);
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    gptoss_request *keep = a.request;
    gptoss_engine_event ev;
    gptoss_finish_reason last = GPTOSS_FINISH_NONE;
    while (gptoss_request_next_event(keep, &ev, 20000) == 1)
        last = ev.finish;
    assert_int_equal(last, GPTOSS_FINISH_ERROR);
    assert_non_null(strstr(gptoss_request_error(keep), "injected device failure"));
    gptoss_request_release(keep);
    b = a;
    b.request = NULL;
    memset(b.n_out, 0, sizeof b.n_out);
    submit(e, &b);
    collect(&b);
    expect_reference(&b, 0, f);
    gptoss_engine_stats s;
    wait_idle_stats(e, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(s.requests_finished[GPTOSS_FINISH_ERROR], 1);
    gptoss_engine_free(e);

    /* The same after a fork: siblings fail together and nothing is freed twice. */
    atomic_store(&f->calls, 0);
    atomic_store(&f->fail_at_call, 4);
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    job c = a;
    c.request = NULL;
    c.params.n = 3;
    submit(e, &c);
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    int finished = 0;
    while (gptoss_request_next_event(c.request, &ev, 20000) == 1)
        if (ev.finish != GPTOSS_FINISH_NONE) {
            assert_int_equal(ev.finish, GPTOSS_FINISH_ERROR);
            finished++;
        }
    assert_int_equal(finished, 3);
    gptoss_request_release(c.request);
    wait_idle_stats(e, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    gptoss_engine_free(e);
    fake_free(f);
}

/* The tokens a seeded request must produce, computed here from token lists alone: the fake's
 * reference logits, each draw's edits by brute force from the history (logit_bias, stop
 * tokens masked before min_tokens, penalties), the row's Philox counter (seed, absolute
 * position of the drawn token, choice), and the host reference sampler. */
static int32_t reference_sampled(const job *j, int32_t choice, int32_t max_new, const int32_t *eos,
                                 int32_t n_eos, int32_t window, int32_t *out) {
    const gptoss_sampling_params *p = &j->params;
    gptoss_sample_scratch *s;
    gptoss_error err;
    assert_int_equal(gptoss_sample_scratch_create(VOCAB, &s, &err), GPTOSS_OK);
    int32_t ctx[256 + MAX_OUT];
    memcpy(ctx, j->prompt, (size_t)j->n_prompt * sizeof(int32_t));
    int32_t n = j->n_prompt, made = 0;
    float row[VOCAB];
    while (made < max_new) {
        fake_reference_logits(ctx, n, window, VOCAB, row);
        gptoss_sample_edit edits[VOCAB];
        int32_t n_edits = 0;
        for (int32_t t = 0; t < VOCAB; t++) {
            gptoss_sample_edit e = {t, 0.0f, 0, 0, 0};
            bool any = false;
            for (int32_t i = 0; i < p->n_logit_bias; i++)
                if (p->logit_bias_tokens[i] == t) e.bias = p->logit_bias_values[i], any = true;
            bool stop = false;
            for (int32_t i = 0; i < p->n_stop_token_ids; i++)
                stop |= p->stop_token_ids[i] == t;
            for (int32_t i = 0; i < n_eos && !p->ignore_eos; i++)
                stop |= eos[i] == t;
            if (stop && made < p->min_tokens) e.masked = 1, any = true;
            for (int32_t i = j->n_prompt; i < n; i++)
                e.output_count += ctx[i] == t;
            bool seen = e.output_count > 0;
            for (int32_t i = 0; i < j->n_prompt; i++)
                seen |= ctx[i] == t;
            if (p->repetition_penalty != 1.0f && seen) e.seen = 1, any = true;
            if ((p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) && e.output_count > 0)
                any = true;
            if (!(p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f)) e.output_count = 0;
            if (any) edits[n_edits++] = e;
        }
        gptoss_sample_row r = {0};
        r.temperature = p->temperature;
        r.top_p = p->top_p;
        r.top_k = p->top_k > 0 ? p->top_k : 0;
        r.min_p = p->min_p;
        r.repetition_penalty = p->repetition_penalty;
        r.frequency_penalty = p->frequency_penalty;
        r.presence_penalty = p->presence_penalty;
        r.seed = p->seed;
        r.position = n;
        r.choice = choice;
        r.n_edits = n_edits;
        r.allowed_row = -1;
        int32_t token = gptoss_sample_reference(row, VOCAB, &r, n_edits ? edits : NULL, NULL, s);
        ctx[n++] = token;
        out[made++] = token;
        bool stop = false;
        for (int32_t i = 0; i < p->n_stop_token_ids; i++)
            stop |= p->stop_token_ids[i] == token;
        for (int32_t i = 0; i < n_eos && !p->ignore_eos; i++)
            stop |= eos[i] == token;
        if (stop) break;
    }
    gptoss_sample_scratch_free(s);
    return made;
}

/* A seeded request with every sampling parameter set (n = 2) gives exactly the reference's
 * tokens alone, inside a batch of 7 other requests with other parameters (greedy, other
 * temperatures, top_k, min_p, penalties, logprobs, unseeded), and in a KV pool so small that
 * sequences are preempted and recomputed. */
static void test_seeded_request_any_batch(void **state) {
    (void)state;
    int32_t bias_tokens[3] = {40, 7, 13};
    float bias_values[3] = {2.5f, -100.0f, 1.0f};
    job target;
    memset(&target, 0, sizeof target);
    lcg_state = 2718;
    random_prompt(&target, 37);
    gptoss_sampling_params *p = &target.params;
    *p = gptoss_sampling_params_default();
    p->temperature = 0.8f;
    p->top_k = 20;
    p->top_p = 0.95f;
    p->min_p = 0.02f;
    p->repetition_penalty = 1.1f;
    p->frequency_penalty = 0.3f;
    p->presence_penalty = 0.2f;
    p->logit_bias_tokens = bias_tokens;
    p->logit_bias_values = bias_values;
    p->n_logit_bias = 3;
    p->has_seed = true;
    p->seed = 0x5eed5eed12345ull;
    p->max_tokens = 24;
    p->min_tokens = 5;
    p->stop_token_ids[0] = 3;
    p->n_stop_token_ids = 1;
    p->n = 2;
    const int32_t eos[1] = {11};
    int32_t want[2][MAX_OUT], n_want[2];
    for (int c = 0; c < 2; c++) {
        n_want[c] = reference_sampled(&target, c, 24, eos, 1, 16, want[c]);
        for (int32_t i = 0; i < n_want[c]; i++)
            assert_true(want[c][i] != 7); /* logit_bias -100 */
    }
    assert_true(memcmp(want[0], want[1], sizeof want[0]) != 0); /* choices draw differently */

    for (int pass = 0; pass < 3; pass++) {
        /* 0: alone; 1: in a batch; 2: in a batch with preemptions */
        fake_backend *f =
            pass < 2 ? fake_create(VOCAB, 8, 512, 0, 16) : fake_create(VOCAB, 4, 44, 12, 16);
        gptoss_engine_options o = fake_options(f);
        o.eos_token_ids[0] = eos[0];
        o.n_eos_token_ids = 1;
        o.max_num_batched_tokens = 32;
        if (pass == 2) o.admit_headroom = 0;
        job jobs[8];
        int n_jobs = pass == 0 ? 1 : 8;
        lcg_state = 99 + (uint64_t)pass;
        for (int i = 1; i < n_jobs; i++) {
            greedy_job(&jobs[i], 20 + i);
            random_prompt(&jobs[i], 10 + (int32_t)(lcg() % 30));
            gptoss_sampling_params *q = &jobs[i].params;
            q->temperature = (float)(i % 4) * 0.5f;
            q->top_k = i % 3 == 0 ? 5 : 0;
            q->min_p = i % 2 ? 0.1f : 0.0f;
            q->repetition_penalty = i == 5 ? 1.3f : 1.0f;
            q->presence_penalty = i == 6 ? -0.5f : 0.0f;
            q->logprobs = i == 4;
            q->top_logprobs = i == 4 ? 3 : 0;
            q->has_seed = i % 2 == 0;
            q->seed = (uint64_t)i;
            q->n = i == 7 ? 3 : 1;
        }
        jobs[0] = target;
        gptoss_engine_stats st;
        if (pass == 0) {
            run_jobs(&o, jobs, 1, &st);
        } else {
            /* the target in the middle of the queue */
            job tmp = jobs[0];
            jobs[0] = jobs[3];
            jobs[3] = tmp;
            run_jobs(&o, jobs, n_jobs, &st);
            tmp = jobs[0];
            jobs[0] = jobs[3];
            jobs[3] = tmp;
        }
        for (int c = 0; c < 2; c++) {
            if (jobs[0].n_out[c] != n_want[c] ||
                memcmp(jobs[0].out[c], want[c], (size_t)n_want[c] * 4) != 0)
                fail_msg("pass %d choice %d: %d tokens, reference %d (first %d vs %d)", pass, c,
                         jobs[0].n_out[c], n_want[c], jobs[0].out[c][0], want[c][0]);
        }
        if (pass == 2) assert_true(st.preemptions > 0);
        assert_int_equal(f->bad_reads, 0);
        fake_free(f);
    }
}

/* The allowed-token callback: greedy under a mask equals the reference argmax over the
 * allowed tokens, and a callback that refuses ends the choice with an error. */
typedef struct allow_state {
    atomic_int calls;
    int32_t refuse_after; /* generated tokens after which the callback refuses (-1: never) */
} allow_state;

static bool allow_multiples_of_3(void *user, int32_t choice, const int32_t *generated,
                                 int32_t n_generated, uint32_t *mask, int32_t vocab) {
    allow_state *a = user;
    atomic_fetch_add(&a->calls, 1);
    (void)generated;
    if (a->refuse_after >= 0 && n_generated >= a->refuse_after) return false;
    for (int32_t t = choice % 3; t < vocab;
         t += 3) /* choice 0: 0, 3, 6, ...; choice 1: 1, 4, ... */
        mask[t / 32] |= 1u << (t % 32);
    return true;
}

static void test_allowed_tokens(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 256, 0, 0);
    gptoss_engine_options o = fake_options(f);
    allow_state a;
    atomic_init(&a.calls, 0);
    a.refuse_after = -1;
    job j;
    greedy_job(&j, 10);
    random_prompt(&j, 12);
    j.params.n = 2;
    j.ropts.allowed_tokens = allow_multiples_of_3;
    j.ropts.allowed_tokens_user = &a;
    run_jobs(&o, &j, 1, NULL);
    for (int c = 0; c < 2; c++) {
        int32_t ctx[64];
        float row[VOCAB];
        memcpy(ctx, j.prompt, (size_t)j.n_prompt * sizeof(int32_t));
        assert_int_equal(j.n_out[c], 10);
        for (int32_t k = 0; k < 10; k++) {
            fake_reference_logits(ctx, j.n_prompt + k, 0, VOCAB, row);
            int32_t best = c;
            for (int32_t t = c; t < VOCAB; t += 3)
                if (row[t] > row[best]) best = t;
            assert_int_equal(j.out[c][k], best);
            ctx[j.n_prompt + k] = best;
        }
    }
    assert_int_equal(atomic_load(&a.calls), 20);

    a.refuse_after = 4;
    job r;
    greedy_job(&r, 10);
    random_prompt(&r, 12);
    r.ropts.allowed_tokens = allow_multiples_of_3;
    r.ropts.allowed_tokens_user = &a;
    gptoss_engine *e;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    submit(e, &r);
    gptoss_request *keep = r.request;
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    gptoss_engine_event ev;
    int tokens = 0;
    gptoss_finish_reason last = GPTOSS_FINISH_NONE;
    while (gptoss_request_next_event(keep, &ev, 20000) == 1) {
        tokens += ev.token_id >= 0;
        last = ev.finish;
    }
    assert_int_equal(tokens, 4);
    assert_int_equal(last, GPTOSS_FINISH_ERROR);
    assert_non_null(strstr(gptoss_request_error(keep), "allowed-token"));
    gptoss_request_release(keep);
    gptoss_engine_stats s;
    wait_idle_stats(e, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    gptoss_engine_free(e);
    fake_free(f);
}

/* The masks are asked for inside the backend, once the step's forward has run (as the CUDA
 * backend asks while its forward runs), never before the step is handed to it; a refusing
 * callback ends its own request with an error while the requests beside it in the same
 * steps, constrained or not, go on to their references. */
typedef struct ordered_allow {
    allow_state allow;
    const fake_backend *f;
    atomic_int early; /* masks asked for before the current call's forward finished */
} ordered_allow;

static bool allow_after_forward(void *user, int32_t choice, const int32_t *generated,
                                int32_t n_generated, uint32_t *mask, int32_t vocab) {
    ordered_allow *o = user;
    if (o->f->forward_done != atomic_load(&o->f->calls)) atomic_fetch_add(&o->early, 1);
    return allow_multiples_of_3(&o->allow, choice, generated, n_generated, mask, vocab);
}

static void test_masks_after_forward(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 256, 0, 0);
    gptoss_engine_options o = fake_options(f);
    ordered_allow keep = {.f = f}, refuse = {.f = f};
    atomic_init(&keep.allow.calls, 0);
    atomic_init(&keep.early, 0);
    keep.allow.refuse_after = -1;
    atomic_init(&refuse.allow.calls, 0);
    atomic_init(&refuse.early, 0);
    refuse.allow.refuse_after = 3;
    job jobs[3];
    for (int i = 0; i < 3; i++) {
        greedy_job(&jobs[i], 8);
        random_prompt(&jobs[i], 10 + i);
    }
    jobs[0].ropts.allowed_tokens = allow_after_forward;
    jobs[0].ropts.allowed_tokens_user = &keep;
    jobs[2].ropts.allowed_tokens = allow_after_forward;
    jobs[2].ropts.allowed_tokens_user = &refuse;
    run_jobs(&o, jobs, 3, NULL);

    assert_int_equal(atomic_load(&keep.early) + atomic_load(&refuse.early), 0);
    assert_int_equal(atomic_load(&keep.allow.calls), 8);
    assert_int_equal(atomic_load(&refuse.allow.calls), 4);
    int32_t ctx[64];
    float row[VOCAB];
    memcpy(ctx, jobs[0].prompt, (size_t)jobs[0].n_prompt * sizeof(int32_t));
    assert_int_equal(jobs[0].n_out[0], 8);
    for (int32_t k = 0; k < 8; k++) {
        fake_reference_logits(ctx, jobs[0].n_prompt + k, 0, VOCAB, row);
        int32_t best = 0;
        for (int32_t t = 0; t < VOCAB; t += 3)
            if (row[t] > row[best]) best = t;
        assert_int_equal(jobs[0].out[0][k], best);
        ctx[jobs[0].n_prompt + k] = best;
    }
    assert_int_equal(jobs[0].finish[0], GPTOSS_FINISH_LENGTH);
    expect_reference(&jobs[1], 0, f);
    assert_int_equal(jobs[2].n_out[0], 3);
    assert_int_equal(jobs[2].finish[0], GPTOSS_FINISH_ERROR);
    for (int32_t k = 0; k < 3; k++)
        assert_int_equal(jobs[2].out[0][k] % 3, 0);
    fake_free(f);
}

/* Logprobs are those of the raw model distribution (reference: log-softmax in the test). */
static void test_logprobs(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 64, 0, 0);
    gptoss_engine_options o = fake_options(f);
    job j;
    greedy_job(&j, 6);
    random_prompt(&j, 9);
    j.params.temperature = 0.7f;
    j.params.has_seed = true;
    j.params.seed = 5;
    j.params.logprobs = true;
    j.params.top_logprobs = 5;
    run_jobs(&o, &j, 1, NULL);
    int32_t ctx[64];
    memcpy(ctx, j.prompt, (size_t)j.n_prompt * sizeof(int32_t));
    for (int32_t k = 0; k < j.n_out[0]; k++) {
        float row[VOCAB];
        fake_reference_logits(ctx, j.n_prompt + k, 0, VOCAB, row);
        double m = -1e30, sum = 0;
        for (int v = 0; v < VOCAB; v++)
            m = row[v] > m ? row[v] : m;
        for (int v = 0; v < VOCAB; v++)
            sum += exp(row[v] - m);
        double lse = m + log(sum);
        int32_t tok = j.out[0][k];
        assert_true(fabs(j.logprob[0][k] - (row[tok] - lse)) < 1e-4);
        /* top 5 by brute force */
        int used[VOCAB] = {0};
        for (int r = 0; r < 5; r++) {
            int best = -1;
            for (int v = 0; v < VOCAB; v++)
                if (!used[v] && (best < 0 || row[v] > row[best])) best = v;
            used[best] = 1;
            assert_int_equal(j.top[0][k][r].token_id, best);
            assert_true(fabs(j.top[0][k][r].logprob - (row[best] - lse)) < 1e-4);
        }
        ctx[j.n_prompt + k] = tok;
    }
    fake_free(f);
}

static atomic_int notified;
static gptoss_request *notified_request;

static atomic_int notified_wrong_user;

/* Runs on the engine thread: record only (cmocka asserts must stay on the test thread). */
static void on_event(void *user, gptoss_request *request) {
    if (user != &notified) atomic_fetch_add(&notified_wrong_user, 1);
    notified_request = request;
    atomic_fetch_add(&notified, 1);
}

/* The notify callback fires for every queued event, with the request it belongs to. */
static void test_notify_callback(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, 8, 64, 0, 0);
    gptoss_engine_options o = fake_options(f);
    job j;
    greedy_job(&j, 7);
    random_prompt(&j, 5);
    j.ropts.notify = on_event;
    j.ropts.notify_user = &notified;
    atomic_store(&notified, 0);
    gptoss_engine *e;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    submit(e, &j);
    gptoss_request *r = j.request;
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    collect(&j);
    gptoss_engine_free(e); /* joins the engine thread: every callback has returned */
    assert_int_equal(atomic_load(&notified), 7);
    assert_int_equal(atomic_load(&notified_wrong_user), 0);
    assert_ptr_equal(notified_request, r);
    fake_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_vs_batched),
        cmocka_unit_test(test_prefix_cache_off_on_collisions),
        cmocka_unit_test(test_cache_salt),
        cmocka_unit_test(test_preemption_keeps_greedy_outputs),
        cmocka_unit_test(test_shared_pages),
        cmocka_unit_test(test_n_choices_share_prompt),
        cmocka_unit_test(test_seed_reproducible_across_batches),
        cmocka_unit_test(test_stop_conditions),
        cmocka_unit_test(test_cancel_frees_blocks),
        cmocka_unit_test(test_submit_limits_and_drain),
        cmocka_unit_test(test_backend_error),
        cmocka_unit_test(test_seeded_request_any_batch),
        cmocka_unit_test(test_allowed_tokens),
        cmocka_unit_test(test_masks_after_forward),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_notify_callback),
    };
    int failed = cmocka_run_group_tests_name("token pushes after the step", tests, NULL, NULL);
    hook_pass = true;
    failed += cmocka_run_group_tests_name("token pushes while the backend runs", tests, NULL, NULL);
    return failed;
}
