/*
 * ptx.cuh - inline PTX and launch wrappers shared by the CUDA kernels: programmatic dependent
 * launch (pdl_wait, pdl_trigger_wait, launch_pdl), mbarrier + bulk copies (sm_90), warp
 * reductions. Static inline: each kernel file compiles its own copy.
 */
#ifndef GPTOSS_CUDA_PTX_CUH
#define GPTOSS_CUDA_PTX_CUH

#include "backend/cuda/cuda_kernels.h"

/*
 * Programmatic dependent launch (sm_90): a kernel launched through launch_pdl may be
 * scheduled while the kernel before it in the stream is still finishing; it must run
 * pdl_wait() in every block before reading anything that kernel (or an earlier one) wrote,
 * and must not exit before that wait (a grid that finished without waiting would let its
 * own successor run ahead of the predecessor). Work that only reads weights (loads of the
 * first weight rows) goes before the wait, which is where the overlap comes from. Off unless
 * gptoss_cuda_set_pdl(true) (the backend turns it on; GPTOSS_CUDA_PDL=0 keeps it off).
 *
 * pdl_wait() also lets the next kernel launch (griddepcontrol.launch_dependents) as soon as
 * this block is past its own wait, not when the grid exits: the successor's blocks then sit
 * beside this kernel's, run their weight-only prologue (the GEMVs' L2 prefetch, the router's
 * row loads) while this kernel works, and wait. Triggering after the wait keeps the early
 * launch one kernel deep: a chain of waiting grids cannot fill the GPU ahead of the kernel
 * that is running (pdl_trigger_wait below is the one exception, two deep).
 */

#ifdef __CUDACC__
static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#ifndef GPTOSS_PDL_NO_TRIGGER
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#endif
}

/*
 * pdl_wait with the trigger first, for a kernel whose successor should launch before this
 * kernel waits. Used by decode attention only: its successor, the O projection, copies its
 * weights before its own wait, and so starts them during RoPE instead of after it (20b tg128
 * +0.5% on an H100). The same in the residual norm before the QKV projection was slower: the
 * projection's blocks then sit waiting beside the experts' last blocks (see bench/CUDA.md,
 * "PDL: triggering before the wait"). A successor must read nothing but weights before its
 * own wait and trigger after it, so the early launch stays two kernels deep; no block is
 * displaced, since a grid launches only once every block of its predecessor has started.
 */
static __device__ __forceinline__ void pdl_trigger_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifndef GPTOSS_PDL_NO_TRIGGER
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* Bulk copies into shared memory (sm_90): one thread arms an mbarrier (arrival count 1) with
 * the bytes to come and issues cp.async.bulk copies that complete on it; every thread that
 * reads the data waits for the phase. The barrier's address is a shared-space address. */
static __device__ __forceinline__ void mbar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    for (uint32_t done = 0; !done;)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
/* One bulk copy global -> shared, completing on bar (which expects the bytes). */
static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes,
                                                 uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"((uint32_t)__cvta_generic_to_shared(dst)),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}
#endif

/* Whether the code this device runs for kernel was built for compute capability 9.0 or later
 * (from sm_90 SASS or PTX, not a JIT of older PTX): the bulk-copy kernels trap otherwise. */
static inline bool gptoss_cuda_runs_sm90_code(const void *kernel) {
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && fa.ptxVersion >= 90 &&
           fa.binaryVersion >= 90;
}

/* Sum and max over the 32 lanes of a warp (every lane gets the result). */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* cp.async groups: closes this thread's copies issued since the last commit into a group; waits
 * until at most N of its committed groups are still in flight. */
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;");
}
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix
 * i, and lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of each (one register each). */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

template <typename... KArgs, typename... Args>
static inline void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = gptoss_cuda_pdl_enabled() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}
#endif

#endif
