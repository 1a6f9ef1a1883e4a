/*
 * response_store.h - the responses /v1/responses keeps: for GET, for previous_response_id
 * chains, and for background generations still running.
 *
 * Owns: the records (the response JSON text and the normalized conversation items, see
 * responses_input.h), a byte budget with least-recently-used eviction, and the registry of
 * background jobs (the engine request of each, so that a cancel or a shutdown can stop it).
 * Records of running jobs are pinned: never evicted. Every function may be called from any
 * thread (one mutex). Texts go in and come out as copies; nothing returned points inside.
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
