/*
 * engine_internal.h - the engine's private data, shared by the files of src/engine that
 * implement gptoss_engine.h only.
 *
 * Owns: the layout of struct gptoss_request and struct gptoss_engine, the sample batch's row
 * record, and the entry points between engine.c (options, create/start/drain/free, stats),
 * engine_thread.c (the engine thread: its loop and each step) and request.c (request handles,
 * their event queues, submission). Must not be included outside src/engine.
 */
#ifndef GPTOSS_ENGINE_INTERNAL_H
#define GPTOSS_ENGINE_INTERNAL_H

#include "gptoss_engine.h"

#include "engine/draft.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "util/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct gptoss_request {
    uint64_t id;
    pthread_mutex_t mutex;       /* guards events and refs */
    pthread_cond_t cond;         /* signalled when events arrive */
    gptoss_engine_event *events; /* ring buffer [cap_events] */
    int32_t head, n_events, cap_events;
    int32_t n_choices;       /* params.n */
    int32_t n_finish_events; /* finish events queued so far */
    int refs;                /* caller + engine */
    atomic_bool cancel_requested;
    atomic_bool *stop_requested; /* [n_choices] stop-string hits reported by the caller */
    atomic_int cached_prompt_tokens;
    char error_message[GPTOSS_ERROR_MESSAGE_MAX];
    gptoss_request_notify_fn notify;
    void *notify_user;
    gptoss_engine *engine; /* (mutex) NULL once the engine let go of the request */
    /* Registry links (engine->mutex). */
    gptoss_request *prev, *next;
    gptoss_request *inbox_next;
    /* Engine thread only. */
    gptoss_sampling_params params;
    int32_t max_tokens;          /* resolved (> 0) */
    gptoss_seq **seqs;           /* [n_choices] live sequences, NULL once finished/not forked */
    uint64_t seed;               /* Philox key of every draw (the request's, or drawn at submit) */
    gptoss_token_counts *counts; /* [n_choices] when penalties need them, else NULL */
    int32_t *bias_tokens;        /* [params.n_logit_bias] copied at submit, sorted by token */
    float *bias_values;
    gptoss_allowed_tokens_fn allowed_tokens; /* optional constraint on each draw */
    void *allowed_tokens_user;
    void (*allowed_tokens_free)(void *user); /* owned once submitted: called by request_free */
    bool allowed_tokens_stateless;           /* it may be asked about draft positions */
    double *last_token_time;                 /* [n_choices] seconds, 0 = none yet */
    bool *choice_done;                       /* [n_choices] finish event queued */
    int32_t n_done;
    bool forked;          /* children of choice 0 created */
    bool started;         /* choice 0 admitted once */
    double queue_seconds; /* submit until the step that admitted it began (-1 before) */
    bool failed_step;     /* a forward carrying this request failed */
    int32_t n_pending;    /* token events in the engine's pending list, not pushed yet */
    double submit_time;
    /* Speculative decoding (engine thread): each choice's drafting record, and the replay
     * drafter's continuation (copied at submit). */
    gptoss_spec_state *spec; /* [n_choices] */
    int32_t *replay;         /* [n_replay] or NULL */
    int32_t n_replay;
};

/* One token drawn this step (one row of the sample batch): for which sequence and choice.
 * At the end of a prompt with n > 1 the prompt's last logits row is asked for once per
 * choice; those rows name the prompt's sequence and the choice forked from it after the
 * step. */
typedef struct sample_job {
    gptoss_seq *seq;           /* its request is seq->user */
    int32_t choice;            /* != seq->index: a choice to fork from seq */
    bool refused;              /* the allowed-token callback refused: end the choice */
    int32_t n_ahead;           /* drafts between the choice's tokens and this row's draw */
    int32_t n_group;           /* on the first row of a decode with drafts: its rows (1 + the
                                  drafts, consecutive); 0 elsewhere */
    gptoss_engine_event event; /* filled from the batch's outputs */
} sample_job;

struct gptoss_engine {
    gptoss_engine_options options;
    gptoss_kv_manager *kv;
    gptoss_scheduler *sched;
    /* The sample batch of the current step, row k for jobs[k] (grown, never shrunk). */
    sample_job *jobs; /* [cap_jobs] */
    int32_t n_jobs, cap_jobs;
    int32_t *logit_index;      /* [cap_jobs] the plan's logit_token_index, per row */
    gptoss_sample_row *rows;   /* [cap_jobs] */
    int32_t *token_ids;        /* [cap_jobs] drawn tokens */
    float *logprobs;           /* [cap_jobs] */
    int32_t *top_ids;          /* [cap_jobs, GPTOSS_MAX_SAMPLE_LOGPROBS] */
    float *top_logprobs;       /* same */
    gptoss_sample_edit *edits; /* [cap_edits] */
    int32_t n_edits, cap_edits;
    int32_t n_masks; /* allowed-token rows of the batch, filled by fill_masks_hook */
    /* Token events of the last step not yet handed to their requests: pushing one locks the
     * request and may wake its reader, about 2 us, so a step of 1000 sequences would leave
     * the GPU idle for 2 ms. They are pushed while the device runs the next step (the
     * summary's while_running hook), or after its forward when the backend has no hook, in
     * order; a finish of a request with pending events pushes them first. */
    struct pending_push {
        gptoss_request *r;
        gptoss_engine_event event;
    } * pending;
    int32_t n_pending, cap_pending;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mutex;
    pthread_cond_t wake; /* engine thread waits here for work */
    pthread_cond_t idle; /* drain waits here for the registry to empty */
    gptoss_request *inbox_head, *inbox_tail;
    gptoss_request *registry; /* live requests (submitted, not fully finished) */
    int32_t n_live;           /* requests in the registry */
    int32_t n_queued;         /* submitted, not started */
    bool stop, draining;
    double step_start; /* engine thread: when the current step began */
    bool attention;    /* a cancel/stop flag was set since the last look */
    uint64_t next_id;
    gptoss_rng entropy;        /* seeds for requests without a seed (under mutex) */
    gptoss_engine_stats stats; /* published snapshot (under mutex) */
    /* Engine thread only. */
    gptoss_request **active; /* requests the engine thread is serving */
    int32_t n_active, cap_active;
    gptoss_engine_stats local; /* counters accumulated by the thread */
    /* Speculative decoding: the draft source (NULL: no drafting) and the step's draft
     * requests with the sequence each is for. */
    gptoss_drafter *drafter;
    gptoss_draft_seq *draft_seqs; /* [cap_draft_seqs] */
    gptoss_seq **draft_owners;    /* [cap_draft_seqs] */
    int32_t *draft_counts;        /* [cap_draft_seqs] drafts proposed */
    float *draft_p;               /* [cap_draft_seqs] each one's chance to be right */
    int32_t cap_draft_seqs;
    gptoss_draft_observed *observed; /* [cap_observed] a draft head's view of the step */
    int32_t cap_observed;
    gptoss_spec_costs *spec_costs; /* measured seconds of decode steps by width */
    double propose_seconds;        /* the draft source's time for this step's drafts */
    /* GPTOSS_STEP_TIMING=1: host seconds per phase of a step, printed at exit */
    bool timing;
    double t_schedule, t_forward, t_sample, t_between, t_mark, t_rows, t_flush;
    int64_t timed_steps;
};

/* request.c: a request's reference count and event queue. */
void engine_request_unref(gptoss_request *r);
bool engine_request_reserve(gptoss_request *r, int32_t extra);
bool engine_request_push(gptoss_request *r, const gptoss_engine_event *event);

/* engine_thread.c: the sample batch's rows, the thread's body and its shutdown. */
bool engine_grow_rows(gptoss_engine *e, int32_t need);
void *engine_main(void *arg);
void engine_shutdown_requests(gptoss_engine *e);

#endif
