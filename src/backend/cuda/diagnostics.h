/*
 * diagnostics.h - what the CUDA backend records about itself, and the hooks enqueue_step
 * calls for it (CUDA C++ only).
 *
 * Profiling (bench --profile, the profile knob) records an event between a step's
 * components; step timing (step_timing) splits a served step's wall time. Both are in every
 * build. The ablation (the ablate knob) leaves components out of one-token steps so that
 * `gptoss bench` can time what each costs inside the decode graph, where events between
 * kernels cannot look; its logits are wrong, so it exists only in builds configured with
 * -DGPTOSS_DIAGNOSTICS=ON, and elsewhere GPTOSS_CUDA_ABLATED is a constant false.
 */
#ifndef GPTOSS_CUDA_DIAGNOSTICS_H
#define GPTOSS_CUDA_DIAGNOSTICS_H

#include "backend/cuda/cuda_backend.h"

/* Bits of the ablate knob: the components a one-token step leaves out. */
enum {
    GPTOSS_CUDA_ABLATE_ROUTER = 1,
    GPTOSS_CUDA_ABLATE_ROPE = 2, /* RoPE + KV write */
    GPTOSS_CUDA_ABLATE_ATTENTION = 4,
    GPTOSS_CUDA_ABLATE_NORMS = 8, /* the residual norms */
    GPTOSS_CUDA_ABLATE_MOE = 16,
    GPTOSS_CUDA_ABLATE_QKV = 32,
    GPTOSS_CUDA_ABLATE_O = 64,
    GPTOSS_CUDA_ABLATE_LM_HEAD = 128,
};

#ifdef GPTOSS_DIAGNOSTICS
#define GPTOSS_CUDA_ABLATED(s, key, bits)                                                          \
    ((key)->n_tokens == 1 && ((s)->tuning.ablate & (bits)) != 0)
#else
#define GPTOSS_CUDA_ABLATED(s, key, bits) false
#endif

/* Profiling: the time since the previous mark is charged to part (PART_*). */
static inline void gptoss_cuda_prof_mark(gptoss_cuda_state *s, int part) {
    if (!s->profiling || s->prof_n >= GPTOSS_CUDA_MAX_PROF_EVENTS) return;
    cudaEventRecord(s->prof_events[s->prof_n], s->stream);
    s->prof_part[s->prof_n++] = part;
}

/* Creates the events the tuning's profile and step_timing need. */
gptoss_status gptoss_cuda_diagnostics_init(gptoss_cuda_state *s, gptoss_error *error);

/* Prints the profile and step timing totals (when on) and destroys the events. */
void gptoss_cuda_diagnostics_free(gptoss_cuda_state *s);

/* gptoss_cuda_summary_step, profiled or timed as the tuning asks, totals added to the state. */
gptoss_status gptoss_cuda_summary_step_measured(gptoss_cuda_state *s, const gptoss_batch_plan *plan,
                                                const gptoss_logits_summary *out,
                                                gptoss_error *error);

#endif
