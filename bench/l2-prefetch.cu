// bench/l2-prefetch.cu - does data that one set of blocks prefetches into L2 serve a later read
// by other blocks? For each size: flush L2 (read 1 GB), warm the first N MB of a buffer in one
// of several ways (720 blocks, each a contiguous share: a bulk L2 prefetch by thread 0,
// prefetch.global.L2 per 128-byte line, the same with the evict_last hint, or plain loads),
// wait 30 us, then time a read of those N MB in reversed block order (other SMs than the
// warming ones). Events; median of 5. Build and run on the GPU machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o l2-prefetch bench/l2-prefetch.cu && ./l2-prefetch
// Numbers: bench/history/2026-11-25-decode-seventh-pass.md, "L2 prefetch of the next
// projection's weights".
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
__global__ void flush(const uint4 *b, size_t n, unsigned *sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) acc ^= b[i].x;
  if (acc == 0x12345678) *sink = acc;
}
// mode 1 bulk prefetch (thread 0), 2 per-thread prefetch.global.L2, 3 loads
__global__ void warm(const uint8_t *p, size_t bytes, uint32_t chunk, int mode, unsigned *sink) {
  size_t off = (size_t)blockIdx.x * chunk;
  if (off >= bytes) return;
  uint32_t len = (uint32_t)(bytes - off < chunk ? bytes - off : chunk);
  if (mode == 1) {
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(len) : "memory");
  } else if (mode == 2) {
    for (uint32_t o = threadIdx.x * 128; o < len; o += blockDim.x * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off + o));
  } else if (mode == 4) {
    if (threadIdx.x == 0) {
      uint64_t pol;
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + off), "r"(len), "l"(pol) : "memory");
    }
  } else if (mode == 5) {
    for (uint32_t o = threadIdx.x * 128; o < len; o += blockDim.x * 128) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + off + o));
  } else if (mode == 6) { /* loads, 8 in flight per thread */
    uint32_t acc = 0;
    for (uint32_t o = threadIdx.x * 16; o < len; o += 8 * blockDim.x * 16) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; u++) v[u] = o + u * blockDim.x * 16 < len ? *(const uint4 *)(p + off + o + u * blockDim.x * 16) : make_uint4(0,0,0,0);
#pragma unroll
      for (int u = 0; u < 8; u++) acc ^= v[u].x;
    }
    if (acc == 0x12345678) *sink = acc;
  } else {
    uint32_t acc = 0;
    for (uint32_t o = threadIdx.x * 16; o < len; o += blockDim.x * 16) acc ^= ((const uint4 *)(p + off + o))->x;
    if (acc == 0x12345678) *sink = acc;
  }
}
__global__ void spin(long long ns) {
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); if (t - t0 > (unsigned long long)ns) break; }
}
// read in reversed block order, 8 loads in flight per thread
__global__ void readk(const uint4 *p, size_t n, unsigned *sink) {
  size_t per = (n + gridDim.x - 1) / gridDim.x;
  size_t b = gridDim.x - 1 - blockIdx.x, s = b * per, e = s + per < n ? s + per : n;
  uint32_t acc = 0;
  for (size_t i = s + threadIdx.x; i < e; i += 8 * blockDim.x) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = i + u * blockDim.x < e ? p[i + u * blockDim.x] : make_uint4(0,0,0,0);
#pragma unroll
    for (int u = 0; u < 8; u++) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0x12345678) *sink = acc;
}
int main() {
  const size_t FB = (size_t)1 << 30, AB = (size_t)64 << 20;
  uint8_t *a, *b; unsigned *sink;
  CK(cudaMalloc(&a, AB)); CK(cudaMalloc(&b, FB)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(a, 1, AB)); CK(cudaMemset(b, 2, FB));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t e0, e1, e2; cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&e2);
  const char *names[7] = {"cold", "bulk", "lines", "loads", "bulk evict_last", "lines evict_last", "loads x8"};
  printf("| MB | warm mode | warm kernel us | read us (median of 5) | read GB/s |\n|---|---|---|---|---|\n");
  for (int mb : {8, 16, 32}) {
    size_t bytes = (size_t)mb << 20;
    for (int mode = 0; mode < 7; mode++) {
      float rd[5], wk[5];
      for (int r = 0; r < 5; r++) {
        flush<<<4 * sms, 512>>>((const uint4 *)b, FB / 16, sink);
        cudaEventRecord(e0);
        if (mode) warm<<<720, 192>>>(a, bytes, (uint32_t)(bytes / 720 + 16) & ~15u, mode, sink);
        cudaEventRecord(e1);
        spin<<<1, 32>>>(30000);
        cudaEventRecord(e2);
        readk<<<2 * sms, 512>>>((const uint4 *)a, bytes / 16, sink);
        cudaEvent_t e3; cudaEventCreate(&e3); cudaEventRecord(e3);
        CK(cudaEventSynchronize(e3));
        cudaEventElapsedTime(&wk[r], e0, e1); cudaEventElapsedTime(&rd[r], e2, e3); cudaEventDestroy(e3);
      }
      for (int i = 0; i < 5; i++) for (int j = i + 1; j < 5; j++) { if (rd[j] < rd[i]) { float t = rd[i]; rd[i] = rd[j]; rd[j] = t; } if (wk[j] < wk[i]) { float t = wk[i]; wk[i] = wk[j]; wk[j] = t; } }
      printf("| %d | %s | %.1f | %.1f | %.0f |\n", mb, names[mode], wk[2] * 1e3, rd[2] * 1e3, bytes / (rd[2] * 1e-3) / 1e9);
    }
  }
  CK(cudaGetLastError());
  return 0;
}
