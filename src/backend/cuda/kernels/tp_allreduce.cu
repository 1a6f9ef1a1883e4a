/*
 * tp_allreduce.cu - the all-reduce over peer memory of tensor parallelism (tp_allreduce.h).
 *
 * Small sums (decode: one row of hidden_size floats per token) are one kernel instead of an
 * NCCL collective, whose fixed cost (about 15 us on NVLink) is larger than the transfer. Every
 * rank owns a receive area [2 parities][N ranks][slot_floats], flags [P2P_BLOCKS][N] and round
 * counters [P2P_BLOCKS], all in its own GPU memory; with peer access enabled between every
 * pair of GPUs each rank writes straight into its peers' areas.
 *
 * Block b of rank r, in its round e (counters[b] + 1, kept in device memory by the kernel, so
 * a replayed graph advances it like an eager launch): writes its chunk of the input into slot
 * r of parity e & 1 on every rank (its own included), fences, stores e into flag [b][r] of
 * every rank (release, system scope), waits until flags [b][0..N-1] of its own GPU reach e
 * (acquire), then sums slots 0..N-1 in that order into the output: every rank adds the same
 * values in the same order, so every rank gets bitwise the same sum. Flags only grow, so a
 * peer already in round e + 1 does not hide round e. The two parities keep a fast rank off
 * the slots a slow one is still reading: a rank writes parity e & 1 again only in round e + 2,
 * after its peers' flags of round e + 1, which their kernels set after their round e ended.
 * The grid is always P2P_BLOCKS blocks, so the counters of every block stay equal and block b
 * covers the same floats on every rank.
 *
 * The kernel is launched without programmatic dependent launch: it starts after the kernel
 * that wrote its input has finished, and the next one (PDL or not) waits for its end. */

#include "backend/cuda/kernels/tp_allreduce.h"

#define P2P_BLOCKS GPTOSS_CUDA_P2P_BLOCKS
#define P2P_THREADS 256

static __device__ __forceinline__ void p2p_fence_sys(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
    __threadfence_system();
#else
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

static __device__ __forceinline__ void p2p_store_release(uint32_t *p, uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
    __threadfence_system();
    *(volatile uint32_t *)p = v;
#else
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}

static __device__ __forceinline__ uint32_t p2p_load_acquire(const uint32_t *p) {
    uint32_t v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
    v = *(const volatile uint32_t *)p;
    __threadfence_system();
#else
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#endif
    return v;
}

static __device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* buf [n] f32 in place; VEC: buf 16-byte aligned and n a multiple of 4. Block b covers the
 * floats [b c, (b + 1) c) with c a multiple of 4, the same with or without VEC. */
template <int N, bool VEC>
static __global__ void __launch_bounds__(P2P_THREADS)
    p2p_allreduce_kernel(gptoss_cuda_p2p_ptrs a, float *buf, uint32_t n) {
    const uint32_t b = blockIdx.x, tid = threadIdx.x;
    const uint32_t epoch = __ldcg(a.counters + b) + 1; /* every thread, before the barriers */
    const uint32_t par = epoch & 1u;
    const uint32_t per = ((n + 3) / 4 + P2P_BLOCKS - 1) / P2P_BLOCKS * 4;
    const uint32_t lo = min(n, b * per), hi = min(n, (b + 1) * per);
    const size_t area = (size_t)par * N * a.slot_floats;
    const size_t mine = area + (size_t)a.rank * a.slot_floats;
    if (VEC) {
        for (uint32_t i = lo / 4 + tid; i < hi / 4; i += P2P_THREADS) {
            const float4 v = ((const float4 *)buf)[i];
#pragma unroll
            for (int q = 0; q < N; q++)
                ((float4 *)(a.slots[q] + mine))[i] = v;
        }
    } else {
        for (uint32_t i = lo + tid; i < hi; i += P2P_THREADS) {
            const float v = buf[i];
#pragma unroll
            for (int q = 0; q < N; q++)
                a.slots[q][mine + i] = v;
        }
    }
    p2p_fence_sys();
    __syncthreads();
    if (tid < (uint32_t)N) {
        p2p_store_release(a.flags[tid] + b * N + a.rank, epoch);
        const uint32_t *f = a.flags[a.rank] + b * N + tid;
        /* a peer that failed never comes: the abort word ends the wait (the sum is then
         * garbage, and the step fails on the host) */
        for (uint32_t spins = 1; (int32_t)(p2p_load_acquire(f) - epoch) < 0; spins++)
            if ((spins & 1023u) == 0 && *(const volatile uint32_t *)a.abort) break;
    }
    __syncthreads();
    const float *own = a.slots[a.rank] + area;
    if (VEC) {
        for (uint32_t i = lo / 4 + tid; i < hi / 4; i += P2P_THREADS) {
            float4 acc = __ldcg((const float4 *)own + i);
#pragma unroll
            for (int q = 1; q < N; q++)
                acc = add4(acc, __ldcg((const float4 *)(own + (size_t)q * a.slot_floats) + i));
            ((float4 *)buf)[i] = acc;
        }
    } else {
        for (uint32_t i = lo + tid; i < hi; i += P2P_THREADS) {
            float acc = __ldcg(own + i);
#pragma unroll
            for (int q = 1; q < N; q++)
                acc += __ldcg(own + (size_t)q * a.slot_floats + i);
            buf[i] = acc;
        }
    }
    if (tid == 0) a.counters[b] = epoch;
}

template <int N>
static void p2p_launch(const gptoss_cuda_p2p_ptrs &a, float *buf, uint32_t n, cudaStream_t stream) {
    if (n % 4 == 0 && ((uintptr_t)buf & 15) == 0)
        p2p_allreduce_kernel<N, true><<<P2P_BLOCKS, P2P_THREADS, 0, stream>>>(a, buf, n);
    else
        p2p_allreduce_kernel<N, false><<<P2P_BLOCKS, P2P_THREADS, 0, stream>>>(a, buf, n);
}

void gptoss_cuda_p2p_allreduce(const gptoss_cuda_p2p_ptrs *a, int n_ranks, float *buf, uint32_t n,
                               cudaStream_t stream) {
    switch (n_ranks) {
    case 2:
        p2p_launch<2>(*a, buf, n, stream);
        break;
    case 4:
        p2p_launch<4>(*a, buf, n, stream);
        break;
    default:
        p2p_launch<8>(*a, buf, n, stream);
        break;
    }
}
