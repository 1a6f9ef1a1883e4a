/*
 * tp_nccl.h - NCCL for tensor parallelism, opened at run time (dlopen of libnccl.so.2, or the
 * file GPTOSS_NCCL_LIBRARY names, or libnccl.so.2 next to the executable), so a binary used
 * without tensor parallelism needs no NCCL: the part of its C ABI tp.cu calls, and the loader.
 */
#ifndef GPTOSS_CUDA_TP_NCCL_H
#define GPTOSS_CUDA_TP_NCCL_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>

extern "C" {
#include "util/dist.h" /* GPTOSS_DIST_BLOB_BYTES */
#include "util/error.h"
}

/* The stable part of NCCL's C ABI that is used here (nccl.h of NCCL 2.x). */
typedef struct nccl_comm *nccl_comm_t;
typedef int nccl_result_t; /* ncclResult_t: 0 = ncclSuccess */
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 };
typedef struct nccl_unique_id {
    char internal[GPTOSS_DIST_BLOB_BYTES]; /* ncclUniqueId: 128 bytes, passed by value */
} nccl_unique_id;

typedef struct nccl_api {
    bool loaded;
    char error[512];
    nccl_result_t (*comm_init_all)(nccl_comm_t *comms, int n, const int *devices);
    nccl_result_t (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                                nccl_comm_t comm, cudaStream_t stream);
    nccl_result_t (*all_gather)(const void *send, void *recv, size_t send_count, int dtype,
                                nccl_comm_t comm, cudaStream_t stream);
    nccl_result_t (*comm_destroy)(nccl_comm_t comm);
    nccl_result_t (*comm_abort)(nccl_comm_t comm);
    const char *(*error_string)(nccl_result_t result);
    nccl_result_t (*get_version)(int *version);
    /* across processes only (looked up, not required, for a single process) */
    nccl_result_t (*get_unique_id)(nccl_unique_id *id);
    nccl_result_t (*comm_init_rank)(nccl_comm_t *comm, int n_ranks, nccl_unique_id id, int rank);
    nccl_result_t (*group_start)(void);
    nccl_result_t (*group_end)(void);
} nccl_api;

/* The library's entry points once gptoss_tp_nccl_load succeeded. */
extern nccl_api gptoss_tp_nccl;

/* Opens NCCL once per process; the error says how to provide it. */
gptoss_status gptoss_tp_nccl_load(gptoss_error *error);

/* GPTOSS_OK for ncclSuccess, else an error naming `what` and NCCL's message. */
gptoss_status gptoss_tp_nccl_check(nccl_result_t r, const char *what, gptoss_error *error);

#endif
