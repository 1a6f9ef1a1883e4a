/*
 * route.cu - groups the (token, slot) pairs of a MoE layer by expert: expert offsets, sorted
 * rows and the tile list the grouped paths (route GEMV, WMMA GEMM, mma GEMM, wgmma GEMM) read.
 * The pair paths read topk_idx directly and need no route.
 */
#include "backend/cuda/kernels/moe/fp4.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

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
    return sizeof(int32_t) *
           ((size_t)n_experts + 1 + 2 * (size_t)n_pairs + 2 * (size_t)tiles + n_experts);
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

/* One block: count pairs per expert, prefix-sum, list tiles and active experts, scatter. */
static __global__ void route_kernel(const int32_t *topk_idx, int32_t n_pairs, int32_t k_top,
                                    int32_t n_experts, int32_t max_tiles, int32_t tile_rows,
                                    gptoss_cuda_route route) {
    __shared__ int32_t counts[MOE_ROUTE_MAX_EXPERTS];
    __shared__ int32_t cursor[MOE_ROUTE_MAX_EXPERTS];
    pdl_wait(); /* topk_idx comes from the router */
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
        counts[e] = 0;
        route.active_experts[e] = -1;
    }
    for (int i = threadIdx.x; i < max_tiles; i += blockDim.x)
        route.tile_expert[i] = -1;
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x)
        if (topk_idx[i] >= 0) atomicAdd(&counts[topk_idx[i]], 1);
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
        if (topk_idx[i] < 0) continue; /* another GPU's expert */
        int32_t pos = atomicAdd(&cursor[topk_idx[i]], 1);
        route.sorted_token[pos] = i / k_top;
        route.sorted_pair[pos] = i;
    }
}

void gptoss_cuda_moe_route(const int32_t *topk_idx, int32_t n_tokens, int32_t k_top,
                           int32_t n_experts, int path, gptoss_cuda_route *route,
                           cudaStream_t stream) {
    gptoss_cuda_moe_route_rows(topk_idx, n_tokens, k_top, n_experts,
                               path == GPTOSS_MOE_MMA_GEMM
                                   ? gptoss_moe_mma_tile_rows(n_tokens, k_top, n_experts)
                               : path == GPTOSS_MOE_WGMMA_GEMM ? MOE_WGMMA_TILE_ROWS
                                                               : GPTOSS_MOE_TILE_M,
                               route, stream);
}

void gptoss_cuda_moe_route_rows(const int32_t *topk_idx, int32_t n_tokens, int32_t k_top,
                                int32_t n_experts, int32_t tile_rows, gptoss_cuda_route *route,
                                cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    route->tile_rows = tile_rows < GPTOSS_MOE_MIN_TILE ? GPTOSS_MOE_MIN_TILE : tile_rows;
    if (n_pairs <= 0) return;
    launch_pdl(route_kernel, dim3(1), dim3(1024), 0, stream, topk_idx, n_pairs, k_top, n_experts,
               gptoss_cuda_route_tiles(n_pairs, n_experts, route->tile_rows), route->tile_rows,
               *route);
}
