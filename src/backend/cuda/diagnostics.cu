/*
 * diagnostics.cu - profiling of served steps (the profile knob: events between components,
 * no graphs), step timing (step_timing: host staging, GPU step, GPU summaries, host wait),
 * and their reports when a backend is freed. The ablation's hooks are in diagnostics.h.
 * Owns the state's profiling and timing events.
 */
#include "backend/cuda/diagnostics.h"

#include <stdio.h>

extern "C" {
#include "util/clock.h"
#include "util/log.h"
}

gptoss_status gptoss_cuda_diagnostics_init(gptoss_cuda_state *s, gptoss_error *error) {
    if (s->tuning.profile)
        for (int i = 0; i < GPTOSS_CUDA_MAX_PROF_EVENTS; i++)
            CUDA_TRY(cudaEventCreate(&s->prof_events[i]), "cudaEventCreate");
    if (s->tuning.step_timing)
        for (int i = 0; i < 3; i++)
            CUDA_TRY(cudaEventCreate(&s->timing_events[i]), "cudaEventCreate");
    return GPTOSS_OK;
}

/* Where the time of served steps went, per kind of step (a table on stderr). */
static void print_serve_profile(const gptoss_cuda_state *s) {
    static const char *names[8] = {
        "MoE",         "attention", "dense GEMMs",         "lm_head + summary", "norms/rope/router",
        "plan upload", "gaps",      "(host between steps)"};
    for (int k = 0; k < 2; k++) {
        if (s->serve_prof_steps[k] == 0) continue;
        double steps = s->serve_prof_steps[k], gpu = 0;
        for (int p = 0; p < 7; p++)
            gpu += s->serve_prof_ms[k][p];
        fprintf(stderr, "profile of %.0f %s steps (%.1f tokens per step), ms per step:\n", steps,
                k == 0 ? "decode-only" : "prefill-carrying", s->serve_prof_tokens[k] / steps);
        for (int p = 0; p < 7; p++)
            fprintf(stderr, "  %-22s %8.3f  (%4.1f%%)\n", names[p], s->serve_prof_ms[k][p] / steps,
                    100.0 * s->serve_prof_ms[k][p] / gpu);
        fprintf(stderr, "  %-22s %8.3f\n  %-22s %8.3f\n", "GPU total", gpu / steps,
                "wall per forward call", s->serve_prof_wall_ms[k] / steps);
    }
}

void gptoss_cuda_diagnostics_free(gptoss_cuda_state *s) {
    if (s->tuning.profile) print_serve_profile(s);
    if (s->tuning.step_timing && s->timing_steps > 0) {
        const double n = s->timing_steps, *t = s->timing_ms;
        GPTOSS_LOG_I(
            "cuda",
            "step timing, %.0f steps, us per step: host staging + launch %.1f, GPU step %.1f, GPU "
            "summaries + copy %.1f, host wait %.1f, whole call %.1f",
            n, t[0] / n * 1e3, t[1] / n * 1e3, t[2] / n * 1e3, t[3] / n * 1e3, t[4] / n * 1e3);
    }
    for (int i = 0; i < GPTOSS_CUDA_MAX_PROF_EVENTS; i++)
        if (s->prof_events[i]) cudaEventDestroy(s->prof_events[i]);
    for (int i = 0; i < 3; i++)
        if (s->timing_events[i]) cudaEventDestroy(s->timing_events[i]);
}

gptoss_status gptoss_cuda_summary_step_measured(gptoss_cuda_state *s, const gptoss_batch_plan *plan,
                                                const gptoss_logits_summary *out,
                                                gptoss_error *error) {
    if (!s->tuning.profile) { /* step timing: the events gptoss_cuda_summary_step records */
        double t0 = gptoss_now_ms();
        gptoss_status st = gptoss_cuda_summary_step(s, plan, out, error);
        if (st) return st;
        float a = 0, b = 0;
        cudaEventElapsedTime(&a, s->timing_events[0], s->timing_events[1]);
        cudaEventElapsedTime(&b, s->timing_events[1], s->timing_events[2]);
        s->timing_ms[1] += a;
        s->timing_ms[2] += b;
        s->timing_ms[4] += gptoss_now_ms() - t0;
        s->timing_steps += 1;
        return GPTOSS_OK;
    }
    double t0 = gptoss_now_ms();
    s->profiling = true;
    gptoss_status st = gptoss_cuda_summary_step(s, plan, out, error);
    s->profiling = false;
    if (st) return st;
    int k = plan->n_tokens == plan->n_seqs ? 0 : 1;
    for (int i = 1; i < s->prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, s->prof_events[i - 1], s->prof_events[i]);
        s->serve_prof_ms[k][s->prof_part[i]] += ms;
    }
    s->serve_prof_steps[k] += 1;
    s->serve_prof_tokens[k] += plan->n_tokens;
    s->serve_prof_wall_ms[k] += gptoss_now_ms() - t0;
    return GPTOSS_OK;
}
