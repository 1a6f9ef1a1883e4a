/*
 * test_tp_net.c - the link of tensor parallelism across processes (backend/tp_net.h): a plan
 * survives a STEP frame's round trip field for field; every truncated, overlong or corrupted
 * payload and header is refused with a message; process 0 and two followers, as threads over
 * loopback, exchange HELLO/START/STEP/QUIT in order; a follower that disconnects mid-run, or
 * reports an error, fails process 0's check with a message naming it, and process 0 going
 * away is seen by a follower, all within a bounded time. The job's exchanges: matching HELLOs
 * and the smallest KV pool everywhere; a process started with another model, a load that
 * fails, a plan naming a page that does not exist, a step out of order and process 0 leaving
 * each stop every process with a message saying which and why.
 */
#include "test_support.h"

#include "backend/tp_net.h"
#include "model/config.h"
#include "util/clock.h"
#include "util/error.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- plans ------------------------------------------------------------------------------- */

/* A plan of `seqs` sequences (k-th: k + 1 new tokens after 7 k cached), tables of 4 blocks,
 * sliding tables when asked, and one logit row per sequence plus a repeat; numbers follow
 * `salt` so that steps differ. Arrays live in storage[1024]. */
static gptoss_batch_plan make_plan(int32_t seqs, bool sliding, int32_t salt, int32_t *storage) {
    gptoss_batch_plan p;
    memset(&p, 0, sizeof p);
    int32_t *v = storage, T = 0;
    int32_t *start = v + 512;
    start[0] = 0;
    for (int32_t s = 0; s < seqs; s++) {
        start[s + 1] = start[s] + s + 1;
        T = start[s + 1];
    }
    int32_t *ids = v, *pos = v + 64, *cached = v + 128, *tables = v + 192, *slide = v + 320,
            *logit = v + 448;
    for (int32_t s = 0; s < seqs; s++) {
        cached[s] = 7 * s;
        for (int32_t i = start[s]; i < start[s + 1]; i++) {
            ids[i] = 1000 * salt + i;
            pos[i] = cached[s] + i - start[s];
        }
        for (int32_t b = 0; b < 4; b++) {
            tables[s * 4 + b] = salt + 10 * s + b;
            slide[s * 4 + b] = 500 + salt + 10 * s + b;
        }
        logit[s] = start[s + 1] - 1;
    }
    logit[seqs] = T - 1;
    p.n_tokens = T;
    p.token_ids = ids;
    p.positions = pos;
    p.n_seqs = seqs;
    p.seq_token_start = start;
    p.seq_n_cached = cached;
    p.max_blocks_per_seq = 4;
    p.block_tables = tables;
    p.sliding_block_tables = sliding ? slide : NULL;
    p.n_logits = seqs + 1;
    p.logit_token_index = logit;
    return p;
}

static bool ints_equal(const int32_t *a, const int32_t *b, int32_t n) {
    return n == 0 || memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

/* Every count and every array element equal (the independent reference: the plan sent). */
static bool plans_equal(const gptoss_batch_plan *a, const gptoss_batch_plan *b) {
    const int32_t table = a->n_seqs * a->max_blocks_per_seq;
    return a->n_tokens == b->n_tokens && a->n_seqs == b->n_seqs &&
           a->max_blocks_per_seq == b->max_blocks_per_seq && a->n_logits == b->n_logits &&
           ints_equal(a->token_ids, b->token_ids, a->n_tokens) &&
           ints_equal(a->positions, b->positions, a->n_tokens) &&
           ints_equal(a->seq_token_start, b->seq_token_start, a->n_seqs + 1) &&
           ints_equal(a->seq_n_cached, b->seq_n_cached, a->n_seqs) &&
           ints_equal(a->block_tables, b->block_tables, table) &&
           (a->sliding_block_tables == NULL) == (b->sliding_block_tables == NULL) &&
           (!a->sliding_block_tables ||
            ints_equal(a->sliding_block_tables, b->sliding_block_tables, table)) &&
           ints_equal(a->logit_token_index, b->logit_token_index, a->n_logits);
}

static void test_plan_round_trip(void **state) {
    (void)state;
    int32_t storage[1024];
    gptoss_tp_net_buf buf = {0};
    gptoss_tp_net_step step = {0};
    gptoss_error err = {0};
    for (int sliding = 0; sliding < 2; sliding++)
        for (int32_t seqs = 1; seqs <= 5; seqs += 2) {
            gptoss_batch_plan p = make_plan(seqs, sliding, seqs * 3 + sliding, storage);
            const uint64_t seq = 0x123456789abull + (uint64_t)seqs;
            assert_int_equal(
                gptoss_tp_net_encode_step(&buf, seq, (uint8_t)(seqs % 4), sliding == 1, &p, &err),
                GPTOSS_OK);
            assert_int_equal(gptoss_tp_net_decode_step(buf.data, buf.len, &step, &err), GPTOSS_OK);
            assert_true(step.seq == seq);
            assert_int_equal(step.kind, seqs % 4);
            assert_int_equal(step.graphs, sliding == 1);
            assert_true(plans_equal(&p, &step.plan));
        }
    /* negative numbers and large values pass through unchanged */
    gptoss_batch_plan p = make_plan(2, true, 1, storage);
    storage[0] = -5;
    storage[192] = 0x7fffffff;
    assert_int_equal(gptoss_tp_net_encode_step(&buf, 1, 0, false, &p, &err), GPTOSS_OK);
    assert_int_not_equal(
        gptoss_tp_net_encode_step(&buf, 1, GPTOSS_TP_NET_STEP_KINDS, false, &p, &err), GPTOSS_OK);
    assert_int_equal(gptoss_tp_net_encode_step(&buf, 1, 0, false, &p, &err), GPTOSS_OK);
    assert_int_equal(gptoss_tp_net_decode_step(buf.data, buf.len, &step, &err), GPTOSS_OK);
    assert_int_equal(step.plan.token_ids[0], -5);
    assert_int_equal(step.plan.block_tables[0], 0x7fffffff);
    gptoss_tp_net_step_free(&step);
    gptoss_tp_net_buf_free(&buf);
}

static void test_bad_payloads(void **state) {
    (void)state;
    int32_t storage[1024];
    gptoss_tp_net_buf buf = {0};
    gptoss_tp_net_step step = {0};
    gptoss_error err = {0};
    gptoss_batch_plan p = make_plan(3, true, 2, storage);
    assert_int_equal(gptoss_tp_net_encode_step(&buf, 9, 2, true, &p, &err), GPTOSS_OK);
    const size_t full = buf.len;
    uint8_t *copy = malloc(full + 4);
    assert_non_null(copy);
    memcpy(copy, buf.data, full);
    /* every truncation, and one extra int */
    for (size_t n = 0; n < full; n++) {
        memset(&err, 0, sizeof err);
        assert_int_not_equal(gptoss_tp_net_decode_step(copy, n, &step, &err), GPTOSS_OK);
        assert_true(err.message[0] != '\0');
    }
    memset(copy + full, 0, 4);
    assert_int_not_equal(gptoss_tp_net_decode_step(copy, full + 4, &step, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "bytes"));
    /* a flag that is neither 0 nor 1, a kind that does not exist, the reserved byte set */
    const size_t bad_at[4] = {8, 9, 10, 11};
    const uint8_t bad_value[4] = {2, 2, GPTOSS_TP_NET_STEP_KINDS, 1};
    for (int i = 0; i < 4; i++) {
        memcpy(copy, buf.data, full);
        copy[bad_at[i]] = bad_value[i];
        assert_int_not_equal(gptoss_tp_net_decode_step(copy, full, &step, &err), GPTOSS_OK);
        assert_non_null(strstr(err.message, "a STEP with flags"));
    }
    /* counts that are negative, huge, or whose product overflows 32 bits */
    const size_t count_at[4] = {12, 16, 20, 24};
    for (int i = 0; i < 4; i++) {
        memcpy(copy, buf.data, full);
        copy[count_at[i] + 3] = 0x80; /* negative */
        assert_int_not_equal(gptoss_tp_net_decode_step(copy, full, &step, &err), GPTOSS_OK);
        memcpy(copy, buf.data, full);
        copy[count_at[i] + 2] = 0x10; /* about a million more */
        assert_int_not_equal(gptoss_tp_net_decode_step(copy, full, &step, &err), GPTOSS_OK);
    }
    memcpy(copy, buf.data, full); /* 2^20 sequences x 2^24 blocks: in range each, not together */
    copy[16] = 0, copy[17] = 0, copy[18] = 0x10, copy[19] = 0;
    copy[20] = 0, copy[21] = 0, copy[22] = 0, copy[23] = 1;
    assert_int_not_equal(gptoss_tp_net_decode_step(copy, full, &step, &err), GPTOSS_OK);
    /* random corruptions: a payload either fails or is exactly what the step it decodes to
     * encodes to (nothing accepted is misread) */
    gptoss_tp_net_buf again = {0};
    uint32_t rng = 12345;
    for (int trial = 0; trial < 4000; trial++) {
        memcpy(copy, buf.data, full);
        for (int k = 0; k < 1 + trial % 3; k++) {
            rng = rng * 1664525u + 1013904223u;
            const size_t at = trial % 2 ? (rng >> 8) % 28 : (rng >> 8) % full; /* head or any */
            rng = rng * 1664525u + 1013904223u;
            copy[at] = (uint8_t)(rng >> 24);
        }
        if (gptoss_tp_net_decode_step(copy, full, &step, &err) != GPTOSS_OK) continue;
        assert_int_equal(
            gptoss_tp_net_encode_step(&again, step.seq, step.kind, step.graphs, &step.plan, &err),
            GPTOSS_OK);
        assert_int_equal(again.len, full);
        assert_memory_equal(again.data, copy, full);
    }
    gptoss_tp_net_buf_free(&again);
    /* the decoded step is still usable after all that */
    assert_int_equal(gptoss_tp_net_decode_step(buf.data, full, &step, &err), GPTOSS_OK);
    assert_true(plans_equal(&p, &step.plan));
    free(copy);

    /* HELLO and READY/START payloads */
    gptoss_tp_net_hello h = {.proc = 1, .n_procs = 2, .tp_size = 2, .n_layers = 2};
    gptoss_tp_net_hello back;
    assert_int_equal(gptoss_tp_net_encode_hello(&buf, &h, &err), GPTOSS_OK);
    assert_int_equal(gptoss_tp_net_decode_hello(buf.data, buf.len, &back, &err), GPTOSS_OK);
    assert_int_equal(back.n_layers, 2);
    assert_int_not_equal(gptoss_tp_net_decode_hello(buf.data, buf.len - 1, &back, &err), GPTOSS_OK);
    buf.data[0] = 5; /* process 5 of 2 */
    assert_int_not_equal(gptoss_tp_net_decode_hello(buf.data, buf.len, &back, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "process 5 of 2"));
    gptoss_tp_net_pool pool = {16, 16, 1}, pool_back;
    assert_int_equal(gptoss_tp_net_encode_pool(&buf, &pool, &err), GPTOSS_OK);
    assert_int_equal(gptoss_tp_net_decode_pool(buf.data, buf.len, &pool_back, &err), GPTOSS_OK);
    assert_int_equal(pool_back.n_kv_blocks, 16);
    buf.data[8] = 2;
    assert_int_not_equal(gptoss_tp_net_decode_pool(buf.data, buf.len, &pool_back, &err), GPTOSS_OK);
    memset(buf.data, 0, 4); /* no pages */
    assert_int_not_equal(gptoss_tp_net_decode_pool(buf.data, buf.len, &pool_back, &err), GPTOSS_OK);
    /* an ERROR's bytes become a printable string */
    char text[8];
    gptoss_tp_net_decode_error((const uint8_t *)"ab\ncdefghij", 11, text, sizeof text);
    assert_string_equal(text, "ab?cdef");
    gptoss_tp_net_step_free(&step);
    gptoss_tp_net_buf_free(&buf);
}

static void test_hello_differs(void **state) {
    (void)state;
    gptoss_tp_net_hello a = {.proc = 0, .n_procs = 2, .tp_size = 4, .n_kv_heads = 8};
    gptoss_tp_net_hello b = a;
    char why[256];
    b.proc = 1;
    assert_false(gptoss_tp_net_hello_differs(&a, &b, why, sizeof why));
    b.n_kv_heads = 4;
    assert_true(gptoss_tp_net_hello_differs(&a, &b, why, sizeof why));
    assert_string_equal(why, "the model's KV heads: 8 here, 4 there");
    b = a;
    a.random_weights = b.random_weights = 1;
    b.seed = 7;
    assert_true(gptoss_tp_net_hello_differs(&a, &b, why, sizeof why));
    assert_non_null(strstr(why, "seed"));
}

/* Raw bytes into one end of a socket pair, then a receive on the other. */
static void expect_bad_frame(const uint8_t *bytes, size_t n, bool close_after, const char *needle) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(write(sv[0], bytes, n), (ssize_t)n);
    if (close_after) close(sv[0]);
    gptoss_tp_net_buf buf = {0};
    uint32_t type = 0;
    gptoss_error err = {0};
    assert_int_not_equal(gptoss_tp_net_recv(sv[1], &type, &buf, 2000, &err), GPTOSS_OK);
    if (!strstr(err.message, needle)) fail_msg("'%s' does not say '%s'", err.message, needle);
    gptoss_tp_net_buf_free(&buf);
    if (!close_after) close(sv[0]);
    close(sv[1]);
}

static void test_bad_frames(void **state) {
    (void)state;
    /* a good one first: magic "GOTP", this version, QUIT, 0 bytes */
    const uint8_t quit[12] = {'G', 'O', 'T', 'P', GPTOSS_TP_NET_VERSION, 0, 5, 0, 0, 0, 0, 0};
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(write(sv[0], quit, sizeof quit), (ssize_t)sizeof quit);
    gptoss_tp_net_buf buf = {0};
    uint32_t type = 0;
    gptoss_error err = {0};
    assert_int_equal(gptoss_tp_net_recv(sv[1], &type, &buf, 2000, &err), GPTOSS_OK);
    assert_int_equal(type, GPTOSS_TP_NET_QUIT);
    /* nothing more within the time: a timeout, not a hang */
    assert_int_not_equal(gptoss_tp_net_recv(sv[1], &type, &buf, 100, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "within"));
    close(sv[0]);
    close(sv[1]);
    gptoss_tp_net_buf_free(&buf);

    uint8_t f[16];
    memcpy(f, quit, 12);
    f[0] = 'X';
    expect_bad_frame(f, 12, false, "magic");
    memcpy(f, quit, 12);
    f[4] = GPTOSS_TP_NET_VERSION + 1;
    expect_bad_frame(f, 12, false, "version");
    memcpy(f, quit, 12);
    f[6] = 0;
    expect_bad_frame(f, 12, false, "unknown type 0");
    f[6] = 99;
    expect_bad_frame(f, 12, false, "unknown type 99");
    memcpy(f, quit, 12);
    f[6] = 4, f[11] = 0x7f; /* a STEP of about 2 GB */
    expect_bad_frame(f, 12, false, "at most");
    memcpy(f, quit, 12);
    f[6] = 4, f[8] = 40; /* 40 bytes promised, 4 sent, then closed */
    expect_bad_frame(f, 16, true, "closed the connection");
    expect_bad_frame(quit, 7, true, "closed the connection"); /* half a header */
}

/* ---- process 0 and followers as threads ------------------------------------------------- */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static gptoss_dist_info job(int32_t rank, int32_t world, int port) {
    gptoss_dist_info info;
    memset(&info, 0, sizeof info);
    info.source = GPTOSS_DIST_FLAGS;
    info.rank = rank;
    info.world_size = world;
    info.local_world_size = 1;
    info.node_rank = rank;
    info.n_nodes = world;
    snprintf(info.master_addr, sizeof info.master_addr, "127.0.0.1");
    info.master_port = port;
    return info;
}

#define N_STEPS 12

typedef enum { FOLLOW_ALL, FOLLOW_LEAVE_AFTER_3, FOLLOW_FAIL_AFTER_3 } follow_mode;

typedef struct follower_arg {
    gptoss_dist_info info;
    follow_mode mode;
    int steps_ok;         /* steps received with the plan expected */
    bool quit;            /* QUIT received */
    bool saw_leader_gone; /* gptoss_tp_link_leader_gone turned true before the receive failed */
    gptoss_status end;    /* the receive's status when the loop ended without QUIT */
    char end_message[1024];
} follower_arg;

static gptoss_status dec_pool(const uint8_t *p, size_t n, void *out, gptoss_error *e) {
    return gptoss_tp_net_decode_pool(p, n, (gptoss_tp_net_pool *)out, e);
}

static gptoss_status dec_hello(const uint8_t *p, size_t n, void *out, gptoss_error *e) {
    return gptoss_tp_net_decode_hello(p, n, (gptoss_tp_net_hello *)out, e);
}

static void *follower_main(void *p) {
    follower_arg *a = p;
    gptoss_tp_link link;
    uint8_t blob[GPTOSS_DIST_BLOB_BYTES] = {0};
    gptoss_error err = {0};
    if (gptoss_tp_link_open(&a->info, blob, 10000, &link, &err)) {
        a->end = err.status;
        snprintf(a->end_message, sizeof a->end_message, "%s", err.message);
        return NULL;
    }
    gptoss_tp_net_buf buf = {0};
    gptoss_tp_net_hello h = {.proc = a->info.rank, .n_procs = a->info.world_size, .tp_size = 4};
    gptoss_tp_net_pool ready = {100 + a->info.rank, 50, 0};
    uint32_t type = 0;
    gptoss_tp_net_step step = {0};
    int32_t storage[1024];
    gptoss_status st = gptoss_tp_net_encode_hello(&buf, &h, &err);
    if (!st)
        st = gptoss_tp_net_send(link.fds[0], GPTOSS_TP_NET_HELLO, buf.data, buf.len, 5000, &err);
    if (!st) st = gptoss_tp_net_encode_pool(&buf, &ready, &err);
    if (!st)
        st = gptoss_tp_net_send(link.fds[0], GPTOSS_TP_NET_READY, buf.data, buf.len, 5000, &err);
    if (!st) st = gptoss_tp_net_recv(link.fds[0], &type, &buf, 10000, &err);
    if (!st && type != GPTOSS_TP_NET_START) st = GPTOSS_ERR_IO;
    for (uint64_t want = 1; !st;) {
        st = gptoss_tp_net_recv(link.fds[0], &type, &buf, 10000, &err);
        if (st) {
            a->saw_leader_gone = gptoss_tp_link_leader_gone(&link);
            break;
        }
        if (type == GPTOSS_TP_NET_QUIT) {
            a->quit = true;
            break;
        }
        if (type != GPTOSS_TP_NET_STEP ||
            gptoss_tp_net_decode_step(buf.data, buf.len, &step, &err) || step.seq != want)
            break;
        gptoss_batch_plan expect =
            make_plan(1 + (int32_t)(want % 4), want % 2 == 0, (int32_t)want, storage);
        if (plans_equal(&expect, &step.plan) && step.graphs == (want % 3 == 0)) a->steps_ok++;
        if (want == 3 && a->mode == FOLLOW_LEAVE_AFTER_3) break;
        if (want == 3 && a->mode == FOLLOW_FAIL_AFTER_3) {
            gptoss_tp_net_encode_error(&buf, "CUDA error: an illegal memory access", &err);
            gptoss_tp_net_send(link.fds[0], GPTOSS_TP_NET_ERROR, buf.data, buf.len, 5000, &err);
            /* as a failing follower does: no more sends, then wait for process 0 to close, so
             * that the ERROR is read before the connection is reset */
            shutdown(link.fds[0], SHUT_WR);
            while (!gptoss_tp_net_recv(link.fds[0], &type, &buf, 5000, &err))
                ;
            break;
        }
        want++;
    }
    if (st) {
        a->end = st;
        snprintf(a->end_message, sizeof a->end_message, "%s", err.message);
    }
    gptoss_tp_net_step_free(&step);
    gptoss_tp_net_buf_free(&buf);
    gptoss_tp_link_close(&link);
    return NULL;
}

/* Process 0's side: hellos, readies (the pool is the smallest), START, N_STEPS steps each
 * followed by a check, QUIT. Returns the first failure (its message in err). */
static gptoss_status leader_run(const gptoss_dist_info *info, int *steps_sent, gptoss_error *err) {
    gptoss_tp_link link;
    uint8_t blob[GPTOSS_DIST_BLOB_BYTES] = {1, 2, 3};
    gptoss_status st = gptoss_tp_link_open(info, blob, 10000, &link, err);
    if (st) return st;
    gptoss_tp_net_hello hellos[GPTOSS_TP_NET_MAX_PROCS];
    gptoss_tp_net_pool pools[GPTOSS_TP_NET_MAX_PROCS];
    st = gptoss_tp_link_gather(&link, GPTOSS_TP_NET_HELLO, dec_hello, hellos, sizeof hellos[0],
                               5000, err);
    if (!st)
        st = gptoss_tp_link_gather(&link, GPTOSS_TP_NET_READY, dec_pool, pools, sizeof pools[0],
                                   5000, err);
    for (int32_t p = 1; !st && p < info->world_size; p++) {
        assert_int_equal(hellos[p].proc, p);
        assert_int_equal(pools[p].n_kv_blocks, 100 + p);
    }
    gptoss_tp_net_buf buf = {0};
    int32_t storage[1024];
    if (!st) st = gptoss_tp_net_encode_pool(&buf, &pools[1], err);
    if (!st)
        st = gptoss_tp_link_broadcast(&link, GPTOSS_TP_NET_START, buf.data, buf.len, 5000, NULL,
                                      err);
    for (uint64_t s = 1; !st && s <= N_STEPS; s++) {
        gptoss_batch_plan p = make_plan(1 + (int32_t)(s % 4), s % 2 == 0, (int32_t)s, storage);
        st = gptoss_tp_net_encode_step(&buf, s, GPTOSS_TP_NET_STEP_SAMPLE, s % 3 == 0, &p, err);
        if (!st)
            st = gptoss_tp_link_broadcast(&link, GPTOSS_TP_NET_STEP, buf.data, buf.len, 5000, NULL,
                                          err);
        /* what the watchdog does between and during steps: a follower gone shows within a
         * few checks */
        for (int k = 0; k < 10 && !st; k++) {
            st = gptoss_tp_link_check(&link, err);
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (!st) (*steps_sent)++;
    }
    if (!st) st = gptoss_tp_link_broadcast(&link, GPTOSS_TP_NET_QUIT, NULL, 0, 5000, NULL, err);
    gptoss_tp_net_buf_free(&buf);
    gptoss_tp_link_close(&link);
    return st;
}

static void run_job(follow_mode last_mode, gptoss_status *leader_st, gptoss_error *leader_err,
                    int *steps_sent, follower_arg *fa) {
    const int port = free_port();
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        memset(&fa[i], 0, sizeof fa[i]);
        fa[i].info = job(i + 1, 3, port);
        fa[i].mode = i == 1 ? last_mode : FOLLOW_ALL;
        assert_int_equal(pthread_create(&t[i], NULL, follower_main, &fa[i]), 0);
    }
    gptoss_dist_info info = job(0, 3, port);
    *steps_sent = 0;
    *leader_st = leader_run(&info, steps_sent, leader_err);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
}

static void test_exchange(void **state) {
    (void)state;
    follower_arg fa[2];
    gptoss_error err = {0};
    gptoss_status st;
    int sent = 0;
    run_job(FOLLOW_ALL, &st, &err, &sent, fa);
    if (st) fail_msg("process 0: %s", err.message);
    assert_int_equal(sent, N_STEPS);
    for (int i = 0; i < 2; i++) {
        if (fa[i].end) fail_msg("follower %d: %s", i + 1, fa[i].end_message);
        assert_true(fa[i].quit);
        assert_int_equal(fa[i].steps_ok, N_STEPS);
    }
}

static void test_follower_leaves(void **state) {
    (void)state;
    follower_arg fa[2];
    gptoss_error err = {0};
    gptoss_status st;
    int sent = 0;
    const double t0 = gptoss_now_seconds();
    run_job(FOLLOW_LEAVE_AFTER_3, &st, &err, &sent, fa);
    assert_int_not_equal(st, GPTOSS_OK);
    if (!strstr(err.message, "process 2") || !strstr(err.message, "closed the connection"))
        fail_msg("process 0's message: %s", err.message);
    assert_true(sent >= 2 && sent < N_STEPS); /* seen soon after it left */
    assert_true(gptoss_now_seconds() - t0 < 10);
    /* follower 1 saw process 0 go: the link said so, and its receive failed with why */
    assert_false(fa[0].quit);
    assert_int_not_equal(fa[0].end, GPTOSS_OK);
    if (!strstr(fa[0].end_message, "closed the connection"))
        fail_msg("follower 1's message: %s", fa[0].end_message);
    assert_true(fa[0].saw_leader_gone);
}

static void test_follower_reports_error(void **state) {
    (void)state;
    follower_arg fa[2];
    gptoss_error err = {0};
    gptoss_status st;
    int sent = 0;
    run_job(FOLLOW_FAIL_AFTER_3, &st, &err, &sent, fa);
    assert_int_not_equal(st, GPTOSS_OK);
    if (!strstr(err.message, "process 2 failed: CUDA error: an illegal memory access"))
        fail_msg("process 0's message: %s", err.message);
}

/* ---- the job's exchanges: HELLO, READY/START, the follower's loop ------------------------ */

typedef enum {
    ROLE_OK,
    ROLE_OTHER_MODEL,  /* a HELLO with other KV heads */
    ROLE_LOAD_FAILS,   /* loading fails */
    ROLE_BAD_PLAN,     /* process 0: step 3 names a page that does not exist */
    ROLE_SKIP_STEP,    /* process 0: step 3 is numbered 4 */
    ROLE_LEADER_LEAVES /* process 0: closes after step 3 */
} role;

typedef struct job_arg {
    gptoss_dist_info info;
    role role; /* this thread's (process 0 takes the job's) */
    gptoss_status hello, ready, follow;
    char message[1024];
    gptoss_tp_net_pool pool;
    uint64_t last_seq;
    int steps_run;
} job_arg;

/* The tiny preset, made once: process 0 and the followers' threads ask for it at the same
 * time (a lazy fill here once let a follower read a half-made config: a HELLO of 0 layers). */
static gptoss_config tiny_config;
static bool tiny_made;
static void tiny_make(void) {
    gptoss_error e = {0};
    tiny_made = gptoss_config_preset("tiny", &tiny_config, &e) == GPTOSS_OK;
}
static const gptoss_config *tiny(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, tiny_make);
    assert_true(tiny_made);
    return &tiny_config;
}

static gptoss_tp_net_hello hello_of(const job_arg *a) {
    const gptoss_config *c = tiny();
    gptoss_tp_net_hello h = {.proc = a->info.rank,
                             .n_procs = a->info.world_size,
                             .tp_size = 2 * a->info.world_size,
                             .n_layers = c->n_layers,
                             .n_heads = c->n_heads,
                             .n_kv_heads = c->n_kv_heads,
                             .kv_block_size = 16,
                             .gpu_sms = 132};
    if (a->role == ROLE_OTHER_MODEL) h.n_kv_heads *= 2;
    return h;
}

/* A follower's run: the plan must be the one process 0 made for that step. */
static gptoss_status run_step(void *user, const gptoss_tp_net_step *step, gptoss_error *error) {
    job_arg *a = user;
    int32_t storage[1024];
    gptoss_batch_plan want =
        make_plan(1 + (int32_t)(step->seq % 4), step->seq % 2 == 0, (int32_t)step->seq, storage);
    if (!plans_equal(&want, &step->plan))
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "step %llu: not the plan sent",
                                (unsigned long long)step->seq);
    a->steps_run++;
    return GPTOSS_OK;
}

static void *job_follower(void *p) {
    job_arg *a = p;
    gptoss_tp_link link;
    uint8_t blob[GPTOSS_DIST_BLOB_BYTES];
    gptoss_error err = {0};
    a->hello = a->ready = a->follow = GPTOSS_ERR_BACKEND;
    if (gptoss_tp_link_open(&a->info, blob, 10000, &link, &err)) {
        snprintf(a->message, sizeof a->message, "open: %s", err.message);
        return NULL;
    }
    gptoss_tp_net_hello h = hello_of(a);
    a->hello = gptoss_tp_link_hello(&link, &h, 5000, &err);
    if (!a->hello) {
        a->pool = (gptoss_tp_net_pool){100 + a->info.rank, 600 + a->info.rank, 0};
        a->ready =
            gptoss_tp_link_ready(&link, a->role == ROLE_LOAD_FAILS ? GPTOSS_ERR_OUT_OF_MEMORY : 0,
                                 "CUDA out of memory on GPU 1", &a->pool, &err);
    }
    if (!a->hello && !a->ready) {
        const gptoss_tp_follow_geometry geo = {tiny(), 16, a->pool.n_kv_blocks,
                                               a->pool.n_sliding_kv_blocks};
        a->follow = gptoss_tp_link_follow(&link, &geo, run_step, a, &a->last_seq, &err);
    }
    snprintf(a->message, sizeof a->message, "%s", err.message);
    gptoss_tp_link_close(&link);
    return NULL;
}

/* Process 0 of a job of 3 whose follower 2 takes `r2`, or whose process 0 itself acts `r0`. */
static void run_handshake(role r0, role r2, job_arg *leader, job_arg *followers) {
    const int port = free_port();
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        memset(&followers[i], 0, sizeof followers[i]);
        followers[i].info = job(i + 1, 3, port);
        followers[i].role = i == 1 ? r2 : ROLE_OK;
        assert_int_equal(pthread_create(&t[i], NULL, job_follower, &followers[i]), 0);
    }
    memset(leader, 0, sizeof *leader);
    leader->info = job(0, 3, port);
    leader->role = r0;
    leader->hello = leader->ready = leader->follow = GPTOSS_ERR_BACKEND;
    gptoss_tp_link link;
    uint8_t blob[GPTOSS_DIST_BLOB_BYTES] = {0};
    gptoss_error err = {0};
    gptoss_status st = gptoss_tp_link_open(&leader->info, blob, 10000, &link, &err);
    assert_int_equal(st, GPTOSS_OK);
    gptoss_tp_net_hello h = hello_of(leader);
    leader->hello = gptoss_tp_link_hello(&link, &h, 5000, &err);
    if (!leader->hello) {
        leader->pool = (gptoss_tp_net_pool){120, 700, 0};
        leader->ready = gptoss_tp_link_ready(&link, GPTOSS_OK, NULL, &leader->pool, &err);
    }
    if (!leader->hello && !leader->ready) {
        gptoss_tp_net_buf buf = {0};
        int32_t storage[1024];
        st = GPTOSS_OK;
        for (uint64_t s = 1; s <= N_STEPS && !st; s++) {
            gptoss_batch_plan p = make_plan(1 + (int32_t)(s % 4), s % 2 == 0, (int32_t)s, storage);
            if (s == 3 && r0 == ROLE_BAD_PLAN) storage[192] = 9999; /* a page of no pool */
            uint64_t seq = s == 3 && r0 == ROLE_SKIP_STEP ? 4 : s;
            st = gptoss_tp_net_encode_step(&buf, seq, GPTOSS_TP_NET_STEP_SUMMARY, false, &p, &err);
            if (!st)
                st = gptoss_tp_link_broadcast(&link, GPTOSS_TP_NET_STEP, buf.data, buf.len, 5000,
                                              NULL, &err);
            for (int k = 0; k < 10 && !st; k++) {
                st = gptoss_tp_link_check(&link, &err);
                struct timespec ts = {0, 5 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            if (s == 3 && r0 == ROLE_LEADER_LEAVES) break;
        }
        if (!st && r0 != ROLE_LEADER_LEAVES)
            st = gptoss_tp_link_broadcast(&link, GPTOSS_TP_NET_QUIT, NULL, 0, 5000, NULL, &err);
        leader->follow = st;
        gptoss_tp_net_buf_free(&buf);
    }
    snprintf(leader->message, sizeof leader->message, "%s", err.message);
    gptoss_tp_link_close(&link);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
}

static void expect_in(const char *message, const char *needle, const char *who) {
    if (!strstr(message, needle)) fail_msg("%s said '%s', not '%s'", who, message, needle);
}

static void test_job_ok(void **state) {
    (void)state;
    job_arg leader, f[2];
    run_handshake(ROLE_OK, ROLE_OK, &leader, f);
    if (leader.follow) fail_msg("process 0: %s", leader.message);
    /* every process uses the smallest of each count: follower 1's (process 0 has more) */
    assert_int_equal(leader.pool.n_kv_blocks, 101);
    assert_int_equal(leader.pool.n_sliding_kv_blocks, 601);
    for (int i = 0; i < 2; i++) {
        if (f[i].follow) fail_msg("follower %d: %s", i + 1, f[i].message);
        assert_int_equal(f[i].pool.n_kv_blocks, 101);
        assert_int_equal(f[i].pool.n_sliding_kv_blocks, 601);
        assert_int_equal(f[i].steps_run, N_STEPS);
        assert_true(f[i].last_seq == N_STEPS);
    }
}

static void test_job_other_model(void **state) {
    (void)state;
    job_arg leader, f[2];
    run_handshake(ROLE_OK, ROLE_OTHER_MODEL, &leader, f);
    assert_int_not_equal(leader.hello, GPTOSS_OK);
    expect_in(leader.message,
              "process 2 was started differently from process 0 (the model's KV heads",
              "process 0");
    for (int i = 0; i < 2; i++) {
        assert_int_not_equal(f[i].hello, GPTOSS_OK);
        expect_in(f[i].message, "process 0: process 2 was started differently", "a follower");
    }
}

static void test_job_load_fails(void **state) {
    (void)state;
    job_arg leader, f[2];
    run_handshake(ROLE_OK, ROLE_LOAD_FAILS, &leader, f);
    assert_int_equal(leader.hello, GPTOSS_OK);
    assert_int_not_equal(leader.ready, GPTOSS_OK);
    expect_in(leader.message, "process 2 failed: loading failed on process 2: CUDA out of memory",
              "process 0");
    expect_in(f[1].message, "loading failed on process 2", "follower 2");
    assert_int_not_equal(f[0].ready, GPTOSS_OK); /* told by process 0 why there is no START */
    expect_in(f[0].message, "process 0: process 2 failed: loading failed", "follower 1");
}

static void test_job_bad_steps(void **state) {
    (void)state;
    job_arg leader, f[2];
    run_handshake(ROLE_BAD_PLAN, ROLE_OK, &leader, f);
    assert_int_not_equal(leader.follow, GPTOSS_OK);
    expect_in(leader.message, "received a bad step from process 0: plan: sequence 0 block table",
              "process 0");
    for (int i = 0; i < 2; i++) {
        assert_int_not_equal(f[i].follow, GPTOSS_OK);
        assert_int_equal(f[i].steps_run, 2); /* steps 1 and 2 ran, 3 was refused */
    }
    expect_in(f[0].message, "is not a block in [0, 101)", "follower 1");

    run_handshake(ROLE_SKIP_STEP, ROLE_OK, &leader, f);
    assert_int_not_equal(leader.follow, GPTOSS_OK);
    expect_in(f[0].message, "step 4 arrived after step 2", "follower 1");
    assert_int_equal(f[0].steps_run, 2);
}

static void test_job_leader_leaves(void **state) {
    (void)state;
    job_arg leader, f[2];
    run_handshake(ROLE_LEADER_LEAVES, ROLE_OK, &leader, f);
    for (int i = 0; i < 2; i++) {
        assert_int_not_equal(f[i].follow, GPTOSS_OK);
        assert_int_equal(f[i].steps_run, 3);
        expect_in(f[i].message, "the connection to process 0 ended after step 3", "a follower");
    }
}

/* A job larger than the link takes, and one whose followers never come, fail with a reason. */
static void test_link_refusals(void **state) {
    (void)state;
    gptoss_tp_link link;
    uint8_t blob[GPTOSS_DIST_BLOB_BYTES] = {0};
    gptoss_error err = {0};
    gptoss_dist_info big = job(0, GPTOSS_TP_NET_MAX_PROCS + 1, free_port());
    assert_int_not_equal(gptoss_tp_link_open(&big, blob, 100, &link, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "processes"));
    gptoss_dist_info alone = job(0, 2, free_port());
    assert_int_not_equal(gptoss_tp_link_open(&alone, blob, 300, &link, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "missing rank 1"));
    for (int i = 0; i < GPTOSS_TP_NET_MAX_PROCS; i++)
        assert_int_equal(link.fds[i], -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_round_trip),
        cmocka_unit_test(test_bad_payloads),
        cmocka_unit_test(test_hello_differs),
        cmocka_unit_test(test_bad_frames),
        cmocka_unit_test(test_exchange),
        cmocka_unit_test(test_follower_leaves),
        cmocka_unit_test(test_follower_reports_error),
        cmocka_unit_test(test_link_refusals),
        cmocka_unit_test(test_job_ok),
        cmocka_unit_test(test_job_other_model),
        cmocka_unit_test(test_job_load_fails),
        cmocka_unit_test(test_job_bad_steps),
        cmocka_unit_test(test_job_leader_leaves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
