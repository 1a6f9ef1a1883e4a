// bench/fp8-tile.cu - what the arithmetic of one-token MXFP4 expert rows costs on an SM, in two
// forms, with the tile already in shared memory (so only the issue rate counts):
//   fp16: the form the path-5 expert kernel uses (src/backend/cuda/kernels/moe/pair_mma.cu): each lane
//         turns its 4-bit codes into fp16 pairs (11 integer operations per 8 codes) for
//         mma.sync m16n8k16, the four groups of a window kept apart in the MMA's columns and
//         scaled in fp32; 16 rows x 3072 per block, 6 warps (K slices);
//   fp8:  the same products on wgmma m64n8k32 e4m3 (native on sm_90): a code becomes an e4m3
//         byte in 5 logical operations per 8 codes, the bf16 token enters as two e4m3 terms
//         (hi + lo, exact for bf16 values in range), the group of each quarter of k kept apart
//         in the columns as above; 64 rows x 768 per block, one warpgroup.
// Both blocks multiply 49,152 weights per pass; each block makes R passes over its tile.
// Output: time per pass per SM (ns) with every SM full of blocks, and the largest relative
// error of each form's row sums against a double-precision host reference.
// Build and run on the GPU machine:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o fp8-tile bench/fp8-tile.cu && ./fp8-tile
// Numbers: bench/history/2026-11-25-experts-fp8-tensor-cores.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include "event-timer.cuh"
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

static const float kE2M1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

/* ---- fp16 form (path 5's window) ---------------------------------------------------------- */
#define A_ROWS 16
#define A_K 3072
#define A_GROUPS (A_K / 32)
#define A_WARPS 6

__device__ __forceinline__ void fp4_pairs(uint32_t w, uint32_t p[4]) {
  const uint32_t ev = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
  const uint32_t od = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
  p[0] = __byte_perm(ev, 0u, 0x2404);
  p[1] = __byte_perm(od, 0u, 0x2404);
  p[2] = __byte_perm(ev, 0u, 0x3414);
  p[3] = __byte_perm(od, 0u, 0x3414);
}
__device__ __forceinline__ void mma16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// codes [16][A_GROUPS*16], scales [16][A_GROUPS], xs: token as fp16 chunks in the mma layout
// (chunk 4G + w = the 8 values word w of group G multiplies), then one zero window
__global__ void __launch_bounds__(A_WARPS * 32) tile_fp16(const uint8_t *g_codes, const uint8_t *g_scales,
                                                          const uint4 *g_xs, int passes, float *out) {
  extern __shared__ __align__(16) uint8_t sm_a[];
  uint8_t *codes = sm_a, *sc = sm_a + A_ROWS * A_GROUPS * 16;
  uint4 *xs = (uint4 *)(sc + A_ROWS * A_GROUPS);
  const int n_code4 = A_ROWS * A_GROUPS, n_x = A_K / 8 + 16;
  for (int i = threadIdx.x; i < n_code4; i += blockDim.x) ((uint4 *)codes)[i] = ((const uint4 *)g_codes)[i];
  for (int i = threadIdx.x; i < A_ROWS * A_GROUPS; i += blockDim.x) sc[i] = g_scales[i];
  for (int i = threadIdx.x; i < n_x; i += blockDim.x) xs[i] = g_xs[i];
  __syncthreads();
  __shared__ float red[A_WARPS][16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int n_win = A_GROUPS / 4, per = n_win / A_WARPS, w0 = warp * per, w1 = w0 + per;
  const int la = g, lb = g + 8, row_bytes = A_GROUPS * 16;
  const bool owner = (g & 3) == q;
  const uint8_t *ca = codes + la * row_bytes + 16 * q, *cb = codes + lb * row_bytes + 16 * q;
  const uint8_t *sa = sc + la * A_GROUPS + 2 * (q & 1), *sb = sc + lb * A_GROUPS + 2 * (q & 1);
  const uint4 *xw = owner ? xs + 4 * q : xs + A_K / 8;
  const int x_step = owner ? 16 : 0;
  float acc0 = 0.0f, acc1 = 0.0f;
  for (int p = 0; p < passes; p++) {
#pragma unroll 2
    for (int W = w0; W < w1; W++) {
      const uint4 wa4 = *(const uint4 *)(ca + 64 * W), wb4 = *(const uint4 *)(cb + 64 * W);
      const uint32_t s0 = sa[4 * W], s1 = sa[4 * W + 1], s2 = sb[4 * W], s3 = sb[4 * W + 1];
      const uint4 *xp = xw + x_step * W;
      const uint4 b[4] = {xp[0], xp[1], xp[2], xp[3]};
      const uint32_t wa[4] = {wa4.x, wa4.y, wa4.z, wa4.w}, wb[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
      float d1[4] = {0, 0, 0, 0}, d2[4] = {0, 0, 0, 0};
#pragma unroll
      for (int w = 0; w < 4; w++) {
        float(&dd)[4] = w < 2 ? d1 : d2;
        uint32_t pa[4], pb[4];
        fp4_pairs(wa[w], pa);
        fp4_pairs(wb[w], pb);
        mma16(dd, pa[0], pb[0], pa[1], pb[1], b[w].x, b[w].y);
        mma16(dd, pa[2], pb[2], pa[3], pb[3], b[w].z, b[w].w);
      }
      // fp16 codes are code * 2^-14: the column scale is 2^(s - 127 + 14)
      acc0 = fmaf(d1[0] + d2[0], __uint_as_float((s0 + 14u) << 23), acc0);
      acc0 = fmaf(d1[1] + d2[1], __uint_as_float((s1 + 14u) << 23), acc0);
      acc1 = fmaf(d1[2] + d2[2], __uint_as_float((s2 + 14u) << 23), acc1);
      acc1 = fmaf(d1[3] + d2[3], __uint_as_float((s3 + 14u) << 23), acc1);
    }
  }
  // lanes q = 0, 1 hold the four groups of each window; q = 2, 3 repeat them
  acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
  acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
  if (q == 0) red[warp][la] = acc0, red[warp][lb] = acc1;
  __syncthreads();
  if (threadIdx.x < 16) {
    float s = 0.0f;
    for (int w = 0; w < A_WARPS; w++) s += red[w][threadIdx.x];
    out[blockIdx.x * 16 + threadIdx.x] = s / passes;
  }
}

/* ---- fp8 form on wgmma --------------------------------------------------------------------- */
#define B_ROWS 64
#define B_K 768
#define B_GROUPS (B_K / 32)
#define B_WIN (B_GROUPS / 4)
#define B_SIGMA 5 /* the token is scaled by 2^B_SIGMA before its split into e4m3 terms */

__device__ __forceinline__ void e4m3_pair(uint32_t w, uint32_t &ev, uint32_t &od) {
  // code (s, e1, e0, m) -> e4m3 byte s e1 e0 m 0 0 shifted so that the value is code * 2^-6
  ev = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); /* codes 0 2 4 6 (low nibbles) */
  od = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);        /* codes 1 3 5 7 (high nibbles) */
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void pin4(float (&d)[4]) {
#pragma unroll
  for (int i = 0; i < 4; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// K-major, no swizzle: core matrices of 8 rows x 16 bytes; both byte offsets 128 (the second
// k half of the 8 columns follows the first; there is one group of 8 columns)
__device__ __forceinline__ uint64_t desc_b(const void *p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}
__device__ __forceinline__ void wgmma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint64_t desc, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(accumulate));
}

// codes [64][B_GROUPS*16], scales [64][B_GROUPS], bt: per window, per step w (4), 256 bytes of
// B = [k half][column n][16 bytes of k], column n = 2 * quarter + term
__global__ void __launch_bounds__(128) tile_fp8(const uint8_t *g_codes, const uint8_t *g_scales,
                                                const uint8_t *g_bt, int passes, float *out) {
  extern __shared__ __align__(128) uint8_t sm_b[];
  uint8_t *bt = sm_b, *codes = sm_b + B_WIN * 1024, *sc = codes + B_ROWS * B_GROUPS * 16;
  for (int i = threadIdx.x; i < B_WIN * 64; i += blockDim.x) ((uint4 *)bt)[i] = ((const uint4 *)g_bt)[i];
  for (int i = threadIdx.x; i < B_ROWS * B_GROUPS; i += blockDim.x) {
    ((uint4 *)codes)[i] = ((const uint4 *)g_codes)[i];
    sc[i] = g_scales[i];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* B is read by the async proxy */
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  const uint8_t *ca = codes + r0 * B_GROUPS * 16 + 16 * q, *cb = codes + r1 * B_GROUPS * 16 + 16 * q;
  const uint8_t *sa = sc + r0 * B_GROUPS + q, *sb = sc + r1 * B_GROUPS + q;
  float acc0 = 0.0f, acc1 = 0.0f;
  float d[2][4];
  for (int p = 0; p < passes; p++) {
#pragma unroll
    for (int W = 0; W < B_WIN; W++) {
      const uint4 wa4 = *(const uint4 *)(ca + 64 * W), wb4 = *(const uint4 *)(cb + 64 * W);
      const uint32_t wa[4] = {wa4.x, wa4.y, wa4.z, wa4.w}, wb[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
      uint32_t ea[4], oa[4], eb[4], ob[4];
#pragma unroll
      for (int w = 0; w < 4; w++) {
        e4m3_pair(wa[w], ea[w], oa[w]);
        e4m3_pair(wb[w], eb[w], ob[w]);
      }
      float(&dc)[4] = d[W & 1];
      wg_fence();
#pragma unroll
      for (int w = 0; w < 4; w++)
        wgmma_e4m3(dc, ea[w], eb[w], oa[w], ob[w], desc_b(bt + (4 * W + w) * 256), w > 0);
      wg_commit();
      pin4(dc);
      if (W > 0) {
        wg_wait<1>();
        float(&dp)[4] = d[(W - 1) & 1];
        pin4(dp);
        const int G = 4 * (W - 1);
        // e4m3 codes are code * 2^-6, the token is scaled by 2^B_SIGMA: 2^(s - 127 + 6 - B_SIGMA)
        acc0 = fmaf(dp[0] + dp[1], __uint_as_float(((uint32_t)sa[G] + 6u - B_SIGMA) << 23), acc0);
        acc1 = fmaf(dp[2] + dp[3], __uint_as_float(((uint32_t)sb[G] + 6u - B_SIGMA) << 23), acc1);
      }
    }
    wg_wait<0>();
    float(&dp)[4] = d[(B_WIN - 1) & 1];
    pin4(dp);
    const int G = 4 * (B_WIN - 1);
    acc0 = fmaf(dp[0] + dp[1], __uint_as_float(((uint32_t)sa[G] + 6u - B_SIGMA) << 23), acc0);
    acc1 = fmaf(dp[2] + dp[3], __uint_as_float(((uint32_t)sb[G] + 6u - B_SIGMA) << 23), acc1);
  }
  // lane q holds its row's groups 4W + q: add the four quarters
  acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
  acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
  acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
  acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
  if (q == 0) out[blockIdx.x * 64 + r0] = acc0 / passes, out[blockIdx.x * 64 + r1] = acc1 / passes;
}

/* ---- host ---------------------------------------------------------------------------------- */
static uint32_t rng = 12345u;
static uint32_t next_u32() { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float bf16_round(float v) { uint32_t u; memcpy(&u, &v, 4); u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u; memcpy(&v, &u, 4); return v; }
static uint8_t to_e4m3(float v) { __nv_fp8_e4m3 f(v); return *(uint8_t *)&f; }
static float from_e4m3(uint8_t b) { __nv_fp8_e4m3 f; *(uint8_t *)&f = b; return (float)f; }

// reference row sums: sum over groups of 2^(s-127) * sum_i e2m1(code) * x
static void reference(const std::vector<uint8_t> &codes, const std::vector<uint8_t> &scales, const std::vector<float> &x,
                      int rows, int groups, std::vector<double> &ref) {
  ref.assign(rows, 0.0);
  for (int r = 0; r < rows; r++)
    for (int G = 0; G < groups; G++) {
      double s = 0;
      for (int i = 0; i < 32; i++) {
        uint8_t byte = codes[((size_t)r * groups + G) * 16 + i / 2];
        s += kE2M1[(i & 1) ? byte >> 4 : byte & 15] * (double)x[G * 32 + i];
      }
      ref[r] += s * ldexp(1.0, (int)scales[(size_t)r * groups + G] - 127);
    }
}
static double max_rel(const std::vector<float> &got, const std::vector<double> &ref, int rows) {
  double scale = 0, worst = 0;
  for (int r = 0; r < rows; r++) scale = std::max(scale, fabs(ref[r]));
  for (int r = 0; r < rows; r++) worst = std::max(worst, fabs(got[r] - ref[r]) / scale);
  return worst;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  // codes: random nibbles; scales 118..126 (as in trained checkpoints); token bf16 in (-4, 4)
  std::vector<uint8_t> a_codes(A_ROWS * A_GROUPS * 16), a_scales(A_ROWS * A_GROUPS);
  std::vector<uint8_t> b_codes(B_ROWS * B_GROUPS * 16), b_scales(B_ROWS * B_GROUPS);
  for (auto &c : a_codes) c = (uint8_t)next_u32();
  for (auto &c : b_codes) c = (uint8_t)next_u32();
  for (auto &s : a_scales) s = (uint8_t)(118 + next_u32() % 9);
  for (auto &s : b_scales) s = (uint8_t)(118 + next_u32() % 9);
  std::vector<float> xa(A_K), xb(B_K);
  for (auto &v : xa) v = bf16_round(((int)(next_u32() % 20001) - 10000) * 4e-4f);
  for (auto &v : xb) v = bf16_round(((int)(next_u32() % 20001) - 10000) * 4e-4f);

  // fp16 form: token chunks in the mma layout, then a zero window
  std::vector<__half> a_xs((A_K / 8 + 16) * 8, __float2half(0.0f));
  for (int c = 0; c < A_K / 8; c++)
    for (int j = 0; j < 8; j++) a_xs[c * 8 + (((j & 3) << 1) | (j >> 2))] = __float2half(xa[c * 8 + j]);
  // fp8 form: B per window and step; hi + lo of x * 2^B_SIGMA
  std::vector<uint8_t> bt(B_WIN * 1024, 0);
  double split_err = 0;
  for (int W = 0; W < B_WIN; W++)
    for (int w = 0; w < 4; w++)
      for (int half = 0; half < 2; half++)
        for (int qq = 0; qq < 4; qq++)
          for (int j = 0; j < 4; j++) {
            const float v = ldexpf(xb[32 * (4 * W + qq) + 8 * w + 2 * j + half], B_SIGMA);
            const uint8_t hi = to_e4m3(v), lo = to_e4m3(v - from_e4m3(hi));
            split_err = std::max(split_err, (double)fabsf(from_e4m3(hi) + from_e4m3(lo) - v));
            uint8_t *base = bt.data() + (4 * W + w) * 256 + half * 128;
            base[(2 * qq) * 16 + 4 * qq + j] = hi;
            base[(2 * qq + 1) * 16 + 4 * qq + j] = lo;
          }

  uint8_t *d_ac, *d_as, *d_bc, *d_bs, *d_bt;
  uint4 *d_axs;
  CK(cudaMalloc(&d_ac, a_codes.size() + 64));
  CK(cudaMalloc(&d_as, a_scales.size() + 64));
  CK(cudaMalloc(&d_bc, b_codes.size() + 64));
  CK(cudaMalloc(&d_bs, b_scales.size() + 64));
  CK(cudaMalloc(&d_bt, bt.size()));
  CK(cudaMalloc(&d_axs, a_xs.size() * 2));
  CK(cudaMemcpy(d_ac, a_codes.data(), a_codes.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_as, a_scales.data(), a_scales.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_bc, b_codes.data(), b_codes.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_bs, b_scales.data(), b_scales.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_bt, bt.data(), bt.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_axs, a_xs.data(), a_xs.size() * 2, cudaMemcpyHostToDevice));

  const size_t a_smem = A_ROWS * A_GROUPS * 17 + (A_K / 8 + 16) * 16;
  const size_t b_smem = B_WIN * 1024 + B_ROWS * B_GROUPS * 17;
  CK(cudaFuncSetAttribute(tile_fp16, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)a_smem));
  CK(cudaFuncSetAttribute(tile_fp8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b_smem));
  int a_per_sm = 0, b_per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&a_per_sm, tile_fp16, A_WARPS * 32, a_smem));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b_per_sm, tile_fp8, 128, b_smem));

  // correctness: one block, one pass
  float *d_out;
  const int waves = 4, passes = 32;
  const int a_blocks = sms * a_per_sm * waves, b_blocks = sms * b_per_sm * waves;
  CK(cudaMalloc(&d_out, (size_t)std::max(a_blocks * 16, b_blocks * 64) * 4));
  std::vector<double> ra, rb;
  reference(a_codes, a_scales, xa, A_ROWS, A_GROUPS, ra);
  reference(b_codes, b_scales, xb, B_ROWS, B_GROUPS, rb);
  tile_fp16<<<1, A_WARPS * 32, a_smem>>>(d_ac, d_as, d_axs, 1, d_out);
  CK(cudaGetLastError());
  std::vector<float> ga(A_ROWS), gb(B_ROWS);
  CK(cudaMemcpy(ga.data(), d_out, A_ROWS * 4, cudaMemcpyDeviceToHost));
  tile_fp8<<<1, 128, b_smem>>>(d_bc, d_bs, d_bt, 1, d_out);
  CK(cudaGetLastError());
  CK(cudaMemcpy(gb.data(), d_out, B_ROWS * 4, cudaMemcpyDeviceToHost));
  const double ea = max_rel(ga, ra, A_ROWS), eb = max_rel(gb, rb, B_ROWS);

  // timing: every SM full of blocks, 4 waves, 32 passes per block
  const double ta = bench_median_ms([&] { tile_fp16<<<a_blocks, A_WARPS * 32, a_smem>>>(d_ac, d_as, d_axs, passes, d_out); }, 9, 2);
  const double tb = bench_median_ms([&] { tile_fp8<<<b_blocks, 128, b_smem>>>(d_bc, d_bs, d_bt, passes, d_out); }, 9, 2);
  CK(cudaGetLastError());
  const double na = ta * 1e6 * sms / ((double)a_blocks * passes), nb = tb * 1e6 * sms / ((double)b_blocks * passes);
  printf("device: %s, %d SMs\n", prop.name, sms);
  printf("token split into two e4m3 terms: largest |hi + lo - x| = %.3g (0 = exact)\n\n", split_err);
  printf("| form | rows x k per block | warps | blocks per SM | ns per pass per SM (49,152 weights) | weights per SM-ns | max rel. error |\n");
  printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  printf("| fp16 mma.sync (path 5) | 16 x %d | %d | %d | %.1f | %.0f | %.1e |\n", A_K, A_WARPS, a_per_sm, na,
         49152.0 / na, ea);
  printf("| e4m3 wgmma | 64 x %d | 4 | %d | %.1f | %.0f | %.1e |\n", B_K, b_per_sm, nb, 49152.0 / nb, eb);
  printf("\nfp8 / fp16 time per weight: %.2f\n", nb / na);
  return (ea < 1e-4 && eb < 1e-4) ? 0 : 1;
}
