/*
 * response_store.h - the responses /v1/responses keeps: for GET, for previous_response_id
 * chains, and for background generations still running.
 *
 * Owns: the records (the response JSON text and the normalized conversation items, see
 * responses_input.h), a byte budget with least-recently-used eviction, the registry of
 * background jobs (the engine request of each, so that a cancel or a shutdown can stop it),
 * and each background response's event log: its server-sent events as they were made, which
 * readers (the creating request's stream, GET ?stream=true) follow while the job runs and
 * replay from any sequence number. Records of running jobs are pinned: never evicted; their
 * logs count against the budget and lose their oldest events when they alone outgrow it.
 * Every function may be called from any thread (one mutex). Texts go in and come out as
 * copies; nothing returned points inside.
 */
#ifndef GPTOSS_SERVER_RESPONSE_STORE_H
#define GPTOSS_SERVER_RESPONSE_STORE_H

#include "gptoss_engine.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct response_store response_store;

/* max_bytes: budget for all records (ids and texts); max_jobs: background jobs at once. */
response_store *response_store_create(size_t max_bytes, int max_jobs);

/* Cancels running jobs, waits for them to end (a few seconds at most), frees the store. */
void response_store_free(response_store *store);

/* Keeps or replaces record `id`. items may be NULL (nothing to continue from). Evicts least
 * recently used records past the budget; false when the record alone is over it (not kept). */
bool response_store_put(response_store *store, const char *id, const char *response,
                        const char *items);

/* Copies of record `id` (malloc'd; either out pointer may be NULL); false when there is none
 * (never stored, deleted or evicted). *running (may be NULL): a background job is generating
 * it. Marks the record recently used. */
bool response_store_get(response_store *store, const char *id, char **response, char **items,
                        bool *running);

/* Removes record `id` (cancelling its job, if running); false when there is none. */
bool response_store_delete(response_store *store, const char *id);

/* A background job starts: its pinned record (kept even over the budget, so that polling finds
 * it) and its engine request (borrowed until job_end). false when max_jobs are running or
 * memory ran out (nothing kept). */
bool response_store_job_begin(response_store *store, const char *id, const char *response,
                              const char *items, gptoss_request *request);

/* The job ended: its final record, unpinned (kept unless it was deleted meanwhile or is over
 * the budget alone). */
void response_store_job_end(response_store *store, const char *id, const char *response,
                            const char *items);

/* Appends `len` bytes of whole server-sent events ("event: ...\ndata: {...}\n\n" each, in
 * sequence-number order from 0) to the running job's log and wakes its readers. Past the
 * budget, the oldest events are dropped (a reader still behind them gets
 * RESPONSE_READ_LOST). */
void response_store_job_events(response_store *store, const char *id, const char *events,
                               size_t len);

/* A reader of an event log: one stream's position in it. */
typedef struct response_reader response_reader;

typedef enum response_open_result {
    RESPONSE_OPEN_OK = 0,
    RESPONSE_OPEN_NOT_FOUND = 1, /* no such record */
    RESPONSE_OPEN_NO_LOG = 2,    /* not a background response: nothing to stream */
    RESPONSE_OPEN_TRIMMED = 3,   /* the events after `after` are no longer all kept */
    RESPONSE_OPEN_PAST_END = 4,  /* `after` is not the number of an event there is */
} response_open_result;

/* Opens a reader of `id`'s log at the event after sequence number `after` (-1: the first).
 * wake_fd (an eventfd) is written to whenever the log grows, ends or goes away. *n_events:
 * how many events the log has had (for messages). */
response_open_result response_store_reader_open(response_store *store, const char *id,
                                                int64_t after, int wake_fd, response_reader **out,
                                                int64_t *n_events);

#define RESPONSE_READ_END (-1)  /* the job ended and every event was read */
#define RESPONSE_READ_LOST (-2) /* the record went (deleted, evicted) or the reader fell behind */

/* Copies up to max bytes of the log from the reader's position: the count (> 0), 0 when
 * nothing new is there yet (wait for wake_fd), or RESPONSE_READ_END / RESPONSE_READ_LOST. */
long response_store_reader_read(response_store *store, response_reader *reader, char *buf,
                                size_t max);

/* Detaches and frees the reader (NULL: nothing). */
void response_store_reader_close(response_store *store, response_reader *reader);

typedef enum response_cancel_result {
    RESPONSE_CANCEL_NOT_FOUND = 0,
    RESPONSE_CANCEL_NOT_BACKGROUND = 1, /* only background responses can be cancelled */
    RESPONSE_CANCEL_DONE = 2,           /* cancelled, or it had finished already */
} response_cancel_result;

/* Cancels the background job of `id` and waits up to timeout_s for its record to be final;
 * *response (may be NULL) gets a copy of the record's response then. */
response_cancel_result response_store_cancel(response_store *store, const char *id,
                                             double timeout_s, char **response);

#endif
