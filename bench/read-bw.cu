// bench/read-bw.cu - the read-only bandwidth this GPU gives for a 1.16 GB stream (the size of
// the bf16 lm_head), in two orders: grid-strided (at any moment the whole grid reads one
// compact window of the buffer) and one contiguous share per block (each block streams its
// own far-apart region, as the GEMV's warps and the expert tiles do), against the device's
// own copy. Events; median of 7. Build and run on the GPU machine:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o read-bw bench/read-bw.cu && ./read-bw
// Numbers: bench/history/2026-11-25-decode-eighth-pass.md, "the read rate of a 1.16 GB stream".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "event-timer.cuh"
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

template <int U>
__global__ void read_strided(const uint4 *p, size_t n, unsigned *sink) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = i + u * stride < n ? __ldg(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

template <int U>
__global__ void read_shares(const uint4 *p, size_t n, unsigned *sink) {
  const size_t per = (n + gridDim.x - 1) / gridDim.x, s = blockIdx.x * per, e = s + per < n ? s + per : n;
  uint32_t acc = 0;
  for (size_t i = s + threadIdx.x; i < e; i += U * blockDim.x) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = i + u * blockDim.x < e ? __ldg(p + i + u * blockDim.x) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

int main() {
  const size_t bytes = 1158000000ull, n = bytes / 16;
  uint4 *p;
  unsigned *sink;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(p, 1, bytes));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto run = [&](const char *name, int bpsm, int th, int u, auto launch) {
    const float ms = bench_median_ms(launch, 7, 0);
    printf("| %s | %d x %d | %d | %.3f | %.0f |\n", name, bpsm, th, u, ms, bytes / ms / 1e6);
  };
  printf("| order | blocks per SM x threads | loads in flight | ms | GB/s |\n| --- | --- | ---: | ---: | ---: |\n");
  for (int bpsm : {2, 4, 8})
    for (int th : {256, 512, 1024}) {
      if (bpsm * th > 2048) continue;
      const int g = sms * bpsm;
      run("strided", bpsm, th, 4, [&] { read_strided<4><<<g, th>>>(p, n, sink); });
      run("strided", bpsm, th, 8, [&] { read_strided<8><<<g, th>>>(p, n, sink); });
      run("a share per block", bpsm, th, 4, [&] { read_shares<4><<<g, th>>>(p, n, sink); });
      run("a share per block", bpsm, th, 8, [&] { read_shares<8><<<g, th>>>(p, n, sink); });
    }
  // a device copy of half the buffer: bytes read + bytes written = bytes
  run("cudaMemcpy device to device (read + write)", 0, 0, 0,
      [&] { CK(cudaMemcpyAsync(p, p + n / 2, bytes / 2, cudaMemcpyDeviceToDevice)); });
  return 0;
}
