/*
 * engines.h - the engines behind the server (engines.c): routing a submission to one of them,
 * and what a request must report back to the router. server_engine_stats (the sums for
 * /metrics) is declared in server_internal.h.
 */
#ifndef GPTOSS_SERVER_ENGINES_H
#define GPTOSS_SERVER_ENGINES_H

#include "server/server_internal.h"

/* Picks an engine (router.h; engines whose queue is full are skipped) and submits there, as
 * gptoss_engine_submit does. *engine_index: the engine that took or refused the request, -1
 * when every queue was full (CAPACITY). A request that was taken must be reported with
 * server_engine_done once it is released. */
gptoss_status server_submit(gptoss_server *server, const int32_t *prompt, int32_t n_prompt,
                            const gptoss_sampling_params *params,
                            const gptoss_request_options *options, gptoss_request **out,
                            int32_t *engine_index, gptoss_error *error);

/* The request server_submit gave to engine_index is released (the router's load count). */
void server_engine_done(gptoss_server *server, int32_t engine_index);

/* Whether a CAPACITY refusal by engine_index (or by all, -1) is a full queue (429). */
bool server_queue_full(gptoss_server *server, int32_t engine_index);

/* A number unique over the server's engines for a request (engine ids restart at 1 on each
 * engine): response and tool call ids are made of it. */
uint64_t server_response_number(gptoss_server *server, const gptoss_request *request,
                                int32_t engine_index);

/* Frees the engine array and the router (gptoss_server_stop). */
void server_engines_free(gptoss_server *server);

#endif
