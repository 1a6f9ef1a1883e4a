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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct record {
    struct record *prev, *next;  /* the LRU list, head = most recently used */
    struct record *hash_next;    /* the next record of its hash bucket */
    char *id, *response, *items; /* malloc'd; items may be NULL */
    size_t bytes;                /* what this record counts against the budget */
    bool background;             /* made by a background request (may be cancelled) */
    gptoss_request *running;     /* the job's engine request while it runs (pinned), else NULL */
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

static void free_record(record *r) {
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
        if (!r->running) {
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
    size_t bytes = record_bytes(id, response, items);
    record *old = find(s, id);
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
        if (running) *running = r->running != NULL;
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
        s->jobs++;
    }
    pthread_mutex_unlock(&s->lock);
    return r != NULL;
}

void response_store_job_end(response_store *s, const char *id, const char *response,
                            const char *items) {
    pthread_mutex_lock(&s->lock);
    record *r = find(s, id);
    if (r) {
        r->running = NULL;
        r = put_locked(s, id, response, items, false);
        if (r) r->background = true;
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
        while ((r = find(s, id)) && r->running)
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
