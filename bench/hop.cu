// bench/hop.cu - what one dependency between two steps of a decode costs on this GPU, with
// almost no work in the steps: N steps, each of which reads a value the step before it wrote
// (block 0 writes the next), run three ways:
//   - kernels captured in a CUDA graph, with and without programmatic dependent launch (the
//     kernel waits with griddepcontrol.wait and then triggers its successor, as the decode
//     kernels do), for several grid shapes: the cost grows with the blocks per SM;
//   - one persistent kernel with a grid barrier (one atomic counter) between steps;
//   - one persistent kernel in which one block releases a flag and every other block acquires
//     it (the cheapest possible hand-over, the floor for a one-kernel decode step).
// Events around 500 steps; median of 7. Build and run on the GPU machine:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o hop bench/hop.cu && ./hop
// Numbers: bench/history/2026-11-25-decode-eighth-pass.md, "what one dependency costs".
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__global__ void step(volatile int *v, int pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  int x = v[0];
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) v[0] = x + 1;
}

__global__ void persist_barrier(volatile int *v, unsigned *count, int n, int sleep_ns) {
  for (int i = 0; i < n; i++) {
    int x = v[0];
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) v[0] = x + 1;
    if (threadIdx.x == 0) {
      const unsigned target = (unsigned)(i + 1) * gridDim.x;
      unsigned cur;
      asm volatile("atom.add.release.gpu.u32 %0, [%1], 1;" : "=r"(cur) : "l"(count) : "memory");
      for (cur++; cur < target;) {
        if (sleep_ns) __nanosleep(sleep_ns);
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(cur) : "l"(count) : "memory");
      }
    }
    __syncthreads();
  }
}

__global__ void persist_flag(unsigned *flag, int n) {
  for (int i = 0; i < n; i++) {
    if (blockIdx.x == (unsigned)(i % gridDim.x)) {
      if (threadIdx.x == 0) asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(flag), "r"(i + 1) : "memory");
    } else if (threadIdx.x == 0) {
      unsigned cur;
      do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(cur) : "l"(flag) : "memory");
      while (cur < (unsigned)(i + 1));
    }
    __syncthreads();
  }
}

static float median_ms(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  const int N = 500;
  int *v;
  unsigned *count;
  CK(cudaMalloc(&v, 4));
  CK(cudaMalloc(&count, 8));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto timed = [&](auto enqueue) {
    std::vector<float> t;
    for (int r = 0; r < 7; r++) {
      CK(cudaMemsetAsync(count, 0, 8, s));
      CK(cudaEventRecord(a, s));
      enqueue();
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    return median_ms(t) * 1000.0f / N;
  };
  struct shape { int blocks, threads; };
  const shape shapes[] = {{1, 1024}, {16, 256}, {sms, 256}, {sms, 512}, {sms, 1024}, {2 * sms, 256},
                          {2 * sms, 512}, {4 * sms, 256}, {8 * sms, 256}, {11 * sms, 192}};
  printf("| steps as | grid | PDL | us per step |\n| --- | --- | --- | ---: |\n");
  for (const shape &sh : shapes)
    for (int pdl = 0; pdl < 2; pdl++) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < N; i++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = sh.blocks;
        cfg.blockDim = sh.threads;
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = pdl;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, step, (volatile int *)v, pdl));
      }
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      const float us = timed([&] { CK(cudaGraphLaunch(ge, s)); });
      printf("| kernels in a graph | %d x %d | %s | %.3f |\n", sh.blocks, sh.threads, pdl ? "yes" : "no", us);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
  for (int blocks : {sms, 2 * sms, 4 * sms})
    for (int sleep_ns : {0, 100}) {
      const float us = timed([&] { persist_barrier<<<blocks, 256, 0, s>>>(v, count, N, sleep_ns); });
      printf("| one kernel, grid barrier (sleep %d ns) | %d x 256 | - | %.3f |\n", sleep_ns, blocks, us);
    }
  for (int blocks : {sms, 4 * sms}) {
    const float us = timed([&] { persist_flag<<<blocks, 256, 0, s>>>(count, N); });
    printf("| one kernel, one block releases a flag | %d x 256 | - | %.3f |\n", blocks, us);
  }
  return 0;
}
