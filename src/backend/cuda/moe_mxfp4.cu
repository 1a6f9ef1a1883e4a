/*
 * moe_mxfp4.cu - the MXFP4 mixture-of-experts MLP on the GPU: routing (grouping token/slot
 * pairs by expert), a GEMV path for decode and a tiled tensor-core path for prefill.
 *
 * Weights stay MXFP4 in device memory in the checkpoint's layout (spec 3.4): each output row
 * is H/32 groups of 16 code bytes (low nibble = even lane) plus one E8M0 scale byte per group,
 * which is already what both paths want (a group is one aligned 16-byte load). Dequantized
 * values exist only in registers (GEMV) or shared memory (GEMM), never in global memory.
 *
 * Data flow for one layer (n_pairs = n_tokens * k_top):
 *
 *   topk_idx [T, k] --route--> expert_offsets, sorted rows (token, pair), 64-row tiles
 *   (steps of few pairs: the pair paths read topk_idx directly, no route, h by pair)
 *   t [T, H] bf16 --gate_up + bias + clamped SwiGLU--> h [n_pairs, I] bf16 (by sorted row)
 *   h --down + bias--> y [T*k, H] f32 (by pair = token*k + slot; weighting happens in the
 *                                      residual kernel, so no atomics are needed)
 *
 * Must not: allocate, synchronize, or read experts no token was routed to.
 */
#include "backend/cuda/cuda_kernels.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <mma.h>
#include <string.h>

using namespace nvcuda;

#define WG_BN 128 /* path 6's route tile height; a tile multiplies only its rows rounded up to 32 */

/*
 * Dequantizes the 8 E2M1 codes of one 32-bit word (code k in bits 4k..4k+3) without a table:
 * the code's sign goes to the fp32 sign bit and its 3 magnitude bits (e1 e0 m) to bits 24..22,
 * i.e. the two low exponent bits and the top mantissa bit. That float equals
 * fp4(code) * 2^-126 exactly (e = 0 lands on the subnormal 0.5 * 2^-126 = m * 2^-127), so one
 * multiply by 2^(s-127) * 2^126 = 2^(s-1) gives the value (no shared-memory lookups, which
 * otherwise limit the decode GEMV).
 */
static __device__ __forceinline__ void fp4x8_to_float(uint32_t word, float scale_x2_126, float out[8]) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        uint32_t q = word >> (4 * k);
        uint32_t bits = ((q & 8u) << 28) | ((q & 7u) << 22);
        out[k] = __uint_as_float(bits) * scale_x2_126;
    }
}

/* The E8M0 scale times the 2^126 that fp4x8_to_float leaves out, as a product hi * lo of two
 * finite floats: hi = 2^(min(s,128) - 1), lo = 2^(max(s,128) - 128) (lo is 1 for every scale
 * up to 2^1, i.e. in practice; it keeps scales up to 2^127 exact). */
static __device__ __forceinline__ void e8m0_split(uint8_t s, float *hi, float *lo) {
    int a = s < 128 ? s : 128;
    *hi = __uint_as_float((uint32_t)(a + 126) << 23);
    *lo = __uint_as_float((uint32_t)((s > 128 ? s : 128) - 1) << 23);
}

/* h as the fp16 paths store it: rounded to bf16 first, as every other path stores h (exact in
 * fp16 for the bounded SwiGLU outputs gptoss_cuda_moe_check_mma admits). */
static __device__ __forceinline__ __half h_as_half(float v) {
    return __float2half_rn(__bfloat162float(__float2bfloat16(v)));
}

static __device__ __forceinline__ float swiglu(float gate, float up, float limit, float alpha) {
    float a = fminf(gate, limit);
    float c = fminf(fmaxf(up, -limit), limit);
    return a / (1.0f + expf(-alpha * a)) * (c + 1.0f);
}

/* ---- routing -------------------------------------------------------------------------- */

int32_t gptoss_cuda_route_tiles(int32_t n_pairs, int32_t n_experts, int32_t tile_rows) {
    int32_t active = n_pairs < n_experts ? n_pairs : n_experts;
    return (n_pairs + tile_rows - 1) / tile_rows + active;
}

int32_t gptoss_cuda_route_max_tiles(int32_t n_pairs, int32_t n_experts) {
    return gptoss_cuda_route_tiles(n_pairs, n_experts, GPTOSS_MOE_MIN_TILE);
}

size_t gptoss_cuda_route_bytes(int32_t n_pairs, int32_t n_experts) {
    int32_t tiles = gptoss_cuda_route_max_tiles(n_pairs, n_experts);
    return sizeof(int32_t) * ((size_t)n_experts + 1 + 2 * (size_t)n_pairs + 2 * (size_t)tiles + n_experts);
}

void gptoss_cuda_route_bind(void *memory, int32_t n_pairs, int32_t n_experts,
                            gptoss_cuda_route *route) {
    int32_t tiles = gptoss_cuda_route_max_tiles(n_pairs, n_experts);
    int32_t *p = (int32_t *)memory;
    route->expert_offsets = p;
    p += n_experts + 1;
    route->sorted_token = p;
    p += n_pairs;
    route->sorted_pair = p;
    p += n_pairs;
    route->tile_expert = p;
    p += tiles;
    route->tile_row = p;
    p += tiles;
    route->active_experts = p;
    route->tile_rows = GPTOSS_MOE_TILE_M;
}

#define ROUTE_MAX_EXPERTS 1024

/* One block: count pairs per expert, prefix-sum, list tiles and active experts, scatter. */
static __global__ void route_kernel(const int32_t *topk_idx, int32_t n_pairs, int32_t k_top,
                                    int32_t n_experts, int32_t max_tiles, int32_t tile_rows,
                                    gptoss_cuda_route route) {
    __shared__ int32_t counts[ROUTE_MAX_EXPERTS];
    __shared__ int32_t cursor[ROUTE_MAX_EXPERTS];
    pdl_wait(); /* topk_idx comes from the router */
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
        counts[e] = 0;
        route.active_experts[e] = -1;
    }
    for (int i = threadIdx.x; i < max_tiles; i += blockDim.x) route.tile_expert[i] = -1;
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) atomicAdd(&counts[topk_idx[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t offset = 0, tile = 0, active = 0;
        for (int e = 0; e < n_experts; e++) {
            route.expert_offsets[e] = offset;
            cursor[e] = offset;
            if (counts[e] > 0) route.active_experts[active++] = e;
            for (int r = 0; r < counts[e]; r += tile_rows) {
                route.tile_expert[tile] = e;
                route.tile_row[tile] = offset + r;
                tile++;
            }
            offset += counts[e];
        }
        route.expert_offsets[n_experts] = offset;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        int32_t pos = atomicAdd(&cursor[topk_idx[i]], 1);
        route.sorted_token[pos] = i / k_top;
        route.sorted_pair[pos] = i;
    }
}

static int32_t mma_tile_rows(int32_t n_tokens, int32_t k_top, int32_t n_experts);

void gptoss_cuda_moe_route(const int32_t *topk_idx, int32_t n_tokens, int32_t k_top,
                           int32_t n_experts, int path, gptoss_cuda_route *route,
                           cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    route->tile_rows = path == 4   ? mma_tile_rows(n_tokens, k_top, n_experts)
                       : path == 6 ? WG_BN
                                   : GPTOSS_MOE_TILE_M;
    if (n_pairs <= 0) return;
    launch_pdl(route_kernel, dim3(1), dim3(1024), 0, stream, topk_idx, n_pairs, k_top, n_experts,
               gptoss_cuda_route_tiles(n_pairs, n_experts, route->tile_rows), route->tile_rows, *route);
}

/* ---- GEMV path (decode) ------------------------------------------------------------------ */

/*
 * Grid (row-pair groups, active-expert slot); 8 warps. The block stages the activations of
 * up to MAXT rows routed to its expert in shared memory; each warp then owns one pair of
 * weight rows (gate_up: rows 2u and 2u+1, i.e. the gate and up of unit u; down: rows 2u and
 * 2u+1 of the output). Lane l takes groups l, l+32, l+64, l+96 of both rows and issues all of
 * their 16-byte code loads and scale loads before any arithmetic, so up to 8 loads per lane
 * are in flight (the decode step is bound by how fast expert bytes stream in). The 32 values
 * of a group are dequantized in registers and multiplied into every staged token's
 * accumulator; a warp reduction finishes each row. Weights are read once per expert per pass
 * of MAXT tokens.
 */
#define GEMV_WARPS 8
#define GEMV_MAX_TOKENS 8
#define GEMV_MAX_GROUPS_PER_LANE 4 /* k_in <= 4096 */

template <bool GATE_UP, int MAXT>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
moe_gemv_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const bf16 *act,
                const int32_t *act_rows_sorted_token, int32_t k_in, int32_t n_out_rows,
                gptoss_cuda_route route, float limit, float alpha, bf16 *h_out, float *y_out) {
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    bf16 *xs = (bf16 *)gemv_smem; /* [MAXT][k_in] */
    int e = route.active_experts[blockIdx.y];
    if (e < 0) return;
    int row_begin = route.expert_offsets[e], row_end = route.expert_offsets[e + 1];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n_groups = k_in / 32;
    size_t row_bytes = (size_t)n_groups * 16;
    int unit = blockIdx.x * GEMV_WARPS + warp;
    bool active = 2 * unit < n_out_rows;
    int row0 = 2 * unit;
    const uint8_t *eb = blocks + ((size_t)e * n_out_rows + row0) * row_bytes;
    const uint8_t *es = scales + ((size_t)e * n_out_rows + row0) * n_groups;
    const float *ebias = bias + (size_t)e * n_out_rows;

    /* all loads of this warp's two rows first */
    uint4 codes[2][GEMV_MAX_GROUPS_PER_LANE];
    uint8_t scl[2][GEMV_MAX_GROUPS_PER_LANE];
#pragma unroll
    for (int gi = 0; gi < GEMV_MAX_GROUPS_PER_LANE; gi++) {
        int g = lane + 32 * gi;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (active && g < n_groups) {
                codes[r][gi] = __ldg((const uint4 *)(eb + r * row_bytes + (size_t)g * 16));
                scl[r][gi] = __ldg(es + (size_t)r * n_groups + g);
            } else {
                codes[r][gi] = make_uint4(0, 0, 0, 0);
                scl[r][gi] = 127;
            }
        }
    }

    for (int r0 = row_begin; r0 < row_end; r0 += MAXT) {
        int cnt = min(MAXT, row_end - r0);
        __syncthreads();
        for (int c = 0; c < cnt; c++) {
            /* gate_up reads the token's normalized input; down reads the sorted h row */
            const bf16 *src = GATE_UP ? act + (size_t)act_rows_sorted_token[r0 + c] * k_in
                                      : act + (size_t)(r0 + c) * k_in;
            /* 16-byte chunk q of group g lands at chunk q ^ ((g >> 1) & 3): lanes reading the
             * same chunk of consecutive groups then hit 8 different bank quads */
            for (int ci = threadIdx.x; ci < k_in / 8; ci += blockDim.x) {
                int g = ci >> 2, q = ci & 3;
                *(uint4 *)(xs + (size_t)c * k_in + g * 32 + ((q ^ ((g >> 1) & 3)) * 8)) = *(const uint4 *)(src + ci * 8);
            }
        }
        __syncthreads();
        if (!active) continue;
        float acc[2][MAXT];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int c = 0; c < MAXT; c++) acc[r][c] = 0.0f;
#pragma unroll
        for (int gi = 0; gi < GEMV_MAX_GROUPS_PER_LANE; gi++) {
            int g = lane + 32 * gi;
            if (g >= n_groups) break;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                /* dequantize 8 codes at a time and use them at once for every token, so only
                 * 8 weights are live (keeps the kernel out of local memory) */
                float hi, lo;
                e8m0_split(scl[r][gi], &hi, &lo);
                const uint4 cg = codes[r][gi];
                float part[MAXT];
#pragma unroll
                for (int c = 0; c < MAXT; c++) part[c] = 0.0f;
#pragma unroll 1
                for (int q = 0; q < 4; q++) { /* not unrolled: bounds the live registers */
                    float w8[8];
                    uint32_t word = q == 0 ? cg.x : q == 1 ? cg.y : q == 2 ? cg.z : cg.w;
                    fp4x8_to_float(word, hi, w8);
#pragma unroll
                    for (int c = 0; c < MAXT; c++) {
                        if (c >= cnt) break;
                        /* 128-bit shared load of the 8 matching inputs (swizzled, see staging) */
                        uint4 xq = ((const uint4 *)(xs + (size_t)c * k_in + g * 32))[q ^ ((g >> 1) & 3)];
                        const uint32_t xw[4] = {xq.x, xq.y, xq.z, xq.w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            float x0 = __uint_as_float(xw[j] << 16), x1 = __uint_as_float(xw[j] & 0xffff0000u);
                            part[c] += w8[2 * j] * x0 + w8[2 * j + 1] * x1;
                        }
                    }
                }
#pragma unroll
                for (int c = 0; c < MAXT; c++) acc[r][c] += part[c] * lo;
            }
        }
#pragma unroll
        for (int c = 0; c < MAXT; c++) {
            if (c >= cnt) break;
            float v0 = acc[0][c], v1 = acc[1][c];
            for (int o = 16; o > 0; o >>= 1) {
                v0 += __shfl_xor_sync(0xffffffffu, v0, o);
                v1 += __shfl_xor_sync(0xffffffffu, v1, o);
            }
            if (lane == 0) {
                if (GATE_UP) {
                    float gate = v0 + ebias[row0], up = v1 + ebias[row0 + 1];
                    h_out[(size_t)(r0 + c) * (n_out_rows / 2) + unit] = __float2bfloat16(swiglu(gate, up, limit, alpha));
                } else {
                    float *yr = y_out + (size_t)route.sorted_pair[r0 + c] * n_out_rows;
                    yr[row0] = v0 + ebias[row0];
                    yr[row0 + 1] = v1 + ebias[row0 + 1];
                }
            }
        }
    }
}

template <int MAXT>
static void launch_gemv(const gptoss_cuda_moe_weights *w, const bf16 *t, const gptoss_cuda_route *route,
                        int32_t slots, bf16 *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    size_t smem_gu = (size_t)MAXT * H * sizeof(bf16);
    size_t smem_dn = (size_t)MAXT * I * sizeof(bf16);
    dim3 g1((I + GEMV_WARPS - 1) / GEMV_WARPS, slots); /* one unit (2 rows) per warp */
    moe_gemv_kernel<true, MAXT><<<g1, GEMV_WARPS * 32, smem_gu, stream>>>(
        w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias, t, route->sorted_token, H, 2 * I, *route,
        w->swiglu_limit, w->swiglu_alpha, h, nullptr);
    dim3 g2((H / 2 + GEMV_WARPS - 1) / GEMV_WARPS, slots);
    moe_gemv_kernel<false, MAXT><<<g2, GEMV_WARPS * 32, smem_dn, stream>>>(
        w->down_blocks, w->down_scales, w->down_bias, h, nullptr, I, H, *route, w->swiglu_limit,
        w->swiglu_alpha, nullptr, y);
}

/* ---- pair GEMV path (one or two decode tokens) -------------------------------------------- */

/*
 * For a handful of (token, expert) pairs no grouping pays off: every pair reads its expert's
 * weights once anyway, so the pair path skips the route kernel and reads topk_idx directly.
 * Grid (blocks per pair, pair); 8 warps; each warp walks units (two weight rows: gate and up
 * of one intermediate unit, or two output rows of down) grid-stride within its pair, with
 * the next unit's code and scale loads issued before the current unit's arithmetic (two
 * units in registers, so the memory pipe never idles while a warp computes).
 *
 * Cost per weight is what limits this kernel once the loads overlap, so the arithmetic is
 * trimmed:
 *   - the input vector is staged once per block in shared memory as fp32 multiplied by
 *     2^100 (exact), swizzled so that lanes reading the same 16-byte chunk of consecutive
 *     groups hit different banks; one 128-bit shared load feeds 4 weights of both rows;
 *   - a code becomes the float fp4 * 2^-126 by two shifts and masks (sign to bit 31,
 *     e1 e0 m to bits 24..22; e = 0 lands on the subnormal 0.5 * 2^-126 exactly);
 *   - products fp4 * 2^-126 * x * 2^100 = fp4 * x * 2^-26 stay normal for |fp4 x| >= 2^-100,
 *     and the E8M0 scale multiplies each group's sum once: value = sum * 2^(s - 101).
 */
#define PG_WARPS 8
#define PG_GPL 4 /* groups per lane: k_in <= 32 * 32 * 4 = 4096 */

/* 2^(s - 101) as hi * lo (both finite for every byte; lo = 1 up to s = 228). */
static __device__ __forceinline__ void pair_scale(uint32_t s, float *hi, float *lo) {
    uint32_t a = s < 228u ? s : 228u;
    *hi = __uint_as_float((a + 26u) << 23);
    *lo = __uint_as_float(((s > 228u ? s : 228u) - 101u) << 23);
}

/* Code k (bits 4k..4k+3 of w) as fp4 * 2^-126. k is a compile-time constant after unrolling. */
static __device__ __forceinline__ float fp4_code_f(uint32_t w, int k) {
    uint32_t sgn = (w << (28 - 4 * k)) & 0x80000000u;
    uint32_t mag = k <= 5 ? (w << (22 - 4 * k)) & 0x01C00000u : (w >> (4 * k - 22)) & 0x01C00000u;
    return __uint_as_float(sgn | mag);
}

template <bool GATE_UP>
static __global__ void __launch_bounds__(PG_WARPS * 32, 2)
moe_pair_gemv_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const bf16 *act,
                     const int32_t *topk_idx, int32_t k_top, int32_t k_in, int32_t n_out_rows, float limit,
                     float alpha, bf16 *h_out, float *y_out) {
    extern __shared__ __align__(16) float4 pg_xs[]; /* [k_in / 4], swizzled per group */
    const int pair = blockIdx.y;
    pdl_wait(); /* topk_idx comes from the router, the input from the norm or gate_up */
    const int e = topk_idx[pair];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_groups = k_in >> 5, n_units = n_out_rows >> 1;
    const size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;
    const int stride = gridDim.x * PG_WARPS;
    int u = blockIdx.x * PG_WARPS + warp;

    uint4 cur[2][PG_GPL];
    uint32_t cs[2][PG_GPL];
    auto load_unit = [&](int unit, uint4 (&c)[2][PG_GPL], uint32_t (&sc)[2][PG_GPL]) {
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int gi = 0; gi < PG_GPL; gi++) {
                int g = lane + 32 * gi;
                if (unit < n_units && g < n_groups) {
                    size_t row = 2 * (size_t)unit + r;
                    c[r][gi] = __ldg((const uint4 *)(eb + row * row_bytes + (size_t)g * 16));
                    sc[r][gi] = __ldg(es + row * n_groups + g);
                } else {
                    c[r][gi] = make_uint4(0, 0, 0, 0);
                    sc[r][gi] = 127;
                }
            }
    };
    load_unit(u, cur, cs); /* in flight while the input is staged */

    const bf16 *src = GATE_UP ? act + (size_t)(pair / k_top) * k_in : act + (size_t)pair * k_in;
    for (int ci = threadIdx.x; ci < (k_in >> 3); ci += blockDim.x) {
        uint4 v = *(const uint4 *)(src + (size_t)ci * 8);
        int g = ci >> 2, q = ci & 3, sw = g & 7;
        const uint32_t vw[4] = {v.x, v.y, v.z, v.w};
        float f[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            f[2 * j] = __uint_as_float(vw[j] << 16) * 0x1p100f;
            f[2 * j + 1] = __uint_as_float(vw[j] & 0xffff0000u) * 0x1p100f;
        }
        pg_xs[g * 8 + ((2 * q) ^ sw)] = make_float4(f[0], f[1], f[2], f[3]);
        pg_xs[g * 8 + ((2 * q + 1) ^ sw)] = make_float4(f[4], f[5], f[6], f[7]);
    }
    __syncthreads();

    const float *ebias = bias + (size_t)e * n_out_rows;
    for (; u < n_units; u += stride) {
        uint4 nxt[2][PG_GPL];
        uint32_t ns[2][PG_GPL];
        load_unit(u + stride, nxt, ns);
        float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
        for (int gi = 0; gi < PG_GPL; gi++) {
            int g = lane + 32 * gi;
            if (g < n_groups) {
                const float4 *xg = pg_xs + g * 8;
                int sw = g & 7;
                const uint32_t w0[4] = {cur[0][gi].x, cur[0][gi].y, cur[0][gi].z, cur[0][gi].w};
                const uint32_t w1[4] = {cur[1][gi].x, cur[1][gi].y, cur[1][gi].z, cur[1][gi].w};
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float4 xa = xg[(2 * q) ^ sw], xb = xg[(2 * q + 1) ^ sw];
                    const float x8[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        s0 = fmaf(fp4_code_f(w0[q], k), x8[k], s0);
                        s1 = fmaf(fp4_code_f(w1[q], k), x8[k], s1);
                    }
                }
                float hi, lo;
                pair_scale(cs[0][gi], &hi, &lo);
                acc0 = fmaf(s0 * hi, lo, acc0);
                pair_scale(cs[1][gi], &hi, &lo);
                acc1 = fmaf(s1 * hi, lo, acc1);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            acc0 += __shfl_xor_sync(0xffffffffu, acc0, o);
            acc1 += __shfl_xor_sync(0xffffffffu, acc1, o);
        }
        if (lane == 0) {
            if (GATE_UP) {
                float gate = acc0 + ebias[2 * u], up = acc1 + ebias[2 * u + 1];
                h_out[(size_t)pair * n_units + u] = __float2bfloat16(swiglu(gate, up, limit, alpha));
            } else {
                float *yr = y_out + (size_t)pair * n_out_rows;
                yr[2 * u] = acc0 + ebias[2 * u];
                yr[2 * u + 1] = acc1 + ebias[2 * u + 1];
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int gi = 0; gi < PG_GPL; gi++) {
                cur[r][gi] = nxt[r][gi];
                cs[r][gi] = ns[r][gi];
            }
    }
}

/* Blocks per pair: enough resident warps to cover every SM twice, spread over the pairs. */
static int pair_blocks(int32_t n_pairs, int32_t n_units) {
    static int n_sms = 0;
    if (n_sms == 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n_sms <= 0)
            n_sms = 132;
    }
    int b = (2 * n_sms + n_pairs - 1) / n_pairs;
    int most = (n_units + PG_WARPS - 1) / PG_WARPS;
    return b < most ? b : most;
}

static void launch_pair_gemv(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                             int32_t n_pairs, int32_t k_top, bf16 *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    dim3 g1(pair_blocks(n_pairs, I), n_pairs);
    launch_pdl(moe_pair_gemv_kernel<true>, g1, dim3(PG_WARPS * 32), (size_t)H * sizeof(float), stream,
               w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias, t, topk_idx, k_top, H, 2 * I,
               w->swiglu_limit, w->swiglu_alpha, h, (float *)nullptr);
    dim3 g2(pair_blocks(n_pairs, H / 2), n_pairs);
    launch_pdl(moe_pair_gemv_kernel<false>, g2, dim3(PG_WARPS * 32), (size_t)I * sizeof(float), stream,
               w->down_blocks, w->down_scales, w->down_bias, (const bf16 *)h, topk_idx, k_top, I, H,
               w->swiglu_limit, w->swiglu_alpha, (bf16 *)nullptr, y);
}

/* ---- tiled tensor-core path (prefill) --------------------------------------------------- */

/*
 * Grid (output-row tiles of 64, expert tiles of 64 sorted rows); 4 warps, each owning a
 * 32x32 quarter of the 64x64 output tile as 2x2 WMMA 16x16x16 bf16 fragments (fp32 acc).
 * The reduction walks one MXFP4 group (32 inputs) at a time:
 *
 *        A tile: 64 sorted rows x 32 inputs (bf16, gathered by token)   -> As
 *        B tile: 64 weight rows x 32 inputs (dequantized from 16 B + scale) -> Bs
 *        C += As * Bs^T
 *
 * Rows past the expert's end and weight rows past the matrix load as zero and are not
 * stored. Epilogue through shared memory: gate_up applies bias and the clamped SwiGLU to
 * (even, odd) column pairs, down adds the bias and scatters rows to their pair index.
 */
#define GEMM_BN 64
#define GEMM_BK 32
#define GEMM_LDS (GEMM_BK + 8)
#define GEMM_LDC (GEMM_BN + 4)

template <bool GATE_UP>
static __global__ void __launch_bounds__(128)
moe_gemm_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const bf16 *act,
                int32_t k_in, int32_t n_out_rows, gptoss_cuda_route route, float limit,
                float alpha, bf16 *h_out, float *y_out) {
    constexpr int BM = GPTOSS_MOE_TILE_M;
    __shared__ __align__(128) bf16 As[BM * GEMM_LDS];
    __shared__ __align__(128) bf16 Bs[GEMM_BN * GEMM_LDS];
    __shared__ __align__(128) float Cs[BM * GEMM_LDC];
    int tile = blockIdx.y;
    int e = route.tile_expert[tile];
    if (e < 0) return;
    int r0 = route.tile_row[tile];
    int r_end = route.expert_offsets[e + 1];
    int n0 = blockIdx.x * GEMM_BN;
    int tid = threadIdx.x, warp = tid >> 5;
    int n_groups = k_in / 32;
    size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;

    /* each thread loads half a row (16 values) of A and of B per step */
    int lrow = tid >> 1, lhalf = tid & 1;
    bool a_valid = r0 + lrow < r_end;
    const bf16 *a_src = nullptr;
    if (a_valid) {
        size_t src_row = GATE_UP ? (size_t)route.sorted_token[r0 + lrow] : (size_t)(r0 + lrow);
        a_src = act + src_row * k_in + lhalf * 16;
    }
    bool b_valid = n0 + lrow < n_out_rows;
    const uint8_t *b_src = eb + (size_t)(n0 + lrow) * row_bytes + lhalf * 8;
    const uint8_t *s_src = es + (size_t)(n0 + lrow) * n_groups;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

    /* software pipeline: the global loads of group g+1 are in flight while group g is
     * multiplied (registers hold the next stage; shared memory the current one) */
    uint4 a0 = make_uint4(0, 0, 0, 0), a1 = a0;
    uint2 codes = make_uint2(0, 0);
    uint8_t sbyte = 127;
    if (a_valid) {
        a0 = *(const uint4 *)(a_src);
        a1 = *(const uint4 *)(a_src + 8);
    }
    if (b_valid) {
        codes = __ldg((const uint2 *)(b_src));
        sbyte = __ldg(s_src);
    }
    for (int g = 0; g < n_groups; g++) {
        *(uint4 *)(As + lrow * GEMM_LDS + lhalf * 16) = a0;
        *(uint4 *)(As + lrow * GEMM_LDS + lhalf * 16 + 8) = a1;
        __nv_bfloat162 wv[8];
        {
            float wf[16], hi, lo;
            e8m0_split(sbyte, &hi, &lo);
            fp4x8_to_float(codes.x, hi, wf);
            fp4x8_to_float(codes.y, hi, wf + 8);
#pragma unroll
            for (int b = 0; b < 8; b++) wv[b] = __floats2bfloat162_rn(wf[2 * b] * lo, wf[2 * b + 1] * lo);
        }
        *(uint4 *)(Bs + lrow * GEMM_LDS + lhalf * 16) = *(uint4 *)&wv[0];
        *(uint4 *)(Bs + lrow * GEMM_LDS + lhalf * 16 + 8) = *(uint4 *)&wv[4];
        __syncthreads();
        if (g + 1 < n_groups) {
            if (a_valid) {
                a0 = *(const uint4 *)(a_src + (g + 1) * 32);
                a1 = *(const uint4 *)(a_src + (g + 1) * 32 + 8);
            }
            if (b_valid) {
                codes = __ldg((const uint2 *)(b_src + (size_t)(g + 1) * 16));
                sbyte = __ldg(s_src + g + 1);
            }
        }
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], As + (wm + 16 * i) * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], Bs + (wn + 16 * j) * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * GEMM_LDC + wn + 16 * j, acc[i][j], GEMM_LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    const float *ebias = bias + (size_t)e * n_out_rows;
    if (GATE_UP) {
        int n_units = n_out_rows / 2;
        for (int idx = tid; idx < BM * (GEMM_BN / 2); idx += blockDim.x) {
            int m = idx / (GEMM_BN / 2), u = idx % (GEMM_BN / 2);
            int n = n0 + 2 * u;
            if (r0 + m >= r_end || n >= n_out_rows) continue;
            float gate = Cs[m * GEMM_LDC + 2 * u] + ebias[n];
            float up = Cs[m * GEMM_LDC + 2 * u + 1] + ebias[n + 1];
            h_out[(size_t)(r0 + m) * n_units + n / 2] = __float2bfloat16(swiglu(gate, up, limit, alpha));
        }
    } else {
        for (int idx = tid; idx < BM * GEMM_BN; idx += blockDim.x) {
            int m = idx / GEMM_BN, n = idx % GEMM_BN;
            if (r0 + m >= r_end || n0 + n >= n_out_rows) continue;
            y_out[(size_t)route.sorted_pair[r0 + m] * n_out_rows + n0 + n] = Cs[m * GEMM_LDC + n] + ebias[n0 + n];
        }
    }
}

/* ---- mma path: grouped tensor-core GEMM with fp16 operands (path 4) -------------------------- */

/*
 * One launch per projection; grid (weight-row tiles of 192 rows, route tiles of BN sorted rows).
 * The weight matrix is the M side of mma.sync.m16n8k16 (row-major A, K-major like the
 * checkpoint) and the routed tokens are the N side, so an expert with only a few tokens wastes
 * at most BN - rows columns, not a 64-row tile. 6 warps, each owning 32 weight rows (two
 * m16 fragments) and all BN tokens; fp32 accumulators.
 *
 * K runs in blocks of 128 (4 MXFP4 groups). Thread (g = lane / 4, q = lane % 4) takes group q
 * of each block for its rows g and g + 8 of both fragments: one 16-byte code chunk per row,
 * read from shared memory. The k order inside an mma is permuted (the sum does not care) so
 * that a 32-bit word of codes (8 values, nibble i = value i) dequantizes straight into
 * fragment registers: register i of the word holds the fp16 pair (value i, value i + 4), where
 * both halves need the same shifts:
 *
 *     mag  = (word << (9 - 4i)) & 0x0E000E00    e1 e0 m -> fp16 exponent bits 1..0, mantissa 9
 *     sign = (word << (12 - 4i)) & 0x80008000
 *
 * which is code * 2^-14 exactly (code 1 is the fp16 subnormal 2^-15), and one mul.f16x2 by
 * 2^(s - 113) makes it code * 2^(s - 127), exact for s in [104, 128] (gptoss_cuda_moe_check_mma).
 * Word w of the group feeds two k16 steps: registers 0 and 1 (step 0, k low / k high), 2 and 3
 * (step 1). The activations are stored to match ("mma layout"): inside every 8-value chunk the
 * order is x0 x4 x1 x5 x2 x6 x3 x7, so one 16-byte shared load gives the B registers of both
 * steps. The input t is converted to fp16 in that layout by mma_convert_kernel; gate_up
 * writes h in it directly (rounded to bf16 first, as every other path stores h).
 *
 * Shared memory per stage: A 192 rows x 64 bytes (codes, rows in fragment order), B BN rows x
 * 256 bytes (chunk (word w, group j) of token row r at chunk (4w + j) ^ (r & 1) * 4, so the
 * eight lanes of a 16-byte load phase cover all 32 banks). cp.async fills STAGES - 1 blocks
 * ahead; the scale bytes of the block's rows for the whole K range are loaded once up front.
 *
 * gate_up: fragment row g of m-frag f is the gate row of unit u = 96 * bx + 16 * warp + 8 * f + g
 * and row g + 8 its up row, so each thread ends with gate and up of the same (unit, token) and
 * applies bias + clamped SwiGLU in registers. down: 192 consecutive output rows per block.
 *
 * Measured (H100, 20b shapes, 512-token prefill, ncu): with 128-row blocks the kernel was bound
 * by L2 -> SM traffic (75% of L2 throughput, DRAM 20%): every row block re-reads the token
 * tile and every token tile re-reads the weights. 192-row blocks cut the token re-reads by a
 * third, and B is copied through L1 (cp.async.ca) for the co-resident block on the same tokens.
 */
#define MMA_WARPS 6
#define MMA_BM (32 * MMA_WARPS) /* 192 rows: 2880 and 5760 are multiples */
#define MMA_THREADS (32 * MMA_WARPS)

/*
 * The four fp16 pairs of a word at once (p[i] = register i above: values i and i + 4, each
 * code * 2^-14). An fp16 value code * 2^-14 has a zero low byte, and its high byte is the code
 * with the magnitude moved up one bit and the sign to bit 7. Both are built for four codes at
 * a time (the even codes 0 2 4 6 and the odd codes 1 3 5 7, one per byte), and each pair then
 * takes two bytes of one of them with a byte permute: 11 operations per word, where building
 * each pair with its own shifts and masks (the mag / sign form above) takes 16.
 * Values i and i + 4 are bytes i / 2 and i / 2 + 2 of the even (i even) or odd (i odd) set.
 */
static __device__ __forceinline__ void mma_fp4_pairs(uint32_t w, uint32_t p[4]) {
    const uint32_t ev = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
    const uint32_t od = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
    p[0] = __byte_perm(ev, 0u, 0x2404); /* bytes: 0, ev.0, 0, ev.2 */
    p[1] = __byte_perm(od, 0u, 0x2404);
    p[2] = __byte_perm(ev, 0u, 0x3414); /* bytes: 0, ev.1, 0, ev.3 */
    p[3] = __byte_perm(od, 0u, 0x3414);
}

static __device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

static __device__ __forceinline__ void mma_f16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async16_ca(void *smem, const void *gmem, bool valid) {
    uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;"); }
template <int N>
static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* Position of value j (0..7) of a chunk in the mma layout. */
static __device__ __forceinline__ int mma_pos(int j) { return ((j & 3) << 1) | (j >> 2); }

/* t [n_rows, k] bf16 -> out [n_rows, k] fp16 in the mma layout; one 8-value chunk per thread. */
static __global__ void mma_convert_kernel(const bf16 *t, int64_t n_chunks, __half *out) {
    pdl_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_chunks) return;
    uint4 v = *(const uint4 *)(t + i * 8);
    const bf16 *x = (const bf16 *)&v;
    __align__(16) __half o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) o[mma_pos(j)] = __float2half_rn(__bfloat162float(x[j]));
    *(uint4 *)(out + i * 8) = *(const uint4 *)o;
}

template <int BN>
struct mma_cfg {
    static constexpr int STAGES = BN >= 64 ? 3 : 4;
    static constexpr int MIN_BLOCKS = BN >= 128 ? 1 : 2; /* per SM: caps registers at 168 */
    static constexpr int A_BYTES = MMA_BM * 64;
    static constexpr int B_BYTES = BN * 256;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static size_t smem(int n_groups) {
        return (size_t)STAGES * STAGE_BYTES + (((size_t)MMA_BM * n_groups + 15) & ~(size_t)15) + 2 * BN * sizeof(int32_t);
    }
};

template <bool GATE_UP, int BN>
static __global__ void __launch_bounds__(MMA_THREADS, mma_cfg<BN>::MIN_BLOCKS)
moe_mma_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const __half *act, int32_t k_in,
               int32_t n_out_rows, gptoss_cuda_route route, float limit, float alpha, __half *h_out, float *y_out) {
    typedef mma_cfg<BN> C;
    constexpr int NF = BN / 8;
    extern __shared__ __align__(16) uint8_t mma_smem[];
    uint8_t *s_scale = mma_smem + C::STAGES * C::STAGE_BYTES;
    const int n_groups = k_in >> 5;
    int32_t *s_src = (int32_t *)(s_scale + (((size_t)MMA_BM * n_groups + 15) & ~(size_t)15)); /* [BN] act row */
    int32_t *s_dst = s_src + BN;                                                              /* [BN] out row */

    pdl_wait(); /* the route, the input and h come from earlier kernels */
    const int tile = blockIdx.y;
    const int e = route.tile_expert[tile];
    if (e < 0) return;
    const int r0 = route.tile_row[tile];
    const int n_rows = min(BN, route.expert_offsets[e + 1] - r0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;
    const int n_units = n_out_rows >> 1;

    /* weight row (relative to the block's first, MMA_BM * bx) of fragment row f (0..MMA_BM-1) */
    auto local_row = [&](int f) -> int {
        if (GATE_UP) return 2 * ((f >> 5) * 16 + ((f >> 4) & 1) * 8 + (f & 7)) + ((f >> 3) & 1);
        return f;
    };
    const int row0 = blockIdx.x * MMA_BM, n_valid_rows = min(MMA_BM, n_out_rows - row0);

    for (int i = tid; i < BN; i += MMA_THREADS) {
        int r = r0 + min(i, n_rows - 1);
        s_src[i] = GATE_UP ? route.sorted_token[r] : r;
        s_dst[i] = GATE_UP ? r : route.sorted_pair[r];
    }
    /* the scales of the block's rows, one contiguous range (n_out_rows % 32 == 0 keeps it
     * 16-byte aligned and a multiple of 16 long); rows past the matrix stay unset and only
     * feed outputs that are never stored */
    {
        const uint8_t *src = es + (size_t)row0 * n_groups;
        int chunks = n_valid_rows * n_groups / 16;
        for (int i = tid; i < chunks; i += MMA_THREADS) cp_async16(s_scale + i * 16, src + (size_t)i * 16, true);
    }
    /* this thread's cp.async work per stage: 4 A chunks (rows a_f + BM/4 i, group a_j) and the
     * B chunks tid, tid + THREADS, ... of BN rows x 16 chunks */
    const int a_j = tid & 3, a_f = tid >> 2;
    const uint8_t *a_src[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        a_src[i] = eb + (size_t)(row0 + min(local_row(a_f + (MMA_BM / 4) * i), n_valid_rows - 1)) * row_bytes + a_j * 16;
    const int n_kb = (n_groups + 3) >> 2;
    __syncthreads(); /* s_src before the first B copies */

    auto issue = [&](int kb) {
        uint8_t *sa = mma_smem + (kb % C::STAGES) * C::STAGE_BYTES;
        uint8_t *sb = sa + C::A_BYTES;
        int grp_a = kb * 4 + a_j;
#pragma unroll
        for (int i = 0; i < 4; i++)
            cp_async16(sa + (a_f + (MMA_BM / 4) * i) * 64 + a_j * 16,
                       grp_a < n_groups ? a_src[i] + (size_t)kb * 64 : eb, grp_a < n_groups);
#pragma unroll
        for (int c = tid; c < BN * 16; c += MMA_THREADS) {
            int r = c >> 4, b_j = (c >> 2) & 3, b_w = c & 3, grp_b = kb * 4 + b_j;
            bool ok = grp_b < n_groups && r < n_rows;
            const __half *src = ok ? act + (size_t)s_src[r] * k_in + grp_b * 32 + b_w * 8 : act;
            /* cached in L1: the blocks beside this one on the SM work on the same tokens */
            cp_async16_ca(sb + r * 256 + (((b_w * 4 + b_j) ^ ((r & 1) * 4)) * 16), src, ok);
        }
    };

    float acc[2][NF][4];
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int n = 0; n < NF; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[f][n][c] = 0.0f;

#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < n_kb) issue(s);
        cp_async_commit();
    }
    /* this thread's fragment rows: r = 2 * mfrag + half, row g (half 0) or g + 8 (half 1) */
    int frow[4], srow[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        frow[r] = warp * 32 + (r >> 1) * 16 + (r & 1) * 8 + g;
        srow[r] = local_row(frow[r]) * n_groups;
    }

    for (int kb = 0; kb < n_kb; kb++) {
        if (kb + C::STAGES - 1 < n_kb) issue(kb + C::STAGES - 1);
        cp_async_commit();
        cp_async_wait<C::STAGES - 1>();
        __syncthreads();
        const uint8_t *sa = mma_smem + (kb % C::STAGES) * C::STAGE_BYTES;
        const uint8_t *sb = sa + C::A_BYTES;
        const int grp = kb * 4 + q;
        uint4 araw[4];
        uint32_t mult[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            araw[r] = *(const uint4 *)(sa + frow[r] * 64 + q * 16);
            uint32_t sc = grp < n_groups ? s_scale[srow[r] + grp] : 127u;
            mult[r] = ((sc - 98u) << 10) * 0x00010001u; /* fp16x2 2^(s - 113) */
        }
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint32_t R[4][4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                uint32_t word = w == 0 ? araw[r].x : w == 1 ? araw[r].y : w == 2 ? araw[r].z : araw[r].w;
                mma_fp4_pairs(word, R[r]);
#pragma unroll
                for (int i = 0; i < 4; i++) R[r][i] = hmul2_u32(R[r][i], mult[r]);
            }
#pragma unroll
            for (int n = 0; n < NF; n++) {
                const int row = n * 8 + g;
                uint4 b = *(const uint4 *)(sb + row * 256 + (((w * 4 + q) ^ ((g & 1) * 4)) * 16));
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    mma_f16(acc[f][n], R[2 * f][0], R[2 * f + 1][0], R[2 * f][1], R[2 * f + 1][1], b.x, b.y);
                    mma_f16(acc[f][n], R[2 * f][2], R[2 * f + 1][2], R[2 * f][3], R[2 * f + 1][3], b.z, b.w);
                }
            }
        }
        __syncthreads();
    }

    /* epilogue: acc[f][n] = rows (g, g + 8) of m-frag f x tokens (2q, 2q + 1) of n-frag n */
    const float *ebias = bias + (size_t)e * n_out_rows;
#pragma unroll
    for (int f = 0; f < 2; f++) {
        if (GATE_UP) {
            int u = blockIdx.x * (MMA_BM / 2) + warp * 16 + f * 8 + g;
            if (u >= n_units) continue;
            float bg = ebias[2 * u], bu = ebias[2 * u + 1];
            int col = (u & ~7) | mma_pos(u & 7);
#pragma unroll
            for (int n = 0; n < NF; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int tok = n * 8 + 2 * q + c;
                    if (tok >= n_rows) continue;
                    float v = swiglu(acc[f][n][c] + bg, acc[f][n][2 + c] + bu, limit, alpha);
                    h_out[(size_t)s_dst[tok] * n_units + col] = h_as_half(v);
                }
        } else {
            int row = blockIdx.x * MMA_BM + warp * 32 + f * 16 + g;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int rr = row + 8 * hh;
                if (rr >= n_out_rows) continue;
                float b = ebias[rr];
#pragma unroll
                for (int n = 0; n < NF; n++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        int tok = n * 8 + 2 * q + c;
                        if (tok >= n_rows) continue;
                        y_out[(size_t)s_dst[tok] * n_out_rows + rr] = acc[f][n][2 * hh + c] + b;
                    }
            }
        }
    }
}

/* gptoss_cuda_moe_prepare raised the mma kernels' shared-memory limits (widths up to 4096) */
static int32_t mma_prepared_width = 0;

/* Route tile height for the mma path: a power of two in [8, 128] chosen from the expected
 * rows per active expert (below). */
static int32_t mma_tile_rows(int32_t n_tokens, int32_t k_top, int32_t n_experts) {
    int32_t pairs = n_tokens * k_top;
    int32_t active = pairs < n_experts ? pairs : n_experts;
    int32_t avg = active > 0 ? (pairs + active - 1) / active : 1;
    static int32_t cap = 0; /* GPTOSS_CUDA_MOE_MAX_TILE caps the height (A/B measurements) */
    if (cap == 0) {
        const char *v = getenv("GPTOSS_CUDA_MOE_MAX_TILE");
        /* 64 by default: measured on an H100 (20b, 2048-token prefill, 256 rows per expert),
         * 128-row tiles took 54 ms of MoE against 41 ms for 64 (255 registers, one block per SM) */
        cap = v && atoi(v) >= 8 && atoi(v) <= 128 ? atoi(v) : 64;
    }
    /* The height grows while it is under 1.25 times the average (GPTOSS_CUDA_MOE_TILE_PCT,
     * default 125): an expert with more rows than the tile takes a second tile, which
     * dequantizes its weights again. Measured on an H100 (120b, bench -b, depth 512, rows
     * per expert uniform with mean A): A = 8, 16-row tiles instead of 8: +5.3% tok/s (x256);
     * A = 12, 32 instead of 16: -5% (x384; 10% of the experts take a second 16-row tile, and
     * 32-row tiles double the MMAs and shared loads per weight);
     * A = 16, 32 instead of 16: +6.7% (x512). */
    static int32_t pct = 0;
    if (pct == 0) {
        const char *v = getenv("GPTOSS_CUDA_MOE_TILE_PCT");
        pct = v && atoi(v) >= 50 && atoi(v) <= 800 ? atoi(v) : 125;
    }
    int32_t bn = GPTOSS_MOE_MIN_TILE;
    while (bn * 100 < avg * pct && bn < cap) bn *= 2;
    return bn;
}

template <int BN>
static void launch_mma(const gptoss_cuda_moe_weights *w, const __half *t16, int32_t n_pairs,
                       const gptoss_cuda_route *route, __half *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, BN);
    launch_pdl(moe_mma_kernel<true, BN>, dim3((2 * I + MMA_BM - 1) / MMA_BM, tiles), dim3(MMA_THREADS), mma_cfg<BN>::smem(H / 32),
               stream, w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias, t16, H, 2 * I, *route,
               w->swiglu_limit, w->swiglu_alpha, h, (float *)nullptr);
    launch_pdl(moe_mma_kernel<false, BN>, dim3((H + MMA_BM - 1) / MMA_BM, tiles), dim3(MMA_THREADS),
               mma_cfg<BN>::smem(I / 32), stream, w->down_blocks, w->down_scales, w->down_bias,
               (const __half *)h, I, H, *route, w->swiglu_limit, w->swiglu_alpha, (__half *)nullptr, y);
}

static void moe_mma(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens, int32_t k_top,
                    const gptoss_cuda_route *route, __half *h, float *y, cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    __half *t16 = (__half *)y; /* y is free until the down projection writes it */
    int64_t chunks = (int64_t)n_tokens * w->hidden / 8;
    launch_pdl(mma_convert_kernel, dim3((unsigned)((chunks + 255) / 256)), dim3(256), 0, stream, t, chunks, t16);
    switch (route->tile_rows) {
    case 8: launch_mma<8>(w, t16, n_pairs, route, h, y, stream); break;
    case 16: launch_mma<16>(w, t16, n_pairs, route, h, y, stream); break;
    case 32: launch_mma<32>(w, t16, n_pairs, route, h, y, stream); break;
    case 64: launch_mma<64>(w, t16, n_pairs, route, h, y, stream); break;
    default: launch_mma<128>(w, t16, n_pairs, route, h, y, stream); break;
    }
}

/* ---- wgmma path (path 6, sm_90a): path 4's dequantization feeding warpgroup MMA ---------- */

/*
 * The same grouped GEMM as path 4 (weights the M side, routed tokens the N side, fp16 operands,
 * fp32 accumulators, identical exactness conditions), issued as wgmma.mma_async with A in
 * registers: each warpgroup owns 64 weight rows and multiplies them by the whole BN-token tile
 * (BN = 64 or 128) that sits in shared memory, so a dequantized A fragment feeds 8-16x more
 * multiply-adds than path 4's m16n8k16 and the tensor cores run while other warpgroups
 * dequantize. Block: 3 warpgroups, 192 weight rows (2880 and 5760 are multiples), one block
 * per SM.
 *
 * K runs in 64-wide atoms, 3 per pipeline stage (2880 = 15 stages). Warp w of a warpgroup
 * holds rows 16w + g and 16w + g + 8 (g = lane / 4) of its 64, as in an m16n8k16 A fragment;
 * thread q = lane % 4 takes bytes 8q..8q+7 of a row's 32 code bytes of the atom (two words,
 * half of group q / 2). Word w' and step s (k16 step j = 2w' + s of the atom) give the
 * registers pair(word, 2s) and pair(word, 2s + 1) of path 4 (mma_fp4_pairs, values i and i + 4),
 * so the MMA's k index kk = 2q + c + 8h reads atom element 16q + 8w' + 2s + h + 4c. The tokens
 * are stored in that order ("wgmma layout", wg_pos): inside every 64-element atom, element e
 * sits at position 16j + kk. gate_up writes h in the same layout for down.
 *
 * Shared memory per stage: the B atoms (BN rows x 128 bytes each, the 128-byte swizzle wgmma
 * descriptors expect: 16-byte chunk c of row r at c ^ (r & 7), 1024-byte aligned), then the A
 * codes (192 rows x 96 bytes, rows in fragment order). cp.async fills two stages ahead; a
 * proxy fence makes the copies visible to the tensor cores' shared-memory reads. Each atom's
 * MMAs are one asynchronous group, so the tensor cores work on atom a while the warps
 * dequantize atom a + 1 (and across stages).
 *
 * Route tiles are 128 rows; a tile multiplies only its rows rounded up to 32 (m64n32..n128),
 * so an expert's weights are read once per 128 of its rows and the padding stays under 32.
 */
#define WG_GROUPS 3
#define WG_BM (64 * WG_GROUPS)
#define WG_THREADS (128 * WG_GROUPS)
#define WG_KA 3 /* 64-wide k atoms per stage */

/* Position of element e (0..63) of a 64-element k atom in the wgmma layout. */
static __host__ __device__ __forceinline__ int wg_pos(int e) {
    int r = e & 3, c = (e >> 2) & 1, w = (e >> 3) & 1, q = e >> 4;
    return 16 * (2 * w + (r >> 1)) + 2 * q + c + 8 * (r & 1);
}

template <int BN>
struct wg_cfg {
    static_assert(BN == 128, "the MMA widths go up to m64n128");
    static constexpr int STAGES = 3;
    static constexpr int B_BYTES = WG_KA * BN * 128;
    static constexpr int A_BYTES = WG_BM * WG_KA * 32;
    static constexpr int STAGE_BYTES = B_BYTES + A_BYTES; /* a multiple of 1024 */
    static size_t smem(int n_groups) {
        return 1024 + (size_t)STAGES * STAGE_BYTES + (((size_t)WG_BM * n_groups + 15) & ~(size_t)15) +
               2 * BN * sizeof(int32_t);
    }
};

/* t [n_rows, k] bf16 -> out [n_rows, k] fp16 in the wgmma layout; one 64-value atom per thread. */
static __global__ void wg_convert_kernel(const bf16 *t, int64_t n_atoms, __half *out) {
    pdl_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_atoms) return;
    __align__(16) __half o[64];
#pragma unroll
    for (int c = 0; c < 8; c++) {
        uint4 v = *(const uint4 *)(t + i * 64 + c * 8);
        const bf16 *x = (const bf16 *)&v;
#pragma unroll
        for (int j = 0; j < 8; j++) o[wg_pos(c * 8 + j)] = __float2half_rn(__bfloat162float(x[j]));
    }
#pragma unroll
    for (int c = 0; c < 8; c++) *(uint4 *)(out + i * 64 + c * 8) = *(const uint4 *)(o + c * 8);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GPTOSS_WGMMA 1
static __device__ __forceinline__ void wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
static __device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
/* keeps the compiler from moving accumulator accesses across the asynchronous MMAs */
template <int N>
static __device__ __forceinline__ void wg_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* shared-memory matrix descriptor: 128-byte swizzle, 8-row groups 1024 bytes apart */
static __device__ __forceinline__ uint64_t wg_desc(const void *smem) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
static __device__ __forceinline__ void wgmma_n32(float *d, const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
static __device__ __forceinline__ void wgmma_n64(float *d, const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
static __device__ __forceinline__ void wgmma_n96(float *d, const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
                 "}, {%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
static __device__ __forceinline__ void wgmma_n128(float *d, const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

/* One atom (4 k16 steps) for the tile's first N tokens. */
template <int N>
static __device__ __forceinline__ void wgmma_atom(float *d, const uint32_t (&R)[4][4], const uint8_t *sb) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint64_t desc = wg_desc(sb + j * 32);
        if (N == 128) wgmma_n128(d, R[j], desc);
        else if (N == 96) wgmma_n96(d, R[j], desc);
        else if (N == 64) wgmma_n64(d, R[j], desc);
        else wgmma_n32(d, R[j], desc);
    }
}
template <int N>
static __device__ __forceinline__ void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
#endif

template <bool GATE_UP, int BN>
static __global__ void __launch_bounds__(WG_THREADS, 1)
moe_wg_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const __half *act, int32_t k_in,
              int32_t n_out_rows, gptoss_cuda_route route, float limit, float alpha, __half *h_out, float *y_out) {
#ifdef GPTOSS_WGMMA
    typedef wg_cfg<BN> C;
    extern __shared__ __align__(16) uint8_t wg_smem_raw[];
    uint8_t *smem = wg_smem_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(wg_smem_raw) & 1023u)) & 1023u);
    uint8_t *s_scale = smem + C::STAGES * C::STAGE_BYTES;
    const int n_groups = k_in >> 5, n_atoms = k_in >> 6;
    int32_t *s_src = (int32_t *)(s_scale + (((size_t)WG_BM * n_groups + 15) & ~(size_t)15)); /* [BN] act row */
    int32_t *s_dst = s_src + BN;                                                             /* [BN] out row */

    pdl_wait(); /* the route, the input and h come from earlier kernels */
    const int tile = blockIdx.y;
    const int e = route.tile_expert[tile];
    if (e < 0) return;
    const int r0 = route.tile_row[tile];
    const int n_rows = min(BN, route.expert_offsets[e + 1] - r0);
    const int n_mma = (n_rows + 31) & ~31; /* MMA width: the tile's rows rounded up to 32 */
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int frag = tid >> 5; /* warp index in the block: fragment rows 16 frag .. 16 frag + 15 */
    const size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;
    const int n_units = n_out_rows >> 1;

    /* weight row (relative to the block's first) of fragment row f: gate_up pairs a unit's
     * gate (row g of a 16-row fragment) with its up row (g + 8) */
    auto local_row = [&](int f) -> int {
        if (GATE_UP) return 2 * ((f >> 4) * 8 + (f & 7)) + ((f >> 3) & 1);
        return f;
    };
    const int row0 = blockIdx.x * WG_BM, n_valid_rows = min(WG_BM, n_out_rows - row0);

    for (int i = tid; i < BN; i += WG_THREADS) {
        int r = r0 + min(i, n_rows - 1);
        s_src[i] = GATE_UP ? route.sorted_token[r] : r;
        s_dst[i] = GATE_UP ? r : route.sorted_pair[r];
    }
    {
        const uint8_t *src = es + (size_t)row0 * n_groups;
        int chunks = n_valid_rows * n_groups / 16;
        for (int i = tid; i < chunks; i += WG_THREADS) cp_async16(s_scale + i * 16, src + (size_t)i * 16, true);
    }
    /* A copies per stage: 192 rows x 6 chunks of 16 bytes, 3 per thread */
    const uint8_t *a_src[3];
    int a_dst[3], a_part[3];
#pragma unroll
    for (int i = 0; i < 3; i++) {
        int c = tid + WG_THREADS * i, f = c / 6;
        a_part[i] = c % 6;
        a_dst[i] = f * (WG_KA * 32) + a_part[i] * 16;
        a_src[i] = eb + (size_t)(row0 + min(local_row(f), n_valid_rows - 1)) * row_bytes + a_part[i] * 16;
    }
    const int n_kb = (n_atoms + WG_KA - 1) / WG_KA;
    __syncthreads(); /* s_src before the first B copies */

    auto issue = [&](int kb) {
        uint8_t *sb = smem + (kb % C::STAGES) * C::STAGE_BYTES;
        uint8_t *sa = sb + C::B_BYTES;
#pragma unroll
        for (int i = 0; i < 3; i++) {
            bool ok = kb * 2 * WG_KA + a_part[i] < n_groups;
            cp_async16(sa + a_dst[i], ok ? a_src[i] + (size_t)kb * (WG_KA * 32) : eb, ok);
        }
        for (int c = tid; c < n_mma * WG_KA * 8; c += WG_THREADS) { /* rows past n_mma are never read */
            int r = c / (WG_KA * 8), rem = c % (WG_KA * 8), a = rem >> 3, ch = rem & 7, atom = kb * WG_KA + a;
            bool ok = atom < n_atoms && r < n_rows;
            const __half *src = ok ? act + (size_t)s_src[r] * k_in + atom * 64 + ch * 8 : act;
            cp_async16(sb + a * (BN * 128) + r * 128 + ((ch ^ (r & 7)) << 4), src, ok);
        }
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < n_kb) issue(s);
        cp_async_commit();
    }
    const int f0 = frag * 16 + g, f1 = f0 + 8;
    const int srow0 = local_row(f0) * n_groups, srow1 = local_row(f1) * n_groups;

    /* Atom a of stage kb is dequantized into R[a] and its 4 MMAs committed as one group, which
     * runs while atom a + 1 is dequantized. R[a] is rewritten once the group that read it (atom a
     * of the stage before) is done: at most WG_KA - 1 groups pending. The stage before's slot is
     * refilled (stage kb + STAGES - 1) once every warpgroup has finished all its groups. */
    uint32_t R[WG_KA][4][4];
    for (int kb = 0; kb < n_kb; kb++) {
        cp_async_wait<C::STAGES - 2>(); /* stage kb has landed */
        fence_proxy_async();            /* this thread's copies, visible to the tensor cores */
        __syncthreads();
        const uint8_t *sb = smem + (kb % C::STAGES) * C::STAGE_BYTES;
        const uint8_t *sa = sb + C::B_BYTES;
#pragma unroll
        for (int a = 0; a < WG_KA; a++) {
            wgmma_wait<WG_KA - 1>();
            if (a == WG_KA - 1) { /* stage kb - 1 is done here; once done everywhere, refill it */
                __syncthreads();
                if (kb + C::STAGES - 1 < n_kb) issue(kb + C::STAGES - 1);
                cp_async_commit();
            }
            const int grp = (kb * WG_KA + a) * 2 + (q >> 1);
            uint2 c0 = *(const uint2 *)(sa + f0 * (WG_KA * 32) + a * 32 + q * 8);
            uint2 c1 = *(const uint2 *)(sa + f1 * (WG_KA * 32) + a * 32 + q * 8);
            uint32_t s0 = grp < n_groups ? s_scale[srow0 + grp] : 127u;
            uint32_t s1 = grp < n_groups ? s_scale[srow1 + grp] : 127u;
            uint32_t m0 = ((s0 - 98u) << 10) * 0x00010001u, m1 = ((s1 - 98u) << 10) * 0x00010001u;
#pragma unroll
            for (int w = 0; w < 2; w++) {
                uint32_t w0 = w ? c0.y : c0.x, w1 = w ? c1.y : c1.x;
                uint32_t p0[4], p1[4];
                mma_fp4_pairs(w0, p0);
                mma_fp4_pairs(w1, p1);
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    R[a][2 * w + s][0] = hmul2_u32(p0[2 * s], m0);
                    R[a][2 * w + s][1] = hmul2_u32(p1[2 * s], m1);
                    R[a][2 * w + s][2] = hmul2_u32(p0[2 * s + 1], m0);
                    R[a][2 * w + s][3] = hmul2_u32(p1[2 * s + 1], m1);
                }
            }
            wgmma_fence();
            const uint8_t *sba = sb + a * (BN * 128);
            if (n_mma > 96) wgmma_atom<128>(acc, R[a], sba); /* uniform in the block */
            else if (n_mma > 64) wgmma_atom<96>(acc, R[a], sba);
            else if (n_mma > 32) wgmma_atom<64>(acc, R[a], sba);
            else wgmma_atom<32>(acc, R[a], sba);
            wgmma_commit();
        }
    }
    wgmma_wait<0>();
    wg_pin(acc);

    /* epilogue: acc[4i + c] = row f0, token 8i + 2q + c; acc[4i + 2 + c] = row f1 */
    const float *ebias = bias + (size_t)e * n_out_rows;
    if (GATE_UP) {
        int u = blockIdx.x * (WG_BM / 2) + frag * 8 + g;
        if (u < n_units) {
            float bg = ebias[2 * u], bu = ebias[2 * u + 1];
            int col = (u & ~63) | wg_pos(u & 63);
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int tok = i * 8 + 2 * q + c;
                    if (tok >= n_rows) continue;
                    float v = swiglu(acc[4 * i + c] + bg, acc[4 * i + 2 + c] + bu, limit, alpha);
                    h_out[(size_t)s_dst[tok] * n_units + col] = h_as_half(v);
                }
        }
    } else {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int rr = row0 + frag * 16 + 8 * hh + g;
            if (rr >= n_out_rows) continue;
            float b = ebias[rr];
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int tok = i * 8 + 2 * q + c;
                    if (tok >= n_rows) continue;
                    y_out[(size_t)s_dst[tok] * n_out_rows + rr] = acc[4 * i + 2 * hh + c] + b;
                }
        }
    }
#else
    (void)blocks, (void)scales, (void)bias, (void)act, (void)k_in, (void)n_out_rows, (void)route, (void)limit;
    (void)alpha, (void)h_out, (void)y_out;
    __trap(); /* never launched: gptoss_cuda_moe_prepare enables path 6 on compute capability 9.0 only */
#endif
}

/* gptoss_cuda_moe_prepare: true when path 6 can run here (an sm_90 device, widths that are
 * multiples of 64, its shared memory granted) */
static bool wg_supported = false;


template <int BN>
static void launch_wg(const gptoss_cuda_moe_weights *w, const __half *t16, int32_t n_pairs,
                      const gptoss_cuda_route *route, __half *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, BN);
    launch_pdl(moe_wg_kernel<true, BN>, dim3((2 * I + WG_BM - 1) / WG_BM, tiles), dim3(WG_THREADS),
               wg_cfg<BN>::smem(H / 32), stream, w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias, t16, H,
               2 * I, *route, w->swiglu_limit, w->swiglu_alpha, h, (float *)nullptr);
    launch_pdl(moe_wg_kernel<false, BN>, dim3((H + WG_BM - 1) / WG_BM, tiles), dim3(WG_THREADS),
               wg_cfg<BN>::smem(I / 32), stream, w->down_blocks, w->down_scales, w->down_bias, (const __half *)h, I,
               H, *route, w->swiglu_limit, w->swiglu_alpha, (__half *)nullptr, y);
}

static void moe_wg(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens, int32_t k_top,
                   const gptoss_cuda_route *route, __half *h, float *y, cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    __half *t16 = (__half *)y; /* y is free until the down projection writes it */
    int64_t atoms = (int64_t)n_tokens * w->hidden / 64;
    launch_pdl(wg_convert_kernel, dim3((unsigned)((atoms + 127) / 128)), dim3(128), 0, stream, t, atoms, t16);
    launch_wg<WG_BN>(w, t16, n_pairs, route, h, y, stream);
}

/* ---- mma pair GEMV (path 5): decode steps of few pairs on the tensor cores ---------------- */

/*
 * The pair GEMV above spends about four integer operations per weight building floats, and
 * the integer pipe (half the FP32 rate on sm_90) then takes longer than the bytes do. Here
 * the dot products run on mma.sync.m16n8k16 (fp16 in, fp32 accumulate), so a weight costs
 * about 1.4 integer operations (mma_fp4_pairs builds four fp16 pairs in 11) and no FMA.
 *
 * A warp owns a tile of 16 weight rows and a slice of K, in windows of four MXFP4 groups
 * (128 inputs, 64 bytes of each row). Lane (g = lane / 4, q = lane % 4) holds group G + q of
 * rows a and b (16 bytes each; gate_up: rows 2g and 2g + 1 of the tile, the gate and up rows
 * of one unit, interleaved in the checkpoint; down: rows g and g + 8). Step w (0..3) of a
 * window feeds word w of each lane's group as the A operand of two m16n8k16 MMAs, so the k
 * dimension of one MMA mixes four groups, whose scales differ. The B operand keeps them
 * apart: column n holds the token's values only in the k positions of lane q = n % 4 and
 * zeros elsewhere (lane (g, q) supplies column g, and loads the token only if g % 4 == q), so
 * D[row][n] is the dot product of group G + n % 4 alone. Lanes q = 0, 1 then scale columns
 * 2q and 2q + 1 (groups G + 2q, G + 2q + 1) in fp32, acc += d * 2^(s - 113) (the fp16 codes
 * are code * 2^-14), so any scale byte up to 240 is exact, not only [104, 128]. The token sits
 * in shared memory as fp16 in the mma layout (path 4's): the values that word w of group G
 * multiplies are chunk 4G + w.
 *
 * K slices add in shared memory; gate_up's epilogue applies bias and SwiGLU and writes h by
 * pair as fp16 (rounded to bf16 first) in the mma layout, which down stages directly.
 *
 * Two kernels stream the codes:
 * - moe_pair_tma_kernel (sm_90 and up): one block per tile and pair, 6 warps (K slices, PT_KS). One
 *   thread copies the tile's 16 rows of codes and of scale bytes (contiguous in the
 *   checkpoint) into shared memory with two bulk copies (cp.async.bulk, completing on an
 *   mbarrier), so the whole tile is in flight at once without holding registers: ~30 KB per
 *   block and 7 blocks per SM at the 20b/120b shapes.
 * - moe_pair_wide_kernel (older GPUs): the same arithmetic with each lane's 16-byte loads in
 *   registers, one window ahead; 8 warps = 2 tiles x 4 K slices per block.
 *
 * History (H100, 20b tg128): lanes that each loaded one 4-byte word of 8 rows requested every
 * 32-byte sector twice and ran at 1.3-1.5 TB/s (ncu); the 16-byte loads took decode from 429
 * to 444 tok/s. Even so ncu timed gate_up at 27.3 us (1.29 TB/s) and down at 16.7 us: with
 * one window ahead, each warp keeps 1 KB in flight and the registers cap a block at 16-32
 * warps per SM, too little for the memory latency; two windows ahead (half the warps
 * resident), two K slices (one wave), or an L2 bulk prefetch of each tile beside the loads
 * were each slower. A ring of cp.async stages per warp was also slower (367 vs 390 tok/s).
 */
#define PM_KS 4  /* K slices (warps) per tile of the wide kernel */
#define PT_KS 6  /* ... of the TMA kernel (H100, 20b / 120b tg128: 4 slices 479.2 / 333.5 tok/s, 6 slices
                    486.7 / 338.7, 8 slices 485.3 / 338.5, 8 slices with registers capped for 6 or 7
                    blocks per SM slower: the compute after a tile lands is latency-bound per warp) */
#define PM_TPB 2 /* tiles per block of the wide kernel */

/* The token (gate_up: bf16 row pair / k_top of act; down: h of this pair, already fp16 in the
 * mma layout) into shared memory as fp16 chunks in the mma layout. */
template <bool GATE_UP>
static __device__ __forceinline__ void pair_stage_input(const void *act, int pair, int32_t k_top, int32_t k_in,
                                                        uint4 *xs) {
    if (GATE_UP) {
        const bf16 *src = (const bf16 *)act + (size_t)(pair / k_top) * k_in;
        for (int ci = threadIdx.x; ci < (k_in >> 3); ci += blockDim.x) {
            uint4 v = *(const uint4 *)(src + (size_t)ci * 8);
            const bf16 *x = (const bf16 *)&v;
            __align__(16) __half o[8];
#pragma unroll
            for (int j = 0; j < 8; j++) o[mma_pos(j)] = __float2half_rn(__bfloat162float(x[j]));
            xs[ci] = *(const uint4 *)o;
        }
    } else {
        const uint4 *src = (const uint4 *)((const __half *)act + (size_t)pair * k_in);
        for (int ci = threadIdx.x; ci < (k_in >> 3); ci += blockDim.x) xs[ci] = src[ci];
    }
}

/* The MMAs of one window (groups G .. G + 3) of one lane: ca / cb its group's codes of rows a
 * and b, b the token chunks its four words multiply (zeros where the lane holds no token
 * values). d gets columns 2q and 2q + 1 of rows a (d[0], d[1]) and b (d[2], d[3]), unscaled. */
static __device__ __forceinline__ void pair_window_mma(uint4 ca, uint4 cb, const uint4 (&b)[4], float (&d)[4]) {
    const uint32_t wa[4] = {ca.x, ca.y, ca.z, ca.w};
    const uint32_t wb[4] = {cb.x, cb.y, cb.z, cb.w};
    /* two accumulators (words 0-1 and 2-3: the same groups) halve the chain of dependent MMAs */
    float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        float(&dd)[4] = w < 2 ? d1 : d2;
        uint32_t pa[4], pb[4];
        mma_fp4_pairs(wa[w], pa);
        mma_fp4_pairs(wb[w], pb);
        mma_f16(dd, pa[0], pb[0], pa[1], pb[1], b[w].x, b[w].y);
        mma_f16(dd, pa[2], pb[2], pa[3], pb[3], b[w].z, b[w].w);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = d1[i] + d2[i];
}

/* One window of the wide kernel: pair_window_mma, then the column scales; s4 the scale bytes
 * of groups G + 2q and G + 2q + 1 of row a (low half) and row b (zero for q >= 2, whose column
 * copies pair_finish drops). */
static __device__ __forceinline__ void pair_window(uint4 ca, uint4 cb, uint32_t s4, int G, int q, bool owner,
                                                   int n_groups, const uint4 *xs, float &acc0, float &acc1) {
    const bool has_x = owner && G + q < n_groups;
    uint4 b[4];
#pragma unroll
    for (int w = 0; w < 4; w++) b[w] = has_x ? xs[4 * (G + q) + w] : make_uint4(0, 0, 0, 0);
    float d[4];
    pair_window_mma(ca, cb, b, d);
    acc0 = fmaf(d[0], __uint_as_float(((s4 & 0xffu) + 14u) << 23), acc0);
    acc0 = fmaf(d[1], __uint_as_float((((s4 >> 8) & 0xffu) + 14u) << 23), acc0);
    acc1 = fmaf(d[2], __uint_as_float((((s4 >> 16) & 0xffu) + 14u) << 23), acc1);
    acc1 = fmaf(d[3], __uint_as_float(((s4 >> 24) + 14u) << 23), acc1);
}

/* The scale bytes pair_window takes, from a row-major [rows][n_groups] table; sa / sb point
 * at group 0 of rows a and b. */
template <typename P>
static __device__ __forceinline__ uint32_t pair_scales(P sa, P sb, int G, int q, int n_groups) {
    if (q >= 2) return 0u;
    const int g0 = G + 2 * q, g1 = g0 + 1;
    const bool h0 = g0 < n_groups, h1 = g1 < n_groups;
    return (h0 ? (uint32_t)sa[g0] : 0u) | (h1 ? (uint32_t)sa[g1] << 8 : 0u) | (h0 ? (uint32_t)sb[g0] << 16 : 0u) |
           (h1 ? (uint32_t)sb[g1] << 24 : 0u);
}

/* The bias values pair_finish adds in this thread (gate_up: the gate and up biases of its unit;
 * down: its row's bias in .x), zero for threads that write nothing. Loaded as soon as the
 * expert is known, so that the load's latency (a DRAM trip: each layer's biases are read once
 * per step) is not added to the end of the block. */
template <bool GATE_UP>
static __device__ __forceinline__ float2 pair_bias(const float *bias, int e, int32_t n_out_rows, int tpb, int tile0,
                                                   int n_tiles) {
    const float *ebias = bias + (size_t)e * n_out_rows;
    const int tid = threadIdx.x;
    if (GATE_UP) {
        const int tt = tile0 + (tid >> 3);
        if (tid < tpb * 8 && tt < n_tiles) return *(const float2 *)(ebias + 2 * (8 * tt + (tid & 7)));
    } else {
        const int tt = tile0 + (tid >> 4);
        if (tid < tpb * 16 && tt < n_tiles) return make_float2(ebias[16 * tt + (tid & 15)], 0.0f);
    }
    return make_float2(0.0f, 0.0f);
}

/* Adds the K slices of the block's tiles (warp = tile_in_block * ks + slice) and writes the
 * outputs: gate_up h (bias, SwiGLU, fp16 in the mma layout), down y (bias). b: pair_bias, or
 * with LATE, loaded here from bias and e after the reduction's barrier. */
template <bool GATE_UP, bool LATE = false>
static __device__ __forceinline__ void pair_finish(float acc0, float acc1, float (*red)[16], int ks, int tpb,
                                                   int tile0, int n_tiles, int pair, float2 b, const float *bias,
                                                   int e, int32_t n_out_rows, float limit, float alpha,
                                                   __half *h_out, float *y_out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    /* lanes q = 2, 3 hold copies of columns 0..3 (their scale bytes are 0, but the copies
     * are finite, so they are dropped here rather than scaled by 2^-113) */
    if (q >= 2) acc0 = acc1 = 0.0f;
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    if (q == 0) {
        red[warp][g] = acc0;
        red[warp][g + 8] = acc1;
    }
    __syncthreads();
    if (LATE) b = pair_bias<GATE_UP>(bias, e, n_out_rows, tpb, tile0, n_tiles);
    const int tid = threadIdx.x;
    if (GATE_UP) {
        const int t2 = tid >> 3, gg = tid & 7, tt = tile0 + t2;
        if (tid < tpb * 8 && tt < n_tiles) {
            float gate = 0.0f, up = 0.0f;
            for (int s = 0; s < ks; s++) {
                gate += red[t2 * ks + s][gg];
                up += red[t2 * ks + s][gg + 8];
            }
            const int u = 8 * tt + gg, n_units = n_out_rows >> 1;
            float v = swiglu(gate + b.x, up + b.y, limit, alpha);
            h_out[(size_t)pair * n_units + ((u & ~7) | mma_pos(u & 7))] = h_as_half(v);
        }
    } else {
        const int t2 = tid >> 4, r = tid & 15, tt = tile0 + t2;
        if (tid < tpb * 16 && tt < n_tiles) {
            float v = 0.0f;
            for (int s = 0; s < ks; s++) v += red[t2 * ks + s][r];
            const int row = 16 * tt + r;
            y_out[(size_t)pair * n_out_rows + row] = v + b.x;
        }
    }
}

template <bool GATE_UP>
static __global__ void __launch_bounds__(PM_KS * PM_TPB * 32)
moe_pair_wide_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const void *act,
                     const int32_t *topk_idx, int32_t k_top, int32_t k_in, int32_t n_out_rows, float limit,
                     float alpha, __half *h_out, float *y_out) {
    extern __shared__ __align__(16) uint4 pm_xs[]; /* [k_in / 8] fp16 chunks, mma layout */
    __shared__ float red[PM_KS * PM_TPB][16];
    const int pair = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int slice = warp % PM_KS, tile = blockIdx.x * PM_TPB + warp / PM_KS, n_tiles = n_out_rows >> 4;
    const int n_groups = k_in >> 5, n_win = (n_groups + 3) >> 2;
    const size_t row_bytes = (size_t)n_groups * 16;
    pdl_wait(); /* topk_idx comes from the router, the input from the norm or gate_up */
    const int e = topk_idx[pair];
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;

    const int per = (n_win + PM_KS - 1) / PM_KS;
    const int w0 = min(n_win, slice * per);
    const int w1 = tile < n_tiles ? min(n_win, w0 + per) : w0; /* warp-uniform */
    const int ra = GATE_UP ? 2 * (8 * tile + g) : 16 * tile + g, rb = GATE_UP ? ra + 1 : ra + 8;
    const uint4 *pa = (const uint4 *)(eb + (size_t)ra * row_bytes) + q;
    const uint4 *pb = (const uint4 *)(eb + (size_t)rb * row_bytes) + q;
    const uint8_t *sa = es + (size_t)ra * n_groups, *sb = es + (size_t)rb * n_groups;
    const bool owner = (g & 3) == q;

    auto load = [&](int W, uint4 &xa, uint4 &xb, uint32_t &s) {
        const int G = 4 * W;
        xa = xb = make_uint4(0, 0, 0, 0);
        s = 0;
        if (W < w1) {
            if (G + q < n_groups) {
                xa = __ldg(pa + 4 * W);
                xb = __ldg(pb + 4 * W);
            }
            s = pair_scales(sa, sb, G, q, n_groups);
        }
    };
    uint4 ca, cb;
    uint32_t sc;
    load(w0, ca, cb, sc); /* in flight while the input is staged */
    pair_stage_input<GATE_UP>(act, pair, k_top, k_in, pm_xs);
    __syncthreads();

    float acc0 = 0.0f, acc1 = 0.0f;
    for (int W = w0; W < w1; W++) {
        uint4 na, nb;
        uint32_t ns;
        load(W + 1, na, nb, ns);
        pair_window(ca, cb, sc, 4 * W, q, owner, n_groups, pm_xs, acc0, acc1);
        ca = na, cb = nb, sc = ns;
    }
    pair_finish<GATE_UP, true>(acc0, acc1, red, PM_KS, PM_TPB, blockIdx.x * PM_TPB, n_tiles, pair,
                               make_float2(0.0f, 0.0f), bias, e, n_out_rows, limit, alpha, h_out, y_out);
}


/*
 * Shared memory of the TMA kernel, in bytes from its start (16-byte multiples, so every part
 * stays aligned): the tile's codes (16 rows of k_in / 32 groups of 16 bytes), its scale bytes
 * (16 rows of k_in / 32) and 16 zero bytes after them, the token as fp16 chunks in the mma
 * layout, zero-filled up to whole windows, then one window's token chunks of zeros (64 bytes)
 * that the lanes holding no token values read. At most 43 KB (k_in <= 4096).
 */
struct pair_tma_layout {
    uint32_t scales, token, zeros, bytes;
};
static __host__ __device__ __forceinline__ pair_tma_layout pair_tma_parts(int32_t k_in) {
    const uint32_t n_groups = (uint32_t)k_in / 32, n_win = (n_groups + 3) / 4;
    pair_tma_layout l;
    l.scales = 16 * 16 * n_groups;
    l.token = l.scales + 16 * n_groups + 16;
    l.zeros = l.token + 256 * n_win;
    l.bytes = l.zeros + 64;
    return l;
}
static size_t pair_tma_smem(int32_t k_in) { return pair_tma_parts(k_in).bytes; }

/*
 * A timeline of the TMA kernel's blocks, for diagnosis only: built when GPTOSS_MOE_TRACE is
 * defined (cmake -DCMAKE_CUDA_FLAGS=-DGPTOSS_MOE_TRACE), never in a normal build. Each block
 * records, in a ring of the last TRACE_N blocks, its kind (gate_up or down), pair, tile and SM,
 * and globaltimer stamps: start, past the PDL wait, copy issued, tile landed, end. At exit the
 * ring goes to the file GPTOSS_MOE_TRACE_FILE names; bench/moe-trace.py reads it.
 */
/* The SM this thread runs on, and the GPU's nanosecond clock (the trace and the in-flight
 * limit below). */
static __device__ __forceinline__ unsigned sm_id(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
static __device__ __forceinline__ unsigned long long globaltimer_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#ifdef GPTOSS_MOE_TRACE
#define TRACE_N (1u << 18)
__device__ unsigned long long *trace_buf;
__device__ unsigned long long trace_seq;
static unsigned long long *trace_host;
static void trace_dump(void) {
    const char *f = getenv("GPTOSS_MOE_TRACE_FILE");
    if (!f || !trace_host) return;
    static unsigned long long h[TRACE_N * 6];
    unsigned long long seq = 0;
    cudaDeviceSynchronize();
    cudaMemcpy(h, trace_host, sizeof h, cudaMemcpyDeviceToHost);
    cudaMemcpyFromSymbol(&seq, trace_seq, sizeof seq);
    FILE *o = fopen(f, "wb");
    if (!o) return;
    fwrite(&seq, sizeof seq, 1, o);
    fwrite(h, sizeof h, 1, o);
    fclose(o);
    fprintf(stderr, "moe trace: %llu records -> %s\n", seq, f);
}
static void trace_init(void) {
    if (trace_host) return;
    if (cudaMalloc(&trace_host, sizeof(unsigned long long) * TRACE_N * 6) != cudaSuccess ||
        cudaMemset(trace_host, 0, sizeof(unsigned long long) * TRACE_N * 6) != cudaSuccess ||
        cudaMemcpyToSymbol(trace_buf, &trace_host, sizeof trace_host) != cudaSuccess) {
        fprintf(stderr, "moe trace: no device memory for the ring; not tracing\n");
        trace_host = NULL;
        return;
    }
    atexit(trace_dump);
}
#endif

/*
 * Copies in flight per SM for the TMA kernel. Without a limit every resident block (5-6 per SM
 * at one token) issues its tile when the router ends; the memory system serves the ~20 MB
 * interleaved, so every tile lands in the same microsecond, every block computes at once and
 * the DRAM idles while they do (bench/CUDA.md, "The expert kernel's timeline"). So each block
 * takes a ticket from its SM's counter and issues its copy only while fewer than `inflight`
 * copies with earlier tickets on that SM have not landed; a block counts its tile landed right
 * after its mbarrier wait (down: before its PDL wait, so that no landing waits for gate_up).
 * A ticket is taken only by a resident block whose landing depends on nothing but its own copy,
 * so the lowest unlanded ticket never waits. The counters sit on their own 128-byte lines and
 * the wait backs off with __nanosleep: a first form that polled 132 counters packed into 1 KB
 * in a tight loop did not finish a batched run in three minutes (under one without the
 * limit). The wait also gives up after PT_WAIT_NS (the copy is issued anyway and the give-up
 * counted), so a broken premise costs time, never a hang. H100 (tg128, N = 3 against none):
 * 120b +2.3%, 20b +2.0%, 120b at depth 8192 +1.7%, batched steps of 8 to 96 pairs +0.7-4.3%.
 */
#define PT_MAX_SMS 256
#define PT_WAIT_NS 20000ull
struct __align__(128) pt_counter {
    unsigned v;
    unsigned pad[31];
};
__device__ pt_counter pt_copy_issued[PT_MAX_SMS];
__device__ pt_counter pt_copy_landed[PT_MAX_SMS];
__device__ unsigned long long pt_copy_giveups;

static __device__ __forceinline__ unsigned pt_load(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void pt_take_turn(unsigned sm, int32_t inflight) {
    unsigned landed = pt_load(&pt_copy_landed[sm].v); /* beside the ticket: an older count only waits longer */
    const unsigned ticket = atomicAdd(&pt_copy_issued[sm].v, 1u);
    if ((int)(ticket - landed) < inflight) return;
    const unsigned long long t0 = globaltimer_ns();
    do {
        __nanosleep(200);
        landed = pt_load(&pt_copy_landed[sm].v);
        if ((int)(ticket - landed) < inflight) return;
    } while (globaltimer_ns() - t0 < PT_WAIT_NS);
    atomicAdd(&pt_copy_giveups, 1ull);
}

/*
 * One block per (tile, pair), 6 warps (K slices). Thread 0 copies the tile's 16 rows of codes
 * and of scale bytes into shared memory with two bulk copies completing on an mbarrier, and
 * the block stages the token meanwhile. A persistent form of this kernel (a grid of resident
 * blocks, each taking a run of tiles through two stages) measured 0.5% slower end to end, and
 * gate_up and down fused into one such grid (down's tiles copied while gate_up computes, a
 * counter per pair between them) 2.6% slower (20b tg128, H100): with two stages per block only
 * 4 blocks fit per SM, and the arithmetic after a tile lands is latency-bound per warp, so the
 * resident warps count for more than the bytes in flight (the same grid with one stage and 7
 * blocks per SM matched the two kernels; 6 K slices instead of 4 gained 1.5%).
 *
 * down issues its copies before its wait: only h comes from gate_up, its predecessor.
 * topk_idx comes from the router, which finished before gate_up passed its own wait, and
 * this grid launches only once every gate_up block has passed it (pdl_wait triggers the
 * dependent launch after waiting, never before), so the index is readable here and the tile
 * streams in while gate_up ends. gate_up's copies need its wait (the router is its
 * predecessor). EARLY_BIAS: the threads that write outputs load their bias values beside the
 * copy (down: before the wait, like the copy) instead of after the reduction, which takes a
 * DRAM trip off the block's end; pair_mma_launch says for which steps.
 */
template <bool GATE_UP, bool EARLY_BIAS>
static __global__ void __launch_bounds__(PT_KS * 32)
moe_pair_tma_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const void *act,
                    const int32_t *topk_idx, int32_t k_top, int32_t k_in, int32_t n_out_rows, float limit,
                    float alpha, __half *h_out, float *y_out, int32_t inflight) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t pt_smem[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[PT_KS][16];
    const int pair = blockIdx.y, tile = blockIdx.x, n_tiles = n_out_rows >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n_groups = k_in >> 5, n_win = (n_groups + 3) >> 2;
    const uint32_t row_bytes = (uint32_t)n_groups * 16, code_bytes = 16 * row_bytes, scale_bytes = 16 * n_groups;
    const pair_tma_layout lay = pair_tma_parts(k_in);
    uint8_t *codes = pt_smem, *sc = pt_smem + lay.scales;
    uint4 *xs = (uint4 *)(pt_smem + lay.token), *zeros = (uint4 *)(pt_smem + lay.zeros);
    const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar);
#ifdef GPTOSS_MOE_TRACE
    unsigned long long tr_start = globaltimer_ns(), tr_issue = 0, tr_wait = 0, tr_land = 0;
#endif
    const unsigned sm = inflight > 0 ? sm_id() % PT_MAX_SMS : 0u;
    auto issue = [&]() {
        const size_t row0 = (size_t)topk_idx[pair] * n_out_rows + 16 * (size_t)tile;
        if (inflight > 0) pt_take_turn(sm, inflight);
#ifdef GPTOSS_MOE_TRACE
        tr_issue = globaltimer_ns();
#endif
        mbar_expect_tx(bar_s, code_bytes + scale_bytes);
        bulk_copy(codes, blocks + row0 * row_bytes, code_bytes, bar_s);
        bulk_copy(sc, scales + row0 * n_groups, scale_bytes, bar_s);
    };
    if (threadIdx.x == 0) {
        mbar_init(bar_s);
        if (!GATE_UP) {
            issue();
            if (inflight > 0) { /* its landing must not wait for gate_up, which may hold later tickets */
                mbar_wait(bar_s, 0);
                atomicAdd(&pt_copy_landed[sm].v, 1u);
            }
        }
    }
    float2 bv = make_float2(0.0f, 0.0f);
    if (EARLY_BIAS && !GATE_UP) bv = pair_bias<false>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    /* zeros: the 16 bytes after the scales, the token past k_in up to whole windows, and the
     * zero window (none of them is written by the copies) */
    for (int i = threadIdx.x; i < 1 + (int)(lay.bytes - lay.token) / 16 - (k_in >> 3); i += blockDim.x)
        (i == 0 ? (uint4 *)(sc + scale_bytes) : xs + (k_in >> 3) + i - 1)[0] = make_uint4(0, 0, 0, 0);
    pdl_wait(); /* gate_up: topk_idx from the router; both: the input */
#ifdef GPTOSS_MOE_TRACE
    tr_wait = globaltimer_ns();
#endif
    if (GATE_UP && threadIdx.x == 0) issue();
    if (EARLY_BIAS && GATE_UP) bv = pair_bias<true>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    pair_stage_input<GATE_UP>(act, pair, k_top, k_in, xs);
    __syncthreads(); /* the token is staged, and every thread sees the initialized barrier */
    mbar_wait(bar_s, 0);
    if (GATE_UP && inflight > 0 && threadIdx.x == 0) atomicAdd(&pt_copy_landed[sm].v, 1u);
#ifdef GPTOSS_MOE_TRACE
    tr_land = globaltimer_ns();
#endif

    /*
     * No lane tests anything per window: groups past n_groups in the last window read codes of
     * the next row (or of the scale bytes after the last one: finite fp16 values either way)
     * times the zero-filled token, so their columns are exactly 0, and their scale bytes are
     * the next row's (at most 240, gptoss_cuda_moe_check_mma) or the zero bytes, so 0 times a
     * finite scale adds nothing. Lanes that hold no token values read the zero window, with a
     * step of 0. Lanes q = 2, 3 repeat the scales of lanes q = 0, 1 (their columns are copies).
     */
    const int per = (n_win + PT_KS - 1) / PT_KS;
    const int w0 = min(n_win, warp * per), w1 = min(n_win, w0 + per);
    const int la = GATE_UP ? 2 * g : g, lb = GATE_UP ? la + 1 : la + 8;
    const bool owner = (g & 3) == q;
    const uint8_t *ca = codes + la * row_bytes + 16 * q, *cb = codes + lb * row_bytes + 16 * q;
    const uint8_t *sa = sc + la * n_groups + 2 * (q & 1), *sb = sc + lb * n_groups + 2 * (q & 1);
    const uint4 *xw = owner ? xs + 4 * q : zeros;
    const int x_step = owner ? 16 : 0; /* uint4 chunks per window */
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll 2
    for (int W = w0; W < w1; W++) {
        const uint4 wa4 = *(const uint4 *)(ca + 64 * W), wb4 = *(const uint4 *)(cb + 64 * W);
        const uint32_t s0 = sa[4 * W], s1 = sa[4 * W + 1], s2 = sb[4 * W], s3 = sb[4 * W + 1];
        const uint4 *xp = xw + x_step * W;
        const uint4 b[4] = {xp[0], xp[1], xp[2], xp[3]};
        float d[4];
        pair_window_mma(wa4, wb4, b, d);
        /* column scale 2^(s - 113) (the fp16 codes are code * 2^-14): the exponent field s + 14 */
        acc0 = fmaf(d[0], __uint_as_float(s0 * (1u << 23) + (14u << 23)), acc0);
        acc0 = fmaf(d[1], __uint_as_float(s1 * (1u << 23) + (14u << 23)), acc0);
        acc1 = fmaf(d[2], __uint_as_float(s2 * (1u << 23) + (14u << 23)), acc1);
        acc1 = fmaf(d[3], __uint_as_float(s3 * (1u << 23) + (14u << 23)), acc1);
    }
    pair_finish<GATE_UP, !EARLY_BIAS>(acc0, acc1, red, PT_KS, 1, tile, n_tiles, pair, bv, bias, topk_idx[pair],
                                      n_out_rows, limit, alpha, h_out, y_out);
#ifdef GPTOSS_MOE_TRACE
    if (threadIdx.x == 0 && trace_buf) {
        const unsigned long long end = globaltimer_ns();
        const unsigned long long n = atomicAdd(&trace_seq, 1ull);
        unsigned long long *r = trace_buf + 6 * (n % TRACE_N);
        r[0] = (unsigned long long)GATE_UP | (unsigned long long)(pair & 0x7f) << 1 |
               (unsigned long long)(tile & 0xffff) << 8 | (unsigned long long)(sm_id() & 0xff) << 24 |
               (n & 0xffffffffu) << 32;
        r[1] = tr_start, r[2] = tr_wait, r[3] = tr_issue, r[4] = tr_land, r[5] = end;
    }
#endif
#else
    __trap(); /* never launched: the host picks this kernel only where it was built for sm_90 or later */
#endif
}

/*
 * moe_pair_fp8_kernel (sm_90a): path 5's tile (16 rows, the whole k_in, the same two bulk
 * copies and copy limit) with the products on wgmma's FP8 tensor cores, which sm_90 runs
 * natively, instead of mma.sync on fp16 pairs. Not the default: each block builds the FP8
 * form of its token (B below) itself, after its PDL wait, and that costs more than the
 * arithmetic saves (H100 tg128, GPTOSS_CUDA_MOE_PAIR_KERNEL=fp8 against the TMA kernel: 20b
 * 537 -> 484 tok/s, 120b 382 -> 340; with B left unbuilt, a timing-only build, 548 and 391).
 * B built once per token and pair by the kernels that produce the inputs would make it pay;
 * bench/CUDA.md says how. bench/fp8-tile.cu measured a form of this arithmetic at 0.56 of the
 * fp16 form's time per weight.
 * - A (registers): an e2m1 code becomes the e4m3 byte s e1 e0 m 0 0 shifted into place, whose
 *   value is code * 2^-6 exactly (subnormals included): 5 logical operations per 8 codes,
 *   where building fp16 pairs takes 11.
 * - One warpgroup, 4 warps = 4 K slices: warp w's 16 rows of the m64 operand are the tile's 16
 *   rows over slice w's groups. Each wgmma (m64n8k32) covers one group of every slice, lane q
 *   supplying word q of its group (codes 8q + 0, 2, 4, 6 as k = 4q..4q+3, the odd codes as
 *   k = 16 + 4q..), so one E8M0 scale per row applies to the whole product.
 * - B (shared memory, K-major, no swizzle): column 2s + t holds term t of slice s's token
 *   values. The token (gate_up: bf16; down: h, bf16 values held as fp16) is scaled by 2^sigma
 *   so that its largest value lies in [128, 256), then split into hi = e4m3(x) and lo = e4m3(x -
 *   hi): a bf16 value has 8 significant bits and each term 4, so hi + lo is exact wherever lo
 *   is a normal e4m3 value (x above 2^-10 of the largest) and off by less than 2^-12 of the
 *   largest below that. Lane q of warp w holds the products of slice q's token with slice w's
 *   codes; only q == w is kept. The tensor cores add FP8 products in less than fp32: the
 *   kernel tests measure a relative error of about 6e-5 against the reference (the fp16 form:
 *   under 1e-5), well inside bf16's 2^-9.
 * - Per window of 4 groups: 8 word loads and 8 scale bytes per lane, 4 wgmmas into a fresh
 *   accumulator set, and the previous window's sets scaled while they run.
 * Groups past the end of a slice multiply zero columns of B (its steps past the slice's
 * groups are zero), so the codes they read (the next slice's, the next row's, or the scale
 * bytes after the table: finite e4m3 bytes whatever their value) add nothing.
 */
#define PF_KS 4 /* K slices: the four warps of one warpgroup */

struct pair_fp8_layout {
    uint32_t scales, bt, bytes;
    int32_t gps, nws; /* groups per slice, windows of 4 groups per slice */
};
static __host__ __device__ __forceinline__ pair_fp8_layout pair_fp8_parts(int32_t k_in) {
    const int32_t n_groups = k_in / 32;
    pair_fp8_layout l;
    l.gps = (n_groups + PF_KS - 1) / PF_KS;
    l.nws = (l.gps + 3) / 4;
    l.scales = 16u * 16u * (uint32_t)n_groups;
    l.bt = (l.scales + 16u * (uint32_t)n_groups + 16u + 127u) & ~127u;
    l.bytes = l.bt + 256u * 4u * (uint32_t)l.nws;
    return l;
}
static size_t pair_fp8_smem(int32_t k_in) { return pair_fp8_parts(k_in).bytes; }

#ifdef GPTOSS_WGMMA
/* K-major without swizzle: core matrices of 8 columns x 16 bytes; the second k half 128
 * bytes after the first (LBO); one group of 8 columns (SBO unused, set alike) */
static __device__ __forceinline__ uint64_t pf_desc(uint32_t smem_addr) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}
static __device__ __forceinline__ void wgmma_e4m3_n8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                     uint32_t a3, uint64_t desc) {
    /* scale-d false: d = A * B (each group has its own accumulators) */
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(0));
}

/* e2m1 codes (8 per word, the even ones in the low nibbles) -> e4m3 bytes, value code * 2^-6 */
static __device__ __forceinline__ void e2m1_to_e4m3(uint32_t w, uint32_t &ev, uint32_t &od) {
    ev = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
    od = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}

/* The token into B (see moe_pair_fp8_kernel); returns 2^-sigma. red4: 4 floats of shared memory. */
template <bool GATE_UP>
static __device__ __forceinline__ float pair_fp8_stage(const void *act, int pair, int32_t k_top, int32_t k_in,
                                                       const pair_fp8_layout &lay, uint8_t *bt, float *red4) {
    constexpr int U = 4; /* units per thread: 4 * nws * 16 <= 512 for k_in <= 4096 */
    const int n_groups = k_in >> 5, n_units = 4 * lay.nws * 16;
    float v[U][8];
    float mx = 0.0f;
#pragma unroll
    for (int i = 0; i < U; i++) {
        const int u = threadIdx.x + i * (PF_KS * 32);
        const int gi = u >> 4, s = (u >> 2) & 3, q = u & 3, G = lay.gps * s + gi;
#pragma unroll
        for (int j = 0; j < 8; j++) v[i][j] = 0.0f;
        if (u < n_units && gi < lay.gps && G < n_groups) {
            const size_t idx = (size_t)32 * G + 8 * q;
            if (GATE_UP) {
                const uint4 raw = *(const uint4 *)((const bf16 *)act + (size_t)(pair / k_top) * k_in + idx);
                const bf16 *x = (const bf16 *)&raw;
#pragma unroll
                for (int j = 0; j < 8; j++) v[i][j] = __bfloat162float(x[j]);
            } else {
                const uint4 raw = *(const uint4 *)((const __half *)act + (size_t)pair * k_in + idx);
                const __half *x = (const __half *)&raw;
#pragma unroll
                for (int j = 0; j < 8; j++) v[i][j] = __half2float(x[mma_pos(j)]);
            }
#pragma unroll
            for (int j = 0; j < 8; j++) mx = fmaxf(mx, fabsf(v[i][j]));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) red4[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(red4[0], red4[1]), fmaxf(red4[2], red4[3]));
    /* sigma: the largest value into [128, 256) */
    const int e = mx > 0.0f ? (int)((__float_as_uint(mx) >> 23) & 255u) - 127 : 0;
    const int sigma = max(-100, min(100, 7 - e));
    const float up = __uint_as_float((uint32_t)(127 + sigma) << 23);
#pragma unroll
    for (int i = 0; i < U; i++) {
        const int u = threadIdx.x + i * (PF_KS * 32);
        if (u >= n_units) break;
        const int gi = u >> 4, s = (u >> 2) & 3, q = u & 3;
        /* step gi: [k half][column 2s + t][16 bytes], lane q's k bytes 4q..4q+3 */
        uint32_t hi[2] = {0u, 0u}, lo[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            const float2 x = make_float2(v[i][j] * up, v[i][j + 1] * up);
            const __nv_fp8x2_storage_t h2 = __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, __NV_E4M3);
            const float2 hf = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(h2, __NV_E4M3)));
            const __nv_fp8x2_storage_t l2 =
                __nv_cvt_float2_to_fp8x2(make_float2(x.x - hf.x, x.y - hf.y), __NV_SATFINITE, __NV_E4M3);
            /* value j (even) goes to half 0, byte j / 2; value j + 1 to half 1, byte j / 2 */
            hi[0] |= (uint32_t)(h2 & 0xffu) << (4 * j);
            hi[1] |= (uint32_t)(h2 >> 8) << (4 * j);
            lo[0] |= (uint32_t)(l2 & 0xffu) << (4 * j);
            lo[1] |= (uint32_t)(l2 >> 8) << (4 * j);
        }
        uint8_t *step = bt + 256 * gi;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            *(uint32_t *)(step + 128 * half + 16 * (2 * s) + 4 * q) = hi[half];
            *(uint32_t *)(step + 128 * half + 16 * (2 * s + 1) + 4 * q) = lo[half];
        }
    }
    /* the zero bytes of B: columns of other slices' lanes (none written: every byte of a step
     * belongs to exactly one (s, q) unit above), so nothing else is left to clear */
    return __uint_as_float((uint32_t)(127 - sigma) << 23);
}
#endif /* GPTOSS_WGMMA */

template <bool GATE_UP, bool EARLY_BIAS>
static __global__ void __launch_bounds__(PF_KS * 32, 7)
moe_pair_fp8_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const void *act,
                    const int32_t *topk_idx, int32_t k_top, int32_t k_in, int32_t n_out_rows, float limit,
                    float alpha, __half *h_out, float *y_out, int32_t inflight) {
#ifdef GPTOSS_WGMMA
    extern __shared__ __align__(128) uint8_t pf_smem[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[PF_KS][16];
    __shared__ float red4[4];
    const int pair = blockIdx.y, tile = blockIdx.x, n_tiles = n_out_rows >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n_groups = k_in >> 5;
    const uint32_t row_bytes = (uint32_t)n_groups * 16, code_bytes = 16 * row_bytes, scale_bytes = 16 * n_groups;
    const pair_fp8_layout lay = pair_fp8_parts(k_in);
    uint8_t *codes = pf_smem, *sc = pf_smem + lay.scales, *bt = pf_smem + lay.bt;
    const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar);
    const unsigned sm = inflight > 0 ? sm_id() % PT_MAX_SMS : 0u;
    auto issue = [&]() {
        const size_t row0 = (size_t)topk_idx[pair] * n_out_rows + 16 * (size_t)tile;
        if (inflight > 0) pt_take_turn(sm, inflight);
        mbar_expect_tx(bar_s, code_bytes + scale_bytes);
        bulk_copy(codes, blocks + row0 * row_bytes, code_bytes, bar_s);
        bulk_copy(sc, scales + row0 * n_groups, scale_bytes, bar_s);
    };
    if (threadIdx.x == 0) {
        mbar_init(bar_s);
        if (!GATE_UP) {
            issue();
            if (inflight > 0) {
                mbar_wait(bar_s, 0);
                atomicAdd(&pt_copy_landed[sm].v, 1u);
            }
        }
    }
    float2 bv = make_float2(0.0f, 0.0f);
    if (EARLY_BIAS && !GATE_UP) bv = pair_bias<false>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    /* the 16 bytes after the scales are read past the last row's groups (see above) */
    if (threadIdx.x < 4) ((uint32_t *)(sc + scale_bytes))[threadIdx.x] = 0u;
    pdl_wait(); /* gate_up: topk_idx from the router; both: the input */
    if (GATE_UP && threadIdx.x == 0) issue();
    if (EARLY_BIAS && GATE_UP) bv = pair_bias<true>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    const float unscale = pair_fp8_stage<GATE_UP>(act, pair, k_top, k_in, lay, bt, red4);
    fence_proxy_async(); /* B is read by the tensor cores' (async) proxy */
    __syncthreads();     /* B is staged, and every thread sees the initialized barrier */
    mbar_wait(bar_s, 0);
    if (GATE_UP && inflight > 0 && threadIdx.x == 0) atomicAdd(&pt_copy_landed[sm].v, 1u);

    const int la = GATE_UP ? 2 * g : g, lb = GATE_UP ? la + 1 : la + 8;
    const int G0 = lay.gps * warp; /* this slice's first group */
    const uint8_t *ca = codes + la * row_bytes + 16 * G0 + 4 * q, *cb = codes + lb * row_bytes + 16 * G0 + 4 * q;
    const uint8_t *sa = sc + la * n_groups + G0, *sb = sc + lb * n_groups + G0;
    const uint32_t bt_s = (uint32_t)__cvta_generic_to_shared(bt);
    float acc0 = 0.0f, acc1 = 0.0f;
    float d0[4][4], d1[4][4];
    /* column scale 2^(s - 127) * 2^6 (the e4m3 codes are code * 2^-6): the exponent field s + 6 */
    auto scale_window = [&](float (&dw)[4][4], int W) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            wg_pin(dw[i]);
            acc0 = fmaf(dw[i][0] + dw[i][1], __uint_as_float(((uint32_t)sa[4 * W + i] + 6u) << 23), acc0);
            acc1 = fmaf(dw[i][2] + dw[i][3], __uint_as_float(((uint32_t)sb[4 * W + i] + 6u) << 23), acc1);
        }
    };
    auto issue_window = [&](float (&dw)[4][4], int W) {
        uint32_t ea[4], oa[4], eb[4], ob[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            e2m1_to_e4m3(*(const uint32_t *)(ca + 16 * (4 * W + i)), ea[i], oa[i]);
            e2m1_to_e4m3(*(const uint32_t *)(cb + 16 * (4 * W + i)), eb[i], ob[i]);
        }
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < 4; i++) wgmma_e4m3_n8(dw[i], ea[i], eb[i], oa[i], ob[i], pf_desc(bt_s + 256 * (4 * W + i)));
        wgmma_commit();
    };
    /* two accumulator sets: a window's wgmmas run while the previous window is scaled */
#pragma unroll
    for (int W = 0; W < 8; W += 2) { /* nws <= 8 (k_in <= 4096) */
        if (W >= lay.nws) break;
        issue_window(d0, W);
        if (W > 0) {
            wgmma_wait<1>();
            scale_window(d1, W - 1);
        }
        if (W + 1 < lay.nws) {
            issue_window(d1, W + 1);
            wgmma_wait<1>();
            scale_window(d0, W);
        }
    }
    wgmma_wait<0>();
    if (lay.nws & 1) scale_window(d0, lay.nws - 1);
    else if (lay.nws > 0) scale_window(d1, lay.nws - 1);
    /* lane q of warp w holds slice q's token against slice w's codes: keep q == w, in lane q = 0 */
    acc0 = __shfl_sync(0xffffffffu, acc0, (lane & ~3) | warp) * unscale;
    acc1 = __shfl_sync(0xffffffffu, acc1, (lane & ~3) | warp) * unscale;
    if (q != 0) acc0 = acc1 = 0.0f;
    pair_finish<GATE_UP, !EARLY_BIAS>(acc0, acc1, red, PF_KS, 1, tile, n_tiles, pair, bv, bias, topk_idx[pair],
                                      n_out_rows, limit, alpha, h_out, y_out);
#else
    __trap(); /* never launched: the host picks this kernel only on compute capability 9.0 with sm_90a code */
#endif
}

static bool pair_tma_supported = false; /* set by gptoss_cuda_moe_prepare */
static bool pair_fp8_supported = false; /* set by gptoss_cuda_moe_prepare */
static int pair_kernel_choice = -1;     /* gptoss_cuda_moe_set_pair_kernel; -1: not set */

void gptoss_cuda_moe_set_pair_kernel(int kernel) { pair_kernel_choice = kernel; }

/* 1 = the wide kernel, 2 = the TMA kernel, 3 = the FP8 kernel: the TMA kernel wherever it runs
 * unless gptoss_cuda_moe_set_pair_kernel or GPTOSS_CUDA_MOE_PAIR_KERNEL (wide, tma or fp8)
 * says otherwise; a kernel that does not run here falls back to the next one that does. */
int gptoss_cuda_moe_pair_kernel(void) {
    if (pair_kernel_choice < 0) {
        const char *v = getenv("GPTOSS_CUDA_MOE_PAIR_KERNEL");
        pair_kernel_choice = !v ? 0 : strcmp(v, "wide") == 0 ? 1 : strcmp(v, "tma") == 0 ? 2 : strcmp(v, "fp8") == 0 ? 3 : 0;
    }
    if (pair_kernel_choice == 1 || !pair_tma_supported) return 1;
    if (pair_kernel_choice == 3 && pair_fp8_supported) return 3;
    return 2;
}

/* The TMA kernel's copies in flight per SM (pt_take_turn): GPTOSS_CUDA_MOE_INFLIGHT=N, 0 for
 * no limit; 3 when unset (H100, tg128: 2 gained 1.5-2%, 3 2.0-2.3%, 4 0.7-1%). With the
 * variable set, the number of waits that gave up is printed at exit (a diagnostic: 0 in every
 * run measured). */
static void pair_tma_report(void) {
    unsigned long long n = 0;
    if (cudaMemcpyFromSymbol(&n, pt_copy_giveups, sizeof n) == cudaSuccess)
        fprintf(stderr, "moe in-flight limit: %llu waits gave up\n", n);
}
static int32_t pair_tma_inflight(void) {
    static int32_t n = -1;
    if (n < 0) {
        const char *v = getenv("GPTOSS_CUDA_MOE_INFLIGHT");
        n = v ? (atoi(v) > 0 ? atoi(v) : 0) : 3;
        if (v && n > 0) atexit(pair_tma_report);
    }
    return n;
}

template <bool GATE_UP>
static void pair_mma_launch(const uint8_t *blocks, const uint8_t *scales, const float *bias, const void *act,
                            const int32_t *topk_idx, int32_t n_pairs, int32_t k_top, int32_t k_in, int32_t n_out,
                            const gptoss_cuda_moe_weights *w, __half *h, float *y, cudaStream_t stream) {
    const int tiles = n_out / 16;
    /* Steps of up to 8 pairs load the biases early (H100, one token: 120b tg128 +1.6%, 20b
     * +1.3%); larger steps load them after the reduction: with early loads, steps of 32 to 96
     * pairs ran 1.5-2% slower, without them 1.1-1.7% faster than before the split (bench -b 8,
     * 16, 24 on 120b, 7 on 20b). */
    const int kernel = gptoss_cuda_moe_pair_kernel();
    if (kernel == 3)
        launch_pdl(n_pairs <= GPTOSS_MOE_PAIR_MAX ? moe_pair_fp8_kernel<GATE_UP, true>
                                                  : moe_pair_fp8_kernel<GATE_UP, false>,
                   dim3(tiles, n_pairs), dim3(PF_KS * 32), pair_fp8_smem(k_in), stream, blocks, scales, bias, act,
                   topk_idx, k_top, k_in, n_out, w->swiglu_limit, w->swiglu_alpha, h, y, pair_tma_inflight());
    else if (kernel == 2)
        launch_pdl(n_pairs <= GPTOSS_MOE_PAIR_MAX ? moe_pair_tma_kernel<GATE_UP, true>
                                                  : moe_pair_tma_kernel<GATE_UP, false>,
                   dim3(tiles, n_pairs), dim3(PT_KS * 32), pair_tma_smem(k_in), stream, blocks, scales, bias, act,
                   topk_idx, k_top, k_in, n_out, w->swiglu_limit, w->swiglu_alpha, h, y, pair_tma_inflight());
    else
        launch_pdl(moe_pair_wide_kernel<GATE_UP>, dim3((tiles + PM_TPB - 1) / PM_TPB, n_pairs),
                   dim3(PM_KS * PM_TPB * 32), (size_t)k_in * sizeof(__half), stream, blocks, scales, bias, act,
                   topk_idx, k_top, k_in, n_out, w->swiglu_limit, w->swiglu_alpha, h, y);
}

static void launch_pair_mma(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                            int32_t n_pairs, int32_t k_top, __half *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    pair_mma_launch<true>(w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias, (const void *)t, topk_idx, n_pairs,
                          k_top, H, 2 * I, w, h, (float *)nullptr, stream);
    pair_mma_launch<false>(w->down_blocks, w->down_scales, w->down_bias, (const void *)h, topk_idx, n_pairs, k_top, I,
                           H, w, (__half *)nullptr, y, stream);
}

/* min and max of bytes (out[0] = min, out[1] = max; out starts at {255, 0}) */
static __global__ void u8_range_kernel(const uint8_t *p, size_t n, unsigned *out) {
    unsigned lo = 255, hi = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = p[i];
        lo = min(lo, v);
        hi = max(hi, v);
    }
    for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&out[0], lo);
        atomicMax(&out[1], hi);
    }
}

/* out[2] = max |x| as float bits (non-negative floats order like their bits; NaN -> huge) */
static __global__ void absmax_kernel(const float *x, int32_t n, unsigned *out) {
    unsigned m = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = fabsf(x[i]);
        m = max(m, v == v ? __float_as_uint(v) : 0x7f800000u);
    }
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(&out[2], m);
}

cudaError_t gptoss_cuda_moe_check_mma(gptoss_cuda_moe_weights *w, const float *input_gain, unsigned *scratch,
                                      cudaStream_t stream) {
    w->mma_ok = false;
    w->pair_mma_ok = false;
    w->wg_ok = false;
    size_t E = (size_t)w->n_experts, H = (size_t)w->hidden, I = (size_t)w->intermediate;
    unsigned init[4] = {255u, 0u, 0u, 0u}, got[4];
    cudaError_t err = cudaMemcpyAsync(scratch, init, sizeof init, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return err;
    u8_range_kernel<<<512, 256, 0, stream>>>(w->gate_up_scales, E * 2 * I * (H / 32), scratch);
    u8_range_kernel<<<512, 256, 0, stream>>>(w->down_scales, E * H * (I / 32), scratch);
    if (input_gain) absmax_kernel<<<8, 256, 0, stream>>>(input_gain, (int32_t)H, scratch);
    err = cudaMemcpyAsync(got, scratch, sizeof got, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) return err;
    float gain_f;
    memcpy(&gain_f, &got[2], sizeof gain_f);
    double gain = gain_f;
    double in_bound = sqrt((double)H) * gain, h_bound = (double)w->swiglu_limit * ((double)w->swiglu_limit + 1.0);
    bool fp16_ok = in_bound < 32768.0 && isfinite(h_bound) && h_bound < 32768.0 && H % 32 == 0 && I % 32 == 0 &&
                   (int32_t)H <= mma_prepared_width && (int32_t)I <= mma_prepared_width;
    w->mma_ok = fp16_ok && got[0] >= 104 && got[1] <= 128;
    w->wg_ok = w->mma_ok && wg_supported && H % 64 == 0 && I % 64 == 0;
    w->pair_mma_ok = fp16_ok && got[1] <= 240; /* scales applied in fp32: 2^(s - 113) must be finite */
    return cudaSuccess;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

/* Path 6 where experts average at least GPTOSS_CUDA_MOE_WG_MIN rows (default 24): its MMAs
 * are at least 32 columns wide, path 4's 8. Measured on an H100 (bench -b, depth 512): at 8
 * and 12 rows per expert (120b x256, x384) path 6 was 16% and 15% slower, at 32 (20b x256)
 * 7.5% faster; 24 sits between. */
static bool wg_worth(int32_t n_tokens, int32_t k_top, int32_t n_experts) {
    static int32_t min_avg = -1;
    if (min_avg < 0) {
        const char *v = getenv("GPTOSS_CUDA_MOE_WG_MIN");
        min_avg = v && atoi(v) >= 1 ? atoi(v) : 24;
    }
    int32_t pairs = n_tokens * k_top;
    int32_t active = pairs < n_experts ? pairs : n_experts;
    return active > 0 && pairs >= (int64_t)min_avg * active;
}

/*
 * Path 5 for steps of several tokens while their pairs number at most 7/8 of the experts: one
 * block per (pair, 16 rows), so an expert that several tokens chose is read once per pair,
 * where path 4 reads it once. Path 4's blocks each stream 192 rows through a 4-stage pipeline
 * and spend instructions on 8-row tiles that hold one or two rows here, while path 5's many
 * small blocks keep more copies in flight. Measured on an H100 (bench -b, depth 512, FP8 KV;
 * tok/s path 4 -> 5):
 *   120b: x2 366 -> 478, x4 493 -> 655, x8 688 -> 879, x16 1034 -> 1237, x24 1246 -> 1345,
 *         x32 1431 -> 1392, x64 2187 -> 1482 (crossing near 28 tokens, 112 pairs);
 *   20b:  x2 565 -> 695, x4 809 -> 968, x6 1020 -> 1181, x7 1134 -> 1251, x8 1240 -> 1315,
 *         x12 1882 -> 1728 (crossing near 9 tokens, 36 pairs).
 * GPTOSS_CUDA_MOE_PAIR_TOKENS=N replaces the rule by "up to N tokens" (1: one token only, as
 * before), for measurements.
 */
static bool pair_path_worth(int32_t n_tokens, int32_t k_top, int32_t n_experts) {
    static int32_t max_tokens = -1;
    if (max_tokens < 0) {
        const char *v = getenv("GPTOSS_CUDA_MOE_PAIR_TOKENS");
        max_tokens = v && atoi(v) >= 1 ? atoi(v) : 0;
    }
    int64_t pairs = (int64_t)n_tokens * k_top;
    if (pairs > GPTOSS_MOE_PAIR5_MAX) return false;
    return max_tokens > 0 ? n_tokens <= max_tokens : 8 * pairs <= 7 * (int64_t)n_experts;
}

int gptoss_cuda_moe_choose_path(int path, int32_t n_tokens, int32_t k_top, const gptoss_cuda_moe_weights *w) {
    bool few = n_tokens * k_top <= GPTOSS_MOE_PAIR_MAX;
    if (path == 3 && !few) path = 0; /* too many pairs */
    if (path == 5 && n_tokens * k_top > GPTOSS_MOE_PAIR5_MAX) path = 0;
    if (path == 0 && n_tokens > 1 && w->pair_mma_ok && pair_path_worth(n_tokens, k_top, w->n_experts)) return 5;
    if (path == 6 && !w->wg_ok) path = 4;           /* no sm_90 here, or widths it does not take */
    if (path == 4 && !w->mma_ok) path = 0;          /* not exact for this layer */
    if (path == 5 && !w->pair_mma_ok) path = few ? 3 : 0;
    if (path != 0) return path;
    if (n_tokens == 1 && few) return w->pair_mma_ok ? 5 : 3;
    if (w->wg_ok && wg_worth(n_tokens, k_top, w->n_experts)) return 6;
    if (w->mma_ok) return 4;
    /* Measured on an H100 (120b shape, batched decode of ~87 tokens, ~2.7 rows per expert):
     * the GEMV path took 95.6 ms per step against 85.0 for the GEMM, although the GEMM's
     * 64-row tiles are mostly empty there; both are instruction-bound at that size. So the
     * GEMV only for small steps, whatever the expert count. */
    return n_tokens <= 16 ? 1 : 2;
}

void gptoss_cuda_moe(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                     int32_t k_top, const int32_t *topk_idx, const gptoss_cuda_route *route, void *h_mem,
                     float *y, int path, cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    if (n_pairs <= 0) return;
    int32_t H = w->hidden, I = w->intermediate;
    bf16 *h = (bf16 *)h_mem;
    path = gptoss_cuda_moe_choose_path(path, n_tokens, k_top, w);
    if (path == 6) {
        moe_wg(w, t, n_tokens, k_top, route, (__half *)h_mem, y, stream);
    } else if (path == 5) {
        launch_pair_mma(w, t, topk_idx, n_pairs, k_top, (__half *)h_mem, y, stream);
    } else if (path == 4) {
        moe_mma(w, t, n_tokens, k_top, route, (__half *)h_mem, y, stream);
    } else if (path == 3) {
        launch_pair_gemv(w, t, topk_idx, n_pairs, k_top, h, y, stream);
    } else if (path == 1) {
        int32_t slots = n_pairs < w->n_experts ? n_pairs : w->n_experts;
        if (n_tokens <= 1) launch_gemv<1>(w, t, route, slots, h, y, stream);
        else if (n_tokens <= 2) launch_gemv<2>(w, t, route, slots, h, y, stream);
        else if (n_tokens <= 4) launch_gemv<4>(w, t, route, slots, h, y, stream);
        else launch_gemv<8>(w, t, route, slots, h, y, stream);
    } else {
        int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, GPTOSS_MOE_TILE_M);
        dim3 g1((2 * I + GEMM_BN - 1) / GEMM_BN, tiles);
        moe_gemm_kernel<true><<<g1, 128, 0, stream>>>(w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias,
                                                      t, H, 2 * I, *route, w->swiglu_limit,
                                                      w->swiglu_alpha, h, nullptr);
        dim3 g2((H + GEMM_BN - 1) / GEMM_BN, tiles);
        moe_gemm_kernel<false><<<g2, 128, 0, stream>>>(w->down_blocks, w->down_scales, w->down_bias, h,
                                                       I, H, *route, w->swiglu_limit, w->swiglu_alpha,
                                                       nullptr, y);
    }
}

/* Raises the dynamic shared-memory limit of the GEMV kernels (hidden sizes above 3072). */
cudaError_t gptoss_cuda_moe_prepare(int32_t hidden, int32_t intermediate) {
    int32_t widest = hidden > intermediate ? hidden : intermediate;
    if (widest > 32 * 32 * GEMV_MAX_GROUPS_PER_LANE) return cudaErrorInvalidValue;
    int bytes = (int)(GEMV_MAX_TOKENS * widest * sizeof(bf16));
    cudaError_t err = cudaSuccess;
#define RAISE(GU, T)                                                                                   \
    if (err == cudaSuccess)                                                                            \
        err = cudaFuncSetAttribute(moe_gemv_kernel<GU, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    RAISE(true, 1) RAISE(true, 2) RAISE(true, 4) RAISE(true, 8)
    RAISE(false, 1) RAISE(false, 2) RAISE(false, 4) RAISE(false, 8)
#undef RAISE
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(moe_pair_gemv_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)(widest * sizeof(float)));
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(moe_pair_gemv_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)(widest * sizeof(float)));
#define RAISE_MMA(BN)                                                                                    \
    if (err == cudaSuccess)                                                                              \
        err = cudaFuncSetAttribute(moe_mma_kernel<true, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                   (int)mma_cfg<BN>::smem(widest / 32));                                 \
    if (err == cudaSuccess)                                                                              \
        err = cudaFuncSetAttribute(moe_mma_kernel<false, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                   (int)mma_cfg<BN>::smem(widest / 32));
    RAISE_MMA(8) RAISE_MMA(16) RAISE_MMA(32) RAISE_MMA(64) RAISE_MMA(128)
#undef RAISE_MMA
    if (err == cudaSuccess) mma_prepared_width = widest;
    /* path 6: compute capability 9.0 only (its kernels are built for sm_90a alone), and only
     * where the device grants the shared memory; otherwise the other paths run */
    int dev = 0, major = 0, minor = 0;
    bool wg = err == cudaSuccess && cudaGetDevice(&dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
              major == 9 && minor == 0 && hidden % 64 == 0 && intermediate % 64 == 0;
#define RAISE_WG(BN)                                                                                     \
    if (wg)                                                                                              \
        wg = cudaFuncSetAttribute(moe_wg_kernel<true, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                  (int)wg_cfg<BN>::smem(widest / 32)) == cudaSuccess &&                  \
             cudaFuncSetAttribute(moe_wg_kernel<false, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                  (int)wg_cfg<BN>::smem(widest / 32)) == cudaSuccess;
    RAISE_WG(WG_BN)
#undef RAISE_WG
    if (err == cudaSuccess) (void)cudaGetLastError(); /* a refused path-6 attribute is not an error */
    wg_supported = wg;
#ifdef GPTOSS_MOE_TRACE
    trace_init();
#endif
    /* the TMA pair kernel wherever the code that runs was built for compute capability 9.0 or
     * later (its body is a trap below that, as in a JIT of older PTX) */
    pair_tma_supported = err == cudaSuccess && gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<true, true>) &&
                         gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<false, true>) &&
                         gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<true, false>) &&
                         gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<false, false>);
    /* the FP8 pair kernel: wgmma, so compute capability 9.0 with sm_90a code, as path 6 */
    pair_fp8_supported = pair_tma_supported && major == 9 && minor == 0 &&
                         gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<true, true>) &&
                         gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<false, true>) &&
                         gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<true, false>) &&
                         gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<false, false>);
    if (err == cudaSuccess) (void)cudaGetLastError();
    return err;
}
