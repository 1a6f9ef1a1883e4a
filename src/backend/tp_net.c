/*
 * tp_net.c - the frames, link and job of tensor parallelism across processes (see tp_net.h).
 *
 * Payloads, all integers little-endian:
 *   HELLO  19 i32 (the fields of gptoss_tp_net_hello in order) and the seed u64
 *   READY, START  n_kv_blocks i32, n_sliding_kv_blocks i32, kv_shared_pages i32 (0 or 1)
 *   STEP   seq u64, graphs u8, has_sliding u8, kind u8, 0 u8, n_tokens i32, n_seqs i32,
 *          max_blocks_per_seq i32, n_logits i32, then i32 arrays: token_ids[n_tokens],
 *          positions[n_tokens], seq_token_start[n_seqs + 1], seq_n_cached[n_seqs],
 *          block_tables[n_seqs * max_blocks_per_seq], the sliding tables of the same shape
 *          when has_sliding, logit_token_index[n_logits]
 *   QUIT   empty
 *   ERROR  the message's bytes
 */
#include "backend/tp_net.h"

#include "util/clock.h"
#include "util/error.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define STEP_HEAD_BYTES 28
#define HELLO_INTS 20
#define HELLO_BYTES (HELLO_INTS * 4 + 8)
#define POOL_BYTES 12
/* Counts a STEP may carry (the plan's validation bounds them further). */
#define MAX_TOKENS (1 << 22)
#define MAX_SEQS (1 << 20)
#define MAX_BLOCKS_PER_SEQ (1 << 24)

const char *gptoss_tp_net_type_name(uint32_t type) {
    static const char *const names[] = {"?", "HELLO", "READY", "START", "STEP", "QUIT", "ERROR"};
    return type < sizeof names / sizeof names[0] ? names[type] : "?";
}

/* ---- bytes ------------------------------------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16),
    p[3] = (uint8_t)(v >> 24);
}

static void put_u64(uint8_t *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

void gptoss_tp_net_buf_free(gptoss_tp_net_buf *buf) {
    free(buf->data);
    buf->data = NULL;
    buf->len = buf->cap = 0;
}

/* Makes buf hold n bytes (contents undefined). */
static gptoss_status buf_resize(gptoss_tp_net_buf *buf, size_t n, gptoss_error *error) {
    if (n > buf->cap) {
        size_t cap = buf->cap ? buf->cap : 256;
        while (cap < n)
            cap *= 2;
        uint8_t *d = realloc(buf->data, cap);
        if (!d) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        buf->data = d;
        buf->cap = cap;
    }
    buf->len = n;
    return GPTOSS_OK;
}

/* ---- payloads ---------------------------------------------------------------------------- */

static void hello_ints(const gptoss_tp_net_hello *h, int32_t v[HELLO_INTS]) {
    const int32_t f[HELLO_INTS] = {
        h->proc,           h->n_procs,           h->tp_size,       h->n_layers,
        h->hidden_size,    h->intermediate_size, h->n_heads,       h->n_kv_heads,
        h->head_dim,       h->n_experts,         h->vocab_size,    h->sliding_window,
        h->kv_block_size,  h->kv_cache_dtype,    h->fp8_layers,    h->batch_invariant,
        h->random_weights, h->gpu_sms,           h->split_lm_head, h->moe_parallel};
    memcpy(v, f, sizeof f);
}

/* What each hello field is, for the mismatch message (index as in hello_ints). */
static const char *const hello_names[HELLO_INTS] = {
    "process rank",
    "processes in the job",
    "tensor parallel size (all GPUs)",
    "the model's layers",
    "the model's hidden size",
    "the model's intermediate size",
    "the model's query heads",
    "the model's KV heads",
    "the model's head size",
    "the model's experts",
    "the model's vocabulary",
    "the model's sliding window",
    "the KV page size",
    "the KV cache dtype",
    "the FP8 layers",
    "batch invariance",
    "random weights",
    "the GPUs' multiprocessors (every node needs the same GPU model)",
    "GPTOSS_TP_SPLIT_LM_HEAD",
    "--moe-parallel"};

gptoss_status gptoss_tp_net_encode_hello(gptoss_tp_net_buf *buf, const gptoss_tp_net_hello *h,
                                         gptoss_error *error) {
    gptoss_status st = buf_resize(buf, HELLO_BYTES, error);
    if (st) return st;
    int32_t v[HELLO_INTS];
    hello_ints(h, v);
    for (int i = 0; i < HELLO_INTS; i++)
        put_u32(buf->data + 4 * i, (uint32_t)v[i]);
    put_u64(buf->data + 4 * HELLO_INTS, h->seed);
    return GPTOSS_OK;
}

gptoss_status gptoss_tp_net_decode_hello(const uint8_t *p, size_t n, gptoss_tp_net_hello *h,
                                         gptoss_error *error) {
    if (n != HELLO_BYTES)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "tp link: a HELLO of %zu bytes, not %d", n,
                                HELLO_BYTES);
    int32_t v[HELLO_INTS];
    for (int i = 0; i < HELLO_INTS; i++)
        v[i] = (int32_t)get_u32(p + 4 * i);
    if (v[1] < 2 || v[1] > GPTOSS_TP_NET_MAX_PROCS || v[0] < 0 || v[0] >= v[1])
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "tp link: a HELLO from process %d of %d (at most %d processes)",
                                (int)v[0], (int)v[1], GPTOSS_TP_NET_MAX_PROCS);
    memset(h, 0, sizeof *h);
    h->proc = v[0], h->n_procs = v[1], h->tp_size = v[2], h->n_layers = v[3];
    h->hidden_size = v[4], h->intermediate_size = v[5], h->n_heads = v[6], h->n_kv_heads = v[7];
    h->head_dim = v[8], h->n_experts = v[9], h->vocab_size = v[10], h->sliding_window = v[11];
    h->kv_block_size = v[12], h->kv_cache_dtype = v[13], h->fp8_layers = v[14];
    h->batch_invariant = v[15], h->random_weights = v[16], h->gpu_sms = v[17];
    h->split_lm_head = v[18];
    h->moe_parallel = v[19];
    h->seed = get_u64(p + 4 * HELLO_INTS);
    return GPTOSS_OK;
}

bool gptoss_tp_net_hello_differs(const gptoss_tp_net_hello *mine, const gptoss_tp_net_hello *theirs,
                                 char *why, size_t why_size) {
    int32_t a[HELLO_INTS], b[HELLO_INTS];
    hello_ints(mine, a);
    hello_ints(theirs, b);
    for (int i = 1; i < HELLO_INTS; i++)
        if (a[i] != b[i]) {
            snprintf(why, why_size, "%s: %d here, %d there", hello_names[i], (int)a[i], (int)b[i]);
            return true;
        }
    if (mine->random_weights && mine->seed != theirs->seed) {
        snprintf(why, why_size, "the random weights' seed: %llu here, %llu there",
                 (unsigned long long)mine->seed, (unsigned long long)theirs->seed);
        return true;
    }
    return false;
}

gptoss_status gptoss_tp_net_encode_pool(gptoss_tp_net_buf *buf, const gptoss_tp_net_pool *pool,
                                        gptoss_error *error) {
    gptoss_status st = buf_resize(buf, POOL_BYTES, error);
    if (st) return st;
    put_u32(buf->data, (uint32_t)pool->n_kv_blocks);
    put_u32(buf->data + 4, (uint32_t)pool->n_sliding_kv_blocks);
    put_u32(buf->data + 8, (uint32_t)pool->kv_shared_pages);
    return GPTOSS_OK;
}

gptoss_status gptoss_tp_net_decode_pool(const uint8_t *p, size_t n, gptoss_tp_net_pool *pool,
                                        gptoss_error *error) {
    if (n != POOL_BYTES)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "tp link: a KV pool of %zu bytes, not %d", n,
                                POOL_BYTES);
    gptoss_tp_net_pool v = {(int32_t)get_u32(p), (int32_t)get_u32(p + 4), (int32_t)get_u32(p + 8)};
    if (v.n_kv_blocks < 1 || v.n_sliding_kv_blocks < 1 ||
        (v.kv_shared_pages != 0 && v.kv_shared_pages != 1))
        return gptoss_set_error(
            error, GPTOSS_ERR_IO, "tp link: a KV pool of %d full and %d sliding pages (shared %d)",
            (int)v.n_kv_blocks, (int)v.n_sliding_kv_blocks, (int)v.kv_shared_pages);
    *pool = v;
    return GPTOSS_OK;
}

static uint8_t *put_ints(uint8_t *p, const int32_t *v, size_t n) {
    for (size_t i = 0; i < n; i++, p += 4)
        put_u32(p, (uint32_t)v[i]);
    return p;
}

gptoss_status gptoss_tp_net_encode_step(gptoss_tp_net_buf *buf, uint64_t seq, uint8_t kind,
                                        bool graphs, const gptoss_batch_plan *plan,
                                        gptoss_error *error) {
    if (kind >= GPTOSS_TP_NET_STEP_KINDS)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tp link: a step of kind %u cannot be sent", (unsigned)kind);
    const int32_t T = plan->n_tokens, S = plan->n_seqs, M = plan->max_blocks_per_seq,
                  NL = plan->n_logits;
    if (T < 0 || T > MAX_TOKENS || S < 0 || S > MAX_SEQS || M < 0 || M > MAX_BLOCKS_PER_SEQ ||
        NL < 0 || NL > 128 * MAX_TOKENS)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tp link: a plan of %d tokens, %d sequences, %d blocks per "
                                "sequence, %d logits cannot be sent",
                                (int)T, (int)S, (int)M, (int)NL);
    const bool sliding = plan->sliding_block_tables != NULL;
    const size_t table = (size_t)S * (size_t)M;
    const size_t ints = 2 * (size_t)T + 2 * (size_t)S + 1 + (sliding ? 2 : 1) * table + NL;
    if (ints > (GPTOSS_TP_NET_MAX_PAYLOAD - STEP_HEAD_BYTES) / 4)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tp link: a plan of %zu integers is larger than a frame", ints);
    gptoss_status st = buf_resize(buf, STEP_HEAD_BYTES + 4 * ints, error);
    if (st) return st;
    uint8_t *p = buf->data;
    put_u64(p, seq);
    p[8] = graphs ? 1 : 0;
    p[9] = sliding ? 1 : 0;
    p[10] = kind;
    p[11] = 0;
    put_u32(p + 12, (uint32_t)T);
    put_u32(p + 16, (uint32_t)S);
    put_u32(p + 20, (uint32_t)M);
    put_u32(p + 24, (uint32_t)NL);
    p += STEP_HEAD_BYTES;
    p = put_ints(p, plan->token_ids, (size_t)T);
    p = put_ints(p, plan->positions, (size_t)T);
    p = put_ints(p, plan->seq_token_start, (size_t)S + 1);
    p = put_ints(p, plan->seq_n_cached, (size_t)S);
    p = put_ints(p, plan->block_tables, table);
    if (sliding) p = put_ints(p, plan->sliding_block_tables, table);
    p = put_ints(p, plan->logit_token_index, (size_t)NL);
    return GPTOSS_OK;
}

void gptoss_tp_net_step_free(gptoss_tp_net_step *step) {
    free(step->ints);
    memset(step, 0, sizeof *step);
}

gptoss_status gptoss_tp_net_decode_step(const uint8_t *p, size_t n, gptoss_tp_net_step *step,
                                        gptoss_error *error) {
    if (n < STEP_HEAD_BYTES)
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "tp link: a STEP of %zu bytes is shorter than its %d-byte head", n,
                                STEP_HEAD_BYTES);
    const uint64_t seq = get_u64(p);
    const uint8_t graphs = p[8], sliding = p[9];
    const int32_t T = (int32_t)get_u32(p + 12), S = (int32_t)get_u32(p + 16),
                  M = (int32_t)get_u32(p + 20), NL = (int32_t)get_u32(p + 24);
    const uint8_t kind = p[10];
    if (graphs > 1 || sliding > 1 || kind >= GPTOSS_TP_NET_STEP_KINDS || p[11] != 0)
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "tp link: a STEP with flags %u/%u (each 0 or 1), kind %u (0 to %d) "
                                "and reserved byte %u (0)",
                                (unsigned)graphs, (unsigned)sliding, (unsigned)kind,
                                GPTOSS_TP_NET_STEP_KINDS - 1, (unsigned)p[11]);
    if (T < 0 || T > MAX_TOKENS || S < 0 || S > MAX_SEQS || M < 0 || M > MAX_BLOCKS_PER_SEQ ||
        NL < 0 || NL > 128 * MAX_TOKENS)
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "tp link: a STEP of %d tokens, %d sequences, %d blocks per "
                                "sequence and %d logits is out of range",
                                (int)T, (int)S, (int)M, (int)NL);
    const uint64_t table = (uint64_t)S * (uint64_t)M;
    const uint64_t ints =
        2 * (uint64_t)T + 2 * (uint64_t)S + 1 + (sliding ? 2 : 1) * table + (uint64_t)NL;
    if ((uint64_t)(n - STEP_HEAD_BYTES) != 4 * ints)
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "tp link: a STEP of %zu bytes, but its counts (%d tokens, %d "
                                "sequences x %d blocks, %d logits) need %llu",
                                n, (int)T, (int)S, (int)M, (int)NL,
                                (unsigned long long)(STEP_HEAD_BYTES + 4 * ints));
    if (ints > step->ints_cap) {
        int32_t *v = realloc(step->ints, (size_t)ints * sizeof *v);
        if (!v) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        step->ints = v;
        step->ints_cap = (size_t)ints;
    }
    int32_t *v = step->ints;
    const uint8_t *q = p + STEP_HEAD_BYTES;
    for (uint64_t i = 0; i < ints; i++, q += 4)
        v[i] = (int32_t)get_u32(q);
    gptoss_batch_plan *plan = &step->plan;
    memset(plan, 0, sizeof *plan);
    plan->n_tokens = T;
    plan->n_seqs = S;
    plan->max_blocks_per_seq = M;
    plan->n_logits = NL;
    plan->token_ids = v;
    plan->positions = v += T;
    plan->seq_token_start = v += T;
    plan->seq_n_cached = v += S + 1;
    plan->block_tables = v += S;
    v += table;
    if (sliding) {
        plan->sliding_block_tables = v;
        v += table;
    }
    plan->logit_token_index = v;
    step->seq = seq;
    step->kind = kind;
    step->graphs = graphs == 1;
    return GPTOSS_OK;
}

gptoss_status gptoss_tp_net_encode_error(gptoss_tp_net_buf *buf, const char *message,
                                         gptoss_error *error) {
    size_t n = message ? strlen(message) : 0;
    if (n > GPTOSS_TP_NET_MAX_MESSAGE - 1) n = GPTOSS_TP_NET_MAX_MESSAGE - 1;
    gptoss_status st = buf_resize(buf, n, error);
    if (st) return st;
    if (n) memcpy(buf->data, message, n);
    return GPTOSS_OK;
}

void gptoss_tp_net_decode_error(const uint8_t *p, size_t n, char *out, size_t out_size) {
    if (!out_size) return;
    size_t k = n < out_size - 1 ? n : out_size - 1;
    for (size_t i = 0; i < k; i++)
        out[i] = p[i] >= 32 && p[i] < 127 ? (char)p[i] : '?';
    out[k] = '\0';
}

/* ---- frames over a socket ---------------------------------------------------------------- */

static int64_t now_ms(void) {
    return (int64_t)(gptoss_now_seconds() * 1000.0);
}

/* Reads or writes exactly n bytes before the deadline (< 0: none): 0 done, 1 timeout,
 * -1 closed, -2 error (errno). */
static int io_all(int fd, void *buf, size_t n, bool write_, int64_t deadline_ms) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k =
            write_ ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k == 0) return -1;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == ECONNRESET || errno == EPIPE ? -1 : -2;
        for (;;) {
            int wait = -1;
            if (deadline_ms >= 0) {
                int64_t left = deadline_ms - now_ms();
                if (left <= 0) return 1;
                wait = left > 1000000 ? 1000000 : (int)left;
            }
            struct pollfd pfd = {.fd = fd, .events = write_ ? POLLOUT : POLLIN};
            int r = poll(&pfd, 1, wait);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return -2;
            if (r > 0) break;
        }
    }
    return 0;
}

static int64_t deadline_of(int64_t timeout_ms) {
    return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

gptoss_status gptoss_tp_net_send(int fd, uint32_t type, const uint8_t *payload, size_t n,
                                 int64_t timeout_ms, gptoss_error *error) {
    if (n > GPTOSS_TP_NET_MAX_PAYLOAD)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tp link: a frame of %zu bytes is too large", n);
    uint8_t head[GPTOSS_TP_NET_HEADER_BYTES];
    put_u32(head, GPTOSS_TP_NET_MAGIC);
    put_u16(head + 4, GPTOSS_TP_NET_VERSION);
    put_u16(head + 6, (uint16_t)type);
    put_u32(head + 8, (uint32_t)n);
    const int64_t deadline = deadline_of(timeout_ms);
    int r = io_all(fd, head, sizeof head, true, deadline);
    if (!r && n) r = io_all(fd, (void *)payload, n, true, deadline);
    if (!r) return GPTOSS_OK;
    if (r == 1)
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "sending %s timed out after %.1f s (the peer does not read)",
                                gptoss_tp_net_type_name(type), (double)timeout_ms / 1000.0);
    if (r == -1) return gptoss_set_error(error, GPTOSS_ERR_IO, "the peer closed the connection");
    return gptoss_set_error(error, GPTOSS_ERR_IO, "sending %s failed: %s",
                            gptoss_tp_net_type_name(type), strerror(errno));
}

gptoss_status gptoss_tp_net_recv(int fd, uint32_t *type, gptoss_tp_net_buf *payload,
                                 int64_t timeout_ms, gptoss_error *error) {
    const int64_t deadline = deadline_of(timeout_ms);
    uint8_t head[GPTOSS_TP_NET_HEADER_BYTES];
    int r = io_all(fd, head, sizeof head, false, deadline);
    if (!r) {
        const uint32_t magic = get_u32(head), n = get_u32(head + 8);
        const uint16_t version = get_u16(head + 4), t = get_u16(head + 6);
        if (magic != GPTOSS_TP_NET_MAGIC)
            return gptoss_set_error(error, GPTOSS_ERR_IO,
                                    "tp link: a frame with magic 0x%08x, not 0x%08x (not a gptoss "
                                    "peer, or the stream lost its place)",
                                    (unsigned)magic, (unsigned)GPTOSS_TP_NET_MAGIC);
        if (version != GPTOSS_TP_NET_VERSION)
            return gptoss_set_error(error, GPTOSS_ERR_IO,
                                    "tp link: the peer speaks version %u, this process %u (run "
                                    "the same gptoss on every node)",
                                    (unsigned)version, (unsigned)GPTOSS_TP_NET_VERSION);
        if (t < GPTOSS_TP_NET_HELLO || t > GPTOSS_TP_NET_ERROR)
            return gptoss_set_error(error, GPTOSS_ERR_IO, "tp link: a frame of unknown type %u",
                                    (unsigned)t);
        if (n > GPTOSS_TP_NET_MAX_PAYLOAD)
            return gptoss_set_error(
                error, GPTOSS_ERR_IO, "tp link: a %s frame of %u bytes (at most %u)",
                gptoss_tp_net_type_name(t), (unsigned)n, (unsigned)GPTOSS_TP_NET_MAX_PAYLOAD);
        gptoss_status st = buf_resize(payload, n, error);
        if (st) return st;
        r = n ? io_all(fd, payload->data, n, false, deadline) : 0;
        if (!r) {
            *type = t;
            return GPTOSS_OK;
        }
    }
    if (r == 1)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "no frame from the peer within %.1f s",
                                (double)timeout_ms / 1000.0);
    if (r == -1) return gptoss_set_error(error, GPTOSS_ERR_IO, "the peer closed the connection");
    return gptoss_set_error(error, GPTOSS_ERR_IO, "receiving failed: %s", strerror(errno));
}

/* ---- the link ---------------------------------------------------------------------------- */

/* Keep-alive: a peer whose host stops answering fails the socket after about 10 + 3 x 5 s. */
static void socket_tune(int fd) {
    int one = 1, idle = 10, interval = 5, count = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

gptoss_status gptoss_tp_link_open(const gptoss_dist_info *info, uint8_t *blob, int64_t timeout_ms,
                                  gptoss_tp_link *link, gptoss_error *error) {
    memset(link, 0, sizeof *link);
    for (int i = 0; i < GPTOSS_TP_NET_MAX_PROCS; i++)
        link->fds[i] = -1;
    if (info->world_size < 2 || info->world_size > GPTOSS_TP_NET_MAX_PROCS)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tensor parallelism across processes takes 2 to %d processes, "
                                "not %d",
                                GPTOSS_TP_NET_MAX_PROCS, (int)info->world_size);
    link->proc = info->rank;
    link->n_procs = info->world_size;
    gptoss_status st = gptoss_dist_rendezvous_keep(info, blob, timeout_ms, link->fds, error);
    if (st) return st;
    for (int i = 0; i < GPTOSS_TP_NET_MAX_PROCS; i++)
        if (link->fds[i] >= 0) socket_tune(link->fds[i]);
    return GPTOSS_OK;
}

void gptoss_tp_link_close(gptoss_tp_link *link) {
    for (int i = 0; i < GPTOSS_TP_NET_MAX_PROCS; i++)
        if (link->fds[i] >= 0) {
            close(link->fds[i]);
            link->fds[i] = -1;
        }
}

gptoss_status gptoss_tp_link_broadcast(gptoss_tp_link *link, uint32_t type, const uint8_t *payload,
                                       size_t n, int64_t timeout_ms, int32_t *failed_proc,
                                       gptoss_error *error) {
    for (int32_t p = 1; p < link->n_procs; p++) {
        gptoss_status st = gptoss_tp_net_send(link->fds[p], type, payload, n, timeout_ms, error);
        if (st) {
            if (failed_proc) *failed_proc = p;
            gptoss_error_prefix(error, "process %d: ", (int)p);
            return st;
        }
    }
    return GPTOSS_OK;
}

/* A frame from follower p that is not the one wanted: its ERROR's message, or what it was. */
static gptoss_status unexpected(int32_t p, uint32_t type, const gptoss_tp_net_buf *payload,
                                const char *wanted, gptoss_error *error) {
    if (type == GPTOSS_TP_NET_ERROR) {
        char message[GPTOSS_TP_NET_MAX_MESSAGE];
        gptoss_tp_net_decode_error(payload->data, payload->len, message, sizeof message);
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "process %d failed: %s", (int)p,
                                message);
    }
    return gptoss_set_error(error, GPTOSS_ERR_IO, "process %d sent %s where %s was due", (int)p,
                            gptoss_tp_net_type_name(type), wanted);
}

gptoss_status gptoss_tp_link_gather(gptoss_tp_link *link, uint32_t type,
                                    gptoss_status (*decode)(const uint8_t *p, size_t n, void *out,
                                                            gptoss_error *error),
                                    void *out, size_t out_stride, int64_t timeout_ms,
                                    gptoss_error *error) {
    const int64_t deadline = deadline_of(timeout_ms);
    gptoss_tp_net_buf buf = {0};
    gptoss_status st = GPTOSS_OK;
    /* In process order: every follower sends once, so waiting on one at a time loses no
     * time, and the deadline is the same for all. */
    for (int32_t p = 1; p < link->n_procs && !st; p++) {
        int64_t left = deadline < 0 ? -1 : deadline - now_ms();
        if (deadline >= 0 && left < 0) left = 0;
        uint32_t got = 0;
        st = gptoss_tp_net_recv(link->fds[p], &got, &buf, left, error);
        if (st) {
            gptoss_error_prefix(error, "process %d: ", (int)p);
            break;
        }
        if (got != type) {
            st = unexpected(p, got, &buf, gptoss_tp_net_type_name(type), error);
            break;
        }
        st = decode(buf.data, buf.len, (char *)out + (size_t)p * out_stride, error);
        if (st) gptoss_error_prefix(error, "process %d: ", (int)p);
    }
    gptoss_tp_net_buf_free(&buf);
    return st;
}

gptoss_status gptoss_tp_link_check(gptoss_tp_link *link, gptoss_error *error) {
    struct pollfd pfd[GPTOSS_TP_NET_MAX_PROCS];
    int32_t n = 0;
    for (int32_t p = 1; p < link->n_procs; p++)
        pfd[n++] = (struct pollfd){.fd = link->fds[p], .events = POLLIN};
    int r;
    do
        r = poll(pfd, (nfds_t)n, 0);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return GPTOSS_OK;
    for (int32_t i = 0; i < n; i++) {
        if (!pfd[i].revents) continue;
        const int32_t p = i + 1;
        gptoss_tp_net_buf buf = {0};
        uint32_t type = 0;
        gptoss_status st = gptoss_tp_net_recv(link->fds[p], &type, &buf, 1000, error);
        if (st) {
            gptoss_error_prefix(error, "process %d: ", (int)p);
        } else {
            st = unexpected(p, type, &buf, "nothing", error);
        }
        gptoss_tp_net_buf_free(&buf);
        return st;
    }
    return GPTOSS_OK;
}

bool gptoss_tp_link_leader_gone(const gptoss_tp_link *link) {
    struct pollfd pfd = {.fd = link->fds[0], .events = POLLRDHUP};
    int r;
    do
        r = poll(&pfd, 1, 0);
    while (r < 0 && errno == EINTR);
    return r > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- a job's exchanges ------------------------------------------------------------------ */

static gptoss_status dec_hello(const uint8_t *p, size_t n, void *out, gptoss_error *error) {
    return gptoss_tp_net_decode_hello(p, n, (gptoss_tp_net_hello *)out, error);
}

static gptoss_status dec_pool(const uint8_t *p, size_t n, void *out, gptoss_error *error) {
    return gptoss_tp_net_decode_pool(p, n, (gptoss_tp_net_pool *)out, error);
}

/* A follower's receive of process 0's answer of `type`: ERROR becomes "process 0: message". */
static gptoss_status recv_from_leader(gptoss_tp_link *link, uint32_t type, gptoss_tp_net_buf *buf,
                                      int64_t timeout_ms, gptoss_error *error) {
    uint32_t got = 0;
    gptoss_status st = gptoss_tp_net_recv(link->fds[0], &got, buf, timeout_ms, error);
    if (st) return gptoss_error_prefix(error, "process 0: ");
    if (got == GPTOSS_TP_NET_ERROR) {
        char message[GPTOSS_TP_NET_MAX_MESSAGE];
        gptoss_tp_net_decode_error(buf->data, buf->len, message, sizeof message);
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "process 0: %s", message);
    }
    if (got != type)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "process 0 sent %s where %s was due",
                                gptoss_tp_net_type_name(got), gptoss_tp_net_type_name(type));
    return GPTOSS_OK;
}

gptoss_status gptoss_tp_link_hello(gptoss_tp_link *link, const gptoss_tp_net_hello *mine,
                                   int64_t timeout_ms, gptoss_error *error) {
    gptoss_tp_net_buf buf = {0};
    char why[512];
    gptoss_status st = gptoss_tp_net_encode_hello(&buf, mine, error);
    if (!st && link->proc == 0) {
        gptoss_tp_net_hello theirs[GPTOSS_TP_NET_MAX_PROCS];
        st = gptoss_tp_link_gather(link, GPTOSS_TP_NET_HELLO, dec_hello, theirs, sizeof theirs[0],
                                   timeout_ms, error);
        if (st) gptoss_tp_link_tell(link, error->message); /* the others learn why */
        for (int32_t p = 1; p < link->n_procs && !st; p++) {
            if (theirs[p].proc != p)
                st = gptoss_set_error(error, GPTOSS_ERR_IO,
                                      "the connection of process %d says it is process %d", (int)p,
                                      (int)theirs[p].proc);
            else if (gptoss_tp_net_hello_differs(mine, &theirs[p], why, sizeof why))
                st = gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                      "process %d was started differently from process 0 (%s); "
                                      "start every process of the job with the same model, "
                                      "options and GPU model",
                                      (int)p, why);
            if (st) gptoss_tp_link_tell(link, error->message);
        }
        if (!st)
            st = gptoss_tp_link_broadcast(link, GPTOSS_TP_NET_HELLO, buf.data, buf.len, timeout_ms,
                                          NULL, error);
    } else if (!st) {
        gptoss_tp_net_hello theirs;
        st = gptoss_tp_net_send(link->fds[0], GPTOSS_TP_NET_HELLO, buf.data, buf.len, timeout_ms,
                                error);
        if (!st) st = recv_from_leader(link, GPTOSS_TP_NET_HELLO, &buf, timeout_ms, error);
        if (!st) st = gptoss_tp_net_decode_hello(buf.data, buf.len, &theirs, error);
        if (!st && gptoss_tp_net_hello_differs(mine, &theirs, why, sizeof why))
            st = gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                  "this process was started differently from process 0 (%s)", why);
    }
    gptoss_tp_net_buf_free(&buf);
    return st;
}

gptoss_status gptoss_tp_link_ready(gptoss_tp_link *link, gptoss_status load_status,
                                   const char *load_message, gptoss_tp_net_pool *pool,
                                   gptoss_error *error) {
    char told[GPTOSS_TP_NET_MAX_MESSAGE];
    if (load_status) {
        snprintf(told, sizeof told, "loading failed on process %d: %s", (int)link->proc,
                 load_message ? load_message : gptoss_status_name(load_status));
        gptoss_tp_link_tell(link, told);
        return gptoss_set_error(error, load_status, "%s", told);
    }
    gptoss_tp_net_buf buf = {0};
    gptoss_status st = GPTOSS_OK;
    if (link->proc == 0) {
        gptoss_tp_net_pool theirs[GPTOSS_TP_NET_MAX_PROCS];
        st = gptoss_tp_link_gather(link, GPTOSS_TP_NET_READY, dec_pool, theirs, sizeof theirs[0],
                                   -1, error);
        if (st) gptoss_tp_link_tell(link, error->message); /* the others learn why */
        for (int32_t p = 1; p < link->n_procs && !st; p++) {
            if (theirs[p].kv_shared_pages != pool->kv_shared_pages) {
                st = gptoss_set_error(
                    error, GPTOSS_ERR_INVALID_ARGUMENT,
                    "process %d %s KV pages between full and sliding layers, process 0 %s", (int)p,
                    theirs[p].kv_shared_pages ? "shares" : "does not share",
                    pool->kv_shared_pages ? "does" : "does not");
                gptoss_tp_link_tell(link, error->message);
            }
            if (theirs[p].n_kv_blocks < pool->n_kv_blocks)
                pool->n_kv_blocks = theirs[p].n_kv_blocks;
            if (theirs[p].n_sliding_kv_blocks < pool->n_sliding_kv_blocks)
                pool->n_sliding_kv_blocks = theirs[p].n_sliding_kv_blocks;
        }
        if (!st) st = gptoss_tp_net_encode_pool(&buf, pool, error);
        if (!st)
            st = gptoss_tp_link_broadcast(link, GPTOSS_TP_NET_START, buf.data, buf.len, 60 * 1000,
                                          NULL, error);
    } else {
        st = gptoss_tp_net_encode_pool(&buf, pool, error);
        if (!st)
            st = gptoss_tp_net_send(link->fds[0], GPTOSS_TP_NET_READY, buf.data, buf.len, 60 * 1000,
                                    error);
        /* no limit: process 0 may still be loading */
        if (!st) st = recv_from_leader(link, GPTOSS_TP_NET_START, &buf, -1, error);
        if (!st) st = gptoss_tp_net_decode_pool(buf.data, buf.len, pool, error);
    }
    gptoss_tp_net_buf_free(&buf);
    return st;
}

void gptoss_tp_link_tell(gptoss_tp_link *link, const char *message) {
    if (link->n_procs < 2) return;
    gptoss_tp_net_buf buf = {0};
    gptoss_error ignored = {0};
    if (!gptoss_tp_net_encode_error(&buf, message, &ignored)) {
        if (link->proc == 0) { /* each follower, whether or not one before it is gone */
            for (int32_t p = 1; p < link->n_procs; p++)
                if (link->fds[p] >= 0)
                    gptoss_tp_net_send(link->fds[p], GPTOSS_TP_NET_ERROR, buf.data, buf.len, 500,
                                       &ignored);
        } else if (link->fds[0] >= 0 && !gptoss_tp_net_send(link->fds[0], GPTOSS_TP_NET_ERROR,
                                                            buf.data, buf.len, 1000, &ignored)) {
            shutdown(link->fds[0], SHUT_WR);
            const int64_t until = now_ms() + 2000;
            while (!gptoss_tp_link_leader_gone(link) && now_ms() < until) {
                struct pollfd pfd = {.fd = link->fds[0], .events = POLLRDHUP};
                poll(&pfd, 1, 20);
            }
        }
    }
    gptoss_tp_net_buf_free(&buf);
}

gptoss_status gptoss_tp_link_follow(gptoss_tp_link *link, const gptoss_tp_follow_geometry *geo,
                                    gptoss_status (*run)(void *user, const gptoss_tp_net_step *step,
                                                         gptoss_error *error),
                                    void *user, uint64_t *last_seq, gptoss_error *error) {
    gptoss_tp_net_buf buf = {0};
    gptoss_tp_net_step step;
    memset(&step, 0, sizeof step);
    gptoss_status st = GPTOSS_OK;
    for (;;) {
        uint32_t type = 0;
        gptoss_error e = {0};
        if (gptoss_tp_net_recv(link->fds[0], &type, &buf, -1, &e)) {
            st = gptoss_set_error(error, GPTOSS_ERR_IO,
                                  "the connection to process 0 ended after step %llu (%s): "
                                  "process 0 exited or its host went down; its log says why",
                                  (unsigned long long)*last_seq, e.message);
            break;
        }
        if (type == GPTOSS_TP_NET_QUIT) break;
        if (type == GPTOSS_TP_NET_ERROR) {
            char message[GPTOSS_TP_NET_MAX_MESSAGE];
            gptoss_tp_net_decode_error(buf.data, buf.len, message, sizeof message);
            st = gptoss_set_error(error, GPTOSS_ERR_BACKEND, "process 0 failed: %s", message);
            break;
        }
        if (type != GPTOSS_TP_NET_STEP)
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "process 0 sent %s where a step was due",
                                  gptoss_tp_net_type_name(type));
        if (!st) st = gptoss_tp_net_decode_step(buf.data, buf.len, &step, error);
        if (!st && step.seq != *last_seq + 1)
            st =
                gptoss_set_error(error, GPTOSS_ERR_IO,
                                 "step %llu arrived after step %llu (a frame was lost or repeated)",
                                 (unsigned long long)step.seq, (unsigned long long)*last_seq);
        if (!st)
            st = gptoss_batch_plan_validate(&step.plan, geo->config, geo->kv_block_size,
                                            geo->n_kv_blocks, geo->n_sliding_kv_blocks, error);
        if (st) {
            gptoss_error_prefix(error, "a bad step from process 0: ");
            char told[GPTOSS_TP_NET_MAX_MESSAGE];
            snprintf(told, sizeof told, "process %d received %s", (int)link->proc, error->message);
            gptoss_tp_link_tell(link, told);
            break;
        }
        *last_seq = step.seq;
        st = run(user, &step, error);
        if (st) break;
    }
    gptoss_tp_net_step_free(&step);
    gptoss_tp_net_buf_free(&buf);
    return st;
}

/* ---- the job ------------------------------------------------------------------------------ */

static pthread_mutex_t g_job_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_job_set;
static gptoss_dist_info g_job;
static void (*g_on_broken)(void *user);
static void *g_on_broken_user;
static gptoss_status (*g_follow)(void *state, gptoss_error *error);
static void *g_follow_state;

void gptoss_tp_job_set(const gptoss_dist_info *info) {
    pthread_mutex_lock(&g_job_mu);
    g_job_set = info && info->world_size > 1;
    if (g_job_set) g_job = *info;
    pthread_mutex_unlock(&g_job_mu);
}

const gptoss_dist_info *gptoss_tp_job(void) {
    pthread_mutex_lock(&g_job_mu);
    const gptoss_dist_info *j = g_job_set ? &g_job : NULL;
    pthread_mutex_unlock(&g_job_mu);
    return j;
}

void gptoss_tp_job_on_broken(void (*fn)(void *user), void *user) {
    pthread_mutex_lock(&g_job_mu);
    g_on_broken = fn;
    g_on_broken_user = user;
    pthread_mutex_unlock(&g_job_mu);
}

void gptoss_tp_job_broken(void) {
    pthread_mutex_lock(&g_job_mu);
    void (*fn)(void *) = g_on_broken;
    void *user = g_on_broken_user;
    pthread_mutex_unlock(&g_job_mu);
    if (fn) fn(user);
}

void gptoss_tp_job_set_follower(gptoss_status (*follow)(void *state, gptoss_error *error),
                                void *state) {
    pthread_mutex_lock(&g_job_mu);
    g_follow = follow;
    g_follow_state = state;
    pthread_mutex_unlock(&g_job_mu);
}

gptoss_status gptoss_tp_job_follow(gptoss_error *error) {
    pthread_mutex_lock(&g_job_mu);
    gptoss_status (*follow)(void *, gptoss_error *) = g_follow;
    void *state = g_follow_state;
    pthread_mutex_unlock(&g_job_mu);
    if (!follow)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "this process follows process 0 of a tensor-parallel job, but no "
                                "tensor-parallel backend was created");
    return follow(state, error);
}
