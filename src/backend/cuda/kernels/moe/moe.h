/*
 * moe.h - the MXFP4 mixture-of-experts MLP on the GPU (kernels/moe/): the named paths, the
 * route that groups pairs by expert, the layer's weights, the choice rule and the launch.
 */
#ifndef GPTOSS_CUDA_MOE_H
#define GPTOSS_CUDA_MOE_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

/*
 * The ways to run a layer's experts. The numbers are stable: GPTOSS_CUDA_MOE_PATH=N forces
 * path N (or its name, gptoss_cuda_moe_path_parse).
 */
enum gptoss_moe_path {
    GPTOSS_MOE_AUTO = 0,       /* chosen per step (gptoss_cuda_moe_choose_path) */
    GPTOSS_MOE_ROUTE_GEMV = 1, /* CUDA-core GEMV over the route, up to 8 tokens per pass */
    GPTOSS_MOE_WMMA_GEMM = 2,  /* bf16 WMMA GEMM over 64-row route tiles (any layer) */
    GPTOSS_MOE_PAIR_GEMV = 3,  /* CUDA-core GEMV per (token, expert) pair, up to
                                  GPTOSS_MOE_PAIR_MAX pairs; reads topk_idx, no route */
    GPTOSS_MOE_MMA_GEMM = 4,   /* mma.sync fp16 grouped GEMM (only where w->mma_ok; uses y as
                                  scratch for the fp16 copy of t before writing it) */
    GPTOSS_MOE_PAIR_MMA = 5,   /* the pair GEMV on the tensor cores (only where
                                  w->pair_mma_ok, else PAIR_GEMV), up to GPTOSS_MOE_PAIR5_MAX
                                  pairs; h by pair as fp16 in the mma layout; no route */
    GPTOSS_MOE_WGMMA_GEMM = 6, /* MMA_GEMM on sm_90a wgmma (only where w->wg_ok, else
                                  MMA_GEMM); h fp16 in the wgmma layout */
};

/* The kernels of GPTOSS_MOE_PAIR_MMA (GPTOSS_CUDA_MOE_PAIR_KERNEL=wide|tma|fp8). */
enum gptoss_moe_pair_kernel {
    GPTOSS_MOE_PAIR_DEFAULT = 0, /* DENSE where TMA runs, else wide */
    GPTOSS_MOE_PAIR_WIDE = 1,    /* 16-byte register loads, any GPU */
    GPTOSS_MOE_PAIR_TMA = 2,     /* bulk copies into shared memory, sm_90+ */
    GPTOSS_MOE_PAIR_FP8 = 3,     /* wgmma on e4m3, sm_90a; not the default */
    GPTOSS_MOE_PAIR_DENSE = 4,   /* TMA with the mma GEMM's arithmetic (gptoss_moe_pair_dense)
                                    where w->mma_ok, else TMA; the default on sm_90+ */
};

/* A path from its number ("0".."6") or name ("route_gemv", "wmma_gemm", "pair_gemv",
 * "mma_gemm", "pair_mma", "wgmma_gemm", "auto"); GPTOSS_MOE_AUTO for NULL or anything else. */
enum gptoss_moe_path gptoss_cuda_moe_path_parse(const char *s);
/* The path's name as gptoss_cuda_moe_path_parse takes it. */
const char *gptoss_cuda_moe_path_name(enum gptoss_moe_path path);

/* An expert index of -1 in topk_idx (tensor parallelism: another GPU's expert) is a pair that
 * every path skips: no weights read, its h and y rows left unwritten (its weight is 0 and the
 * weighted sum leaves such slots out). */

/* Groups the n_tokens*k_top (token, slot) pairs by expert (see kernels/moe/route.cu for the layout
 * of `route`) into tiles of route->tile_rows rows, the tile height of the MoE path that will read
 * it (gptoss_cuda_moe_route sets it from that path). Returns nothing; route lives in device
 * memory of gptoss_cuda_route_bytes bytes. */
typedef struct gptoss_cuda_route {
    int32_t *expert_offsets; /* [n_experts + 1] prefix offsets into the sorted rows */
    int32_t *sorted_token;   /* [n_pairs] token of each sorted row */
    int32_t *sorted_pair;    /* [n_pairs] token*k_top + slot of each sorted row */
    int32_t *tile_expert;    /* [max_tiles] expert of each tile, -1 past the end */
    int32_t *tile_row;       /* [max_tiles] first sorted row of each tile */
    int32_t *active_experts; /* [n_experts] experts with at least one row, then -1 */
    int32_t tile_rows;       /* host side: rows per tile the route was built with */
} gptoss_cuda_route;

#define GPTOSS_MOE_TILE_M 64  /* tile height of GPTOSS_MOE_WMMA_GEMM */
#define GPTOSS_MOE_MIN_TILE 8 /* smallest tile of GPTOSS_MOE_MMA_GEMM; sizes the route */

/* Tiles a route of tile_rows-row tiles can need: every active expert may end in a partial one. */
int32_t gptoss_cuda_route_tiles(int32_t n_pairs, int32_t n_experts, int32_t tile_rows);
int32_t gptoss_cuda_route_max_tiles(int32_t n_pairs, int32_t n_experts);
size_t gptoss_cuda_route_bytes(int32_t n_pairs, int32_t n_experts);
void gptoss_cuda_route_bind(void *memory, int32_t n_pairs, int32_t n_experts,
                            gptoss_cuda_route *route);
/* path: the resolved path (gptoss_cuda_moe_choose_path) the route is for; the pair paths
 * (GPTOSS_MOE_PAIR_GEMV, GPTOSS_MOE_PAIR_MMA) need none. */
void gptoss_cuda_moe_route(const int32_t *topk_idx, int32_t n_tokens, int32_t k_top,
                           int32_t n_experts, int path, gptoss_cuda_route *route,
                           cudaStream_t stream);

/* The same with tile_rows-row tiles (at least GPTOSS_MOE_MIN_TILE), for
 * gptoss_moe_pair_grouped. */
void gptoss_cuda_moe_route_rows(const int32_t *topk_idx, int32_t n_tokens, int32_t k_top,
                                int32_t n_experts, int32_t tile_rows, gptoss_cuda_route *route,
                                cudaStream_t stream);

/* MXFP4 expert weights of one layer, HF layout (spec 3.4). */
typedef struct gptoss_cuda_moe_weights {
    const uint8_t *gate_up_blocks; /* [E, 2I, H/32, 16] */
    const uint8_t *gate_up_scales; /* [E, 2I, H/32] E8M0 */
    const float *gate_up_bias;     /* [E, 2I] interleaved gate, up */
    const uint8_t *down_blocks;    /* [E, H, I/32, 16] */
    const uint8_t *down_scales;    /* [E, H, I/32] */
    const float *down_bias;        /* [E, H] */
    int32_t n_experts, hidden, intermediate;
    float swiglu_limit, swiglu_alpha;
    bool mma_ok;       /* set by gptoss_cuda_moe_check_mma: GPTOSS_MOE_MMA_GEMM is exact here */
    bool pair_mma_ok;  /* ... and GPTOSS_MOE_PAIR_MMA is */
    bool wg_ok;        /* ... and GPTOSS_MOE_WGMMA_GEMM is, and runs here (mma_ok on sm_90) */
    bool masked_slots; /* this GPU holds some of the experts (tensor parallelism): top-k slots
                          may be -1; the TMA and FP8 pair kernels test for them only then (the
                          test is a load before each block's copy: 120b tg128 -0.4%, H100) */
} gptoss_cuda_moe_weights;

/*
 * The expert MLPs of one layer. t [n_tokens, H] bf16 (normalized input); h scratch
 * [n_pairs, I] (16-bit values: bf16 by sorted row, by pair on the pair GEMV; fp16 in the mma
 * layout on the mma GEMM); y [n_tokens * k_top, H] f32 (by token*k_top + slot), each row =
 * down(swiglu(gate_up(t))) + down_bias, unweighted. path: a gptoss_moe_path (an int so that
 * callers may pass a forced value as read); GPTOSS_MOE_AUTO chooses
 * (gptoss_cuda_moe_choose_path). The route must have been built for the same path (the pair
 * paths need none).
 */
#define GPTOSS_MOE_PAIR_MAX 8
#define GPTOSS_MOE_PAIR5_MAX 256 /* GPTOSS_MOE_PAIR_MMA takes up to this many pairs */
enum gptoss_moe_path gptoss_cuda_moe_choose_path(int path, int32_t n_tokens, int32_t k_top,
                                                 const gptoss_cuda_moe_weights *w);
void gptoss_cuda_moe(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                     int32_t k_top, const int32_t *topk_idx, const gptoss_cuda_route *route,
                     void *h, float *y, int path, cudaStream_t stream);

/*
 * The pair mma's TMA kernel arithmetic for any number of pairs (the batch-invariant experts):
 * gptoss_moe_pair_tma runs the TMA pair kernel itself (whatever GPTOSS_CUDA_MOE_PAIR_KERNEL
 * says; up to GPTOSS_MOE_PAIR5_MAX pairs, no route), gptoss_moe_pair_grouped one block per
 * (16-row tile, route tile) over a route from gptoss_cuda_moe_route_rows, each pair multiplied as
 * the pair kernel does: a pair's h (fp16, mma layout, by pair) and y rows are bitwise the same
 * from either, whatever else the step holds. Only where gptoss_moe_pair_grouped_ok (w->pair_mma_ok
 * and the TMA pair kernel runs on this device).
 */
bool gptoss_moe_pair_grouped_ok(const gptoss_cuda_moe_weights *w);
void gptoss_moe_pair_tma(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                         int32_t n_pairs, int32_t k_top, __half *h, float *y, cudaStream_t stream);
void gptoss_moe_pair_grouped(const gptoss_cuda_moe_weights *w, const bf16 *t,
                             const gptoss_cuda_route *route, int32_t n_tokens, int32_t k_top,
                             __half *h, float *y, cudaStream_t stream);

/*
 * The batch-invariant experts on the mma GEMM's arithmetic (codes scaled in fp16, one chain of
 * MMAs per K slice, the MOE_PAIR_TMA_K_SLICES slice sums added in order): gptoss_moe_pair_dense
 * one block per (16-row tile, pair) like gptoss_moe_pair_tma (steps of a few tokens, no route;
 * h by pair), gptoss_moe_mma_gemm_sliced the mma GEMM over a route from
 * gptoss_cuda_moe_route_rows with gptoss_moe_mma_sliced_tile_rows rows per tile (h by sorted
 * row). Each pair's y row is bitwise the same from either, whatever else the step holds; the
 * GEMM runs prefill at the mma path's speed, where the pair arithmetic above multiplies one
 * token per MMA. Only where gptoss_moe_bi_mma_ok (w->mma_ok, the TMA pair kernel runs here and
 * the mma GEMM's tiles fit).
 */
bool gptoss_moe_bi_mma_ok(const gptoss_cuda_moe_weights *w);
void gptoss_moe_pair_dense(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                           int32_t n_pairs, int32_t k_top, __half *h, float *y,
                           cudaStream_t stream);
int32_t gptoss_moe_mma_sliced_tile_rows(int32_t n_tokens, int32_t k_top, int32_t n_experts);
void gptoss_moe_mma_gemm_sliced(const gptoss_cuda_moe_weights *w, const bf16 *t,
                                const gptoss_cuda_route *route, int32_t n_tokens, int32_t k_top,
                                __half *h, float *y, cudaStream_t stream);

/*
 * Decides w->mma_ok: GPTOSS_MOE_MMA_GEMM dequantizes to fp16 (code * 2^(s-127) exactly) and feeds
 * the inputs as fp16, which is exact when every scale byte of both projections lies in [104, 128],
 * the SwiGLU output bound limit * (limit + 1) and the input bound sqrt(H) * max|input_gain| (an
 * RMSNorm output; input_gain [H] f32 on the device, NULL to skip) stay below 2^15. Also decides
 * w->pair_mma_ok: GPTOSS_MOE_PAIR_MMA scales in fp32, so it needs the same input bounds and scale
 * bytes up to 240. scratch: 4 device words. Synchronizes the stream.
 */
cudaError_t gptoss_cuda_moe_check_mma(gptoss_cuda_moe_weights *w, const float *input_gain,
                                      unsigned *scratch, cudaStream_t stream);

/* Which kernel GPTOSS_MOE_PAIR_MMA runs (tests and A/B runs): a gptoss_moe_pair_kernel;
 * GPTOSS_MOE_PAIR_DEFAULT = the TMA kernel on compute capability 9.0 and up, the wide kernel
 * elsewhere. Sets the current kernel context's choice (cuda_kernels.h), whose initial value is
 * the moe_pair_kernel knob (tuning.h). */
void gptoss_cuda_moe_set_pair_kernel(int kernel);
/* The kernel GPTOSS_MOE_PAIR_MMA launches now (never DEFAULT; decided by gptoss_cuda_moe_prepare,
 * a kernel that does not run here falls back to the next one that does). */
enum gptoss_moe_pair_kernel gptoss_cuda_moe_pair_kernel(void);

/* Raises the MoE kernels' dynamic shared-memory limits for these widths and decides which
 * paths and pair kernels run on this device, recorded in the current kernel context (call
 * once per context). */
cudaError_t gptoss_cuda_moe_prepare(int32_t hidden, int32_t intermediate);

#endif
