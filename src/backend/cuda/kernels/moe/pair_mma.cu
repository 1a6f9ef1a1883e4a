/*
 * pair_mma.cu - GPTOSS_MOE_PAIR_MMA: decode steps of few pairs on the tensor cores, one block
 * per (pair, 16 weight rows), no route. Three kernels: wide (mma.sync, any GPU), TMA (bulk
 * copies, sm_90+) and FP8 (wgmma e4m3, sm_90a), and the in-flight copy limiter of the TMA
 * and FP8 kernels.
 */
#include "backend/cuda/kernels/moe/wgmma.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

#include <cuda_fp8.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- mma pair GEMV (GPTOSS_MOE_PAIR_MMA): decode steps of few pairs on the tensor cores ------ */

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
 * in shared memory as fp16 in the mma layout (the mma GEMM's): the values that word w of group G
 * multiplies are chunk 4G + w.
 *
 * K slices add in shared memory; gate_up's epilogue applies bias and SwiGLU and writes h by
 * pair as fp16 (rounded to bf16 first) in the mma layout, which down stages directly.
 *
 * Two kernels stream the codes:
 * - moe_pair_tma_kernel (sm_90 and up): one block per tile and pair, 6 warps (K slices,
 *   MOE_PAIR_TMA_K_SLICES). One thread copies the tile's 16 rows of codes and of scale bytes
 *   (contiguous in the checkpoint) into shared memory with two bulk copies (cp.async.bulk,
 *   completing on an mbarrier), so the whole tile is in flight at once without holding registers:
 *   ~30 KB per block and 7 blocks per SM at the 20b/120b shapes.
 * - moe_pair_wide_kernel (older GPUs): the same arithmetic with each lane's 16-byte loads in
 *   registers, one window ahead; 8 warps = 2 tiles x 4 K slices per block.
 *
 * The wide kernel's registers cap a block at 16-32 warps per SM, too little in flight for the
 * memory latency, which is why the TMA kernel exists; 6 K slices per tile measured best for
 * it (see bench/CUDA.md, "The pair mma kernels: what was tried").
 */

/* The token (gate_up: bf16 row pair / k_top of act; down: h of this pair, already fp16 in the
 * mma layout) into shared memory as fp16 chunks in the mma layout. */
template <bool GATE_UP>
static __device__ __forceinline__ void pair_stage_input(const void *act, int pair, int32_t k_top,
                                                        int32_t k_in, uint4 *xs) {
    if (GATE_UP) {
        const bf16 *src = (const bf16 *)act + (size_t)(pair / k_top) * k_in;
        for (int ci = threadIdx.x; ci < (k_in >> 3); ci += blockDim.x) {
            uint4 v = *(const uint4 *)(src + (size_t)ci * 8);
            const bf16 *x = (const bf16 *)&v;
            __align__(16) __half o[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                o[mma_pos(j)] = __float2half_rn(__bfloat162float(x[j]));
            xs[ci] = *(const uint4 *)o;
        }
    } else {
        const uint4 *src = (const uint4 *)((const __half *)act + (size_t)pair * k_in);
        for (int ci = threadIdx.x; ci < (k_in >> 3); ci += blockDim.x)
            xs[ci] = src[ci];
    }
}

/* One window's codes of rows a and b (ca / cb: one lane's group) as the fp16 pairs the MMAs
 * take: pa[w] / pb[w] from word w. */
static __device__ __forceinline__ void pair_window_convert(uint4 ca, uint4 cb, uint32_t (&pa)[4][4],
                                                           uint32_t (&pb)[4][4]) {
    const uint32_t wa[4] = {ca.x, ca.y, ca.z, ca.w};
    const uint32_t wb[4] = {cb.x, cb.y, cb.z, cb.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        mma_fp4_pairs(wa[w], pa[w]);
        mma_fp4_pairs(wb[w], pb[w]);
    }
}

/* The MMAs of one window (groups G .. G + 3) of one lane on converted codes: b the token
 * chunks its four words multiply (zeros where the lane holds no token values). d gets columns
 * 2q and 2q + 1 of rows a (d[0], d[1]) and b (d[2], d[3]), unscaled. */
static __device__ __forceinline__ void pair_window_dot(const uint32_t (&pa)[4][4],
                                                       const uint32_t (&pb)[4][4],
                                                       const uint4 (&b)[4], float (&d)[4]) {
    /* two accumulators (words 0-1 and 2-3: the same groups) halve the chain of dependent MMAs */
    float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        float(&dd)[4] = w < 2 ? d1 : d2;
        mma_f16(dd, pa[w][0], pb[w][0], pa[w][1], pb[w][1], b[w].x, b[w].y);
        mma_f16(dd, pa[w][2], pb[w][2], pa[w][3], pb[w][3], b[w].z, b[w].w);
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
        d[i] = d1[i] + d2[i];
}

/* Both: ca / cb the lane's group codes of rows a and b. (Converting each word just before its
 * two MMAs instead measured the same: 120b tg128 361.5 / 360.0 against 361.8 / 361.2, H100.) */
static __device__ __forceinline__ void pair_window_mma(uint4 ca, uint4 cb, const uint4 (&b)[4],
                                                       float (&d)[4]) {
    uint32_t pa[4][4], pb[4][4];
    pair_window_convert(ca, cb, pa, pb);
    pair_window_dot(pa, pb, b, d);
}

/* One window of the wide kernel: pair_window_mma, then the column scales; s4 the scale bytes
 * of groups G + 2q and G + 2q + 1 of row a (low half) and row b (zero for q >= 2, whose column
 * copies pair_finish drops). */
static __device__ __forceinline__ void pair_window(uint4 ca, uint4 cb, uint32_t s4, int G, int q,
                                                   bool owner, int n_groups, const uint4 *xs,
                                                   float &acc0, float &acc1) {
    const bool has_x = owner && G + q < n_groups;
    uint4 b[4];
#pragma unroll
    for (int w = 0; w < 4; w++)
        b[w] = has_x ? xs[4 * (G + q) + w] : make_uint4(0, 0, 0, 0);
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
    return (h0 ? (uint32_t)sa[g0] : 0u) | (h1 ? (uint32_t)sa[g1] << 8 : 0u) |
           (h0 ? (uint32_t)sb[g0] << 16 : 0u) | (h1 ? (uint32_t)sb[g1] << 24 : 0u);
}

/* The bias values pair_finish adds in this thread (gate_up: the gate and up biases of its unit;
 * down: its row's bias in .x), zero for threads that write nothing. Loaded as soon as the
 * expert is known, so that the load's latency (a DRAM trip: each layer's biases are read once
 * per step) is not added to the end of the block. */
template <bool GATE_UP>
static __device__ __forceinline__ float2 pair_bias(const float *bias, int e, int32_t n_out_rows,
                                                   int tpb, int tile0, int n_tiles) {
    const float *ebias = bias + (size_t)e * n_out_rows;
    const int tid = threadIdx.x;
    if (GATE_UP) {
        const int tt = tile0 + (tid >> 3);
        if (tid < tpb * 8 && tt < n_tiles)
            return *(const float2 *)(ebias + 2 * (8 * tt + (tid & 7)));
    } else {
        const int tt = tile0 + (tid >> 4);
        if (tid < tpb * 16 && tt < n_tiles) return make_float2(ebias[16 * tt + (tid & 15)], 0.0f);
    }
    return make_float2(0.0f, 0.0f);
}

/* Adds the K slices of the block's tiles (warp = tile_in_block * ks + slice) and writes the
 * outputs: gate_up h (bias, SwiGLU, fp16 in the mma layout), down y (bias). b: pair_bias, or
 * with LATE, loaded here from bias and e after the reduction's barrier. DENSE: every lane
 * holds its rows' whole slice sums (pair_tma_products_dense), not a quarter of them. */
template <bool GATE_UP, bool LATE = false, bool DENSE = false>
static __device__ __forceinline__ void
pair_finish(float acc0, float acc1, float (*red)[16], int ks, int tpb, int tile0, int n_tiles,
            int pair, float2 b, const float *bias, int e, int32_t n_out_rows, float limit,
            float alpha, __half *h_out, float *y_out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    /* lanes q = 2, 3 hold copies of columns 0..3 (their scale bytes are 0, but the copies
     * are finite, so they are dropped here rather than scaled by 2^-113) */
    if (!DENSE) {
        if (q >= 2) acc0 = acc1 = 0.0f;
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    }
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
            for (int s = 0; s < ks; s++)
                v += red[t2 * ks + s][r];
            const int row = 16 * tt + r;
            y_out[(size_t)pair * n_out_rows + row] = v + b.x;
        }
    }
}

template <bool GATE_UP>
static __global__ void __launch_bounds__(MOE_PAIR_WIDE_K_SLICES *MOE_PAIR_WIDE_TILES_PER_BLOCK * 32)
    moe_pair_wide_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                         const void *act, const int32_t *topk_idx, int32_t k_top, int32_t k_in,
                         int32_t n_out_rows, float limit, float alpha, __half *h_out,
                         float *y_out) {
    extern __shared__ __align__(16) uint4 pm_xs[]; /* [k_in / 8] fp16 chunks, mma layout */
    __shared__ float red[MOE_PAIR_WIDE_K_SLICES * MOE_PAIR_WIDE_TILES_PER_BLOCK][16];
    const int pair = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int slice = warp % MOE_PAIR_WIDE_K_SLICES,
              tile = blockIdx.x * MOE_PAIR_WIDE_TILES_PER_BLOCK + warp / MOE_PAIR_WIDE_K_SLICES,
              n_tiles = n_out_rows >> 4;
    const int n_groups = k_in >> 5, n_win = (n_groups + 3) >> 2;
    const size_t row_bytes = (size_t)n_groups * 16;
    pdl_wait(); /* topk_idx comes from the router, the input from the norm or gate_up */
    const int e = topk_idx[pair];
    if (e < 0) return; /* another GPU's expert */
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;

    const int per = (n_win + MOE_PAIR_WIDE_K_SLICES - 1) / MOE_PAIR_WIDE_K_SLICES;
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
    pair_finish<GATE_UP, true>(
        acc0, acc1, red, MOE_PAIR_WIDE_K_SLICES, MOE_PAIR_WIDE_TILES_PER_BLOCK,
        blockIdx.x * MOE_PAIR_WIDE_TILES_PER_BLOCK, n_tiles, pair, make_float2(0.0f, 0.0f), bias, e,
        n_out_rows, limit, alpha, h_out, y_out);
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
static size_t pair_tma_smem(int32_t k_in) {
    return pair_tma_parts(k_in).bytes;
}

/*
 * A timeline of the TMA kernel's blocks, for diagnosis only: built when GPTOSS_MOE_TRACE is
 * defined in a diagnostics build (cmake -DGPTOSS_DIAGNOSTICS=ON
 * -DCMAKE_CUDA_FLAGS=-DGPTOSS_MOE_TRACE), never in a release build. Each block
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

#if defined(GPTOSS_MOE_TRACE) && !defined(GPTOSS_DIAGNOSTICS)
#error "GPTOSS_MOE_TRACE is a diagnostic: configure with -DGPTOSS_DIAGNOSTICS=ON"
#endif
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
 * Copies in flight per SM for the TMA kernel. Without a limit every resident block (5-6 per SM at
 * one token) issues its tile when the router ends; the memory system serves the ~20 MB interleaved,
 * so every tile lands in the same microsecond, every block computes at once and the DRAM idles
 * while they do (bench/CUDA.md, "The expert kernel's timeline"). So each block takes a ticket from
 * its SM's counter and issues its copy only while fewer than `inflight` copies with earlier tickets
 * on that SM have not landed; a block counts its tile landed right after its mbarrier wait (down:
 * before its PDL wait, so that no landing waits for gate_up). A ticket is taken only by a resident
 * block whose landing depends on nothing but its own copy, so the lowest unlanded ticket never
 * waits. The counters sit on their own 128-byte lines and the wait backs off with __nanosleep: a
 * first form that polled 132 counters packed into 1 KB in a tight loop did not finish a batched run
 * in three minutes (under one without the limit). The wait also gives up after
 * MOE_PAIR_LIMIT_WAIT_NS (the copy is issued anyway and the give-up counted), so a broken premise
 * costs time, never a hang. N = 3 against no limit: 120b tg128 +2.3% on an H100 (see bench/CUDA.md,
 * "The pair mma kernels: what was tried").
 */
struct __align__(128) pt_counter {
    unsigned v;
    unsigned pad[31];
};
__device__ pt_counter pt_copy_issued[MOE_PAIR_LIMIT_MAX_SMS];
__device__ pt_counter pt_copy_landed[MOE_PAIR_LIMIT_MAX_SMS];
__device__ unsigned long long pt_copy_giveups;

static __device__ __forceinline__ unsigned pt_load(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void pt_take_turn(unsigned sm, int32_t inflight) {
    unsigned landed =
        pt_load(&pt_copy_landed[sm].v); /* beside the ticket: an older count only waits longer */
    const unsigned ticket = atomicAdd(&pt_copy_issued[sm].v, 1u);
    if ((int)(ticket - landed) < inflight) return;
    const unsigned long long t0 = globaltimer_ns();
    do {
        __nanosleep(200);
        landed = pt_load(&pt_copy_landed[sm].v);
        if ((int)(ticket - landed) < inflight) return;
    } while (globaltimer_ns() - t0 < MOE_PAIR_LIMIT_WAIT_NS);
    atomicAdd(&pt_copy_giveups, 1ull);
}

/*
 * The TMA kernels' products of one staged token: warp w is K slice w of the tile's codes and
 * scales in shared memory, lane (g, q) sums rows a and b of its unit (acc0, acc1). No lane
 * tests anything per window: groups past n_groups in the last window read codes of the next
 * row (or of the scale bytes after the last one: finite fp16 values either way) times the
 * zero-filled token, so their columns are exactly 0, and their scale bytes are the next row's
 * (at most 240, gptoss_cuda_moe_check_mma) or the zero bytes, so 0 times a finite scale adds
 * nothing. Lanes that hold no token values read the zero window, with a step of 0. Lanes
 * q = 2, 3 repeat the scales of lanes q = 0, 1 (their columns are copies). Both TMA kernels
 * call this, so a pair's sums are the same bits in either.
 */
template <bool GATE_UP>
static __device__ __forceinline__ void pair_tma_products(const uint8_t *codes, const uint8_t *sc,
                                                         const uint4 *xs, const uint4 *zeros,
                                                         int n_groups, float &acc0, float &acc1) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n_win = (n_groups + 3) >> 2;
    const uint32_t row_bytes = (uint32_t)n_groups * 16;
    const int per = (n_win + MOE_PAIR_TMA_K_SLICES - 1) / MOE_PAIR_TMA_K_SLICES;
    const int w0 = min(n_win, warp * per), w1 = min(n_win, w0 + per);
    const int la = GATE_UP ? 2 * g : g, lb = GATE_UP ? la + 1 : la + 8;
    const bool owner = (g & 3) == q;
    const uint8_t *ca = codes + la * row_bytes + 16 * q, *cb = codes + lb * row_bytes + 16 * q;
    const uint8_t *sa = sc + la * n_groups + 2 * (q & 1), *sb = sc + lb * n_groups + 2 * (q & 1);
    const uint4 *xw = owner ? xs + 4 * q : zeros;
    const int x_step = owner ? 16 : 0; /* uint4 chunks per window */
    acc0 = 0.0f;
    acc1 = 0.0f;
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
}

/*
 * The batch-invariant form of pair_tma_products (DENSE): the arithmetic of the mma GEMM
 * (mma_gemm.cu), which the batch-invariant mode runs for steps of many tokens with its K cut
 * into the same MOE_PAIR_TMA_K_SLICES slices (gptoss_moe_mma_gemm_sliced). Lane (g, q) takes
 * group G + q of rows a and b as here, but each code is multiplied by its scale in fp16
 * before the MMAs (exact for scale bytes in [104, 128], w->mma_ok) and every lane supplies the
 * token, so each MMA column holds the whole dot product of its 16 k positions over four groups
 * and the slice's MMAs chain through one accumulator in the GEMM's order (window, word, k
 * half). Every column is the same token; acc0 / acc1 are its rows a and b. Groups past n_groups
 * take zero codes (the GEMM's copies zero-fill them) against the zero-filled token.
 */
template <bool GATE_UP>
static __device__ __forceinline__ void
pair_tma_products_dense(const uint8_t *codes, const uint8_t *sc, const uint4 *xs, int n_groups,
                        float &acc0, float &acc1) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n_win = (n_groups + 3) >> 2;
    const uint32_t row_bytes = (uint32_t)n_groups * 16;
    const int per = (n_win + MOE_PAIR_TMA_K_SLICES - 1) / MOE_PAIR_TMA_K_SLICES;
    const int w0 = min(n_win, warp * per), w1 = min(n_win, w0 + per);
    const int la = GATE_UP ? 2 * g : g, lb = GATE_UP ? la + 1 : la + 8;
    const uint8_t *ca = codes + la * row_bytes + 16 * q, *cb = codes + lb * row_bytes + 16 * q;
    const uint8_t *sa = sc + la * n_groups + q, *sb = sc + lb * n_groups + q;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int W = w0; W < w1; W++) {
        const bool in = 4 * W + q < n_groups;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const uint4 *xp = xs + 16 * W + 4 * q;
        const uint4 b[4] = {xp[0], xp[1], xp[2], xp[3]};
        mma_dense_window(in ? *(const uint4 *)(ca + 64 * W) : zero,
                         in ? *(const uint4 *)(cb + 64 * W) : zero, in ? (uint32_t)sa[4 * W] : 127u,
                         in ? (uint32_t)sb[4 * W] : 127u, b, acc);
    }
    acc0 = acc[0];
    acc1 = acc[2];
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
template <bool GATE_UP, bool EARLY_BIAS, bool DENSE = false>
static __global__ void __launch_bounds__(MOE_PAIR_TMA_K_SLICES * 32)
    moe_pair_tma_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                        const void *act, const int32_t *topk_idx, int32_t k_top, int32_t k_in,
                        int32_t n_out_rows, float limit, float alpha, __half *h_out, float *y_out,
                        int32_t inflight, bool masked) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t pt_smem[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[MOE_PAIR_TMA_K_SLICES][16];
    const int pair = blockIdx.y, tile = blockIdx.x, n_tiles = n_out_rows >> 4;
    const int n_groups = k_in >> 5;
    const uint32_t row_bytes = (uint32_t)n_groups * 16, code_bytes = 16 * row_bytes,
                   scale_bytes = 16 * n_groups;
    const pair_tma_layout lay = pair_tma_parts(k_in);
    uint8_t *codes = pt_smem, *sc = pt_smem + lay.scales;
    uint4 *xs = (uint4 *)(pt_smem + lay.token), *zeros = (uint4 *)(pt_smem + lay.zeros);
    const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar);
#ifdef GPTOSS_MOE_TRACE
    unsigned long long tr_start = globaltimer_ns(), tr_issue = 0, tr_wait = 0, tr_land = 0;
#endif
    if (!GATE_UP && masked && topk_idx[pair] < 0) { /* another GPU's expert */
        pdl_wait();                                 /* no block exits before its wait (ptx.cuh) */
        return;
    }
    const unsigned sm = inflight > 0 ? sm_id() % MOE_PAIR_LIMIT_MAX_SMS : 0u;
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
            if (inflight >
                0) { /* its landing must not wait for gate_up, which may hold later tickets */
                mbar_wait(bar_s, 0);
                atomicAdd(&pt_copy_landed[sm].v, 1u);
            }
        }
    }
    float2 bv = make_float2(0.0f, 0.0f);
    if (EARLY_BIAS && !GATE_UP)
        bv = pair_bias<false>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    /* zeros: the 16 bytes after the scales, the token past k_in up to whole windows, and the
     * zero window (none of them is written by the copies) */
    for (int i = threadIdx.x; i < 1 + (int)(lay.bytes - lay.token) / 16 - (k_in >> 3);
         i += blockDim.x)
        (i == 0 ? (uint4 *)(sc + scale_bytes) : xs + (k_in >> 3) + i - 1)[0] =
            make_uint4(0, 0, 0, 0);
    pdl_wait(); /* gate_up: topk_idx from the router; both: the input */
    if (GATE_UP && masked && topk_idx[pair] < 0) return; /* another GPU's expert */
#ifdef GPTOSS_MOE_TRACE
    tr_wait = globaltimer_ns();
#endif
    if (GATE_UP && threadIdx.x == 0) issue();
    if (EARLY_BIAS && GATE_UP)
        bv = pair_bias<true>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    pair_stage_input<GATE_UP>(act, pair, k_top, k_in, xs);
    __syncthreads(); /* the token is staged, and every thread sees the initialized barrier */
    mbar_wait(bar_s, 0);
    if (GATE_UP && inflight > 0 && threadIdx.x == 0) atomicAdd(&pt_copy_landed[sm].v, 1u);
#ifdef GPTOSS_MOE_TRACE
    tr_land = globaltimer_ns();
#endif

    float acc0, acc1;
    if (DENSE)
        pair_tma_products_dense<GATE_UP>(codes, sc, xs, n_groups, acc0, acc1);
    else
        pair_tma_products<GATE_UP>(codes, sc, xs, zeros, n_groups, acc0, acc1);
    pair_finish<GATE_UP, !EARLY_BIAS, DENSE>(acc0, acc1, red, MOE_PAIR_TMA_K_SLICES, 1, tile,
                                             n_tiles, pair, bv, bias, topk_idx[pair], n_out_rows,
                                             limit, alpha, h_out, y_out);
#ifdef GPTOSS_MOE_TRACE
    if (threadIdx.x == 0 && trace_buf) {
        const unsigned long long end = globaltimer_ns();
        const unsigned long long n = atomicAdd(&trace_seq, 1ull);
        unsigned long long *r = trace_buf + 6 * (n % TRACE_N);
        r[0] = (unsigned long long)GATE_UP | (unsigned long long)(pair & 0x7f) << 1 |
               (unsigned long long)(tile & 0xffff) << 8 |
               (unsigned long long)(sm_id() & 0xff) << 24 | (n & 0xffffffffu) << 32;
        r[1] = tr_start, r[2] = tr_wait, r[3] = tr_issue, r[4] = tr_land, r[5] = end;
    }
#endif
#else
    __trap(); /* never launched: the host picks this kernel only where it was built for sm_90 or
                 later */
#endif
}

/*
 * moe_pair_grouped_kernel (sm_90 and up): the TMA kernel's arithmetic for steps of many pairs,
 * over a route (gptoss_cuda_moe_route_rows) of up to MOE_PAIR_GROUP pairs per route tile. Block
 * (16-row tile, route tile), MOE_PAIR_TMA_K_SLICES warps: the tile's codes of the route tile's
 * expert are copied once and every pair's token staged beside them (the TMA kernel's layout,
 * one token area per pair); each warp converts a window's codes once and multiplies them with
 * every staged token, keeping one pair of accumulators per token. Per token that is exactly the
 * TMA kernel's sequence of MMAs and fmaf's (pair_window_dot, the same scales, windows in the same
 * order, slices added by pair_finish), so a pair's h and y are the same bits whichever kernel
 * ran and whatever else the step holds; the conversion, the TMA kernel's main integer cost, is
 * shared by the pairs of a tile. The batch-invariant mode runs the experts this way for every
 * step size on GPUs with the TMA pair kernel (kernels/batch_invariant.h).
 */
#define MOE_PAIR_GROUP 8 /* tokens staged and multiplied together */
static __host__ __device__ __forceinline__ uint32_t pair_group_token_bytes(int32_t k_in) {
    const pair_tma_layout l = pair_tma_parts(k_in);
    return l.zeros - l.token;
}
static size_t pair_group_smem(int32_t k_in) {
    const pair_tma_layout l = pair_tma_parts(k_in);
    return (size_t)l.token + (size_t)MOE_PAIR_GROUP * pair_group_token_bytes(k_in) + 64;
}

template <bool GATE_UP>
static __global__ void __launch_bounds__(MOE_PAIR_TMA_K_SLICES * 32)
    moe_pair_grouped_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                            const void *act, gptoss_cuda_route route, int32_t k_top, int32_t k_in,
                            int32_t n_out_rows, float limit, float alpha, __half *h_out,
                            float *y_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t pt_smem[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[MOE_PAIR_TMA_K_SLICES][16];
    __shared__ int pairs[MOE_PAIR_GROUP];
    const int tile = blockIdx.x, n_tiles = n_out_rows >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n_groups = k_in >> 5, n_win = (n_groups + 3) >> 2;
    const uint32_t row_bytes = (uint32_t)n_groups * 16, code_bytes = 16 * row_bytes,
                   scale_bytes = 16 * n_groups, tok_bytes = pair_group_token_bytes(k_in);
    const pair_tma_layout lay = pair_tma_parts(k_in);
    uint8_t *codes = pt_smem, *sc = pt_smem + lay.scales;
    uint8_t *toks = pt_smem + lay.token;
    const uint4 *zeros = (const uint4 *)(toks + MOE_PAIR_GROUP * tok_bytes);
    const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar);
    pdl_wait(); /* the route and the input come from earlier kernels */
    const int e = route.tile_expert[blockIdx.y];
    if (e < 0) return;
    const int32_t r_begin = route.tile_row[blockIdx.y],
                  r_end = min(r_begin + route.tile_rows, route.expert_offsets[e + 1]);
    if (threadIdx.x == 0) {
        const size_t row0 = (size_t)e * n_out_rows + 16 * (size_t)tile;
        mbar_init(bar_s);
        mbar_expect_tx(bar_s, code_bytes + scale_bytes);
        bulk_copy(codes, blocks + row0 * row_bytes, code_bytes, bar_s);
        bulk_copy(sc, scales + row0 * n_groups, scale_bytes, bar_s);
    }
    /* zeros: the 16 bytes after the scales, each token area past k_in, the zero window */
    if (threadIdx.x == 0) *(uint4 *)(sc + scale_bytes) = make_uint4(0, 0, 0, 0);
    const int tail = (int)tok_bytes / 16 - (k_in >> 3);
    for (int i = threadIdx.x; i < MOE_PAIR_GROUP * tail + 4; i += blockDim.x)
        (i < MOE_PAIR_GROUP * tail
             ? (uint4 *)(toks + (i / tail) * tok_bytes) + (k_in >> 3) + i % tail
             : (uint4 *)zeros + (i - MOE_PAIR_GROUP * tail))[0] = make_uint4(0, 0, 0, 0);
    const float2 bv = pair_bias<GATE_UP>(bias, e, n_out_rows, 1, tile, n_tiles);
    for (int32_t r0 = r_begin; r0 < r_end; r0 += MOE_PAIR_GROUP) {
        const int n = min(MOE_PAIR_GROUP, r_end - r0);
        if (threadIdx.x < MOE_PAIR_GROUP)
            pairs[threadIdx.x] = threadIdx.x < n ? route.sorted_pair[r0 + threadIdx.x] : 0;
        __syncthreads(); /* the pair list (and, the first time, the zeros and the barrier) */
        for (int j = 0; j < n; j++)
            pair_stage_input<GATE_UP>(act, pairs[j], k_top, k_in, (uint4 *)(toks + j * tok_bytes));
        __syncthreads(); /* the tokens are staged */
        if (r0 == r_begin) mbar_wait(bar_s, 0);

        /* pair_tma_products for every staged token at once (its comment says why no lane tests
         * anything per window) */
        const int per = (n_win + MOE_PAIR_TMA_K_SLICES - 1) / MOE_PAIR_TMA_K_SLICES;
        const int w0 = min(n_win, warp * per), w1 = min(n_win, w0 + per);
        const int la = GATE_UP ? 2 * g : g, lb = GATE_UP ? la + 1 : la + 8;
        const bool owner = (g & 3) == q;
        const uint8_t *ca = codes + la * row_bytes + 16 * q, *cb = codes + lb * row_bytes + 16 * q;
        const uint8_t *sa = sc + la * n_groups + 2 * (q & 1),
                      *sb = sc + lb * n_groups + 2 * (q & 1);
        const int x_step = owner ? 16 : 0; /* uint4 chunks per window */
        float acc0[MOE_PAIR_GROUP], acc1[MOE_PAIR_GROUP];
#pragma unroll
        for (int j = 0; j < MOE_PAIR_GROUP; j++)
            acc0[j] = acc1[j] = 0.0f;
        for (int W = w0; W < w1; W++) {
            uint32_t pa[4][4], pb[4][4];
            pair_window_convert(*(const uint4 *)(ca + 64 * W), *(const uint4 *)(cb + 64 * W), pa,
                                pb);
            const float f0 = __uint_as_float((uint32_t)sa[4 * W] * (1u << 23) + (14u << 23)),
                        f1 = __uint_as_float((uint32_t)sa[4 * W + 1] * (1u << 23) + (14u << 23)),
                        f2 = __uint_as_float((uint32_t)sb[4 * W] * (1u << 23) + (14u << 23)),
                        f3 = __uint_as_float((uint32_t)sb[4 * W + 1] * (1u << 23) + (14u << 23));
#pragma unroll
            for (int j = 0; j < MOE_PAIR_GROUP; j++) {
                if (j >= n) break;
                const uint4 *xp =
                    (owner ? (const uint4 *)(toks + j * tok_bytes) + 4 * q : zeros) + x_step * W;
                const uint4 b[4] = {xp[0], xp[1], xp[2], xp[3]};
                float d[4];
                pair_window_dot(pa, pb, b, d);
                acc0[j] = fmaf(d[0], f0, acc0[j]);
                acc0[j] = fmaf(d[1], f1, acc0[j]);
                acc1[j] = fmaf(d[2], f2, acc1[j]);
                acc1[j] = fmaf(d[3], f3, acc1[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < MOE_PAIR_GROUP; j++) {
            if (j >= n) break;
            pair_finish<GATE_UP, false>(acc0[j], acc1[j], red, MOE_PAIR_TMA_K_SLICES, 1, tile,
                                        n_tiles, pairs[j], bv, bias, e, n_out_rows, limit, alpha,
                                        h_out, y_out);
            __syncthreads(); /* red (and, after the last, the tokens and the pair list) free again
                              */
        }
    }
#else
    __trap(); /* never launched: the host picks this kernel only where the TMA pair kernel runs */
#endif
}

/*
 * moe_pair_fp8_kernel (sm_90a): the pair mma's tile (16 rows, the whole k_in, the same two bulk
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

struct pair_fp8_layout {
    uint32_t scales, bt, bytes;
    int32_t gps, nws; /* groups per slice, windows of 4 groups per slice */
};
static __host__ __device__ __forceinline__ pair_fp8_layout pair_fp8_parts(int32_t k_in) {
    const int32_t n_groups = k_in / 32;
    pair_fp8_layout l;
    l.gps = (n_groups + MOE_PAIR_FP8_K_SLICES - 1) / MOE_PAIR_FP8_K_SLICES;
    l.nws = (l.gps + 3) / 4;
    l.scales = 16u * 16u * (uint32_t)n_groups;
    l.bt = (l.scales + 16u * (uint32_t)n_groups + 16u + 127u) & ~127u;
    l.bytes = l.bt + 256u * 4u * (uint32_t)l.nws;
    return l;
}
static size_t pair_fp8_smem(int32_t k_in) {
    return pair_fp8_parts(k_in).bytes;
}

#ifdef GPTOSS_WGMMA
/* K-major without swizzle: core matrices of 8 columns x 16 bytes; the second k half 128
 * bytes after the first (LBO); one group of 8 columns (SBO unused, set alike) */
static __device__ __forceinline__ uint64_t pf_desc(uint32_t smem_addr) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) |
           ((uint64_t)(128 >> 4) << 32);
}
static __device__ __forceinline__ void wgmma_e4m3_n8(float (&d)[4], uint32_t a0, uint32_t a1,
                                                     uint32_t a2, uint32_t a3, uint64_t desc) {
    /* scale-d false: d = A * B (each group has its own accumulators) */
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, "
                 "%6, %7}, %8, p, 1, 1;\n}\n"
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
static __device__ __forceinline__ float pair_fp8_stage(const void *act, int pair, int32_t k_top,
                                                       int32_t k_in, const pair_fp8_layout &lay,
                                                       uint8_t *bt, float *red4) {
    constexpr int U = 4; /* units per thread: 4 * nws * 16 <= 512 for k_in <= 4096 */
    const int n_groups = k_in >> 5, n_units = 4 * lay.nws * 16;
    float v[U][8];
    float mx = 0.0f;
#pragma unroll
    for (int i = 0; i < U; i++) {
        const int u = threadIdx.x + i * (MOE_PAIR_FP8_K_SLICES * 32);
        const int gi = u >> 4, s = (u >> 2) & 3, q = u & 3, G = lay.gps * s + gi;
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[i][j] = 0.0f;
        if (u < n_units && gi < lay.gps && G < n_groups) {
            const size_t idx = (size_t)32 * G + 8 * q;
            if (GATE_UP) {
                const uint4 raw =
                    *(const uint4 *)((const bf16 *)act + (size_t)(pair / k_top) * k_in + idx);
                const bf16 *x = (const bf16 *)&raw;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[i][j] = __bfloat162float(x[j]);
            } else {
                const uint4 raw = *(const uint4 *)((const __half *)act + (size_t)pair * k_in + idx);
                const __half *x = (const __half *)&raw;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[i][j] = __half2float(x[mma_pos(j)]);
            }
#pragma unroll
            for (int j = 0; j < 8; j++)
                mx = fmaxf(mx, fabsf(v[i][j]));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) red4[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(red4[0], red4[1]), fmaxf(red4[2], red4[3]));
    /* sigma: the largest value into [128, 256) */
    const int e = mx > 0.0f ? (int)((__float_as_uint(mx) >> 23) & 255u) - 127 : 0;
    const int sigma = max(-100, min(100, 7 - e));
    const float up = __uint_as_float((uint32_t)(127 + sigma) << 23);
#pragma unroll
    for (int i = 0; i < U; i++) {
        const int u = threadIdx.x + i * (MOE_PAIR_FP8_K_SLICES * 32);
        if (u >= n_units) break;
        const int gi = u >> 4, s = (u >> 2) & 3, q = u & 3;
        /* step gi: [k half][column 2s + t][16 bytes], lane q's k bytes 4q..4q+3 */
        uint32_t hi[2] = {0u, 0u}, lo[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            const float2 x = make_float2(v[i][j] * up, v[i][j + 1] * up);
            const __nv_fp8x2_storage_t h2 = __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, __NV_E4M3);
            const float2 hf = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(h2, __NV_E4M3)));
            const __nv_fp8x2_storage_t l2 = __nv_cvt_float2_to_fp8x2(
                make_float2(x.x - hf.x, x.y - hf.y), __NV_SATFINITE, __NV_E4M3);
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
static __global__ void __launch_bounds__(MOE_PAIR_FP8_K_SLICES * 32, 7)
    moe_pair_fp8_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                        const void *act, const int32_t *topk_idx, int32_t k_top, int32_t k_in,
                        int32_t n_out_rows, float limit, float alpha, __half *h_out, float *y_out,
                        int32_t inflight, bool masked) {
#ifdef GPTOSS_WGMMA
    extern __shared__ __align__(128) uint8_t pf_smem[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[MOE_PAIR_FP8_K_SLICES][16];
    __shared__ float red4[4];
    const int pair = blockIdx.y, tile = blockIdx.x, n_tiles = n_out_rows >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n_groups = k_in >> 5;
    const uint32_t row_bytes = (uint32_t)n_groups * 16, code_bytes = 16 * row_bytes,
                   scale_bytes = 16 * n_groups;
    const pair_fp8_layout lay = pair_fp8_parts(k_in);
    uint8_t *codes = pf_smem, *sc = pf_smem + lay.scales, *bt = pf_smem + lay.bt;
    const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar);
    if (!GATE_UP && masked && topk_idx[pair] < 0) { /* another GPU's expert */
        pdl_wait();                                 /* no block exits before its wait (ptx.cuh) */
        return;
    }
    const unsigned sm = inflight > 0 ? sm_id() % MOE_PAIR_LIMIT_MAX_SMS : 0u;
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
    if (EARLY_BIAS && !GATE_UP)
        bv = pair_bias<false>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    /* the 16 bytes after the scales are read past the last row's groups (see above) */
    if (threadIdx.x < 4) ((uint32_t *)(sc + scale_bytes))[threadIdx.x] = 0u;
    pdl_wait(); /* gate_up: topk_idx from the router; both: the input */
    if (GATE_UP && masked && topk_idx[pair] < 0) return; /* another GPU's expert */
    if (GATE_UP && threadIdx.x == 0) issue();
    if (EARLY_BIAS && GATE_UP)
        bv = pair_bias<true>(bias, topk_idx[pair], n_out_rows, 1, tile, n_tiles);
    const float unscale = pair_fp8_stage<GATE_UP>(act, pair, k_top, k_in, lay, bt, red4);
    fence_proxy_async(); /* B is read by the tensor cores' (async) proxy */
    __syncthreads();     /* B is staged, and every thread sees the initialized barrier */
    mbar_wait(bar_s, 0);
    if (GATE_UP && inflight > 0 && threadIdx.x == 0) atomicAdd(&pt_copy_landed[sm].v, 1u);

    const int la = GATE_UP ? 2 * g : g, lb = GATE_UP ? la + 1 : la + 8;
    const int G0 = lay.gps * warp; /* this slice's first group */
    const uint8_t *ca = codes + la * row_bytes + 16 * G0 + 4 * q,
                  *cb = codes + lb * row_bytes + 16 * G0 + 4 * q;
    const uint8_t *sa = sc + la * n_groups + G0, *sb = sc + lb * n_groups + G0;
    const uint32_t bt_s = (uint32_t)__cvta_generic_to_shared(bt);
    float acc0 = 0.0f, acc1 = 0.0f;
    float d0[4][4], d1[4][4];
    /* column scale 2^(s - 127) * 2^6 (the e4m3 codes are code * 2^-6): the exponent field s + 6 */
    auto scale_window = [&](float(&dw)[4][4], int W) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            wg_pin(dw[i]);
            acc0 = fmaf(dw[i][0] + dw[i][1], __uint_as_float(((uint32_t)sa[4 * W + i] + 6u) << 23),
                        acc0);
            acc1 = fmaf(dw[i][2] + dw[i][3], __uint_as_float(((uint32_t)sb[4 * W + i] + 6u) << 23),
                        acc1);
        }
    };
    auto issue_window = [&](float(&dw)[4][4], int W) {
        uint32_t ea[4], oa[4], eb[4], ob[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            e2m1_to_e4m3(*(const uint32_t *)(ca + 16 * (4 * W + i)), ea[i], oa[i]);
            e2m1_to_e4m3(*(const uint32_t *)(cb + 16 * (4 * W + i)), eb[i], ob[i]);
        }
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < 4; i++)
            wgmma_e4m3_n8(dw[i], ea[i], eb[i], oa[i], ob[i], pf_desc(bt_s + 256 * (4 * W + i)));
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
    if (lay.nws & 1)
        scale_window(d0, lay.nws - 1);
    else if (lay.nws > 0)
        scale_window(d1, lay.nws - 1);
    /* lane q of warp w holds slice q's token against slice w's codes: keep q == w, in lane q = 0 */
    acc0 = __shfl_sync(0xffffffffu, acc0, (lane & ~3) | warp) * unscale;
    acc1 = __shfl_sync(0xffffffffu, acc1, (lane & ~3) | warp) * unscale;
    if (q != 0) acc0 = acc1 = 0.0f;
    pair_finish<GATE_UP, !EARLY_BIAS>(acc0, acc1, red, MOE_PAIR_FP8_K_SLICES, 1, tile, n_tiles,
                                      pair, bv, bias, topk_idx[pair], n_out_rows, limit, alpha,
                                      h_out, y_out);
#else
    __trap(); /* never launched: the host picks this kernel only on compute capability 9.0 with
                 sm_90a code */
#endif
}

void gptoss_cuda_moe_set_pair_kernel(int kernel) {
    gptoss_cuda_kernel_ctx_current()->moe_pair_kernel = kernel;
}

/* The TMA kernel wherever it runs, in its dense form (GPTOSS_MOE_PAIR_DENSE) for weights whose
 * scales allow it, unless the context's choice (the moe_pair_kernel knob, or
 * gptoss_cuda_moe_set_pair_kernel) says otherwise; a kernel that does not run here falls back
 * to the next one that does. The dense form against the other (H100, tg128, random weights, 5
 * repeats twice each): 120b 361.8 / 361.2 -> 376.4 / 374.8 tok/s, 20b 509.5 / 510.5 -> 529.1 /
 * 530.1; batch 8 +1.8% (120b), batch 32 the same. Per window it issues the same 8 MMAs and
 * conversions plus 32 fp16 multiplies (on the FMA pipe, beside the integer work) instead of the
 * fp32 scaling, and one accumulator chain per slice instead of two per window. */
enum gptoss_moe_pair_kernel gptoss_cuda_moe_pair_kernel(void) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    if (kc->moe_pair_kernel == GPTOSS_MOE_PAIR_WIDE || !kc->moe_pair_tma_ok)
        return GPTOSS_MOE_PAIR_WIDE;
    if (kc->moe_pair_kernel == GPTOSS_MOE_PAIR_FP8 && kc->moe_pair_fp8_ok)
        return GPTOSS_MOE_PAIR_FP8;
    if (kc->moe_pair_kernel == GPTOSS_MOE_PAIR_TMA) return GPTOSS_MOE_PAIR_TMA;
    return GPTOSS_MOE_PAIR_DENSE; /* TMA with the mma arithmetic where the weights allow */
}

/* The TMA kernel's copies in flight per SM (pt_take_turn): the moe_inflight knob, 0 for no
 * limit, 3 by default (H100, tg128: 2 gained 1.5-2%, 3 2.0-2.3%, 4 0.7-1%). With the knob
 * given, the number of waits that gave up is printed at exit (a diagnostic: 0 in every run
 * measured). */
static void pair_tma_report(void) {
    unsigned long long n = 0;
    if (cudaMemcpyFromSymbol(&n, pt_copy_giveups, sizeof n) == cudaSuccess)
        fprintf(stderr, "moe in-flight limit: %llu waits gave up\n", n);
}
static int32_t pair_tma_inflight(void) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    static bool report_registered = false; /* atexit is per process */
    if (kc->moe_inflight_report && !report_registered) {
        atexit(pair_tma_report);
        report_registered = true;
    }
    return kc->moe_inflight;
}

template <bool GATE_UP>
static void pair_mma_launch(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                            const void *act, const int32_t *topk_idx, int32_t n_pairs,
                            int32_t k_top, int32_t k_in, int32_t n_out,
                            const gptoss_cuda_moe_weights *w, __half *h, float *y,
                            enum gptoss_moe_pair_kernel kernel, bool dense, cudaStream_t stream) {
    const int tiles = n_out / 16;
    /* Steps of up to 8 pairs load the biases early (H100, one token: 120b tg128 +1.6%, 20b
     * +1.3%); larger steps load them after the reduction: with early loads, steps of 32 to 96
     * pairs ran 1.5-2% slower, without them 1.1-1.7% faster than before the split (bench -b 8,
     * 16, 24 on 120b, 7 on 20b). */
    if (kernel == GPTOSS_MOE_PAIR_FP8)
        launch_pdl(n_pairs <= GPTOSS_MOE_PAIR_MAX ? moe_pair_fp8_kernel<GATE_UP, true>
                                                  : moe_pair_fp8_kernel<GATE_UP, false>,
                   dim3(tiles, n_pairs), dim3(MOE_PAIR_FP8_K_SLICES * 32), pair_fp8_smem(k_in),
                   stream, blocks, scales, bias, act, topk_idx, k_top, k_in, n_out, w->swiglu_limit,
                   w->swiglu_alpha, h, y, pair_tma_inflight(), w->masked_slots);
    else if (kernel == GPTOSS_MOE_PAIR_TMA && dense)
        launch_pdl(n_pairs <= GPTOSS_MOE_PAIR_MAX ? moe_pair_tma_kernel<GATE_UP, true, true>
                                                  : moe_pair_tma_kernel<GATE_UP, false, true>,
                   dim3(tiles, n_pairs), dim3(MOE_PAIR_TMA_K_SLICES * 32), pair_tma_smem(k_in),
                   stream, blocks, scales, bias, act, topk_idx, k_top, k_in, n_out, w->swiglu_limit,
                   w->swiglu_alpha, h, y, pair_tma_inflight(), w->masked_slots);
    else if (kernel == GPTOSS_MOE_PAIR_TMA)
        launch_pdl(n_pairs <= GPTOSS_MOE_PAIR_MAX ? moe_pair_tma_kernel<GATE_UP, true>
                                                  : moe_pair_tma_kernel<GATE_UP, false>,
                   dim3(tiles, n_pairs), dim3(MOE_PAIR_TMA_K_SLICES * 32), pair_tma_smem(k_in),
                   stream, blocks, scales, bias, act, topk_idx, k_top, k_in, n_out, w->swiglu_limit,
                   w->swiglu_alpha, h, y, pair_tma_inflight(), w->masked_slots);
    else
        launch_pdl(moe_pair_wide_kernel<GATE_UP>,
                   dim3((tiles + MOE_PAIR_WIDE_TILES_PER_BLOCK - 1) / MOE_PAIR_WIDE_TILES_PER_BLOCK,
                        n_pairs),
                   dim3(MOE_PAIR_WIDE_K_SLICES * MOE_PAIR_WIDE_TILES_PER_BLOCK * 32),
                   (size_t)k_in * sizeof(__half), stream, blocks, scales, bias, act, topk_idx,
                   k_top, k_in, n_out, w->swiglu_limit, w->swiglu_alpha, h, y);
}

static void pair_mma_run(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                         int32_t n_pairs, int32_t k_top, __half *h, float *y,
                         enum gptoss_moe_pair_kernel kernel, bool dense, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    if (kernel == GPTOSS_MOE_PAIR_DENSE) { /* the TMA kernel, densely where the scales allow */
        kernel = GPTOSS_MOE_PAIR_TMA;
        dense = w->mma_ok;
    }
    pair_mma_launch<true>(w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias, (const void *)t,
                          topk_idx, n_pairs, k_top, H, 2 * I, w, h, (float *)nullptr, kernel, dense,
                          stream);
    pair_mma_launch<false>(w->down_blocks, w->down_scales, w->down_bias, (const void *)h, topk_idx,
                           n_pairs, k_top, I, H, w, (__half *)nullptr, y, kernel, dense, stream);
}

void gptoss_moe_pair_mma(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                         int32_t n_pairs, int32_t k_top, __half *h, float *y, cudaStream_t stream) {
    pair_mma_run(w, t, topk_idx, n_pairs, k_top, h, y, gptoss_cuda_moe_pair_kernel(), false,
                 stream);
}

void gptoss_moe_pair_tma(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                         int32_t n_pairs, int32_t k_top, __half *h, float *y, cudaStream_t stream) {
    pair_mma_run(w, t, topk_idx, n_pairs, k_top, h, y, GPTOSS_MOE_PAIR_TMA, false, stream);
}

void gptoss_moe_pair_dense(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                           int32_t n_pairs, int32_t k_top, __half *h, float *y,
                           cudaStream_t stream) {
    pair_mma_run(w, t, topk_idx, n_pairs, k_top, h, y, GPTOSS_MOE_PAIR_TMA, true, stream);
}

bool gptoss_moe_pair_grouped_ok(const gptoss_cuda_moe_weights *w) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    return w->pair_mma_ok && kc->moe_pair_tma_ok && kc->moe_pair_group_ok &&
           w->hidden <= kc->moe_prepared_width && w->intermediate <= kc->moe_prepared_width;
}

bool gptoss_moe_bi_mma_ok(const gptoss_cuda_moe_weights *w) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    return w->mma_ok && kc->moe_pair_tma_ok && kc->moe_mma_max_tile >= 8 &&
           w->hidden <= kc->moe_prepared_width && w->intermediate <= kc->moe_prepared_width;
}

void gptoss_moe_pair_grouped(const gptoss_cuda_moe_weights *w, const bf16 *t,
                             const gptoss_cuda_route *route, int32_t n_tokens, int32_t k_top,
                             __half *h, float *y, cudaStream_t stream) {
    const int32_t H = w->hidden, I = w->intermediate;
    const int32_t tiles = gptoss_cuda_route_tiles(n_tokens * k_top, w->n_experts, route->tile_rows);
    if (tiles <= 0) return;
    launch_pdl(moe_pair_grouped_kernel<true>, dim3(2 * I / 16, tiles),
               dim3(MOE_PAIR_TMA_K_SLICES * 32), pair_group_smem(H), stream, w->gate_up_blocks,
               w->gate_up_scales, w->gate_up_bias, (const void *)t, *route, k_top, H, 2 * I,
               w->swiglu_limit, w->swiglu_alpha, h, (float *)nullptr);
    launch_pdl(moe_pair_grouped_kernel<false>, dim3(H / 16, tiles),
               dim3(MOE_PAIR_TMA_K_SLICES * 32), pair_group_smem(I), stream, w->down_blocks,
               w->down_scales, w->down_bias, (const void *)h, *route, k_top, I, H, w->swiglu_limit,
               w->swiglu_alpha, (__half *)nullptr, y);
}

void gptoss_moe_pair_mma_prepare(bool ok) {
#ifdef GPTOSS_MOE_TRACE
    trace_init();
#endif
    /* the TMA pair kernel where the context's capabilities have TMA and the code that runs was
     * built for compute capability 9.0 or later (its body is a trap below that, as in a JIT of
     * older PTX) */
    gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    kc->moe_pair_tma_ok =
        ok && kc->caps.tma &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<true, true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<false, true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<true, false>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<false, false>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<true, true, true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<false, true, true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<true, false, true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_tma_kernel<false, false, true>);
    /* the grouped kernel: where the TMA kernel runs, with its shared memory granted */
    const size_t group_smem = pair_group_smem(kc->moe_prepared_width);
    kc->moe_pair_group_ok = kc->moe_pair_tma_ok &&
                            gptoss_cuda_kernel_smem((const void *)moe_pair_grouped_kernel<true>,
                                                    group_smem) == cudaSuccess &&
                            gptoss_cuda_kernel_smem((const void *)moe_pair_grouped_kernel<false>,
                                                    group_smem) == cudaSuccess;
    (void)cudaGetLastError(); /* a refused attribute is not an error: the kernel is not used */
    /* the FP8 pair kernel: wgmma, so compute capability 9.0 with sm_90a code, as the wgmma GEMM */
    kc->moe_pair_fp8_ok =
        kc->moe_pair_tma_ok && kc->caps.wgmma && kc->caps.fp8 &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<true, true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<false, true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<true, false>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_pair_fp8_kernel<false, false>);
}
