/*
 * test_dist.c - rank and world from flags, Open MPI and Slurm (precedence and validation,
 * against environments written out here), Slurm node lists, and the TCP rendezvous with
 * N ranks as N threads on loopback: the blob arrives everywhere; a wrong world size, a
 * duplicate rank, a missing rank and an unreachable master fail with messages that say so.
 */
#include "test_support.h"

#include "util/dist.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- a fake environment --------------------------------------------------------------------- */

typedef struct fake_env {
    const char *const *pairs; /* name, value, name, value, ..., NULL */
} fake_env;

static const char *fake_getenv(void *user, const char *name) {
    const fake_env *e = user;
    for (const char *const *p = e->pairs; *p; p += 2)
        if (!strcmp(p[0], name)) return p[1];
    return NULL;
}

static gptoss_status resolve(const gptoss_dist_flags *flags, const char *const *pairs,
                             gptoss_dist_info *info, gptoss_error *err) {
    fake_env env = {pairs};
    return gptoss_dist_resolve(flags, fake_getenv, &env, info, err);
}

static void test_single_process(void **state) {
    (void)state;
    const char *none[] = {"PATH", "/bin", NULL};
    gptoss_dist_info info;
    gptoss_error err = {0};
    assert_int_equal(resolve(NULL, none, &info, &err), GPTOSS_OK);
    assert_int_equal(info.source, GPTOSS_DIST_SINGLE);
    assert_int_equal(info.rank, 0);
    assert_int_equal(info.world_size, 1);
    assert_int_equal(info.n_nodes, 1);
    assert_int_equal(info.master_port, GPTOSS_DIST_DEFAULT_PORT);
    /* A batch script's own process (SLURM_PROCID without a job step) is a single process. */
    const char *batch[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "8", NULL};
    assert_int_equal(resolve(NULL, batch, &info, &err), GPTOSS_OK);
    assert_int_equal(info.source, GPTOSS_DIST_SINGLE);
    assert_int_equal(info.world_size, 1);
}

static void test_flags(void **state) {
    (void)state;
    const char *env[] = {
        "OMPI_COMM_WORLD_RANK", "3", "OMPI_COMM_WORLD_SIZE", "8", "MASTER_PORT", "1234", NULL};
    gptoss_dist_flags f = gptoss_dist_flags_default();
    f.nnodes = 2, f.node_rank = 1, f.master_addr = "10.0.0.1";
    gptoss_dist_info info;
    gptoss_error err = {0};
    assert_int_equal(resolve(&f, env, &info, &err), GPTOSS_OK);
    assert_int_equal(info.source, GPTOSS_DIST_FLAGS); /* the flags win over Open MPI */
    assert_int_equal(info.rank, 1);
    assert_int_equal(info.world_size, 2);
    assert_int_equal(info.node_rank, 1);
    assert_int_equal(info.n_nodes, 2);
    assert_int_equal(info.local_rank, 0);
    assert_int_equal(info.local_world_size, 1);
    assert_string_equal(info.master_addr, "10.0.0.1");
    assert_int_equal(info.master_port, 1234); /* MASTER_PORT when --master-port is not given */
    f.master_port = 4321;
    assert_int_equal(resolve(&f, env, &info, &err), GPTOSS_OK);
    assert_int_equal(info.master_port, 4321);

    const char *empty[] = {NULL};
    gptoss_dist_flags bad = f;
    bad.node_rank = 2;
    assert_int_equal(resolve(&bad, empty, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "--node-rank 2 is not below --nnodes 2"));
    bad = f;
    bad.node_rank = -1;
    assert_int_equal(resolve(&bad, empty, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "needs --node-rank"));
    bad = f;
    bad.master_addr = NULL;
    assert_int_equal(resolve(&bad, empty, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "--master-addr"));
    bad = gptoss_dist_flags_default();
    bad.node_rank = 0;
    assert_int_equal(resolve(&bad, empty, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "need --nnodes"));
    bad = f;
    bad.master_port = 70000;
    assert_int_equal(resolve(&bad, empty, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    /* --nnodes 1 alone is a single node that needs no master */
    gptoss_dist_flags one = gptoss_dist_flags_default();
    one.nnodes = 1;
    assert_int_equal(resolve(&one, empty, &info, &err), GPTOSS_OK);
    assert_int_equal(info.world_size, 1);
}

static void test_openmpi(void **state) {
    (void)state;
    /* mpirun inside a Slurm step: Open MPI's numbers win over the inherited Slurm ones. */
    const char *env[] = {"OMPI_COMM_WORLD_RANK",
                         "5",
                         "OMPI_COMM_WORLD_SIZE",
                         "8",
                         "OMPI_COMM_WORLD_LOCAL_RANK",
                         "1",
                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                         "4",
                         "MASTER_ADDR",
                         "head",
                         "SLURM_PROCID",
                         "0",
                         "SLURM_STEP_ID",
                         "0",
                         "SLURM_NTASKS",
                         "1",
                         NULL};
    gptoss_dist_info info;
    gptoss_error err = {0};
    assert_int_equal(resolve(NULL, env, &info, &err), GPTOSS_OK);
    assert_int_equal(info.source, GPTOSS_DIST_OPENMPI);
    assert_int_equal(info.rank, 5);
    assert_int_equal(info.world_size, 8);
    assert_int_equal(info.local_rank, 1);
    assert_int_equal(info.local_world_size, 4);
    assert_int_equal(info.n_nodes, 2);
    assert_int_equal(info.node_rank, 1);
    assert_string_equal(info.master_addr, "head");

    const char *bad_rank[] = {"OMPI_COMM_WORLD_RANK",
                              "8",
                              "OMPI_COMM_WORLD_SIZE",
                              "8",
                              "OMPI_COMM_WORLD_LOCAL_RANK",
                              "0",
                              "MASTER_ADDR",
                              "h",
                              NULL};
    assert_int_equal(resolve(NULL, bad_rank, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "rank 8 of 8"));
    const char *junk[] = {"OMPI_COMM_WORLD_RANK", "1x", "OMPI_COMM_WORLD_SIZE", "2", NULL};
    assert_int_equal(resolve(NULL, junk, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "OMPI_COMM_WORLD_RANK='1x'"));
    const char *no_master[] = {"OMPI_COMM_WORLD_RANK",
                               "1",
                               "OMPI_COMM_WORLD_SIZE",
                               "2",
                               "OMPI_COMM_WORLD_LOCAL_RANK",
                               "1",
                               NULL};
    assert_int_equal(resolve(NULL, no_master, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "MASTER_ADDR"));
    const char *uneven[] = {"OMPI_COMM_WORLD_RANK",
                            "0",
                            "OMPI_COMM_WORLD_SIZE",
                            "6",
                            "OMPI_COMM_WORLD_LOCAL_RANK",
                            "0",
                            "OMPI_COMM_WORLD_LOCAL_SIZE",
                            "4",
                            "MASTER_ADDR",
                            "h",
                            NULL};
    assert_int_equal(resolve(NULL, uneven, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "not a multiple"));
}

static void test_slurm(void **state) {
    (void)state;
    const char *env[] = {"SLURM_PROCID",
                         "3",
                         "SLURM_STEP_ID",
                         "0",
                         "SLURM_STEP_NUM_TASKS",
                         "4",
                         "SLURM_NTASKS",
                         "16", /* the allocation's: the step's wins */
                         "SLURM_STEP_NUM_NODES",
                         "2",
                         "SLURM_NODEID",
                         "1",
                         "SLURM_LOCALID",
                         "1",
                         "SLURM_STEP_NODELIST",
                         "gpu[007-008]",
                         NULL};
    gptoss_dist_info info;
    gptoss_error err = {0};
    assert_int_equal(resolve(NULL, env, &info, &err), GPTOSS_OK);
    assert_int_equal(info.source, GPTOSS_DIST_SLURM);
    assert_int_equal(info.rank, 3);
    assert_int_equal(info.world_size, 4);
    assert_int_equal(info.local_rank, 1);
    assert_int_equal(info.local_world_size, 2);
    assert_int_equal(info.node_rank, 1);
    assert_int_equal(info.n_nodes, 2);
    assert_string_equal(info.master_addr, "gpu007");

    const char *local_too_big[] = {"SLURM_PROCID",
                                   "1",
                                   "SLURM_STEP_ID",
                                   "0",
                                   "SLURM_NTASKS",
                                   "2",
                                   "SLURM_NNODES",
                                   "2",
                                   "SLURM_LOCALID",
                                   "1",
                                   "MASTER_ADDR",
                                   "x",
                                   NULL};
    assert_int_equal(resolve(NULL, local_too_big, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "local rank 1 of 1"));
    const char *uneven[] = {"SLURM_PROCID",
                            "0",
                            "SLURM_STEP_ID",
                            "0",
                            "SLURM_NTASKS",
                            "3",
                            "SLURM_NNODES",
                            "2",
                            "MASTER_ADDR",
                            "x",
                            NULL};
    assert_int_equal(resolve(NULL, uneven, &info, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "spread evenly"));
}

static void test_first_host(void **state) {
    (void)state;
    char h[64];
    assert_true(gptoss_dist_first_host("node1", h, sizeof h));
    assert_string_equal(h, "node1");
    assert_true(gptoss_dist_first_host("a,b,c", h, sizeof h));
    assert_string_equal(h, "a");
    assert_true(gptoss_dist_first_host("gpu[07-09,12],cpu1", h, sizeof h));
    assert_string_equal(h, "gpu07");
    assert_true(gptoss_dist_first_host("n[3,5]-ib", h, sizeof h));
    assert_string_equal(h, "n3-ib");
    assert_false(gptoss_dist_first_host("", h, sizeof h));
    assert_false(gptoss_dist_first_host("gpu[", h, sizeof h));
    assert_false(gptoss_dist_first_host("gpu[x-1]", h, sizeof h));
    assert_false(gptoss_dist_first_host("gpu[1-2", h, sizeof h));
    assert_false(gptoss_dist_first_host("averyveryverylongname", h, 8));
}

/* ---- the rendezvous ------------------------------------------------------------------------ */

/* A port nobody listens on right now (bound and released; the rendezvous binds it again). */
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

typedef struct rank_arg {
    gptoss_dist_info info;
    int64_t timeout_ms;
    uint8_t blob[GPTOSS_DIST_BLOB_BYTES];
    gptoss_status status;
    gptoss_error error;
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    a->status = gptoss_dist_rendezvous(&a->info, a->blob, a->timeout_ms, &a->error);
    return NULL;
}

/* Runs ranks[0..n) as threads, each with its rank / world size; rank 0's blob is 0, 1, 2 ...
 * and the others start at 0xee. */
static void run_ranks(rank_arg *args, int n, const int *ranks, const int *worlds, int port,
                      int64_t timeout_ms) {
    pthread_t t[16];
    for (int i = 0; i < n; i++) {
        memset(&args[i], 0, sizeof args[i]);
        args[i].info.source = GPTOSS_DIST_FLAGS;
        args[i].info.rank = ranks[i];
        args[i].info.world_size = worlds[i];
        args[i].info.local_world_size = 1;
        args[i].info.n_nodes = worlds[i];
        args[i].info.node_rank = ranks[i];
        snprintf(args[i].info.master_addr, sizeof args[i].info.master_addr, "127.0.0.1");
        args[i].info.master_port = port;
        args[i].timeout_ms = timeout_ms;
        for (int b = 0; b < GPTOSS_DIST_BLOB_BYTES; b++)
            args[i].blob[b] = ranks[i] == 0 ? (uint8_t)b : 0xee;
    }
    /* the other ranks first: they must wait for rank 0 to come up */
    for (int i = n - 1; i >= 0; i--)
        assert_int_equal(pthread_create(&t[i], NULL, rank_main, &args[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

static void test_rendezvous_ok(void **state) {
    (void)state;
    enum { N = 5 };
    rank_arg args[N];
    int ranks[N] = {0, 1, 2, 3, 4}, worlds[N] = {N, N, N, N, N};
    run_ranks(args, N, ranks, worlds, free_port(), 20000);
    for (int i = 0; i < N; i++) {
        assert_int_equal(args[i].status, GPTOSS_OK);
        for (int b = 0; b < GPTOSS_DIST_BLOB_BYTES; b++)
            assert_int_equal(args[i].blob[b], (uint8_t)b);
    }
    /* a world of one needs nobody */
    rank_arg alone;
    int zero = 0, one = 1;
    run_ranks(&alone, 1, &zero, &one, 1, 10);
    assert_int_equal(alone.status, GPTOSS_OK);
}

static void test_rendezvous_world_mismatch(void **state) {
    (void)state;
    rank_arg args[3];
    int ranks[3] = {0, 1, 2}, worlds[3] = {3, 3, 4};
    run_ranks(args, 3, ranks, worlds, free_port(), 20000);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(args[i].status, GPTOSS_ERR_IO);
        assert_non_null(strstr(args[i].error.message, "world size mismatch"));
        assert_int_equal(args[i].blob[0], i == 0 ? 0 : 0xee); /* nobody got a blob */
    }
}

static void test_rendezvous_duplicate_rank(void **state) {
    (void)state;
    rank_arg args[3];
    int ranks[3] = {0, 1, 1}, worlds[3] = {3, 3, 3};
    run_ranks(args, 3, ranks, worlds, free_port(), 20000);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(args[i].status, GPTOSS_ERR_IO);
        assert_non_null(strstr(args[i].error.message, "two processes claim rank 1"));
    }
}

static void test_rendezvous_missing_rank(void **state) {
    (void)state;
    rank_arg args[3];
    int ranks[3] = {0, 1, 3}, worlds[3] = {5, 5, 5}; /* 2 and 4 never come */
    run_ranks(args, 3, ranks, worlds, free_port(), 700);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(args[i].status, GPTOSS_ERR_IO);
        assert_non_null(strstr(args[i].error.message, "3 of 5 processes joined; missing rank 2 4"));
    }
}

static void test_rendezvous_unreachable(void **state) {
    (void)state;
    rank_arg args[1];
    int ranks[1] = {1}, worlds[1] = {2};
    run_ranks(args, 1, ranks, worlds, free_port(), 400);
    assert_int_equal(args[0].status, GPTOSS_ERR_IO);
    assert_non_null(strstr(args[0].error.message, "cannot reach rank 0 at 127.0.0.1:"));
    assert_int_equal(args[0].blob[0], 0xee);
    /* rank 0 on an address of no interface here cannot listen, and says why */
    rank_arg r0;
    int zero = 0;
    run_ranks(&r0, 1, &zero, worlds, free_port(), 400);
    assert_int_equal(r0.status, GPTOSS_ERR_IO); /* alone: the others never come */
    snprintf(r0.info.master_addr, sizeof r0.info.master_addr, "192.0.2.1"); /* TEST-NET-1 */
    gptoss_error err = {0};
    assert_int_equal(gptoss_dist_rendezvous(&r0.info, r0.blob, 400, &err), GPTOSS_ERR_IO);
    assert_non_null(strstr(err.message, "rank 0 cannot listen on 192.0.2.1"));
}

static void test_env_defaults(void **state) {
    (void)state;
    unsetenv("NCCL_NVLS_ENABLE");
    gptoss_dist_env_defaults();
    assert_string_equal(getenv("NCCL_NVLS_ENABLE"), "0");
    setenv("NCCL_NVLS_ENABLE", "1", 1);
    gptoss_dist_env_defaults();
    assert_string_equal(getenv("NCCL_NVLS_ENABLE"), "1"); /* the user's value stays */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_process),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_openmpi),
        cmocka_unit_test(test_slurm),
        cmocka_unit_test(test_first_host),
        cmocka_unit_test(test_rendezvous_ok),
        cmocka_unit_test(test_rendezvous_world_mismatch),
        cmocka_unit_test(test_rendezvous_duplicate_rank),
        cmocka_unit_test(test_rendezvous_missing_rank),
        cmocka_unit_test(test_rendezvous_unreachable),
        cmocka_unit_test(test_env_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
