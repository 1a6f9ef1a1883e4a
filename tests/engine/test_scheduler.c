/*
 * test_scheduler.c - batching decisions: token budget, decodes before prefill, FCFS,
 * preemption under a tiny KV pool, sliding-window page release, forks and prefix hits.
 * Every plan is also checked with gptoss_batch_plan_validate (the backend's own gate).
 */
#include "test_support.h"

#include "engine/kv_cache.h"
#include "engine/scheduler.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t no_salt[GPTOSS_SHA256_BYTES];

typedef struct rig {
    gptoss_kv_manager *kv;
    gptoss_scheduler *sched;
    gptoss_config config;
    int32_t bs, window, n_blocks, n_sliding;
    gptoss_batch_plan plan;
} rig;

static int32_t rig_headroom = 0; /* admit_headroom of the next rig_init */

static void rig_init(rig *r, int32_t bs, int32_t n_blocks, int32_t n_sliding, int32_t window,
                     int32_t max_seqs, int32_t budget, bool cache) {
    memset(r, 0, sizeof *r);
    r->bs = bs;
    r->window = window;
    r->n_blocks = n_blocks;
    r->n_sliding = n_sliding;
    gptoss_kv_manager_options ko = {bs, n_blocks, window ? n_sliding : 0, cache, 0, false};
    gptoss_error err;
    assert_int_equal(gptoss_kv_manager_create(&ko, &r->kv, &err), GPTOSS_OK);
    gptoss_scheduler_options so = {max_seqs, budget, window, rig_headroom};
    assert_int_equal(gptoss_scheduler_create(&so, r->kv, &r->sched, &err), GPTOSS_OK);
    r->config.vocab_size = 1000;
    r->config.sliding_window = window ? window : 1 << 30;
    r->config.max_position_embeddings = 1 << 30;
}

static void rig_free(rig *r) {
    gptoss_scheduler_free(r->sched);
    gptoss_kv_manager_free(r->kv);
}

static gptoss_seq *make_seq(rig *r, int32_t n_prompt, int32_t max_new, uint64_t priority,
                            int32_t first_token) {
    int32_t prompt[2048];
    for (int32_t i = 0; i < n_prompt; i++)
        prompt[i] = (first_token + i * 7) % 1000;
    gptoss_seq *seq;
    gptoss_error err;
    assert_int_equal(gptoss_seq_create(prompt, n_prompt, n_prompt + max_new, r->bs, priority, 0,
                                       no_salt, &seq, &err),
                     GPTOSS_OK);
    return seq;
}

/* Schedules and validates one plan (not committed). */
static void schedule(rig *r) {
    gptoss_error err = {0};
    assert_int_equal(gptoss_scheduler_schedule(r->sched, &r->plan, &err), GPTOSS_OK);
    if (r->plan.n_seqs == 0) return;
    gptoss_status st = gptoss_batch_plan_validate(&r->plan, &r->config, r->bs, r->n_blocks,
                                                  r->window ? r->n_sliding : r->n_blocks, &err);
    if (st != GPTOSS_OK) fail_msg("invalid plan: %s", err.message);
}

/* Commits the last plan and appends token 1 to every sequence that produced logits. */
static void finish_step(rig *r) {
    gptoss_scheduler_commit(r->sched);
    for (int32_t i = 0; i < r->plan.n_logits; i++) {
        gptoss_seq *seq = gptoss_scheduler_logit_seq(r->sched, i);
        if (seq->n_tokens < seq->cap_tokens) gptoss_seq_append(seq, 1);
    }
}

static int32_t tokens_of(const rig *r, const gptoss_seq *seq) {
    for (int32_t i = 0; i < r->plan.n_seqs; i++)
        if (gptoss_scheduler_plan_seq(r->sched, i) == seq)
            return r->plan.seq_token_start[i + 1] - r->plan.seq_token_start[i];
    return 0;
}

/* The per-step budget holds, chunks fill it, and logits come only at the end of a prompt. */
static void test_budget_and_chunked_prefill(void **state) {
    (void)state;
    rig r;
    rig_init(&r, 4, 256, 0, 0, 8, 16, false);
    gptoss_seq *a = make_seq(&r, 40, 5, 1, 0);
    gptoss_scheduler_add(r.sched, a);
    int32_t steps = 0;
    while (a->n_tokens == a->n_prompt) {
        schedule(&r);
        assert_true(r.plan.n_tokens <= 16);
        assert_int_equal(r.plan.n_logits, a->n_cached + r.plan.n_tokens == 40 ? 1 : 0);
        finish_step(&r);
        steps++;
    }
    assert_int_equal(steps, 3); /* 16 + 16 + 8 */
    assert_int_equal(a->n_cached, 40);
    rig_free(&r);
}

/* A running decode gets its token every step even while an earlier-priority sequence has a
 * long prompt to prefill; the prompt takes the rest of the budget. */
static void test_decodes_first(void **state) {
    (void)state;
    rig r;
    rig_init(&r, 4, 256, 0, 0, 8, 20, false);
    gptoss_seq *b = make_seq(&r, 3, 50, 2, 5);
    gptoss_scheduler_add(r.sched, b);
    schedule(&r);
    finish_step(&r);
    assert_int_equal(b->n_tokens, 4);           /* decoding now */
    gptoss_seq *a = make_seq(&r, 200, 5, 1, 9); /* earlier arrival, long prompt */
    gptoss_scheduler_add(r.sched, a);
    for (int step = 0; step < 6; step++) {
        schedule(&r);
        assert_int_equal(tokens_of(&r, b), 1);
        assert_int_equal(tokens_of(&r, a), 19);
        assert_int_equal(r.plan.n_tokens, 20);
        finish_step(&r);
    }
    rig_free(&r);
}

/* FCFS admission with max_num_seqs, and the cap holds. */
static void test_fcfs_and_seq_cap(void **state) {
    (void)state;
    rig r;
    rig_init(&r, 4, 256, 0, 0, 2, 64, false);
    gptoss_seq *s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = make_seq(&r, 5, 3, (uint64_t)(i + 1), i * 100);
        gptoss_scheduler_add(r.sched, s[i]);
    }
    schedule(&r);
    assert_int_equal(r.plan.n_seqs, 2);
    assert_ptr_equal(gptoss_scheduler_plan_seq(r.sched, 0), s[0]);
    assert_ptr_equal(gptoss_scheduler_plan_seq(r.sched, 1), s[1]);
    assert_int_equal(s[2]->state, GPTOSS_SEQ_WAITING);
    finish_step(&r);
    gptoss_scheduler_finish(r.sched, s[0]);
    gptoss_seq_free(s[0]);
    schedule(&r);
    assert_int_equal(r.plan.n_seqs, 2);
    assert_int_equal(s[2]->state, GPTOSS_SEQ_RUNNING);
    finish_step(&r);
    /* Waiting order under a tight budget: the earlier request gets the tokens. */
    rig_free(&r);
    rig_init(&r, 4, 256, 0, 0, 8, 10, false);
    gptoss_seq *late = make_seq(&r, 8, 3, 9, 1);
    gptoss_seq *early = make_seq(&r, 8, 3, 3, 2);
    gptoss_scheduler_add(r.sched, late);
    gptoss_scheduler_add(r.sched, early);
    schedule(&r);
    assert_int_equal(tokens_of(&r, early), 8);
    assert_int_equal(tokens_of(&r, late), 2);
    rig_free(&r);
}

/* Out of pages: the latest arrival is preempted (pages back to the pool), the earliest keeps
 * running, and the victim is readmitted later. */
static void test_preemption(void **state) {
    (void)state;
    for (int cache = 0; cache < 2; cache++) {
        rig r;
        rig_init(&r, 4, 6, 0, 0, 8, 64, cache);
        gptoss_seq *a = make_seq(&r, 8, 12, 1, 0);
        gptoss_seq *b = make_seq(&r, 8, 12, 2, 500);
        gptoss_scheduler_add(r.sched, a);
        gptoss_scheduler_add(r.sched, b);
        int preempted_at = -1;
        for (int step = 0; step < 40 && a->n_tokens < a->cap_tokens; step++) {
            schedule(&r);
            if (b->state == GPTOSS_SEQ_WAITING && preempted_at < 0) {
                preempted_at = step;
                assert_int_equal(b->n_cached, 0);
                assert_int_equal(b->n_blocks, 0);
                assert_int_equal(b->n_preemptions, 1);
                assert_true(gptoss_kv_used(r.kv, GPTOSS_KV_POOL_FULL) <= 6);
            }
            finish_step(&r);
        }
        assert_true(preempted_at > 0);
        assert_int_equal(a->n_tokens, a->cap_tokens);
        /* b may come back on a spare page and be preempted again: never a itself. */
        assert_true(gptoss_scheduler_get_counters(r.sched).preemptions >= 1);
        assert_int_equal(a->n_preemptions, 0);
        int32_t b_tokens = b->n_tokens;
        bool b_waiting = b->state == GPTOSS_SEQ_WAITING;
        gptoss_scheduler_finish(r.sched, a);
        gptoss_seq_free(a);
        schedule(&r);
        assert_int_equal(b->state, GPTOSS_SEQ_RUNNING);
        /* Recompute covers the prompt and the tokens generated before preemption; with the
         * prefix cache its own published blocks come back for free. */
        assert_int_equal(b->n_cached + tokens_of(&r, b), b_tokens);
        if (b_waiting && cache) assert_true(b->n_cached > 0);
        if (b_waiting && !cache) assert_int_equal(b->n_cached, 0);
        finish_step(&r);
        gptoss_scheduler_finish(r.sched, b);
        gptoss_seq_free(b);
        assert_int_equal(gptoss_kv_used(r.kv, GPTOSS_KV_POOL_FULL), 0);
        rig_free(&r);
    }
}

/* Sliding pages are released only once no future query can see them, and a long sequence
 * holds a bounded number of them. */
static void test_sliding_release(void **state) {
    (void)state;
    const int32_t bs = 4, window = 10;
    rig r;
    rig_init(&r, bs, 64, 8, window, 4, 7, false);
    gptoss_seq *a = make_seq(&r, 30, 60, 1, 3);
    gptoss_scheduler_add(r.sched, a);
    int32_t freed_any = 0;
    for (int step = 0; step < 80 && a->n_tokens < a->cap_tokens; step++) {
        schedule(&r);
        finish_step(&r);
        int32_t held = 0;
        for (int32_t b = 0; b < a->n_blocks; b++) {
            if (a->sliding_blocks[b] >= 0) {
                held++;
                continue;
            }
            freed_any++;
            /* every position in block b is below the next query's window */
            assert_true((b + 1) * bs - 1 < a->n_cached - window + 1);
        }
        assert_true(held <= (window - 1 + bs - 1) / bs + 2 + 2); /* window + chunk of 7 */
        assert_int_equal(held, gptoss_kv_used(r.kv, GPTOSS_KV_POOL_SLIDING));
    }
    assert_int_equal(a->n_tokens, a->cap_tokens);
    assert_true(freed_any > 0);
    gptoss_scheduler_finish(r.sched, a);
    gptoss_seq_free(a);
    assert_int_equal(gptoss_kv_used(r.kv, GPTOSS_KV_POOL_SLIDING), 0);
    rig_free(&r);
}

/* A fork references the parent's full prompt blocks and recomputes the partial one into a
 * page of its own. */
static void test_fork_shares_full_blocks(void **state) {
    (void)state;
    rig r;
    rig_init(&r, 4, 32, 0, 0, 8, 64, false);
    gptoss_seq *p = make_seq(&r, 10, 4, 1, 0);
    gptoss_scheduler_add(r.sched, p);
    schedule(&r);
    gptoss_scheduler_commit(r.sched);
    gptoss_seq *child;
    gptoss_error err;
    assert_int_equal(gptoss_scheduler_fork(r.sched, p, 1, &child, &err), GPTOSS_OK);
    gptoss_seq_append(p, 11);
    gptoss_seq_append(child, 12);
    assert_int_equal(child->n_cached, 8);
    for (int b = 0; b < 2; b++) {
        assert_int_equal(child->full_blocks[b], p->full_blocks[b]);
        assert_int_equal(gptoss_kv_ref_count(r.kv, GPTOSS_KV_POOL_FULL, p->full_blocks[b]), 2);
    }
    assert_int_equal(gptoss_kv_ref_count(r.kv, GPTOSS_KV_POOL_FULL, p->full_blocks[2]), 1);
    schedule(&r);
    assert_int_equal(tokens_of(&r, p), 1);
    assert_int_equal(tokens_of(&r, child), 3); /* prompt tail (2) + its own first token */
    assert_true(child->full_blocks[2] != p->full_blocks[2]);
    finish_step(&r);
    gptoss_scheduler_finish(r.sched, p);
    gptoss_seq_free(p);
    assert_int_equal(gptoss_kv_ref_count(r.kv, GPTOSS_KV_POOL_FULL, child->full_blocks[0]), 1);
    gptoss_scheduler_finish(r.sched, child);
    gptoss_seq_free(child);
    assert_int_equal(gptoss_kv_used(r.kv, GPTOSS_KV_POOL_FULL), 0);
    rig_free(&r);
}

/* Prefix hits leave the last token to compute, need the sliding window's pages, and are
 * refused (recomputed) once those pages were evicted. */
static void test_prefix_hit_and_sliding_requirement(void **state) {
    (void)state;
    const int32_t bs = 4, window = 6;
    rig r;
    rig_init(&r, bs, 32, 16, window, 8, 64, true);
    gptoss_seq *a = make_seq(&r, 20, 2, 1, 0);
    gptoss_scheduler_add(r.sched, a);
    schedule(&r);
    finish_step(&r);
    gptoss_scheduler_finish(r.sched, a);
    gptoss_seq_free(a);
    assert_int_equal(gptoss_kv_used(r.kv, GPTOSS_KV_POOL_FULL), 0);
    assert_int_equal(gptoss_kv_idle_cached(r.kv, GPTOSS_KV_POOL_FULL), 5);

    gptoss_seq *b = make_seq(&r, 20, 2, 2, 0); /* same prompt */
    gptoss_scheduler_add(r.sched, b);
    schedule(&r);
    assert_int_equal(b->n_cached, 16); /* 4 of 5 blocks: the last token must run for logits */
    assert_int_equal(tokens_of(&r, b), 4);
    finish_step(&r);
    gptoss_scheduler_finish(r.sched, b);
    gptoss_seq_free(b);

    /* Take every sliding page (evicting the idle cached ones), then give them back. */
    int32_t pages[16];
    for (int i = 0; i < 16; i++)
        pages[i] = gptoss_kv_alloc(r.kv, GPTOSS_KV_POOL_SLIDING);
    for (int i = 0; i < 16; i++) {
        assert_true(pages[i] >= 0);
        gptoss_kv_release(r.kv, GPTOSS_KV_POOL_SLIDING, pages[i]);
    }
    assert_true(gptoss_kv_idle_cached(r.kv, GPTOSS_KV_POOL_FULL) > 0); /* full pages still cached */
    gptoss_seq *c = make_seq(&r, 20, 2, 3, 0);
    gptoss_scheduler_add(r.sched, c);
    schedule(&r);
    assert_int_equal(tokens_of(&r, c), 20); /* no usable hit without the window's pages */
    finish_step(&r);
    gptoss_scheduler_finish(r.sched, c);
    gptoss_seq_free(c);
    /* c's recomputed window pages were adopted by the existing entries: hits work again. */
    gptoss_seq *d = make_seq(&r, 20, 2, 4, 0);
    gptoss_scheduler_add(r.sched, d);
    schedule(&r);
    assert_int_equal(d->n_cached, 16);
    finish_step(&r);
    gptoss_scheduler_finish(r.sched, d);
    gptoss_seq_free(d);
    rig_free(&r);
}

/* Admission headroom: while A runs, B starts only if its whole prompt leaves admit_headroom
 * free tokens per running sequence. Without headroom B takes the last free pages and is
 * preempted as soon as A needs a page; with it B waits for A and nothing is preempted. */
static void test_admission_headroom(void **state) {
    (void)state;
    for (int32_t headroom = 0; headroom < 2; headroom++) {
        rig_headroom = headroom;
        rig r;
        rig_init(&r, 4, 8, 0, 0, 8, 64, false);
        gptoss_seq *a = make_seq(&r, 8, 20, 1, 0);
        gptoss_seq *b = make_seq(&r, 20, 4, 2, 300);
        gptoss_scheduler_add(r.sched, a);
        schedule(&r);
        finish_step(&r);
        gptoss_scheduler_add(r.sched, b);
        schedule(&r); /* A's decode takes its third page: 5 free pages, 20 tokens, B's prompt */
        assert_int_equal(b->state, headroom ? GPTOSS_SEQ_WAITING : GPTOSS_SEQ_RUNNING);
        assert_int_equal(b->n_blocks, headroom ? 0 : 5);
        finish_step(&r);
        while (a->n_tokens < a->cap_tokens) {
            schedule(&r);
            assert_int_equal(a->state, GPTOSS_SEQ_RUNNING);
            if (headroom) assert_int_equal(b->state, GPTOSS_SEQ_WAITING);
            finish_step(&r);
        }
        assert_int_equal(a->n_preemptions, 0);
        if (headroom)
            assert_int_equal(b->n_preemptions, 0);
        else
            assert_true(b->n_preemptions >= 1); /* and readmitted into the pages A frees up */
        gptoss_scheduler_finish(r.sched, a);
        gptoss_seq_free(a);
        schedule(&r); /* nothing else runs: B starts whatever the headroom */
        assert_int_equal(b->state, GPTOSS_SEQ_RUNNING);
        if (headroom) assert_int_equal(tokens_of(&r, b), 20); /* its whole prompt at once */
        finish_step(&r);
        gptoss_scheduler_finish(r.sched, b);
        gptoss_seq_free(b);
        assert_int_equal(gptoss_kv_used(r.kv, GPTOSS_KV_POOL_FULL), 0);
        rig_free(&r);
    }
    rig_headroom = 0;
}

/* Many requests through a pool that holds a few of them at full length: with the headroom,
 * fewer tokens are computed (fewer prompts recomputed after preemption), in no more steps
 * than a quarter over, and every request completes either way. */
static void test_admission_headroom_load(void **state) {
    (void)state;
    int64_t computed[2], steps[2];
    uint64_t preemptions[2];
    for (int32_t headroom = 0; headroom < 2; headroom++) {
        rig_headroom = headroom;
        rig r;
        rig_init(&r, 16, 40, 0, 0, 64, 256, false);
        enum { N = 40 };
        gptoss_seq *seqs[N];
        for (int i = 0; i < N; i++) {
            seqs[i] = make_seq(&r, 64, 64, (uint64_t)i + 1, i * 13);
            gptoss_scheduler_add(r.sched, seqs[i]);
        }
        computed[headroom] = 0;
        steps[headroom] = 0;
        int done = 0;
        while (done < N) {
            schedule(&r);
            assert_true(r.plan.n_seqs > 0);
            computed[headroom] += r.plan.n_tokens;
            steps[headroom]++;
            finish_step(&r);
            for (int i = 0; i < N; i++)
                if (seqs[i] && seqs[i]->n_tokens == seqs[i]->cap_tokens) {
                    gptoss_scheduler_finish(r.sched, seqs[i]);
                    gptoss_seq_free(seqs[i]);
                    seqs[i] = NULL;
                    done++;
                }
        }
        preemptions[headroom] = gptoss_scheduler_get_counters(r.sched).preemptions;
        assert_int_equal(gptoss_kv_used(r.kv, GPTOSS_KV_POOL_FULL), 0);
        rig_free(&r);
    }
    rig_headroom = 0;
    print_message("admission headroom 0 / 1: %lld / %lld tokens computed (%d needed), %lld / %lld "
                  "steps, %llu / %llu preemptions\n",
                  (long long)computed[0], (long long)computed[1], 40 * 127, (long long)steps[0],
                  (long long)steps[1], (unsigned long long)preemptions[0],
                  (unsigned long long)preemptions[1]);
    assert_true(preemptions[0] > 0);
    assert_true(preemptions[1] < preemptions[0]);
    assert_true(computed[1] < computed[0]);
    assert_true(steps[1] * 4 <= steps[0] * 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_chunked_prefill),
        cmocka_unit_test(test_decodes_first),
        cmocka_unit_test(test_fcfs_and_seq_cap),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_sliding_release),
        cmocka_unit_test(test_fork_shares_full_blocks),
        cmocka_unit_test(test_prefix_hit_and_sliding_requirement),
        cmocka_unit_test(test_admission_headroom),
        cmocka_unit_test(test_admission_headroom_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
