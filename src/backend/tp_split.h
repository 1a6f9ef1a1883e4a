/*
 * tp_split.h - how tensor parallelism divides a model over N GPUs (host C, no CUDA): the checks
 * an N must pass for a config, and which heads and experts rank r holds. N counts every GPU of
 * the job: one process holds all N, or (tp_net.h) P processes hold N / P each, process p the
 * ranks [p N/P, (p+1) N/P).
 *
 * Attention is split by heads: rank r holds query heads [r NH/N, (r+1) NH/N) and KV heads
 * [r NKV/N, (r+1) NKV/N) (their q/k/v rows, biases and sinks, and the o-projection's input
 * columns), so a query head and its KV head always sit on the same rank. The MoE is split by
 * experts: the router stays whole on every rank, rank r computes only the experts
 * [r E/N, (r+1) E/N) of each token's top-k, or (moe_parallel = rows) every expert's
 * intermediate rows [r I/N, (r+1) I/N). Each half ends in a sum over the ranks.
 * Experts rather than the intermediate dimension, because the MXFP4 experts come in 32-wide
 * scale groups along it: gpt-oss's 2880 split 4 or 8 ways (720, 360) is not a whole number of
 * groups, and whole experts keep every MoE kernel's shapes as they are.
 */
#ifndef GPTOSS_BACKEND_TP_SPLIT_H
#define GPTOSS_BACKEND_TP_SPLIT_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest tensor_parallel_size accepted. */
#define GPTOSS_TP_MAX 8

typedef struct gptoss_tp_slice {
    int32_t n_heads, n_kv_heads; /* held by the rank */
    int32_t head0, kv_head0;     /* the rank's first query and KV head (global index) */
    int32_t expert0, n_experts;  /* the rank's experts: [expert0, expert0 + n_experts) */
    int32_t inter0, n_inter;     /* the rows of every expert's intermediate dimension it holds
                                    (all of them unless the MoE is split by rows) */
    bool down_bias;              /* it adds the experts' down-projection bias (rows: rank 0) */
} gptoss_tp_slice;

/* Checks tensor_parallel_size against the options alone (before a model is known): 1, 2, 4
 * or 8; more than 1 only on the CUDA backend. 0 reads as 1. */
gptoss_status gptoss_tp_check_options(int32_t tp_size, gptoss_backend_kind kind,
                                      gptoss_error *error);

/* Checks that tp_size GPUs from `device` exist (n_devices visible) and that tp_size divides
 * the config's query heads, KV heads and experts. */
gptoss_status gptoss_tp_check_config(const gptoss_config *config, int32_t tp_size, int32_t device,
                                     int32_t n_devices, gptoss_error *error);

/* gptoss_tp_check_config for a job of n_procs processes of tp_size / n_procs GPUs each: n_procs
 * divides tp_size, and this process has its share of GPUs from `device`. n_procs 1 is
 * gptoss_tp_check_config. */
gptoss_status gptoss_tp_check_job(const gptoss_config *config, int32_t tp_size, int32_t n_procs,
                                  int32_t device, int32_t n_devices, gptoss_error *error);

/* Data parallelism over engines of tp_size GPUs each (1: one GPU each): engine i takes devices
 * [device + i * tp_size, device + (i + 1) * tp_size). Checks that the n_engines * tp_size GPUs
 * from `device` are among the n_devices visible, and writes engine i's first device into
 * first[i] (first may be NULL). */
gptoss_status gptoss_dp_engine_devices(int32_t n_engines, int32_t tp_size, int32_t device,
                                       int32_t n_devices, int32_t *first, gptoss_error *error);

/* Rank `rank`'s share of a config that passed gptoss_tp_check_config, the MoE by whole experts. */
gptoss_tp_slice gptoss_tp_rank_slice(const gptoss_config *config, int32_t tp_size, int32_t rank);

/* The same for a gptoss_moe_parallel mode: GPTOSS_MOE_PARALLEL_TP gives every rank all the
 * experts and the intermediate rows [r I/N, (r+1) I/N) (gate_up's unit pairs and down's input
 * columns), the down bias on rank 0 only. */
gptoss_tp_slice gptoss_tp_rank_slice_moe(const gptoss_config *config, int32_t tp_size, int32_t rank,
                                         int32_t moe_parallel);

/* Checks moe_parallel (0 or 1) for a config and tp_size: splitting by rows needs
 * intermediate_size / tp_size to be a whole number of 32-wide MXFP4 groups. */
gptoss_status gptoss_tp_check_moe(const gptoss_config *config, int32_t tp_size,
                                  int32_t moe_parallel, gptoss_error *error);

/* Bytes [off, off + n) of each of `rows` rows of row_bytes bytes into dst [rows, n] (an
 * expert tensor's slice along its last dimensions). */
void gptoss_tp_copy_row_slices(const void *src, size_t rows, size_t row_bytes, size_t off, size_t n,
                               void *dst);

/* Columns [col0, col0 + n_cols) of a row-major [rows, cols] matrix of 2-byte elements into
 * dst [rows, n_cols] (the o-projection's input columns of one rank). */
void gptoss_tp_copy_columns16(const void *src, size_t rows, size_t cols, size_t col0, size_t n_cols,
                              void *dst);

#endif
