/*
 * random_init.h - the random weights of `gptoss make-model` and `--random-weights`.
 *
 * Values are a pure function of (seed, tensor name, element index): a counter-based hash,
 * so any chunk of any tensor can be generated independently, in parallel, on the CPU or on
 * a GPU, with identical results. Only integer arithmetic and exact float operations are used
 * (no libm), so checkpoints are byte-identical across machines.
 *
 * Distributions (chosen so activations stay finite and logits stay informative through all
 * layers of the 120b shape, at every width):
 *   embedding                 N(0, 1)
 *   Linear weights [out, in]  N(0, 1/sqrt(in))        (q, k, v, o, router, lm_head)
 *   biases                    N(0, 0.02)
 *   norm gains                1 + N(0, 0.05)
 *   sinks                     N(0, 1)
 *   MXFP4 codes               uniform over the 16 E2M1 codes (element std 2.93 x scale)
 *   MXFP4 scale bytes         s0 + {-1, 0, +1} uniformly, s0 = 127 + round(log2(1 / (2.93
 * sqrt(in)))) "N" is an Irwin-Hall approximation: (u1 + u2 + u3 + u4 - 2) * sqrt(3), u uniform on
 * [0, 1).
 */
#ifndef GPTOSS_MODEL_RANDOM_INIT_H
#define GPTOSS_MODEL_RANDOM_INIT_H

#include "gptoss.h"
#include "model/weights.h"

#include <stddef.h>
#include <stdint.h>

typedef enum gptoss_init_kind {
    GPTOSS_INIT_NORMAL,      /* bf16 N(mean, std) */
    GPTOSS_INIT_MXFP4_CODES, /* u8, two uniform 4-bit codes per byte */
    GPTOSS_INIT_MXFP4_SCALES /* u8, scale_center + {-1,0,1} */
} gptoss_init_kind;

typedef struct gptoss_init_tensor {
    char name[128];     /* checkpoint name */
    gptoss_dtype dtype; /* BF16 or U8 */
    int32_t n_dims;
    int64_t shape[4];
    gptoss_init_kind kind;
    float mean;           /* NORMAL */
    float std;            /* NORMAL */
    int32_t scale_center; /* MXFP4_SCALES */
    uint64_t stream;      /* hash of the name: the tensor's RNG stream */
} gptoss_init_tensor;

/* All tensors of a model in checkpoint order (19 per layer + 3). *out is malloc'd. */
gptoss_status gptoss_init_tensors(const gptoss_config *config, gptoss_init_tensor **out, size_t *n,
                                  gptoss_error *error);

/* Bytes of one tensor. */
uint64_t gptoss_init_tensor_bytes(const gptoss_init_tensor *t);

/* Fills bytes [offset, offset + len) of tensor t (offset and len even for BF16). */
void gptoss_init_fill(const gptoss_init_tensor *t, uint64_t seed, uint64_t offset, uint8_t *out,
                      size_t len);

/* The hash the generator is built on (splitmix64 finalizer); exposed so other backends can
 * reproduce the same values. */
static inline uint64_t gptoss_init_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#endif
