/*
 * traits.h - the tile sizes and launch shapes of every CUDA kernel family (kernels/ and
 * kernels/moe/), in one place. The reasoning behind a value sits beside its kernel.
 */
#ifndef GPTOSS_CUDA_TRAITS_H
#define GPTOSS_CUDA_TRAITS_H

/* Embedding, residual + RMSNorm (embed_norm.cu) */
#define RMSNORM_THREADS                                                                            \
    1024 /* threads per row block; every element of the row stays in registers */
#define RMSNORM_MAX_PER_THREAD 4 /* elements per thread: hidden <= 1024 * 4 */

/* RoPE + KV write (rope_kv.cu) */
#define ROPE_KV_HEADS_PER_BLOCK 8 /* heads per block, head_dim / 2 threads each */

/* Scalar split-K paged attention (attention_split.cu) */
#define ATTN_SPLIT_TILE_KEYS 32   /* keys per shared-memory tile, one online-softmax step each */
#define ATTN_SPLIT_MAX_SPLITS 256 /* most KV splits the merge kernel takes */

/* Tensor-core attention (attention_tc.cu): prefill */
#define ATTN_TC_PREFILL_MAX_WARPS 8 /* warps per block; group * subtiles of them compute */
#define ATTN_TC_PREFILL_THREADS (32 * ATTN_TC_PREFILL_MAX_WARPS) /* all of them copy K/V tiles */
#define ATTN_TC_PREFILL_MAX_TOKENS                                                                 \
    (16 * ATTN_TC_PREFILL_MAX_WARPS) /* tokens per block at most (group 1) */

/* Tensor-core attention (attention_tc.cu): decode */
#define ATTN_TC_DECODE_SMALL_GRID                                                                  \
    16 /* grids of at most this many blocks run 8 warps per block, others 4 */
#define ATTN_TC_DECODE_BF16_TERMS                                                                  \
    3 /* bf16 terms of q and P: 24 significant bits, as the fp32 scalar kernel */

/* bf16 decode GEMV (gemv_bf16.cu) */
#define GEMV_BF16_WARPS 8           /* warps per block, two weight rows at a time each */
#define GEMV_BF16_LOADS_IN_FLIGHT 4 /* 16-byte loads per row and lane in flight */
#define GEMV_BF16_TMA_ROWS 8        /* rows per block of the TMA variant, one warp each */

/* FP8 dense GEMV (dense_lowp.cu) */
#define FP8_GEMV_WARPS 8 /* warps per block */
#define FP8_GEMV_ROWS_PER_WARP                                                                     \
    2 /* rows per warp: each activation read from shared memory feeds both */
#define FP8_GEMV_LOADS_IN_FLIGHT 4 /* 16-byte loads per row and lane in flight */

/* Router (router.cu) */
#define ROUTER_TOKENS_PER_BLOCK 8 /* token rows a router-logits block stages in shared memory */
#define ROUTER_ONE_WARPS 4        /* warps per block of the one-token router */
#define ROUTER_ONE_MAX_CHUNKS                                                                      \
    16                      /* 16-byte weight chunks per lane: hidden <= 32 * 16 * 8 = 4096        \
                             */
#define NORM_ROUTER_WARPS 8 /* warps per block of the fused norm + router */
#define NORM_ROUTER_PER_THREAD                                                                     \
    4 /* float4 per thread per array: hidden <= 8 * 32 * 4 * 4 = 4096                              \
       */
/* Alignment of the router kernels' dynamic shared memory: the layout they were measured with,
 * 128 bytes in sm_90 code and 16 elsewhere (nvcc aligns a file's dynamic region to its widest
 * extern __shared__, and these kernels shared one with the TMA GEMV's 128-byte-aligned region). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ROUTER_SMEM_ALIGN 128
#else
#define ROUTER_SMEM_ALIGN 16
#endif

/* Logits summary (logits_summary.cu) */
#define LOGITS_SUMMARY_THREADS 256    /* threads per block */
#define LOGITS_SUMMARY_CHUNK 4096     /* logits per chunk (one block of the filter launch) */
#define LOGITS_SUMMARY_MAX_TOP 64     /* most top entries per row */
#define LOGITS_SUMMARY_MAX_CHUNKS 256 /* vocabularies up to CHUNK * MAX_CHUNKS = 1,048,576 */
#define LOGITS_SUMMARY_WARPS (LOGITS_SUMMARY_THREADS / 32) /* warps per block */
#define LOGITS_SUMMARY_GROUP                                                                       \
    (LOGITS_SUMMARY_CHUNK / LOGITS_SUMMARY_WARPS) /* logits per group (warp) */
#define LOGITS_SUMMARY_CANDIDATES 4096            /* candidates a row keeps for the select launch */

/* MoE routing (moe/route.cu) */
#define MOE_ROUTE_MAX_EXPERTS                                                                      \
    1024 /* experts the one-block route kernel counts in shared memory                             \
          */

/* MoE route GEMV, GPTOSS_MOE_ROUTE_GEMV (moe/route_gemv.cu) */
#define MOE_ROUTE_GEMV_WARPS 8           /* warps per block, one unit (two weight rows) each */
#define MOE_ROUTE_GEMV_MAX_TOKENS 8      /* tokens per pass staged in shared memory */
#define MOE_ROUTE_GEMV_GROUPS_PER_LANE 4 /* MXFP4 groups per lane: k_in <= 32 * 32 * 4 = 4096 */

/* MoE pair GEMV, GPTOSS_MOE_PAIR_GEMV (moe/pair_gemv.cu) */
#define MOE_PAIR_GEMV_WARPS 8           /* warps per block */
#define MOE_PAIR_GEMV_GROUPS_PER_LANE 4 /* MXFP4 groups per lane: k_in <= 32 * 32 * 4 = 4096 */

/* MoE WMMA GEMM, GPTOSS_MOE_WMMA_GEMM (moe/wmma_gemm.cu) */
#define MOE_WMMA_TILE_N 64 /* weight rows (output columns) per block */
#define MOE_WMMA_TILE_K 32 /* inputs per step: one MXFP4 group */
#define MOE_WMMA_LDS                                                                               \
    (MOE_WMMA_TILE_K + 8) /* shared-memory row stride of the A and B tiles (padded) */
#define MOE_WMMA_LDC (MOE_WMMA_TILE_N + 4) /* shared-memory row stride of the C tile (padded) */

/* MoE mma GEMM, GPTOSS_MOE_MMA_GEMM (moe/mma_gemm.cu) */
#define MOE_MMA_WARPS 6 /* warps per block, 32 weight rows each */
#define MOE_MMA_BLOCK_ROWS                                                                         \
    (32 * MOE_MMA_WARPS) /* weight rows per block: 2880 and 5760 are multiples */
#define MOE_MMA_THREADS (32 * MOE_MMA_WARPS) /* threads per block */

/* MoE wgmma GEMM, GPTOSS_MOE_WGMMA_GEMM (moe/wgmma_gemm.cu) */
#define MOE_WGMMA_WARPGROUPS 3 /* warpgroups per block, 64 weight rows each */
#define MOE_WGMMA_BLOCK_ROWS (64 * MOE_WGMMA_WARPGROUPS) /* weight rows per block */
#define MOE_WGMMA_THREADS (128 * MOE_WGMMA_WARPGROUPS)   /* threads per block */
#define MOE_WGMMA_ATOMS_PER_STAGE 3                      /* 64-wide k atoms per pipeline stage */
#define MOE_WGMMA_TILE_ROWS                                                                        \
    128 /* route tile height; a tile multiplies only its rows rounded up to 32 */

/* MoE pair mma, GPTOSS_MOE_PAIR_MMA (moe/pair_mma.cu) */
#define MOE_PAIR_WIDE_K_SLICES 4        /* K slices (warps) per tile of the wide kernel */
#define MOE_PAIR_WIDE_TILES_PER_BLOCK 2 /* tiles per block of the wide kernel */
#define MOE_PAIR_TMA_K_SLICES 6         /* K slices (warps) per tile of the TMA kernel */
#define MOE_PAIR_FP8_K_SLICES 4    /* K slices of the FP8 kernel: the four warps of one warpgroup */
#define MOE_PAIR_LIMIT_MAX_SMS 256 /* SMs the in-flight copy limiter keeps counters for */
#define MOE_PAIR_LIMIT_WAIT_NS 20000ull /* the limiter's wait gives up after this many ns */

#endif
