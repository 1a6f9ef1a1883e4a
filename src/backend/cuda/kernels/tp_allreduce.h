/*
 * tp_allreduce.h - the all-reduce over peer memory that tensor parallelism (tp.cu) uses for
 * small sums: each rank's kernel arguments and its launcher (tp_allreduce.cu says how it works).
 */
#ifndef GPTOSS_CUDA_KERNELS_TP_ALLREDUCE_H
#define GPTOSS_CUDA_KERNELS_TP_ALLREDUCE_H

extern "C" {
#include "backend/tp_split.h" /* GPTOSS_TP_MAX */
}

#include <cuda_runtime.h>
#include <stdint.h>

/* The grid is always this many blocks; each owns a flag per rank and a round counter. */
#define GPTOSS_CUDA_P2P_BLOCKS 32

typedef struct gptoss_cuda_p2p_ptrs {
    float *slots[GPTOSS_TP_MAX];    /* rank q's receive area [2][N][slot_floats] */
    uint32_t *flags[GPTOSS_TP_MAX]; /* rank q's flags [P2P_BLOCKS][N] */
    uint32_t *counters;             /* this rank's rounds [P2P_BLOCKS] */
    const uint32_t *abort;          /* nonzero once the group is aborted (host memory) */
    int32_t rank;
    uint32_t slot_floats;
} gptoss_cuda_p2p_ptrs;

/* Sums buf [n] f32 over the n_ranks ranks (2, 4 or 8) in place on stream; every rank calls it
 * with its own arguments and gets bitwise the same sum. */
void gptoss_cuda_p2p_allreduce(const gptoss_cuda_p2p_ptrs *a, int n_ranks, float *buf, uint32_t n,
                               cudaStream_t stream);

#endif
