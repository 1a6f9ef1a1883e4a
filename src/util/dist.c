/*
 * dist.c - rank and world from flags or launcher, and the TCP rendezvous (see dist.h).
 *
 * The wire, all integers big-endian:
 *   rank r -> rank 0:  "GPTOSSRV" (8 bytes), version u32, world_size u32, rank u32
 *   rank 0 -> rank r:  status u32 (0 = ok), then either blob[GPTOSS_DIST_BLOB_BYTES] or a
 *                      message: length u32 (< 1024) and its bytes
 */
/* accept4 and SOCK_NONBLOCK need _GNU_SOURCE, which the build defines. */
#include "util/dist.h"

#include "util/clock.h"
#include "util/error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RV_MAGIC "GPTOSSRV"
#define RV_VERSION 1u
#define RV_HELLO_BYTES 20
#define RV_MAX_MESSAGE 1024

const char *gptoss_dist_source_name(gptoss_dist_source s) {
    switch (s) {
    case GPTOSS_DIST_SINGLE:
        return "single process";
    case GPTOSS_DIST_FLAGS:
        return "flags";
    case GPTOSS_DIST_OPENMPI:
        return "Open MPI";
    case GPTOSS_DIST_SLURM:
        return "Slurm";
    }
    return "?";
}

gptoss_dist_flags gptoss_dist_flags_default(void) {
    return (gptoss_dist_flags){.nnodes = 0, .node_rank = -1, .master_addr = NULL, .master_port = 0};
}

/* ---- resolving ------------------------------------------------------------------------------ */

static const char *env_getenv(void *user, const char *name) {
    (void)user;
    return getenv(name);
}

typedef struct env_reader {
    gptoss_dist_getenv_fn get;
    void *user;
} env_reader;

static const char *env_str(const env_reader *r, const char *name) {
    const char *v = r->get(r->user, name);
    return v && *v ? v : NULL;
}

/* An integer in [lo, hi] from a whole string. */
static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* Reads variable `name` into *out (in [lo, hi]); fails naming it when present but bad. A
 * missing variable leaves *out and is not an error unless `required`. */
static gptoss_status env_int(const env_reader *r, const char *name, bool required, int64_t lo,
                             int64_t hi, int64_t *out, gptoss_error *error) {
    const char *v = env_str(r, name);
    if (!v) {
        if (required)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "distributed launch: %s is not set", name);
        return GPTOSS_OK;
    }
    if (!parse_int(v, lo, hi, out))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "distributed launch: %s='%s' is not an integer in [%lld, %lld]",
                                name, v, (long long)lo, (long long)hi);
    return GPTOSS_OK;
}

bool gptoss_dist_first_host(const char *list, char *out, size_t out_size) {
    if (!list || !*list || out_size == 0) return false;
    size_t n = 0;
    const char *p = list;
    while (*p && *p != ',' && *p != '[') {
        if (n + 1 >= out_size) return false;
        out[n++] = *p++;
    }
    if (*p == '[') { /* a range: take its first number, zero padding kept */
        p++;
        if (*p < '0' || *p > '9') return false;
        while (*p >= '0' && *p <= '9') {
            if (n + 1 >= out_size) return false;
            out[n++] = *p++;
        }
        if (*p != '-' && *p != ',' && *p != ']') return false;
        const char *close = strchr(p, ']');
        if (!close) return false;
        p = close + 1; /* a suffix after the range ("n[1-2]-ib") belongs to the name */
        while (*p && *p != ',') {
            if (*p == '[') return false; /* two ranges in one name: not supported */
            if (n + 1 >= out_size) return false;
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    return n > 0;
}

gptoss_status gptoss_dist_resolve(const gptoss_dist_flags *flags, gptoss_dist_getenv_fn get,
                                  void *get_user, gptoss_dist_info *info, gptoss_error *error) {
    memset(info, 0, sizeof *info);
    env_reader env = {get ? get : env_getenv, get ? get_user : NULL};
    gptoss_dist_flags none = gptoss_dist_flags_default();
    if (!flags) flags = &none;
    gptoss_status st;
    int64_t rank = 0, world = 1, local_rank = 0, local_world = 1, node = 0, nodes = 1;
    const int64_t max = GPTOSS_DIST_MAX_WORLD;

    if (flags->nnodes == 0 &&
        (flags->node_rank >= 0 || flags->master_addr || flags->master_port != 0))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "--node-rank, --master-addr and --master-port need --nnodes");
    if (flags->nnodes != 0) {
        if (flags->nnodes < 1 || flags->nnodes > max)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "--nnodes needs an integer in [1, %lld]", (long long)max);
        if (flags->nnodes > 1 && flags->node_rank < 0)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "--nnodes %lld needs --node-rank (0 on the master node)",
                                    (long long)flags->nnodes);
        node = flags->node_rank < 0 ? 0 : flags->node_rank;
        if (node >= flags->nnodes)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "--node-rank %lld is not below --nnodes %lld", (long long)node,
                                    (long long)flags->nnodes);
        info->source = GPTOSS_DIST_FLAGS;
        nodes = world = flags->nnodes;
        rank = node;
    } else if (env_str(&env, "OMPI_COMM_WORLD_RANK") || env_str(&env, "OMPI_COMM_WORLD_SIZE")) {
        info->source = GPTOSS_DIST_OPENMPI;
        if ((st = env_int(&env, "OMPI_COMM_WORLD_SIZE", true, 1, max, &world, error)) ||
            (st = env_int(&env, "OMPI_COMM_WORLD_RANK", true, 0, max - 1, &rank, error)))
            return st;
        local_world = world; /* one node unless Open MPI says otherwise */
        if ((st =
                 env_int(&env, "OMPI_COMM_WORLD_LOCAL_SIZE", false, 1, max, &local_world, error)) ||
            (st = env_int(&env, "OMPI_COMM_WORLD_LOCAL_RANK", world > 1, 0, max - 1, &local_rank,
                          error)))
            return st;
        /* Open MPI names no node index; with its default by-slot mapping a node holds
         * consecutive ranks. */
        if (world % local_world)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "distributed launch: OMPI_COMM_WORLD_SIZE %lld is not a "
                                    "multiple of OMPI_COMM_WORLD_LOCAL_SIZE %lld (every node "
                                    "must run as many processes)",
                                    (long long)world, (long long)local_world);
        nodes = world / local_world;
        node = rank / local_world;
    } else if (env_str(&env, "SLURM_PROCID") && env_str(&env, "SLURM_STEP_ID")) {
        info->source = GPTOSS_DIST_SLURM;
        const char *tasks =
            env_str(&env, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
        const char *n_nodes =
            env_str(&env, "SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
        if ((st = env_int(&env, tasks, true, 1, max, &world, error)) ||
            (st = env_int(&env, "SLURM_PROCID", true, 0, max - 1, &rank, error)) ||
            (st = env_int(&env, n_nodes, false, 1, max, &nodes, error)) ||
            (st = env_int(&env, "SLURM_NODEID", false, 0, max - 1, &node, error)) ||
            (st = env_int(&env, "SLURM_LOCALID", false, 0, max - 1, &local_rank, error)))
            return st;
        if (world % nodes)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "distributed launch: %s %lld tasks do not spread evenly "
                                    "over %s %lld nodes (use srun --ntasks-per-node)",
                                    tasks, (long long)world, n_nodes, (long long)nodes);
        local_world = world / nodes;
    } else {
        info->source = GPTOSS_DIST_SINGLE;
    }
    if (rank >= world || local_rank >= local_world || node >= nodes || local_world > world)
        return gptoss_set_error(
            error, GPTOSS_ERR_INVALID_ARGUMENT,
            "distributed launch (%s): inconsistent numbers: rank %lld of %lld, local rank %lld "
            "of %lld, node %lld of %lld",
            gptoss_dist_source_name(info->source), (long long)rank, (long long)world,
            (long long)local_rank, (long long)local_world, (long long)node, (long long)nodes);
    info->rank = (int32_t)rank, info->world_size = (int32_t)world;
    info->local_rank = (int32_t)local_rank, info->local_world_size = (int32_t)local_world;
    info->node_rank = (int32_t)node, info->n_nodes = (int32_t)nodes;

    /* master address and port */
    int64_t port = GPTOSS_DIST_DEFAULT_PORT;
    if (flags->master_port != 0) {
        if (flags->master_port < 1 || flags->master_port > 65535)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "--master-port needs an integer in [1, 65535]");
        port = flags->master_port;
    } else if ((st = env_int(&env, "MASTER_PORT", false, 1, 65535, &port, error))) {
        return st;
    }
    info->master_port = (int32_t)port;
    const char *addr = flags->master_addr ? flags->master_addr : env_str(&env, "MASTER_ADDR");
    if (addr) {
        if (!*addr || strlen(addr) >= sizeof info->master_addr)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "the master address must be 1 to %zu characters",
                                    sizeof info->master_addr - 1);
        snprintf(info->master_addr, sizeof info->master_addr, "%s", addr);
    } else if (info->source == GPTOSS_DIST_SLURM) {
        const char *list = env_str(&env, "SLURM_STEP_NODELIST");
        if (!list) list = env_str(&env, "SLURM_JOB_NODELIST");
        if (list && !gptoss_dist_first_host(list, info->master_addr, sizeof info->master_addr))
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "distributed launch: cannot read the first host of the "
                                    "Slurm node list '%s'; give --master-addr",
                                    list);
    }
    if (world > 1 && !info->master_addr[0])
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "a job of %d processes (%s) needs the master's address: "
                                "--master-addr HOST or MASTER_ADDR",
                                info->world_size, gptoss_dist_source_name(info->source));
    return GPTOSS_OK;
}

/* ---- the rendezvous ---------------------------------------------------------------------- */

static int64_t now_ms(void) {
    return (int64_t)(gptoss_now_seconds() * 1000.0);
}

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Waits until fd is ready for `events` or the deadline passes: 1 ready, 0 timeout, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline_ms) {
    for (;;) {
        int64_t left = deadline_ms - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r > 0) return 1;
    }
}

/* Reads or writes exactly n bytes of a non-blocking socket before the deadline: 0 done,
 * 1 timeout, -1 error or closed. */
static int io_all(int fd, void *buf, size_t n, bool write_, int64_t deadline_ms) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = write_ ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k == 0) return -1; /* the peer closed */
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        int w = wait_fd(fd, write_ ? POLLOUT : POLLIN, deadline_ms);
        if (w <= 0) return w == 0 ? 1 : -1;
    }
    return 0;
}

static int socket_nonblocking(int family) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

static gptoss_status resolve_addr(const gptoss_dist_info *info, struct addrinfo **out,
                                  gptoss_error *error) {
    char port[16];
    snprintf(port, sizeof port, "%d", info->master_port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int rc = getaddrinfo(info->master_addr, port, &hints, out);
    if (rc)
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "rendezvous: cannot resolve the master address '%s': %s",
                                info->master_addr, gai_strerror(rc));
    return GPTOSS_OK;
}

/* Rank 0 -> one peer: ok + blob, or the error message. Best effort (the peer may be gone). */
static void send_reply(int fd, const uint8_t *blob, const char *message, int64_t deadline_ms) {
    uint8_t buf[4 + 4 + RV_MAX_MESSAGE];
    size_t n;
    if (!message) {
        put_u32(buf, 0);
        memcpy(buf + 4, blob, GPTOSS_DIST_BLOB_BYTES);
        n = 4 + GPTOSS_DIST_BLOB_BYTES;
    } else {
        size_t len = strlen(message);
        if (len > RV_MAX_MESSAGE - 1) len = RV_MAX_MESSAGE - 1;
        put_u32(buf, 1);
        put_u32(buf + 4, (uint32_t)len);
        memcpy(buf + 8, message, len);
        n = 8 + len;
    }
    io_all(fd, buf, n, true, deadline_ms);
}

static gptoss_status serve_rank0(const gptoss_dist_info *info, const uint8_t *blob,
                                 int64_t deadline_ms, int *keep, gptoss_error *error) {
    struct addrinfo *ai = NULL;
    gptoss_status st = resolve_addr(info, &ai, error);
    if (st) return st;
    int lfd = -1, last_errno = 0;
    for (struct addrinfo *a = ai; a && lfd < 0; a = a->ai_next) {
        lfd = socket_nonblocking(a->ai_family);
        if (lfd < 0) continue;
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(lfd, a->ai_addr, a->ai_addrlen) || listen(lfd, 1024)) {
            last_errno = errno;
            close(lfd);
            lfd = -1;
        }
    }
    freeaddrinfo(ai);
    if (lfd < 0)
        return gptoss_set_error(
            error, GPTOSS_ERR_IO, "rendezvous: rank 0 cannot listen on %s:%d: %s%s",
            info->master_addr, info->master_port, strerror(last_errno),
            last_errno == EADDRNOTAVAIL ? " (is --master-addr an address of this host?)"
            : last_errno == EADDRINUSE  ? " (pick another --master-port)"
                                        : "");
    int32_t world = info->world_size;
    int *peer = malloc((size_t)world * sizeof *peer); /* peer[r]: rank r's socket, -1 = none */
    if (!peer) {
        close(lfd);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int32_t r = 0; r < world; r++)
        peer[r] = -1;
    int32_t joined = 1, arrived = 0; /* ranks accepted (rank 0 counts), hellos heard */
    char failure[RV_MAX_MESSAGE] = "";
    int64_t until = deadline_ms;
    while (failure[0] ? arrived < world - 1 : joined < world) {
        int w = wait_fd(lfd, POLLIN, until);
        if (w <= 0) break;
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) continue;
        /* A peer that connects and says nothing may hold rank 0 up for a few seconds only. */
        int64_t hello_deadline = now_ms() + 5000;
        if (hello_deadline > deadline_ms) hello_deadline = deadline_ms;
        uint8_t hello[RV_HELLO_BYTES];
        if (io_all(fd, hello, sizeof hello, false, hello_deadline) ||
            memcmp(hello, RV_MAGIC, 8) != 0) { /* not one of ours (a port scanner?) */
            close(fd);
            continue;
        }
        arrived++;
        if (failure[0]) { /* a late rank hears why the job failed instead of timing out */
            send_reply(fd, NULL, failure, now_ms() + 1000);
            close(fd);
            continue;
        }
        uint32_t version = get_u32(hello + 8), their_world = get_u32(hello + 12),
                 their_rank = get_u32(hello + 16);
        char why[512] = "";
        if (version != RV_VERSION)
            snprintf(why, sizeof why, "rank %u speaks rendezvous version %u, rank 0 speaks %u",
                     their_rank, version, RV_VERSION);
        else if (their_world != (uint32_t)world)
            snprintf(why, sizeof why,
                     "world size mismatch: rank %u was started for %u processes, rank 0 for %d",
                     their_rank, their_world, world);
        else if (their_rank == 0 || their_rank >= (uint32_t)world)
            snprintf(why, sizeof why, "rank %u is not in 1..%d", their_rank, world - 1);
        else if (peer[their_rank] >= 0)
            snprintf(why, sizeof why, "two processes claim rank %u", their_rank);
        if (why[0]) {
            snprintf(failure, sizeof failure, "rendezvous failed: %s", why);
            send_reply(fd, NULL, failure, now_ms() + 1000);
            close(fd);
            /* The job is lost; ranks still on their way get a second to hear it. */
            until = now_ms() + 1000;
            if (until > deadline_ms) until = deadline_ms;
            continue;
        }
        peer[their_rank] = fd;
        joined++;
    }
    close(lfd);
    if (!failure[0] && joined < world) {
        size_t n = (size_t)snprintf(failure, sizeof failure,
                                    "rendezvous timed out: %d of %d processes joined; missing "
                                    "rank",
                                    joined, world);
        int listed = 0;
        for (int32_t r = 1; r < world && n < sizeof failure - 32; r++) {
            if (peer[r] >= 0) continue;
            if (listed++ == 16) {
                n += (size_t)snprintf(failure + n, sizeof failure - n, " ...");
                break;
            }
            n += (size_t)snprintf(failure + n, sizeof failure - n, " %d", r);
        }
    }
    int64_t send_deadline = now_ms() + 5000;
    for (int32_t r = 1; r < world; r++) {
        if (peer[r] < 0) continue;
        send_reply(peer[r], blob, failure[0] ? failure : NULL, send_deadline);
        if (keep && !failure[0])
            keep[r] = peer[r];
        else
            close(peer[r]);
    }
    free(peer);
    if (failure[0]) return gptoss_set_error(error, GPTOSS_ERR_IO, "%s", failure);
    return GPTOSS_OK;
}

/* One connection attempt: the connected socket, or -1 (errno_out says why). */
static int try_connect(const gptoss_dist_info *info, int64_t deadline_ms, int *errno_out) {
    struct addrinfo *ai = NULL;
    gptoss_error ignored = {0};
    if (resolve_addr(info, &ai, &ignored)) {
        *errno_out = EHOSTUNREACH;
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket_nonblocking(a->ai_family);
        if (fd < 0) continue;
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc && errno == EINPROGRESS) {
            int64_t attempt = now_ms() + 2000;
            if (attempt > deadline_ms) attempt = deadline_ms;
            int err = 0;
            socklen_t len = sizeof err;
            if (wait_fd(fd, POLLOUT, attempt) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
                rc = 0;
            else
                errno = err ? err : ETIMEDOUT;
        }
        if (rc) {
            *errno_out = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    return fd;
}

static gptoss_status join_rank0(const gptoss_dist_info *info, uint8_t *blob, int64_t deadline_ms,
                                int64_t timeout_ms, int *keep, gptoss_error *error) {
    struct addrinfo *ai = NULL;
    gptoss_status st = resolve_addr(info, &ai, error); /* a bad name fails at once */
    if (st) return st;
    freeaddrinfo(ai);
    int fd = -1, last_errno = 0;
    while (fd < 0) { /* rank 0 may still be starting: retry until the deadline */
        fd = try_connect(info, deadline_ms, &last_errno);
        if (fd >= 0 || now_ms() >= deadline_ms) break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (fd < 0)
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "rendezvous: cannot reach rank 0 at %s:%d within %.1f s (%s); is "
                                "rank 0 running, and are --master-addr/--master-port right?",
                                info->master_addr, info->master_port, timeout_ms / 1000.0,
                                strerror(last_errno));
    uint8_t hello[RV_HELLO_BYTES];
    memcpy(hello, RV_MAGIC, 8);
    put_u32(hello + 8, RV_VERSION);
    put_u32(hello + 12, (uint32_t)info->world_size);
    put_u32(hello + 16, (uint32_t)info->rank);
    uint8_t head[4];
    /* Rank 0 gives up at about the same deadline and then says why (the ranks missing): its
     * verdict is worth a little longer wait than the timeout itself. */
    deadline_ms += 2000;
    int r = io_all(fd, hello, sizeof hello, true, deadline_ms);
    if (!r) r = io_all(fd, head, 4, false, deadline_ms);
    if (r) {
        close(fd);
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                r > 0 ? "rendezvous: rank 0 at %s:%d did not answer within %.1f s"
                                      : "rendezvous: rank 0 at %s:%d closed the connection "
                                        "(after %.1f s at most)",
                                info->master_addr, info->master_port, timeout_ms / 1000.0);
    }
    if (get_u32(head) == 0) {
        r = io_all(fd, blob, GPTOSS_DIST_BLOB_BYTES, false, deadline_ms);
        if (r || !keep) close(fd);
        if (r) return gptoss_set_error(error, GPTOSS_ERR_IO, "rendezvous: rank 0's answer was cut");
        if (keep) keep[0] = fd;
        return GPTOSS_OK;
    }
    char message[RV_MAX_MESSAGE] = "no reason given";
    uint8_t len_bytes[4];
    if (!io_all(fd, len_bytes, 4, false, deadline_ms)) {
        uint32_t len = get_u32(len_bytes);
        if (len < sizeof message && !io_all(fd, message, len, false, deadline_ms))
            message[len] = '\0';
    }
    close(fd);
    return gptoss_set_error(error, GPTOSS_ERR_IO, "rank 0 refused rank %d: %s", info->rank,
                            message);
}

static gptoss_status rendezvous(const gptoss_dist_info *info, uint8_t *blob, int64_t timeout_ms,
                                int *keep, gptoss_error *error) {
    if (info->world_size <= 1) return GPTOSS_OK;
    if (info->rank < 0 || info->rank >= info->world_size || !info->master_addr[0] ||
        info->master_port < 1 || info->master_port > 65535)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "rendezvous: rank %d of %d with master '%s:%d' is not a valid "
                                "place in a job",
                                info->rank, info->world_size, info->master_addr, info->master_port);
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    if (info->rank == 0) return serve_rank0(info, blob, deadline, keep, error);
    return join_rank0(info, blob, deadline, timeout_ms, keep, error);
}

gptoss_status gptoss_dist_rendezvous(const gptoss_dist_info *info, uint8_t *blob,
                                     int64_t timeout_ms, gptoss_error *error) {
    return rendezvous(info, blob, timeout_ms, NULL, error);
}

gptoss_status gptoss_dist_rendezvous_keep(const gptoss_dist_info *info, uint8_t *blob,
                                          int64_t timeout_ms, int *fds, gptoss_error *error) {
    for (int32_t r = 0; r < (info->rank == 0 ? info->world_size : 1); r++)
        fds[r] = -1;
    return rendezvous(info, blob, timeout_ms, fds, error);
}

void gptoss_dist_env_defaults(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* 0: keep the user's value */
}
