/*
 * tuning.h - every knob of the CUDA backend in one struct, filled once per backend.
 *
 * gptoss_cuda_tuning_init fills it in three layers: the defaults below, then
 * gptoss_backend_options.cuda_tuning ("key=value,key=value"), then the environment (the
 * GPTOSS_CUDA_* variable of each key overrides both). Nothing else in the backend reads the
 * environment or keeps a knob of its own (the one exception, GPTOSS_MOE_TRACE_FILE, exists
 * only in diagnostics builds with the MoE trace): the state holds this struct, and the
 * kernels' choices are copied into its device's kernel context (cuda_kernels.h). The knobs
 * are developer switches for A/B measurements and tests; the defaults are what a user runs.
 *
 *  key               variable                      default  meaning
 *  graphs            GPTOSS_CUDA_GRAPHS            1     replay steps of up to 64 tokens as CUDA
 *                                                        graphs
 *  pdl               GPTOSS_CUDA_PDL               1     programmatic dependent launch (sm_90 or
 *                                                        newer only)
 *  gemv              GPTOSS_CUDA_GEMV              1     decode projections on our GEMV (0: cuBLAS;
 *                                                        all: every GEMM and lm_head on it, no
 *                                                        cuBLAS)
 *  gemv_kernel       GPTOSS_CUDA_GEMV_KERNEL       auto  bf16 GEMV kernel: auto, ld (the one older
 *                                                        GPUs run) or tma (bulk copies, sm_90)
 *  attn_tc           GPTOSS_CUDA_ATTN_TC           1     tensor-core attention for prefill runs
 *  attn_decode       GPTOSS_CUDA_ATTN_DECODE       1     tensor-core split-K attention for decode
 *                                                        tokens
 *  adc_warps         GPTOSS_CUDA_ADC_WARPS         0     warps per decode-attention block: 0 chosen
 *                                                        per launch, 4 or 8 everywhere (8 where it
 *                                                        fits)
 *  norm_router       GPTOSS_CUDA_NORM_ROUTER       1     one decode token: norm after attention +
 *                                                        router in one kernel
 *  qkv_rope          GPTOSS_CUDA_QKV_ROPE          1     one decode token: RoPE + KV write in the
 *                                                        QKV projection's epilogue
 *  router_fused_max  GPTOSS_CUDA_ROUTER_FUSED_MAX  8     steps of up to this many tokens (0..64)
 *                                                        use the fused router; larger ones an SGEMM
 *                                                        + top-k
 *  moe_path          GPTOSS_CUDA_MOE_PATH          auto  MoE path forced, by name or number (enum
 *                                                        gptoss_moe_path, kernels/moe/moe.h): auto
 *                                                        (0, chosen per step), route_gemv,
 *                                                        wmma_gemm, pair_gemv, mma_gemm, pair_mma,
 *                                                        wgmma_gemm (1..6)
 *  moe_pair_kernel   GPTOSS_CUDA_MOE_PAIR_KERNEL   auto  path 5 kernel: auto, wide (the one older
 *                                                        GPUs run), tma, fp8 (sm_90a) or dense
 *                                                        (tma with the mma GEMM's arithmetic)
 *  moe_pair_tokens   GPTOSS_CUDA_MOE_PAIR_TOKENS   0     path 5 for steps of up to N tokens (0: the
 *                                                        rule by pairs per expert)
 *  moe_inflight      GPTOSS_CUDA_MOE_INFLIGHT      3     path 5 TMA copies in flight per SM (0: no
 *                                                        limit); given explicitly, the give-ups
 *                                                        print at exit
 *  moe_wg_min        GPTOSS_CUDA_MOE_WG_MIN        24    path 6 where experts average >= N rows (>=
 *                                                        1)
 *  moe_max_tile      GPTOSS_CUDA_MOE_MAX_TILE      64    largest path 4 route tile (8..128 rows;
 *                                                        also capped by what shared memory holds)
 *  moe_tile_pct      GPTOSS_CUDA_MOE_TILE_PCT      125   path 4 tiles grow while under pct% of the
 *                                                        average rows per expert (50..800)
 *  moe_mma_stage_kb  GPTOSS_CUDA_MOE_MMA_STAGE_KB  0     path 4 K blocks (64 code bytes a row) per
 *                                                        pipeline stage, 1..3 (route tiles of up
 *                                                        to 16 rows take 3, of 32 take 2), 0: by
 *                                                        tile height (8 rows 3, 32 rows 2, else 1)
 *  moe_mma_slab      GPTOSS_CUDA_MOE_MMA_SLAB      0     path 4's 8-row route tiles (and the
 *                                                        batch-invariant sliced GEMM's) on the
 *                                                        slab kernel (sm_90; whole 16-row slabs
 *                                                        by bulk copies): 1 on
 *  profile           GPTOSS_CUDA_PROFILE           0     time every served step's components (no
 *                                                        graphs), totals printed when the backend
 *                                                        is freed
 *  step_timing       GPTOSS_STEP_TIMING            0     where a served step's wall time goes,
 *                                                        printed when the backend is freed
 *  ablate            GPTOSS_CUDA_ABLATE            0     diagnostics builds only
 *                                                        (-DGPTOSS_DIAGNOSTICS=ON): bits of
 *                                                        components one-token steps leave out
 *                                                        (diagnostics.h); the logits are wrong
 *  device_profile    GPTOSS_CUDA_DEVICE_PROFILE    -     kernel paths of auto, ampere, ada or
 *                                                        hopper (gptoss_cuda_profile, gptoss.h);
 *                                                        overrides the backend option cuda_profile
 *  host_weights      GPTOSS_CUDA_HOST_WEIGHTS      0     weights in host memory, as the backend
 *                                                        option weights_in_host_memory (for tests)
 *
 * Values: booleans take 0/1 (also off/on, false/true, no/yes); integers are decimal and must lie
 * in the range given; named choices take the names listed. Anything else, and any unknown key,
 * is an error that names the key (or variable) and what it accepts.
 */
#ifndef GPTOSS_CUDA_TUNING_H
#define GPTOSS_CUDA_TUNING_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "util/error.h"

enum { GPTOSS_CUDA_GEMV_OFF = 0, GPTOSS_CUDA_GEMV_ON = 1, GPTOSS_CUDA_GEMV_ALL = 2 };
/* gemv_kernel: also the values gptoss_cuda_gemv_kernel returns (1 ld, 2 tma) */
enum {
    GPTOSS_CUDA_GEMV_KERNEL_AUTO = 0,
    GPTOSS_CUDA_GEMV_KERNEL_LD = 1,
    GPTOSS_CUDA_GEMV_KERNEL_TMA = 2
};
/* moe_pair_kernel: also the values gptoss_cuda_moe_pair_kernel returns (1 wide, 2 TMA, 3 FP8,
 * 4 dense) */
enum {
    GPTOSS_CUDA_PAIR_KERNEL_AUTO = 0,
    GPTOSS_CUDA_PAIR_KERNEL_WIDE = 1,
    GPTOSS_CUDA_PAIR_KERNEL_TMA = 2,
    GPTOSS_CUDA_PAIR_KERNEL_FP8 = 3,
    GPTOSS_CUDA_PAIR_KERNEL_DENSE = 4
};

typedef struct gptoss_cuda_tuning {
    bool graphs;
    bool pdl;
    int gemv;        /* GPTOSS_CUDA_GEMV_* */
    int gemv_kernel; /* GPTOSS_CUDA_GEMV_KERNEL_* */
    bool attn_tc;
    bool attn_decode;
    int adc_warps; /* 0, 4 or 8 */
    bool norm_router;
    bool qkv_rope;
    int router_fused_max;
    int moe_path;        /* enum gptoss_moe_path: 0 (auto)..6 */
    int moe_pair_kernel; /* GPTOSS_CUDA_PAIR_KERNEL_* */
    int moe_pair_tokens;
    int moe_inflight;
    bool moe_inflight_report; /* moe_inflight given explicitly and > 0 */
    int moe_wg_min;
    int moe_max_tile;
    int moe_tile_pct;
    int moe_mma_stage_kb;
    bool moe_mma_slab;
    /* batch-invariant mode (gptoss_backend_options.batch_invariant): steps of up to
     * bi_dense_max rows (GPTOSS_CUDA_BI_DENSE_MAX, default 16, 0..65536; 0 never) take the skinny
     * dense GEMM, larger ones the large GEMM (bi_dense_large below; bf16 weights) or else its
     * wide form (bi_dense_wide, GPTOSS_CUDA_BI_DENSE_WIDE, default 1; 0: the 64x64 WMMA tiles; e4m3
     * weights take the skinny GEMM up to 128 rows there), steps of up to bi_moe_max tokens
     * (GPTOSS_CUDA_BI_MOE_MAX, default 64, 0..65536) the streaming expert kernel
     * (kernels/batch_invariant.cu; up to bi_moe_pairs tokens, GPTOSS_CUDA_BI_MOE_PAIRS, default 1,
     * 0..64, one block row per (token, expert) pair without the route kernel), larger ones its wide
     * form (bi_moe_wide, GPTOSS_CUDA_BI_MOE_WIDE, default 1; 0: the WMMA path); the others the
     * tile kernels. The results are the same either way; only the time differs.
     * bi_moe_pair (GPTOSS_CUDA_BI_MOE_PAIR, default 1) runs the experts on the pair mma's
     * arithmetic instead, where its TMA kernel runs and the weights allow it (kernels/moe/moe.h,
     * gptoss_moe_pair_grouped): the pair kernel for steps of up to bi_moe_pair_tokens tokens
     * (GPTOSS_CUDA_BI_MOE_PAIR_TOKENS, default 8, 0..64), the grouped kernel beyond. Its bits
     * differ from the WMMA arithmetic's (each is batch-invariant); the other bi_moe knobs then
     * apply only where it does not run. bi_moe_mma (GPTOSS_CUDA_BI_MOE_MMA, default 1) goes
     * before it where the mma GEMM is exact (w->mma_ok): the mma GEMM's arithmetic with K in
     * the pair kernel's slices, the dense pair kernel for steps of up to bi_moe_pair_tokens
     * tokens and the sliced GEMM beyond (gptoss_moe_mma_gemm_sliced), whose prefill multiplies 8
     * tokens per MMA where the pair arithmetic multiplies one. */
    int bi_dense_max;
    bool bi_dense_wide;
    int bi_dense_split; /* steps of up to this many rows (GPTOSS_CUDA_BI_DENSE_SPLIT, default 8,
                           0..8; 0 never) take the split dense GEMM (a warp per input slice) */
    int bi_dense_large; /* past bi_dense_max rows, bf16 weights: the large dense GEMM's tiles
                           (GPTOSS_CUDA_BI_DENSE_LARGE: off=0, auto=1 (default), 128=2, 64=3,
                           64x64=4; off leaves bi_dense_wide to choose) */
    int bi_moe_max;
    int bi_moe_pairs;
    bool bi_moe_wide;
    bool bi_moe_pair;
    bool bi_moe_mma;
    int bi_moe_pair_tokens;
    int bi_moe_tile; /* the sliced mma GEMM's tallest route tile (GPTOSS_CUDA_BI_MOE_TILE, default
                        64, 8..128; also capped by the mma GEMM's own limits) */
    bool profile;
    bool step_timing;
    int ablate;
    int device_profile; /* gptoss_cuda_profile, or -1: not given (the backend option decides) */
    bool host_weights;  /* weights in host memory, as gptoss_backend_options asks for it */
    /* an EAGLE3 head's matrices also held in e4m3 with row scales (GPTOSS_CUDA_DRAFT_FP8,
     * default 1), read by its products of up to GPTOSS_GEMV_MAX_ROWS rows (the decode
     * rounds): half the bytes; drafts only, verification stays exact */
    bool draft_fp8;
} gptoss_cuda_tuning;

/* The defaults of the table above. */
void gptoss_cuda_tuning_default(gptoss_cuda_tuning *t);

/* Applies "key=value,key=value" (spaces around items allowed; NULL or "" changes nothing). */
gptoss_status gptoss_cuda_tuning_parse(gptoss_cuda_tuning *t, const char *spec,
                                       gptoss_error *error);

/* Applies every GPTOSS_CUDA_* variable of the table that is set. */
gptoss_status gptoss_cuda_tuning_from_env(gptoss_cuda_tuning *t, gptoss_error *error);

/* Defaults, then spec (gptoss_backend_options.cuda_tuning), then the environment. */
gptoss_status gptoss_cuda_tuning_init(gptoss_cuda_tuning *t, const char *spec, gptoss_error *error);

#ifdef __cplusplus
}
#endif

#endif
