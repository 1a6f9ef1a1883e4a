/*
 * backend.h - what every backend implements (CPU reference, CUDA).
 *
 * The public gptoss_backend_* functions (backend.c) validate arguments and plans, then call
 * through this table. A backend owns its KV cache pools and scratch memory; it only reads and
 * writes the KV pages a plan names.
 */
#ifndef GPTOSS_BACKEND_H
#define GPTOSS_BACKEND_H

#include "gptoss.h"
#include "model/weights.h"

typedef struct gptoss_backend_ops {
    const char *name;
    /* Creates the backend's state for a model; options are already defaulted and checked. */
    gptoss_status (*create)(const gptoss_model *model, const gptoss_backend_options *options,
                            void **state, gptoss_error *error);
    void (*destroy)(void *state);
    /* Runs a validated plan; logits [n_logits, vocab] f32 in host memory. */
    gptoss_status (*forward)(void *state, const gptoss_batch_plan *plan, float *logits,
                             gptoss_error *error);
} gptoss_backend_ops;

extern const gptoss_backend_ops gptoss_cpu_backend_ops;
#ifdef GPTOSS_WITH_CUDA
extern const gptoss_backend_ops gptoss_cuda_backend_ops;
#endif

#endif
