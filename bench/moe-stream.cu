// bench/moe-stream.cu - how fast the expert weights of a batched decode step can be streamed in
// the access orders an expert GEMM can take, without the arithmetic: the 120b gate_up shape
// (128 experts x 5760 rows x 1440 code bytes), the experts a 64-token step touches (113 of 128,
// about 0.94 GB), one block per (192-row block, expert) as the mma GEMM launches.
//   rows C: the mma GEMM's order: each pipeline step copies C bytes of each of the block's 192
//           rows (cp.async, 16 bytes a copy); the GEMM's is C = 64 on 4 stages, so a row's 1440
//           bytes arrive in 23 pieces spread over the block's life;
//   slab:   16-row slabs (16 x 1440 = 23 KB, contiguous in the checkpoint) by one bulk copy each
//           (cp.async.bulk on an mbarrier), a ring of SLOTS slabs per block;
//   shares: each block reads its 276 KB as one contiguous stream of 16-byte loads (a bound).
// Events; median of 9. Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I include -I src -o moe-stream \
//     bench/moe-stream.cu && ./moe-stream
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "backend/cuda/kernels/ptx.cuh"
#include "event-timer.cuh"
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e = (x);                                                                       \
        if (e) {                                                                                   \
            printf("%s: %s\n", #x, cudaGetErrorString(e));                                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

constexpr int N_EXP = 128, ROWS = 5760, ROW_BYTES = 1440, BLOCK_ROWS = 192;

static __device__ __forceinline__ void cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
}

template <int CB, int STAGES>
__global__ void __launch_bounds__(192) rows(const uint8_t *w, const int *experts, unsigned *sink) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int e = experts[blockIdx.y], tid = threadIdx.x;
    const uint8_t *base = w + ((size_t)e * ROWS + (size_t)blockIdx.x * BLOCK_ROWS) * ROW_BYTES;
    const int nkb = (ROW_BYTES + CB - 1) / CB;
    constexpr int PER_ROW = CB / 16, PER_THREAD = BLOCK_ROWS * PER_ROW / 192;
    auto issue = [&](int kb) {
        uint8_t *s = sm + (kb % STAGES) * BLOCK_ROWS * CB;
#pragma unroll
        for (int i = 0; i < PER_THREAD; i++) {
            const int c = tid + 192 * i, r = c / PER_ROW, j = c % PER_ROW, off = kb * CB + j * 16;
            if (off < ROW_BYTES) cp16(s + r * CB + j * 16, base + (size_t)r * ROW_BYTES + off);
        }
    };
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nkb) issue(s);
        asm volatile("cp.async.commit_group;");
    }
    uint32_t acc = 0;
    for (int kb = 0; kb < nkb; kb++) {
        if (kb + STAGES - 1 < nkb) issue(kb + STAGES - 1);
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1));
        __syncthreads();
        const uint4 v = ((const uint4 *)(sm + (kb % STAGES) * BLOCK_ROWS * CB))[tid];
        acc ^= v.x ^ v.w;
        __syncthreads();
    }
    if (acc == 0x12345678u) *sink = acc;
}

template <int SLOTS>
__global__ void __launch_bounds__(192) slab(const uint8_t *w, const int *experts, unsigned *sink) {
#if defined(__CUDA_ARCH__)
    extern __shared__ __align__(128) uint8_t sm_slab[];
    uint8_t *sm = sm_slab;
    __shared__ __align__(8) uint64_t bar[SLOTS];
    constexpr uint32_t SLAB = 16 * ROW_BYTES;
    constexpr int N_SLABS = BLOCK_ROWS / 16;
    const int e = experts[blockIdx.y];
    const uint8_t *base = w + ((size_t)e * ROWS + (size_t)blockIdx.x * BLOCK_ROWS) * ROW_BYTES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < SLOTS; s++)
            mbar_init((uint32_t)__cvta_generic_to_shared(&bar[s]));
        for (int s = 0; s < SLOTS && s < N_SLABS; s++) {
            const uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar[s]);
            mbar_expect_tx(b, SLAB);
            bulk_copy(sm + s * SLAB, base + (size_t)s * SLAB, SLAB, b);
        }
    }
    __syncthreads();
    uint32_t acc = 0;
    for (int i = 0; i < N_SLABS; i++) {
        const int s = i % SLOTS;
        const uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar[s]);
        mbar_wait(b, (i / SLOTS) & 1);
        const uint4 v = ((const uint4 *)(sm + s * SLAB))[threadIdx.x];
        acc ^= v.x ^ v.w;
        __syncthreads();
        if (threadIdx.x == 0 && i + SLOTS < N_SLABS) {
            mbar_expect_tx(b, SLAB);
            bulk_copy(sm + s * SLAB, base + (size_t)(i + SLOTS) * SLAB, SLAB, b);
        }
    }
    if (acc == 0x12345678u) *sink = acc;
#endif
}

__global__ void shares(const uint8_t *w, const int *experts, unsigned *sink) {
    const int e = experts[blockIdx.y];
    const uint4 *p =
        (const uint4 *)(w + ((size_t)e * ROWS + (size_t)blockIdx.x * BLOCK_ROWS) * ROW_BYTES);
    const int n = BLOCK_ROWS * ROW_BYTES / 16;
    uint32_t acc = 0;
    for (int i = threadIdx.x; i < n; i += 4 * blockDim.x) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = i + u * (int)blockDim.x < n ? __ldg(p + i + u * blockDim.x) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc ^= v[u].x ^ v[u].w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

int main(void) {
    const size_t bytes = (size_t)N_EXP * ROWS * ROW_BYTES;
    uint8_t *w;
    unsigned *sink;
    int *experts;
    CK(cudaMalloc(&w, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(w, 0x5a, bytes)); /* not zeros: the values are xor-ed, never all skipped */
    std::vector<int> pick(N_EXP);
    for (int i = 0; i < N_EXP; i++)
        pick[i] = i;
    srand(7);
    for (int i = N_EXP - 1; i > 0; i--)
        std::swap(pick[i], pick[rand() % (i + 1)]);
    const int n_active = 113;
    CK(cudaMalloc(&experts, sizeof(int) * N_EXP));
    CK(cudaMemcpy(experts, pick.data(), sizeof(int) * N_EXP, cudaMemcpyHostToDevice));
    const dim3 grid(ROWS / BLOCK_ROWS, n_active);
    const double moved = (double)n_active * ROWS * ROW_BYTES;
    auto report = [&](const char *name, float ms) {
        printf("| %-18s | %7.3f | %6.0f |\n", name, ms, moved / (ms * 1e-3) / 1e9);
    };
    printf("| order | ms | GB/s |\n| --- | ---: | ---: |\n");
    report("shares", bench_median_ms([&] { shares<<<grid, 256>>>(w, experts, sink); }, 11, 2));
#define ROWSC(C, S)                                                                                \
    {                                                                                              \
        const size_t smem = (size_t)S * BLOCK_ROWS * C;                                            \
        CK(cudaFuncSetAttribute(rows<C, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)); \
        report("rows " #C " stages " #S,                                                           \
               bench_median_ms([&] { rows<C, S><<<grid, 192, smem>>>(w, experts, sink); }, 11, 2));               \
    }
    ROWSC(64, 3)
    ROWSC(64, 4)
    ROWSC(64, 8)
    ROWSC(128, 3)
    ROWSC(128, 4)
    ROWSC(256, 2)
    ROWSC(256, 3)
    ROWSC(256, 4)
    ROWSC(512, 2)
#define SLAB(S)                                                                                    \
    {                                                                                              \
        const size_t smem = (size_t)S * 16 * ROW_BYTES;                                            \
        CK(cudaFuncSetAttribute(slab<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)); \
        report("slab slots " #S, bench_median_ms([&] { slab<S><<<grid, 192, smem>>>(w, experts, sink); }, 11, 2)); \
    }
    SLAB(1)
    SLAB(2)
    SLAB(3)
    SLAB(4)
    SLAB(6)
    CK(cudaGetLastError());
    return 0;
}
