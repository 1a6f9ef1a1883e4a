/*
 * dist.h - where this process stands in a multi-process (multi-node) job, and the rendezvous
 * that hands every process the same small blob (the NCCL unique id of tensor parallelism across
 * processes, backend/tp_net.h, which keeps the rendezvous connections as its link).
 *
 * Owns: reading the rank, world size and local rank from the command line or the launcher's
 * environment, their validation, and the TCP rendezvous. It knows nothing of GPUs or NCCL.
 *
 * Ranks count processes. One process drives all the GPUs it is given (one thread each), so a
 * GPU's global index is rank * gpus_per_process + its local index; with the explicit flags
 * there is one process per node.
 *
 * Where the numbers come from, first match wins:
 *   1. the flags (--nnodes, --node-rank, --master-addr, --master-port), when --nnodes is
 *      given: rank = node rank, world = nnodes, local rank 0 of 1;
 *   2. Open MPI (mpirun): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE. Before Slurm,
 *      because mpirun inside a Slurm allocation inherits the allocation's SLURM_* variables,
 *      which then describe the batch step rather than this process;
 *   3. Slurm (srun): SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID,
 *      SLURM_NODEID, SLURM_STEP_NUM_NODES (or SLURM_NNODES). Only inside a job step (srun
 *      sets SLURM_STEP_ID); a batch script's own process counts as a single process;
 *   4. none: a single process (rank 0 of 1).
 * The master address is --master-addr, else MASTER_ADDR, else (Slurm) the first host of
 * SLURM_STEP_NODELIST / SLURM_JOB_NODELIST; the port --master-port, else MASTER_PORT, else
 * GPTOSS_DIST_DEFAULT_PORT. A multi-process job without a master address is an error.
 *
 * Threads: gptoss_dist_resolve and gptoss_dist_rendezvous keep no global state (tests run
 * several ranks as threads of one process).
 */
#ifndef GPTOSS_UTIL_DIST_H
#define GPTOSS_UTIL_DIST_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPTOSS_DIST_BLOB_BYTES 128 /* the size of an ncclUniqueId */
#define GPTOSS_DIST_DEFAULT_PORT 29500
#define GPTOSS_DIST_MAX_WORLD 65536

typedef enum gptoss_dist_source {
    GPTOSS_DIST_SINGLE = 0, /* no launcher, no flags */
    GPTOSS_DIST_FLAGS = 1,
    GPTOSS_DIST_OPENMPI = 2,
    GPTOSS_DIST_SLURM = 3,
} gptoss_dist_source;

/* "single process", "flags", "Open MPI", "Slurm". */
const char *gptoss_dist_source_name(gptoss_dist_source source);

/* The command line's part; unset fields are 0 / -1 / NULL. */
typedef struct gptoss_dist_flags {
    int64_t nnodes;          /* --nnodes; 0 = not given */
    int64_t node_rank;       /* --node-rank; -1 = not given */
    const char *master_addr; /* --master-addr; NULL = not given */
    int64_t master_port;     /* --master-port; 0 = not given */
} gptoss_dist_flags;

/* { 0, -1, NULL, 0 }: nothing given. */
gptoss_dist_flags gptoss_dist_flags_default(void);

typedef struct gptoss_dist_info {
    gptoss_dist_source source;
    int32_t rank;             /* 0..world_size-1 */
    int32_t world_size;       /* processes in the job */
    int32_t local_rank;       /* 0..local_world_size-1: index among the node's processes */
    int32_t local_world_size; /* processes on this node */
    int32_t node_rank;        /* 0..n_nodes-1 */
    int32_t n_nodes;
    char master_addr[256]; /* host of rank 0 ("" for a single process) */
    int32_t master_port;   /* 1..65535 */
} gptoss_dist_info;

/* Looks a variable up; NULL = unset. gptoss_dist_resolve uses getenv when none is given. */
typedef const char *(*gptoss_dist_getenv_fn)(void *user, const char *name);

/* Fills *info by the precedence above and validates it: numbers that parse and lie in range
 * (rank < world, local rank < local size, node rank < nodes), flags that come together
 * (--node-rank, --master-addr and --master-port need --nnodes), a master address when the
 * world has more than one process. The message names the flag or variable at fault. */
gptoss_status gptoss_dist_resolve(const gptoss_dist_flags *flags, gptoss_dist_getenv_fn getenv_fn,
                                  void *getenv_user, gptoss_dist_info *info, gptoss_error *error);

/* The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07". False when the list
 * is empty or malformed, or the host does not fit out_size. */
bool gptoss_dist_first_host(const char *nodelist, char *out, size_t out_size);

/* Hands rank 0's blob[GPTOSS_DIST_BLOB_BYTES] to every other rank over TCP: rank 0 listens on
 * master_addr:master_port, every other rank connects (retrying while rank 0 is not up yet)
 * and says its rank and world size; once all world_size - 1 have checked in, rank 0 sends the
 * blob to each. Fails on every rank that hears of it, with a message naming the cause, when
 * the ranks disagree on the world size, two processes claim the same rank, rank 0 cannot be
 * reached or cannot listen, or timeout_ms passes first (rank 0 then names the ranks missing;
 * a connected rank waits up to 2 s longer for that verdict).
 * A world of one returns at once. blob: read on rank 0, written on the others. */
gptoss_status gptoss_dist_rendezvous(const gptoss_dist_info *info, uint8_t *blob,
                                     int64_t timeout_ms, gptoss_error *error);

/* gptoss_dist_rendezvous, keeping the connections open for later messages (tensor
 * parallelism's step stream, backend/tp_net.h): on success rank 0 gets fds[r] for every rank
 * r in 1..world_size-1 (fds[0] = -1; fds has world_size entries), any other rank fds[0], its
 * connection to rank 0 (fds has 1 entry). The sockets are non-blocking and the caller's to
 * close. On failure every entry is -1. */
gptoss_status gptoss_dist_rendezvous_keep(const gptoss_dist_info *info, uint8_t *blob,
                                          int64_t timeout_ms, int *fds, gptoss_error *error);

/* Process-wide environment defaults for collective libraries, before any CUDA or NCCL call:
 * NCCL_NVLS_ENABLE=0 unless the user set it. NVLink SHARP (multicast) collectives need
 * driver and fabric support that many machines and containers lack (NCCL then fails or hangs
 * at communicator creation), and they reserve GPU memory per communicator for little gain on
 * the small all-reduces of inference. */
void gptoss_dist_env_defaults(void);

#endif
