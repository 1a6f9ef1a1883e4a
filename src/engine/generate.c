/*
 * generate.c - one request, synchronously: gptoss_engine_generate (see engine.h).
 *
 * Owns nothing but the wait: it submits through gptoss_engine_submit and reads the events
 * like any other caller, so a terminal front end samples, stops and reuses the prefix cache
 * exactly as the server does. Events are read in short slices so a stop asked for from the
 * caller's side (Ctrl-C) is noticed while the engine is still working on the prompt.
 */
#include "gptoss_engine.h"

#include "util/clock.h"
#include "util/error.h"

#include <string.h>

/* Longest wait for an event before should_stop is asked again. */
#define POLL_MS 20

gptoss_status gptoss_engine_generate(gptoss_engine *engine, const int32_t *prompt, int32_t n_prompt,
                                     const gptoss_sampling_params *params,
                                     const gptoss_generate_options *options,
                                     gptoss_generate_result *result, gptoss_error *error) {
    memset(result, 0, sizeof *result);
    result->finish = GPTOSS_FINISH_NONE;
    result->stop_token_id = -1;
    gptoss_generate_options none = {0};
    if (!options) options = &none;
    gptoss_sampling_params defaults = gptoss_sampling_params_default();
    if (!params) params = &defaults;
    if (params->n != 1)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "gptoss_engine_generate runs one choice; n is %d", params->n);
    double t0 = gptoss_now_seconds();
    gptoss_request *request = NULL;
    gptoss_status st = gptoss_engine_submit(engine, prompt, n_prompt, params,
                                            options->request_options, &request, error);
    if (st != GPTOSS_OK) return st;
    bool stopping = false; /* cancelled by us: later tokens are dropped */
    gptoss_engine_event event;
    for (;;) {
        if (!stopping && options->should_stop && options->should_stop(options->user)) {
            stopping = true;
            gptoss_request_cancel(request);
        }
        int got = gptoss_request_next_event(request, &event, POLL_MS);
        if (got < 0) break;
        if (got == 0) continue;
        if (!stopping && event.token_id >= 0) {
            if (result->n_generated == 0) result->first_token_seconds = gptoss_now_seconds() - t0;
            result->n_generated++;
            if (options->on_token && !options->on_token(options->user, &event)) {
                stopping = true;
                gptoss_request_cancel(request);
            }
        }
        if (event.finish != GPTOSS_FINISH_NONE) {
            result->finish = stopping ? GPTOSS_FINISH_CANCELLED : event.finish;
            result->stop_token_id = stopping ? -1 : event.stop_token_id;
        }
    }
    result->seconds = gptoss_now_seconds() - t0;
    result->n_cached_prompt = gptoss_request_cached_prompt_tokens(request);
    if (result->finish == GPTOSS_FINISH_ERROR)
        st = gptoss_set_error(error, GPTOSS_ERR_BACKEND, "%s",
                              gptoss_request_error(request)[0] ? gptoss_request_error(request)
                                                               : "generation failed");
    gptoss_request_release(request);
    return st;
}
