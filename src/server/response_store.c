/*
 * response_store.c - the /v1/responses record store (see response_store.h).
 *
 * Records sit on one doubly linked list, most recently used first, and in a hash table by id
 * (chained, doubled when it holds twice as many records as buckets). Eviction takes unpinned
 * records from the tail of the list until the bytes fit the budget.
 */
#include "server/response_store.h"

#include "util/log.h"

#include <errno.h>
#include <pthread.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct event_log {
    char *bytes; /* [len] of [cap] */
    size_t len, cap;
    uint64_t base;    /* absolute position of bytes[0] */
    uint64_t *starts; /* [n] absolute positions of the kept events, of [starts_cap] */
    size_t n, starts_cap;
    int64_t first_seq; /* sequence number of starts[0] */
    size_t partial;    /* bytes at the end not yet ended by "\n\n" */
} event_log;

struct response_reader {
    struct record *record; /* NULL once the record went */
    int wake_fd;
    uint64_t pos; /* absolute position of the next byte to read */
    response_reader *next;
};

typedef struct record {
    struct record *prev, *next;  /* the LRU list, head = most recently used */
    struct record *hash_next;    /* the next record of its hash bucket */
    char *id, *response, *items; /* malloc'd; items may be NULL */
    size_t bytes;                /* what this record counts against the budget */
    bool background;             /* made by a background request (may be cancelled) */
    gptoss_request *running;     /* the job's engine request while it runs, else NULL */
    bool in_job;                 /* a job is writing it (pinned) */
    bool has_log;                /* background responses keep their events */
    event_log log;
    response_reader *readers; /* attached to this record */
} record;

struct response_store {
    pthread_mutex_t lock;
    pthread_cond_t changed; /* a job ended */
    record *head, *tail;
    record **buckets; /* [n_buckets], a power of two; NULL until the first record */
    size_t n_buckets, n_records;
    size_t bytes, max_bytes;
    int jobs, max_jobs;
};

static size_t record_bytes(const char *id, const char *response, const char *items) {
    return sizeof(record) + strlen(id) + strlen(response) + (items ? strlen(items) : 0) + 3;
}

response_store *response_store_create(size_t max_bytes, int max_jobs) {
    response_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    s->max_bytes = max_bytes, s->max_jobs = max_jobs;
    return s;
}

static void unlink_record(response_store *s, record *r) {
    if (r->prev)
        r->prev->next = r->next;
    else
        s->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        s->tail = r->prev;
    r->prev = r->next = NULL;
    s->bytes -= r->bytes;
}

static void push_front(response_store *s, record *r) {
    r->prev = NULL, r->next = s->head;
    if (s->head) s->head->prev = r;
    s->head = r;
    if (!s->tail) s->tail = r;
    s->bytes += r->bytes;
}

static size_t log_bytes(const record *r) {
    return r->log.cap + r->log.starts_cap * sizeof(uint64_t);
}

static void wake_readers(record *r) {
    uint64_t one = 1;
    for (response_reader *rd = r->readers; rd; rd = rd->next) {
        ssize_t n = write(rd->wake_fd, &one, sizeof one); /* EAGAIN: already signalled */
        (void)n;
    }
}

static void free_record(record *r) {
    for (response_reader *rd = r->readers; rd; rd = rd->next)
        rd->record = NULL;
    wake_readers(r);
    free(r->log.bytes);
    free(r->log.starts);
    free(r->id);
    free(r->response);
    free(r->items);
    free(r);
}

static size_t hash_id(const char *id) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)h;
}

static record *find(response_store *s, const char *id) {
    if (!s->buckets) return NULL;
    for (record *r = s->buckets[hash_id(id) & (s->n_buckets - 1)]; r; r = r->hash_next)
        if (!strcmp(r->id, id)) return r;
    return NULL;
}

/* Adds r to the table, doubling it first when it is full (a failed doubling only makes the
 * chains longer). false: no table could be allocated at all. */
static bool hash_insert(response_store *s, record *r) {
    if (!s->buckets || s->n_records + 1 > 2 * s->n_buckets) {
        size_t n = s->buckets ? s->n_buckets * 2 : 64;
        record **grown = calloc(n, sizeof *grown);
        if (grown) {
            for (size_t i = 0; i < s->n_buckets; i++)
                for (record *e = s->buckets[i], *next; e; e = next) {
                    next = e->hash_next;
                    size_t b = hash_id(e->id) & (n - 1);
                    e->hash_next = grown[b];
                    grown[b] = e;
                }
            free(s->buckets);
            s->buckets = grown, s->n_buckets = n;
        }
        if (!s->buckets) return false;
    }
    size_t b = hash_id(r->id) & (s->n_buckets - 1);
    r->hash_next = s->buckets[b];
    s->buckets[b] = r;
    s->n_records++;
    return true;
}

static void hash_remove(response_store *s, record *r) {
    if (!s->buckets) return;
    record **link = &s->buckets[hash_id(r->id) & (s->n_buckets - 1)];
    while (*link && *link != r)
        link = &(*link)->hash_next;
    if (*link) {
        *link = r->hash_next;
        s->n_records--;
    }
}

/* Takes r out of the list and the table and frees it. */
static void drop_record(response_store *s, record *r) {
    unlink_record(s, r);
    hash_remove(s, r);
    free_record(r);
}

/* Drops least recently used unpinned records until `incoming` more bytes fit. */
static void evict_for(response_store *s, size_t incoming) {
    record *r = s->tail;
    while (r && s->bytes + incoming > s->max_bytes) {
        record *prev = r->prev;
        if (!r->in_job) {
            GPTOSS_LOG_D("responses", "evicting %s (%zu bytes) from the response store", r->id,
                         r->bytes);
            drop_record(s, r);
        }
        r = prev;
    }
}

/* Replaces or adds a record (lock held). The texts are copied. `force`: kept even when it
 * alone is over the budget (a running job's record, which polling must find). */
static record *put_locked(response_store *s, const char *id, const char *response,
                          const char *items, bool force) {
    record *old = find(s, id);
    size_t bytes = record_bytes(id, response, items) + (old ? log_bytes(old) : 0);
    if (old && bytes > s->max_bytes && !force) {
        drop_record(s, old);
        return NULL;
    }
    if (bytes > s->max_bytes && !force) return NULL;
    if (old) unlink_record(s, old); /* out of the list while the others are evicted */
    evict_for(s, bytes);
    record *r = old ? old : calloc(1, sizeof *r);
    char *resp = strdup(response), *its = items ? strdup(items) : NULL;
    char *rid = old ? old->id : strdup(id);
    if (!r || !resp || (items && !its) || !rid) {
        free(resp);
        free(its);
        if (old) {
            push_front(s, old);
            drop_record(s, old);
        } else {
            free(rid);
            free(r);
        }
        return NULL;
    }
    if (old) {
        free(old->response);
        free(old->items);
    }
    r->id = rid, r->response = resp, r->items = its, r->bytes = bytes;
    push_front(s, r);
    if (!old && !hash_insert(s, r)) {
        drop_record(s, r);
        return NULL;
    }
    return r;
}

bool response_store_put(response_store *s, const char *id, const char *response,
                        const char *items) {
    pthread_mutex_lock(&s->lock);
    record *r = put_locked(s, id, response, items, false);
    pthread_mutex_unlock(&s->lock);
    if (!r && s->max_bytes > 0)
        GPTOSS_LOG_W("responses",
                     "response %s (%zu bytes) is larger than the store "
                     "(--responses-store-bytes %zu): not kept",
                     id, record_bytes(id, response, items), s->max_bytes);
    return r != NULL;
}

bool response_store_get(response_store *s, const char *id, char **response, char **items,
                        bool *running) {
    if (response) *response = NULL;
    if (items) *items = NULL;
    pthread_mutex_lock(&s->lock);
    record *r = find(s, id);
    bool ok = r != NULL;
    if (r) {
        unlink_record(s, r);
        push_front(s, r);
        if (running) *running = r->in_job;
        if (response) ok = ok && (*response = strdup(r->response)) != NULL;
        if (items && r->items) ok = ok && (*items = strdup(r->items)) != NULL;
    }
    pthread_mutex_unlock(&s->lock);
    if (!ok && r) { /* out of memory: report "none" rather than half a record */
        if (response) free(*response), *response = NULL;
        if (items) free(*items), *items = NULL;
    }
    return ok;
}

bool response_store_delete(response_store *s, const char *id) {
    pthread_mutex_lock(&s->lock);
    record *r = find(s, id);
    if (r) {
        if (r->running) gptoss_request_cancel(r->running);
        drop_record(s, r);
    }
    pthread_mutex_unlock(&s->lock);
    return r != NULL;
}

bool response_store_job_begin(response_store *s, const char *id, const char *response,
                              const char *items, gptoss_request *request) {
    pthread_mutex_lock(&s->lock);
    record *r = NULL;
    if (s->jobs < s->max_jobs) r = put_locked(s, id, response, items, true);
    if (r) {
        r->background = true;
        r->running = request;
        r->in_job = true;
        r->has_log = true;
        s->jobs++;
    }
    pthread_mutex_unlock(&s->lock);
    return r != NULL;
}

/* Recounts r's bytes after its log changed (r is on the list). */
static void recount(response_store *s, record *r) {
    s->bytes -= r->bytes;
    r->bytes = record_bytes(r->id, r->response, r->items) + log_bytes(r);
    s->bytes += r->bytes;
}

/* Drops the older half of r's events (at least one; never the last one), shrinking the
 * buffers so that the budget sees the bytes go. */
static void trim_log(response_store *s, record *r) {
    event_log *l = &r->log;
    size_t k = l->n / 2 ? l->n / 2 : 1;
    if (k >= l->n) return;
    size_t cut = (size_t)(l->starts[k] - l->base);
    memmove(l->bytes, l->bytes + cut, l->len - cut);
    memmove(l->starts, l->starts + k, (l->n - k) * sizeof *l->starts);
    l->len -= cut, l->base += cut, l->n -= k, l->first_seq += (int64_t)k;
    char *b = realloc(l->bytes, l->len ? l->len : 1);
    if (b) l->bytes = b, l->cap = l->len ? l->len : 1;
    uint64_t *st = realloc(l->starts, l->n * sizeof *st);
    if (st) l->starts = st, l->starts_cap = l->n;
    recount(s, r);
}

void response_store_job_events(response_store *s, const char *id, const char *events, size_t len) {
    pthread_mutex_lock(&s->lock);
    record *r = find(s, id);
    event_log *l = r && r->has_log ? &r->log : NULL;
    bool ok = l != NULL;
    if (ok && l->len + len > l->cap) {
        size_t cap = l->cap ? l->cap : 4096;
        while (cap < l->len + len)
            cap *= 2;
        char *b = realloc(l->bytes, cap);
        if (b)
            l->bytes = b, l->cap = cap;
        else
            ok = false;
    }
    for (size_t i = 0; ok && i < len; i++) {
        /* an event starts where the previous one ended with an empty line */
        bool starts = l->partial == 0;
        l->bytes[l->len++] = events[i];
        l->partial++;
        if (starts) {
            if (l->n == l->starts_cap) {
                size_t cap = l->starts_cap ? l->starts_cap * 2 : 64;
                uint64_t *st = realloc(l->starts, cap * sizeof *st);
                if (!st) {
                    ok = false;
                    break;
                }
                l->starts = st, l->starts_cap = cap;
            }
            l->starts[l->n++] = l->base + l->len - 1;
        }
        if (l->partial >= 2 && events[i] == '\n' && l->bytes[l->len - 2] == '\n') l->partial = 0;
    }
    if (l && !ok) GPTOSS_LOG_W("responses", "out of memory: events of %s were lost", id);
    if (r) {
        recount(s, r);
        while (l && l->n > 1 && r->bytes > s->max_bytes)
            trim_log(s, r);
        evict_for(s, 0);
        wake_readers(r);
    }
    pthread_mutex_unlock(&s->lock);
}

response_open_result response_store_reader_open(response_store *s, const char *id, int64_t after,
                                                int wake_fd, response_reader **out,
                                                int64_t *n_events) {
    *out = NULL;
    *n_events = 0;
    pthread_mutex_lock(&s->lock);
    record *r = find(s, id);
    response_open_result result = RESPONSE_OPEN_NOT_FOUND;
    if (r) {
        event_log *l = &r->log;
        int64_t total = l->first_seq + (int64_t)l->n;
        *n_events = total;
        int64_t want = after + 1; /* the first event to send */
        result = RESPONSE_OPEN_OK;
        if (!r->has_log)
            result = RESPONSE_OPEN_NO_LOG;
        else if (want < l->first_seq)
            result = RESPONSE_OPEN_TRIMMED;
        else if (want > total)
            result = RESPONSE_OPEN_PAST_END;
        if (result == RESPONSE_OPEN_OK) {
            response_reader *rd = calloc(1, sizeof *rd);
            if (!rd) {
                result = RESPONSE_OPEN_NOT_FOUND;
            } else {
                rd->record = r, rd->wake_fd = wake_fd;
                /* past the last event: the end of the log (a partial event included, which
                 * is completed by the next append) */
                rd->pos =
                    want < total ? l->starts[want - l->first_seq] : l->base + l->len - l->partial;
                rd->next = r->readers;
                r->readers = rd;
                *out = rd;
                unlink_record(s, r); /* recently used */
                push_front(s, r);
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return result;
}

long response_store_reader_read(response_store *s, response_reader *rd, char *buf, size_t max) {
    pthread_mutex_lock(&s->lock);
    long n = 0;
    record *r = rd->record;
    if (!r) {
        n = RESPONSE_READ_LOST;
    } else if (rd->pos < r->log.base) {
        n = RESPONSE_READ_LOST;
    } else {
        /* only whole events: the last one may still be partial */
        uint64_t end = r->log.base + r->log.len - r->log.partial;
        if (rd->pos < end) {
            size_t avail = (size_t)(end - rd->pos);
            if (avail > max) avail = max;
            memcpy(buf, r->log.bytes + (rd->pos - r->log.base), avail);
            rd->pos += avail;
            n = (long)avail;
        } else if (!r->in_job) {
            n = RESPONSE_READ_END;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

void response_store_reader_close(response_store *s, response_reader *rd) {
    if (!rd) return;
    pthread_mutex_lock(&s->lock);
    if (rd->record) {
        response_reader **link = &rd->record->readers;
        while (*link && *link != rd)
            link = &(*link)->next;
        if (*link) *link = rd->next;
    }
    pthread_mutex_unlock(&s->lock);
    free(rd);
}

void response_store_job_end(response_store *s, const char *id, const char *response,
                            const char *items) {
    pthread_mutex_lock(&s->lock);
    record *r = find(s, id);
    if (r) {
        r->running = NULL;
        r->in_job = false;
        size_t texts = record_bytes(id, response, items);
        while (r->log.n > 1 && texts + log_bytes(r) > s->max_bytes)
            trim_log(s, r);
        r = put_locked(s, id, response, items, false);
        if (r) {
            r->background = true;
            wake_readers(r); /* the log ended */
        }
    }
    s->jobs--;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
}

static struct timespec deadline_after(double seconds) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long ns = t.tv_nsec + (long long)((seconds - (double)(long long)seconds) * 1e9);
    t.tv_sec += (time_t)seconds + (time_t)(ns / 1000000000);
    t.tv_nsec = (long)(ns % 1000000000);
    return t;
}

response_cancel_result response_store_cancel(response_store *s, const char *id, double timeout_s,
                                             char **response) {
    if (response) *response = NULL;
    struct timespec until = deadline_after(timeout_s);
    pthread_mutex_lock(&s->lock);
    record *r = find(s, id);
    response_cancel_result result = RESPONSE_CANCEL_NOT_FOUND;
    if (r && !r->background) result = RESPONSE_CANCEL_NOT_BACKGROUND;
    if (r && r->background) {
        result = RESPONSE_CANCEL_DONE;
        if (r->running) gptoss_request_cancel(r->running);
        /* The job notices the cancel at the engine's next step and writes the final record. */
        while ((r = find(s, id)) && r->in_job)
            if (pthread_cond_timedwait(&s->changed, &s->lock, &until) == ETIMEDOUT) break;
        if (r && response) *response = strdup(r->response);
    }
    pthread_mutex_unlock(&s->lock);
    return result;
}

void response_store_free(response_store *s) {
    if (!s) return;
    struct timespec until = deadline_after(10.0);
    pthread_mutex_lock(&s->lock);
    for (record *r = s->head; r; r = r->next)
        if (r->running) gptoss_request_cancel(r->running);
    while (s->jobs > 0)
        if (pthread_cond_timedwait(&s->changed, &s->lock, &until) == ETIMEDOUT) break;
    int left = s->jobs;
    pthread_mutex_unlock(&s->lock);
    if (left > 0) {
        /* A job still holds the store: leave it allocated rather than free it under the job. */
        GPTOSS_LOG_W("responses", "%d background responses did not end in time", left);
        return;
    }
    for (record *r = s->head, *next; r; r = next) {
        next = r->next;
        free_record(r);
    }
    free(s->buckets);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
