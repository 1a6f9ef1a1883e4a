/*
 * attention_tc.cu - paged sink attention on tensor cores for prefill-sized steps (mma.sync
 * m16n8k16, bf16 in, f32 accumulate; sm_80+). Computes what gptoss_cuda_attention computes
 * with n_splits = 1 (attention_split.cu) and replaces it when a step has many tokens; owns no
 * memory.
 *
 * Grid (token tiles, n_kv_heads), latest tile first (causal tiles with the most keys start
 * first). A block takes TQ = 16 * subtiles consecutive tokens of the step and the `group` query
 * heads that share one KV head; warp w owns 16 rows: tokens 16 * (w / group) .. +15 of the
 * tile for query head w % group. All warps read the same keys, so one K/V tile in shared
 * memory serves the whole GQA group (group 8: 16 tokens x 8 heads = 128 rows, 8 warps):
 *
 *                 key tile (KT keys, cp.async, double-buffered, gathered via block table)
 *                   K [KT][D] --ldmatrix-->  B fragments      V [KT][D] --ldmatrix.trans--> B
 *   warp 0: Q(tok 0..15, head 0) [16 x D] . K^T -> S [16 x SUB] f32 -> mask, online softmax
 *   warp 1: Q(tok 0..15, head 1)            -> P = exp2(S - max) (bf16 hi+lo) . V -> O [16 x D] f32
 *   ...      (SUB = 32 keys per softmax step; O, max and sum live in registers across tiles)
 *
 * Data flow: Q rows (f32, global) become bf16 hi/lo A fragments in registers once, times log2(e)
 * so the softmax runs on exp2. For each key tile the block copies KT rows of K and V (D bf16
 * each, contiguous in the paged cache) into shared memory while the warps work on the
 * previous tile; rows are padded by 16 bytes so the 8 row addresses of an ldmatrix hit 8
 * distinct bank groups. P goes from the S accumulators straight into A fragments: the C
 * layout of two adjacent m16n8 tiles is the A layout of one m16k16 tile. The running max
 * starts at the sink logit, so it is always finite (fully masked rows give exp2(-inf) = 0 and
 * a correction of 1, no -inf - -inf) and the sink joins the denominator once at the end:
 *   out = O / (sum + exp2(sink - max)).
 *
 * Varlen: a tile may hold tokens of several sequences. The block walks the tile's segments
 * (runs of one sequence) one after another; a segment's key range is the union of its tokens'
 * ranges, rows outside the segment are fully masked there (their state does not change), and
 * a warp skips the key tiles none of its rows can see. Keys past the segment's range are
 * zero-filled, never read, so garbage (NaN) in unused cache slots cannot reach P . V.
 *
 * Rounding: q (times log2 e) and P enter the tensor cores as bf16 pairs hi + lo
 * (split_bf16x2_n<2>), two mma each, so they keep 16 significant bits instead of bf16's 8; K and V
 * are bf16 already. Max and sums stay f32. With q and P in plain bf16 the kernel ran in 3.1 ms
 * instead of the scalar kernel's 63 (20b shape, 2048 tokens) but moved logits by about 2^-8
 * against the CPU reference, twice the bf16 bar of the forward tests; the split costs one
 * more mma per product and keeps the result as exact as the scalar kernel's.
 *
 * FP8 pages (kv_fp8.h): e4m3 codes with one fp32 scale per key. The codes of a key tile and
 * their scales are what cp.async brings in (double-buffered: half the bytes of a bf16 tile);
 * once a stage has landed, the block decodes its codes into one bf16 K tile and one bf16 V
 * tile (exact: every e4m3 value is a bf16 value), and the warps read those as above. The
 * scales stay in fp32 and are applied where they factor out of the products:
 *   S[row, key] = k_scale[key] * (q . codes_k[key])       (each S element, before the mask)
 *   O[row, :]  += (P[row, key] * v_scale[key]) . codes_v[key]
 * with the row sums taken over the unscaled P. So the FP8 path computes the dequantized
 * cache's attention with the same 16-bit q and P as the bf16 path; it costs one more pass
 * over shared memory and one more barrier per key tile.
 */
#include "backend/cuda/kernels/attention_tc.h"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/ptx.cuh"
#include "backend/kv_fp8.h"

#include <limits.h>
#include <type_traits>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention_tc.cu needs sm_80 or newer (bf16 mma.sync, cp.async)"
#endif

/* Tile shapes by head_dim D, in one place. Shared memory: 2 stages x (K, V) x KEYS x ROW bf16
 * = 36 KB for D = 64, 34 KB for D = 128. */
template <int D> struct atc_traits {
    static_assert(D % 16 == 0 && D >= 16 && D <= 128, "head_dim: a multiple of 16 up to 128");
    static constexpr int KEYS = D <= 64 ? 64 : 32;     /* keys per shared-memory tile */
    static constexpr int SUB = 32;                     /* keys per online-softmax step */
    static constexpr int ROW = D + 8;                  /* smem row stride (bf16): +16 bytes */
    static constexpr int CHUNKS = D / 8;               /* 16-byte chunks per K/V row */
    static constexpr int MIN_BLOCKS = D <= 64 ? 2 : 1; /* blocks per SM: caps registers at 128 */
    static constexpr int CODE_CHUNKS = D / 16;         /* 16-byte chunks per row of e4m3 codes */
};

/* What a KV page element is: bf16, or an e4m3 code (with a scale per key beside the page). */
template <bool E4M3> using atc_kv_t = typename std::conditional<E4M3, uint8_t, bf16>::type;

/* Shared memory of a block. bf16 pages: K and V tiles in two stages, filled by cp.async from
 * the cache. e4m3 pages: codes and scales in two stages (cp.async) and one bf16 K and V tile
 * the current stage is decoded into. 36 KB (bf16) and 35 KB (e4m3) for D = 64. */
template <int D, bool E4M3> struct atc_smem {
    alignas(
        16) bf16 k[2][atc_traits<D>::KEYS * atc_traits<D>::ROW]; /* [stage][key][d], padded rows */
    alignas(16) bf16 v[2][atc_traits<D>::KEYS * atc_traits<D>::ROW];
};
template <int D> struct atc_smem<D, true> {
    alignas(
        16) bf16 k[1][atc_traits<D>::KEYS * atc_traits<D>::ROW]; /* decoded codes, padded rows */
    alignas(16) bf16 v[1][atc_traits<D>::KEYS * atc_traits<D>::ROW];
    alignas(16) uint8_t k_codes[2][atc_traits<D>::KEYS * D]; /* [stage][key][d] */
    alignas(16) uint8_t v_codes[2][atc_traits<D>::KEYS * D];
    alignas(16) float k_scale[2][atc_traits<D>::KEYS]; /* [stage][key]; 0 past the keys */
    alignas(16) float v_scale[2][atc_traits<D>::KEYS];
};

/* ---- PTX wrappers ------------------------------------------------------------------------ */

static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte asynchronous copy global -> shared, cached in L2 only (.cg): a K/V row is reused by
 * the other token tiles of the same KV head (other blocks), never by this block. src_bytes 0
 * reads nothing and writes 16 zero bytes. */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
/* 4-byte asynchronous copy (a scale), through L1 (.ca: .cg copies only 16 bytes). */
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
/* cp_async_commit, cp_async_wait and ldmatrix_x4: ptx.cuh. */
/* The same, transposed: lane l receives rows 2(l%4), 2(l%4)+1 of column l/4 (V as B operand). */
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c[16x8] += a[16x16] . b[16x8], bf16 inputs, f32 accumulators. With g = lane/4, q = lane%4:
 * a = {(g, 2q..2q+1), (g+8, 2q..), (g, 2q+8..), (g+8, 2q+8..)}, b = {(k 2q..2q+1, n g),
 * (k 2q+8.., n g)}, c = {(g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1)}; the lower column (k)
 * sits in the low 16 bits of a pair. */
static __device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4],
                                                      uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x in one MUFU instruction (2 ulp); 2^-inf = +0. */
static __device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* (lo, hi) -> one register of two bf16, lo in the low half (the lower column of a fragment). */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* (a, b) as N bf16 pairs whose sum carries 8N significant bits (N = 2: hi plus the pair of
 * what hi misses, relative 2^-17 instead of bf16's 2^-9; N = 3: about fp32's 24), each term
 * the bf16 rounding of what the terms before it miss. */
template <int N>
static __device__ __forceinline__ void split_bf16x2_n(float a, float b, uint32_t (&parts)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        float2 hf = __bfloat1622float2(h);
        parts[i] = *(const uint32_t *)&h;
        a -= hf.x;
        b -= hf.y;
    }
}

/* ---- the kernel -------------------------------------------------------------------------- */

/* Starts the copy of keys [k0, k0 + KEYS) of one KV head into k_dst/v_dst ([KEYS][ROW]);
 * keys at or past khi are zero-filled. NT threads copy (tid: this thread's index among them):
 * thread i copies chunk i % CHUNKS of rows i / CHUNKS, + NT / CHUNKS, ...: 8 consecutive
 * threads read one 128-byte row (D = 64). */
template <int D, int KEYS, int NT>
static __device__ __forceinline__ void
load_kv_tile(bf16 *k_dst, bf16 *v_dst, const bf16 *k_cache, const bf16 *v_cache,
             const int32_t *table, int32_t block_size, int32_t n_kv_heads, int kv_head, int k0,
             int khi, int tid, int kmin = 0) {
    typedef atc_traits<D> tr;
    static_assert(NT % tr::CHUNKS == 0, "whole rows per pass");
    constexpr int ROWS_PER_PASS = NT / tr::CHUNKS;
    const int ch = tid % tr::CHUNKS;
#pragma unroll
    for (int r = tid / tr::CHUNKS; r < KEYS; r += ROWS_PER_PASS) {
        int j = k0 + r;
        uint32_t kd = smem_addr(k_dst + r * tr::ROW + ch * 8),
                 vd = smem_addr(v_dst + r * tr::ROW + ch * 8);
        if (j >= kmin && j < khi) {
            int blk = table[j / block_size];
            size_t off =
                (((size_t)blk * block_size + j % block_size) * n_kv_heads + kv_head) * D + ch * 8;
            cp_async16(kd, k_cache + off, 16);
            cp_async16(vd, v_cache + off, 16);
        } else {
            cp_async16(kd, k_cache, 0);
            cp_async16(vd, v_cache, 0);
        }
    }
}

/* The e4m3 form of load_kv_tile: the codes of keys [k0, k0 + KEYS) (16-byte chunks) and
 * their scales (4 bytes each) into one stage; keys at or past khi or before kmin are
 * zero-filled (code 0, scale 0). */
template <int D, int KEYS, int NT>
static __device__ __forceinline__ void
load_kv_codes(uint8_t *k_dst, uint8_t *v_dst, float *ks_dst, float *vs_dst, const uint8_t *k_cache,
              const uint8_t *v_cache, const float *k_scale, const float *v_scale,
              const int32_t *table, int32_t block_size, int32_t n_kv_heads, int kv_head, int k0,
              int khi, int tid, int kmin = 0) {
    typedef atc_traits<D> tr;
    for (int i = tid; i < KEYS * tr::CODE_CHUNKS; i += NT) {
        int r = i / tr::CODE_CHUNKS, ch = i % tr::CODE_CHUNKS, j = k0 + r;
        uint32_t kd = smem_addr(k_dst + r * D + ch * 16), vd = smem_addr(v_dst + r * D + ch * 16);
        if (j >= kmin && j < khi) {
            size_t off =
                (((size_t)table[j / block_size] * block_size + j % block_size) * n_kv_heads +
                 kv_head) *
                D;
            cp_async16(kd, k_cache + off + ch * 16, 16);
            cp_async16(vd, v_cache + off + ch * 16, 16);
        } else {
            cp_async16(kd, k_cache, 0);
            cp_async16(vd, v_cache, 0);
        }
    }
    for (int r = tid; r < KEYS; r += NT) {
        int j = k0 + r;
        const bool in = j >= kmin && j < khi;
        size_t slot = 0;
        if (in)
            slot = ((size_t)table[j / block_size] * block_size + j % block_size) * n_kv_heads +
                   kv_head;
        cp_async4(smem_addr(ks_dst + r), k_scale + slot, in ? 4 : 0);
        cp_async4(smem_addr(vs_dst + r), v_scale + slot, in ? 4 : 0);
    }
}

/* Eight codes (two 32-bit words, first code lowest) as eight bf16 in one 16-byte word. */
static __device__ __forceinline__ uint4 decode_e4m3x8(uint2 codes) {
    const uint32_t w[4] = {codes.x & 0xffffu, codes.x >> 16, codes.y & 0xffffu, codes.y >> 16};
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = gptoss_e4m3x2_decode((uint16_t)w[i]);
        out[i] = pack_bf16x2(f.x, f.y);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

/* Decodes one stage of codes into the bf16 tiles the warps read (NT threads, 8 codes at a
 * time; exact, the scales are applied in fp32 later). */
template <int D, int KEYS, int NT>
static __device__ __forceinline__ void
decode_kv_tile(bf16 *k_dst, bf16 *v_dst, const uint8_t *k_src, const uint8_t *v_src, int tid) {
    typedef atc_traits<D> tr;
    constexpr int CH = D / 8;
    for (int i = tid; i < KEYS * CH; i += NT) {
        int r = i / CH, c = i % CH;
        *(uint4 *)(k_dst + r * tr::ROW + c * 8) =
            decode_e4m3x8(*(const uint2 *)(k_src + r * D + c * 8));
        *(uint4 *)(v_dst + r * tr::ROW + c * 8) =
            decode_e4m3x8(*(const uint2 *)(v_src + r * D + c * 8));
    }
}

/* lane-constant parts of the ldmatrix addresses (bytes into a tile of rows of ROW bf16):
 * K (x4 = two key n-tiles of one k-step): lanes 0-7 keys 0-7 at d 0, 8-15 keys 0-7 at d 8,
 *   16-23 keys 8-15 at d 0, 24-31 keys 8-15 at d 8 -> b0b1, b2b3 of n-tile 2np, then 2np+1;
 * V (x4.trans = two d n-tiles of one key k-step): lanes 0-7 keys 0-7 at d 0, 8-15 keys 8-15
 *   at d 0, 16-23 keys 0-7 at d 8, 24-31 keys 8-15 at d 8 -> b0b1, b2b3 of d-tile 2dp, 2dp+1. */
template <int ROW> static __device__ __forceinline__ uint32_t k_lane_offset(int lane) {
    return (uint32_t)((((lane >> 4) * 8 + (lane & 7)) * ROW + ((lane >> 3) & 1) * 8) * 2);
}
template <int ROW> static __device__ __forceinline__ uint32_t v_lane_offset(int lane) {
    return (uint32_t)(((((lane >> 3) & 1) * 8 + (lane & 7)) * ROW + (lane >> 4) * 8) * 2);
}

/* S = Q K^T for SUB keys (log2 units): s[n] = C fragment of keys 8n .. 8n+7 of the rows at
 * k_base (lane offset included); q as NQ bf16 A fragments whose sum is q (split_bf16x2_n). */
template <int D, int SUB, int ROW, int NQ>
static __device__ __forceinline__ void
qk_step(float (&s)[SUB / 8][4], const uint32_t (&qf)[NQ][D / 16][4], uint32_t k_base) {
#pragma unroll
    for (int n = 0; n < SUB / 8; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int np = 0; np < SUB / 16; np++) {
            uint32_t b[4];
            ldmatrix_x4(b, k_base + (uint32_t)(((np * 16) * ROW + kk * 16) * 2));
#pragma unroll
            for (int i = 0; i < NQ; i++) {
                mma_bf16_16816(s[2 * np], qf[i][kk], b[0], b[1]);
                mma_bf16_16816(s[2 * np + 1], qf[i][kk], b[2], b[3]);
            }
        }
    }
}

/* s[n][e] *= scale of its key (e4m3 pages): sc holds SUB scales, frag_col = lane % 4. */
template <int SUB>
static __device__ __forceinline__ void scale_keys(float (&s)[SUB / 8][4], const float *sc,
                                                  int frag_col) {
#pragma unroll
    for (int n = 0; n < SUB / 8; n++) {
        const float2 f = *(const float2 *)&sc[8 * n + 2 * frag_col];
        s[n][0] *= f.x;
        s[n][1] *= f.y;
        s[n][2] *= f.x;
        s[n][3] *= f.y;
    }
}

/* One online-softmax step over SUB keys of masked scores s (log2 units) for fragment rows g
 * and g + 8, then O += P V from the V rows at v_base (lane offset included). The row sums take
 * P alone; with e4m3 pages (v_scale != NULL: SUB scales) P is then weighted by each key's
 * value scale before its product with the codes. */
template <int D, int SUB, int ROW, bool E4M3, int NP>
static __device__ __forceinline__ void
softmax_pv_step(float (&s)[SUB / 8][4], float (&o)[D / 8][4], float &max0, float &max1, float &sum0,
                float &sum1, uint32_t v_base, const float *v_scale, int frag_col) {
    /* online softmax: new max over the 4 lanes of a row, rescale, P = 2^(S - max) */
    float new0 = max0, new1 = max1;
#pragma unroll
    for (int n = 0; n < SUB / 8; n++) {
        new0 = fmaxf(new0, fmaxf(s[n][0], s[n][1]));
        new1 = fmaxf(new1, fmaxf(s[n][2], s[n][3]));
    }
    new0 = fmaxf(new0, __shfl_xor_sync(0xffffffffu, new0, 1));
    new0 = fmaxf(new0, __shfl_xor_sync(0xffffffffu, new0, 2));
    new1 = fmaxf(new1, __shfl_xor_sync(0xffffffffu, new1, 1));
    new1 = fmaxf(new1, __shfl_xor_sync(0xffffffffu, new1, 2));
    const float corr0 = exp2_fast(max0 - new0), corr1 = exp2_fast(max1 - new1);
    max0 = new0;
    max1 = new1;
    float step0 = 0.0f, step1 = 0.0f;
#pragma unroll
    for (int n = 0; n < SUB / 8; n++) {
        s[n][0] = exp2_fast(s[n][0] - max0);
        s[n][1] = exp2_fast(s[n][1] - max0);
        s[n][2] = exp2_fast(s[n][2] - max1);
        s[n][3] = exp2_fast(s[n][3] - max1);
        step0 += s[n][0] + s[n][1];
        step1 += s[n][2] + s[n][3];
    }
    sum0 = sum0 * corr0 + step0;
    sum1 = sum1 * corr1 + step1;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        o[n][0] *= corr0;
        o[n][1] *= corr0;
        o[n][2] *= corr1;
        o[n][3] *= corr1;
    }
    if constexpr (E4M3) scale_keys<SUB>(s, v_scale, frag_col); /* P * v_scale, after the sums */

        /* O += P V: key n-tiles 2kk, 2kk+1 of P are the A fragment of k-step kk; P as NP terms */
#pragma unroll
    for (int kk = 0; kk < SUB / 16; kk++) {
        uint32_t parts[4][NP], pf[NP][4];
        split_bf16x2_n<NP>(s[2 * kk][0], s[2 * kk][1], parts[0]);
        split_bf16x2_n<NP>(s[2 * kk][2], s[2 * kk][3], parts[1]);
        split_bf16x2_n<NP>(s[2 * kk + 1][0], s[2 * kk + 1][1], parts[2]);
        split_bf16x2_n<NP>(s[2 * kk + 1][2], s[2 * kk + 1][3], parts[3]);
#pragma unroll
        for (int i = 0; i < NP; i++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                pf[i][r] = parts[r][i];
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, v_base + (uint32_t)(((kk * 16) * ROW + dp * 16) * 2));
#pragma unroll
            for (int i = 0; i < NP; i++) {
                mma_bf16_16816(o[2 * dp], pf[i], b[0], b[1]);
                mma_bf16_16816(o[2 * dp + 1], pf[i], b[2], b[3]);
            }
        }
    }
}

/* Q rows as NQ-term A fragments for the D/16 k-steps (split_bf16x2_n), times log2(e) (the
 * softmax runs on exp2): q0 is fragment row g (lane / 4), q1 row g + 8; a NULL row is zero. */
template <int D, int NQ>
static __device__ __forceinline__ void q_fragments(uint32_t (&qf)[NQ][D / 16][4], const float *q0,
                                                   const float *q1, int frag_col) {
    const float log2e = 1.4426950408889634f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int c = 16 * kk + 8 * half + 2 * frag_col;
            float2 x0 = make_float2(0.0f, 0.0f), x1 = x0;
            if (q0) x0 = *(const float2 *)(q0 + c);
            if (q1) x1 = *(const float2 *)(q1 + c);
            uint32_t p0[NQ], p1[NQ];
            split_bf16x2_n<NQ>(x0.x * log2e, x0.y * log2e, p0);
            split_bf16x2_n<NQ>(x1.x * log2e, x1.y * log2e, p1);
#pragma unroll
            for (int i = 0; i < NQ; i++) {
                qf[i][kk][2 * half] = p0[i];
                qf[i][kk][2 * half + 1] = p1[i];
            }
        }
    }
}

/* Grid (ceil(n_tokens / tokens_per_block), n_kv_heads) (tokens_per_block 16 * subtiles, or 1),
 * ATTN_TC_PREFILL_THREADS threads. E4M3: the pages hold e4m3 codes with scales k_scale, v_scale
 * [n_blocks, block_size, n_kv_heads] (else the scales are unused). */
template <int D, bool E4M3>
static __global__ void __launch_bounds__(ATTN_TC_PREFILL_THREADS, atc_traits<D>::MIN_BLOCKS)
    attention_tc_kernel(const float *q, const atc_kv_t<E4M3> *k_cache,
                        const atc_kv_t<E4M3> *v_cache, const float *k_scale, const float *v_scale,
                        const int32_t *positions, const int32_t *token_seq,
                        const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                        const float *sinks, int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                        int32_t group, int32_t subtiles, int32_t tokens_per_block, int32_t window,
                        bf16 *out) {
    typedef atc_traits<D> tr;
    constexpr int KT = tr::KEYS, SUB = tr::SUB, ROW = tr::ROW;
    __shared__ atc_smem<D, E4M3> sm;
    __shared__ int32_t tile_pos[ATTN_TC_PREFILL_MAX_TOKENS],
        tile_seq[ATTN_TC_PREFILL_MAX_TOKENS]; /* the block's tokens */

    pdl_wait(); /* q, positions and the caches come from earlier kernels */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int frag_row = lane >> 2; /* g: fragment row of this lane (column of a B fragment) */
    const int frag_col = lane & 3;  /* q: fragment column pair */
    const int kv_head = blockIdx.y;
    const int n_tiles = (n_tokens + tokens_per_block - 1) / tokens_per_block;
    const int tb =
        (n_tiles - 1 - (int)blockIdx.x) * tokens_per_block; /* the block's tokens [tb, te) */
    const int te = min(n_tokens, tb + tokens_per_block);
    for (int i = threadIdx.x; i < te - tb; i += ATTN_TC_PREFILL_THREADS) {
        tile_pos[i] = positions[tb + i];
        tile_seq[i] = token_seq[tb + i];
    }

    /* warps past group * subtiles (group 3, 5, 6, 7) only copy: their rows lie past te */
    const int head = kv_head * group + warp % group;
    const int row0 =
        warp < group * subtiles ? tb + 16 * (warp / group) + frag_row : INT_MAX - 8; /* row g */
    const int row1 = row0 + 8; /* token of fragment row g + 8 */
    const float log2e = 1.4426950408889634f;

    /* Q as A fragments for the D/16 k-steps, scaled by log2(e); rows past te are zero */
    uint32_t qf[2][D / 16][4]; /* hi and lo parts */
    q_fragments<D, 2>(qf, row0 < te ? q + ((size_t)row0 * n_heads + head) * D : nullptr,
                      row1 < te ? q + ((size_t)row1 * n_heads + head) * D : nullptr, frag_col);

    float o[D / 8][4]; /* O rows g, g+8: o[n] = C fragment of output columns 8n..8n+7 */
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    /* running max of rows g, g+8 (log2 units), seeded with the sink; kept finite (-1e30 for a
     * sink of -inf) so that masked keys give 2^-inf = 0 and never inf - inf */
    float max0 = fmaxf(sinks[head] * log2e, -1e30f), max1 = max0;
    float sum0 = 0.0f, sum1 = 0.0f; /* this lane's share of the rows' sums, scaled to the max */

    const uint32_t k_lane = k_lane_offset<ROW>(lane), v_lane = v_lane_offset<ROW>(lane);

    __syncthreads(); /* tile_pos, tile_seq */

    for (int seg_start = tb; seg_start < te;) {
        /* the segment: tokens [seg_start, seg_end) of one sequence; keys [klo, khi) */
        const int seq = tile_seq[seg_start - tb];
        int seg_end = seg_start + 1;
        while (seg_end < te && tile_seq[seg_end - tb] == seq)
            seg_end++;
        int klo = INT_MAX, khi = 0;
        for (int t = seg_start; t < seg_end; t++) {
            int p = tile_pos[t - tb];
            klo = min(klo, window > 0 ? max(0, p - window + 1) : 0);
            khi = max(khi, p + 1);
        }
        /* The online-softmax steps at absolute multiples of SUB keys, whatever the segment's
         * first key: a row's sums then take the same steps in every tile, step and launch shape
         * (batch invariance; full layers start at key 0 anyway). Keys before kfirst are
         * zero-filled and masked, never read: their pages may be gone. */
        const int kfirst = klo;
        klo -= klo % SUB;
        /* this lane's rows see keys [lo(hi), hi), hi = p + 1; hi = 0 outside the segment */
        int hi0 = row0 >= seg_start && row0 < seg_end ? tile_pos[row0 - tb] + 1 : 0;
        int hi1 = row1 >= seg_start && row1 < seg_end ? tile_pos[row1 - tb] + 1 : 0;
        /* over the warp's 16 rows (lo is monotonic in hi): keys the warp sees are
         * [lo(first_hi), last_hi); keys every row sees are [lo(last_hi), all_hi), all_hi = 0
         * when a row is outside the segment (such tiles are masked) */
        int last_hi = max(hi0, hi1);
        int first_hi = min(hi0 > 0 ? hi0 : INT_MAX, hi1 > 0 ? hi1 : INT_MAX);
        int all_hi = min(hi0, hi1);
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) {
            last_hi = max(last_hi, __shfl_xor_sync(0xffffffffu, last_hi, x));
            first_hi = min(first_hi, __shfl_xor_sync(0xffffffffu, first_hi, x));
            all_hi = min(all_hi, __shfl_xor_sync(0xffffffffu, all_hi, x));
        }
        const int any_lo = window > 0 ? max(0, first_hi - window) : 0;
        const int all_lo = window > 0 ? max(0, last_hi - window) : 0;

        const int32_t *table = block_tables + (size_t)seq * max_blocks;
        /* starts the copy of the key tile at k1 into stage st */
        auto load_stage = [&](int st, int k1) {
            if constexpr (E4M3)
                load_kv_codes<D, KT, ATTN_TC_PREFILL_THREADS>(
                    sm.k_codes[st], sm.v_codes[st], sm.k_scale[st], sm.v_scale[st], k_cache,
                    v_cache, k_scale, v_scale, table, block_size, n_kv_heads, kv_head, k1, khi,
                    threadIdx.x, kfirst);
            else
                load_kv_tile<D, KT, ATTN_TC_PREFILL_THREADS>(sm.k[st], sm.v[st], k_cache, v_cache,
                                                             table, block_size, n_kv_heads, kv_head,
                                                             k1, khi, threadIdx.x, kfirst);
        };
        load_stage(0, klo);
        cp_async_commit();
        int stage = 0;
        for (int k0 = klo; k0 < khi; k0 += KT, stage ^= 1) {
            if (k0 + KT < khi) load_stage(stage ^ 1, k0 + KT);
            cp_async_commit(); /* possibly empty: keeps "all but the newest group" = this tile */
            cp_async_wait<1>();
            __syncthreads();
            if constexpr (E4M3) { /* the landed codes -> the bf16 tiles, for every warp */
                decode_kv_tile<D, KT, ATTN_TC_PREFILL_THREADS>(sm.k[0], sm.v[0], sm.k_codes[stage],
                                                               sm.v_codes[stage], threadIdx.x);
                __syncthreads();
            }
            if (k0 < last_hi && k0 + KT > any_lo) { /* warp-uniform */
                const int tile = E4M3 ? 0 : stage;
                const uint32_t k_base = smem_addr(sm.k[tile]) + k_lane;
                const uint32_t v_base = smem_addr(sm.v[tile]) + v_lane;

                /* the tile in steps of SUB keys, one online-softmax update each (keeps S small) */
#pragma unroll
                for (int sub = 0; sub < KT / SUB; sub++) {
                    const int ks = k0 + sub * SUB; /* first key of the step */
                    if (ks >= last_hi || ks + SUB <= any_lo) continue;

                    /* S = Q K^T (log2 units): s[n] = C fragment of keys ks + 8n .. +7 */
                    float s[SUB / 8][4];
                    qk_step<D, SUB, ROW, 2>(s, qf, k_base + (uint32_t)(sub * SUB * ROW * 2));
                    /* S = k_scale * (q . codes), before masking (0 * -inf) */
                    if constexpr (E4M3) scale_keys<SUB>(s, &sm.k_scale[stage][sub * SUB], frag_col);

                    /* causal / window / segment mask, only at the edge of some row's range */
                    if (!(ks >= all_lo && ks + SUB <= all_hi)) {
#pragma unroll
                        for (int n = 0; n < SUB / 8; n++) {
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                int j = ks + 8 * n + 2 * frag_col + (e & 1);
                                int hi = e < 2 ? hi0 : hi1;
                                bool seen = j < hi && (window <= 0 || j >= hi - window);
                                if (!seen) s[n][e] = -INFINITY;
                            }
                        }
                    }

                    const float *v_sc = nullptr;
                    if constexpr (E4M3) v_sc = &sm.v_scale[stage][sub * SUB];
                    softmax_pv_step<D, SUB, ROW, E4M3, 2>(s, o, max0, max1, sum0, sum1,
                                                          v_base + (uint32_t)(sub * SUB * ROW * 2),
                                                          v_sc, frag_col);
                }
            }
            __syncthreads(); /* the stage read here is the one loaded next iteration */
        }
        seg_start = seg_end;
    }

    /* out = O / (row sum + 2^(sink - max)) */
    const float sink = sinks[head] * log2e; /* read again: one register less in the loop */
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    const float inv0 = 1.0f / (sum0 + exp2_fast(sink - max0));
    const float inv1 = 1.0f / (sum1 + exp2_fast(sink - max1));
    if (row0 < te) {
        bf16 *dst = out + ((size_t)row0 * n_heads + head) * D + 2 * frag_col;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(__nv_bfloat162 *)(dst + 8 * n) =
                __floats2bfloat162_rn(o[n][0] * inv0, o[n][1] * inv0);
    }
    if (row1 < te) {
        bf16 *dst = out + ((size_t)row1 * n_heads + head) * D + 2 * frag_col;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(__nv_bfloat162 *)(dst + 8 * n) =
                __floats2bfloat162_rn(o[n][2] * inv1, o[n][3] * inv1);
    }
}

/* ---- decode: one token per block, keys split over warps and blocks ----------------------- */

/*
 * The split-K form for decode tokens (gptoss_cuda_attention's contract, partials included):
 * grid (n_tokens, n_kv_heads, n_splits), W warps. A block takes one token, the `group`
 * query heads of one KV head (fragment rows 0..group-1 of one m16 tile; the rest are zero) and
 * split `blockIdx.z` of the token's key range, cut into tiles of 32 keys (16 for head_dim
 * 128: adc_traits); warp w takes
 * tiles w, w + W, ... and streams them through a two-stage cp.async ring of its own
 * (no block barrier in the loop), so each warp keeps one tile in flight while it multiplies
 * the other:
 *
 *   warp w: [K, V of tile i+1 landing]   Q (8 heads) . K^T -> S [16 x 32] -> online softmax
 *                                       P (3 terms) . V -> O [16 x D]        (registers)
 *   end:    the warps' (max, sum, O) merged through shared memory -> out (one split) or the
 *           partial (max in natural-log units, sum, O) that gptoss_cuda_attention_merge
 *           combines with the sink, as the scalar kernel's partials.
 *
 * What a tile costs: 16 rows x 32 keys x D of mma for 8 useful rows, so half the tensor-core
 * work is padding; decode attention is bound by the KV bytes, not by the multiplies (a 32-key
 * tile is 8 KB of bf16 K and V for 96 mma). The scalar kernel read its tiles with 4-byte loads
 * into shared memory behind a block barrier and computed one lane per key in fp32.
 *
 * Rounding: q and P enter the tensor cores as three bf16 terms each (ATTN_TC_DECODE_BF16_TERMS), 24
 * significant bits, so a decode token's attention is as exact as the fp32 scalar kernel's.
 * With the prefill kernel's two terms (16 bits) the forward tests saw it: a score of 10 moves
 * by about 1e-4, enough to flip the bf16 rounding of a few percent of the outputs, and decode
 * scenarios that had matched the bf16-emulating CPU reference to 1e-7 drifted to 3e-3 (strict
 * bars failed on 6 of 7 models). Decode is bound by the KV bytes, so the third term costs
 * little there. The FP8 form decodes a landed stage into the warp's bf16 tile and applies the
 * scales in fp32 as the prefill kernel does.
 */
/* W = 8 warps for grids of at most ATTN_TC_DECODE_SMALL_GRID blocks (one-token steps over short
 * spans, and every sliding layer: one 32-key tile per warp at spans under 256, where 4 warps walked
 * two in a row), 4 otherwise: 8 warps take 147 KB of shared memory per block (D = 64), and a
 * grid of many such blocks keeps the O projection's blocks, which copy their weights before
 * their own wait, off those SMs (H100 tg128: +1.4% at depth 0 and +0.8% at 8192 for the rule;
 * 8 warps everywhere lost 2.2% at 8192). */

template <int D> struct adc_traits {
    static constexpr int KEYS = D <= 64 ? 32 : 16; /* keys per warp tile */
    static constexpr int ROW = atc_traits<D>::ROW;
};

/* One warp's shared memory: two stages of K and V tiles (bf16 pages), or two stages of codes
 * and scales plus the bf16 tile the landed stage is decoded into (e4m3 pages). After the key
 * loop the same bytes hold the warp's share of the merge ([16][D] O, then 16 max, 16 sums). */
template <int D, bool E4M3> struct adc_warp_smem {
    alignas(16) bf16 k[2][adc_traits<D>::KEYS * adc_traits<D>::ROW];
    alignas(16) bf16 v[2][adc_traits<D>::KEYS * adc_traits<D>::ROW];
};
template <int D> struct adc_warp_smem<D, true> {
    alignas(16) bf16 k[1][adc_traits<D>::KEYS * adc_traits<D>::ROW];
    alignas(16) bf16 v[1][adc_traits<D>::KEYS * adc_traits<D>::ROW];
    alignas(16) uint8_t k_codes[2][adc_traits<D>::KEYS * D];
    alignas(16) uint8_t v_codes[2][adc_traits<D>::KEYS * D];
    alignas(16) float k_scale[2][adc_traits<D>::KEYS];
    alignas(16) float v_scale[2][adc_traits<D>::KEYS];
};

template <int D, bool E4M3, int W>
static __global__ void __launch_bounds__(32 * W)
    attention_decode_kernel(const float *q, const atc_kv_t<E4M3> *k_cache,
                            const atc_kv_t<E4M3> *v_cache, const float *k_scale,
                            const float *v_scale, const int32_t *positions,
                            const int32_t *token_seq, const int32_t *block_tables,
                            int32_t max_blocks, int32_t block_size, const float *sinks,
                            int32_t n_heads, int32_t n_kv_heads, int32_t group, int32_t window,
                            int32_t n_splits, float *partial, bf16 *out) {
    typedef adc_traits<D> tr;
    constexpr int KT = tr::KEYS, ROW = tr::ROW;
    typedef adc_warp_smem<D, E4M3> warp_smem;
    static_assert(sizeof(warp_smem) >= (16 * D + 32) * sizeof(float),
                  "the merge reuses a warp's tiles");
    extern __shared__ __align__(16) unsigned char adc_smem_raw[];
    warp_smem *all = (warp_smem *)adc_smem_raw;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int frag_row = lane >> 2, frag_col = lane & 3;
    const int t = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
    warp_smem &sm = all[warp];
    /* Before the wait: the positions and block tables are the step's plan, copied before its
     * first kernel (complete once this grid can launch: its predecessor has passed its own
     * wait), and every key before p was written by earlier steps. Only q and key p come from
     * the kernels this one waits for. So the pages of the keys this block copies first (each
     * warp's first tile) are prefetched into L2 here, while the RoPE kernel runs; after the
     * wait their copies take an L2 trip instead of the table lookups plus a DRAM trip. */
    const int p = positions[t];
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int span = p - lo + 1;
    /* the split's keys [begin, end), as the scalar kernel cuts them (multiples of 32 keys) */
    const int chunk = ((span + n_splits - 1) / n_splits + 31) / 32 * 32;
    const int begin = lo + split * chunk;
    const int end = min(p + 1, begin + chunk);
    const int32_t *table = block_tables + (size_t)token_seq[t] * max_blocks;
    for (int j = begin + (int)threadIdx.x; j < min(min(end, p), begin + W * KT); j += 32 * W) {
        const size_t slot =
            ((size_t)table[j / block_size] * block_size + j % block_size) * n_kv_heads + kv_head;
        constexpr int ROW_BYTES = D * (E4M3 ? 1 : 2);
#pragma unroll
        for (int b = 0; b < ROW_BYTES; b += 128) {
            asm volatile(
                "prefetch.global.L2 [%0];" ::"l"((const uint8_t *)(k_cache + slot * D) + b));
            asm volatile(
                "prefetch.global.L2 [%0];" ::"l"((const uint8_t *)(v_cache + slot * D) + b));
        }
        if (E4M3) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(k_scale + slot));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(v_scale + slot));
        }
    }

    pdl_trigger_wait(); /* q and key p come from earlier kernels; the O projection may launch */

    const int n_tiles = end > begin ? (end - begin + KT - 1) / KT : 0;
    const int my_tiles = n_tiles > warp ? (n_tiles - warp + W - 1) / W : 0;

    auto load_stage =
        [&](int st,
            int i) { /* the warp's i-th tile into stage st */
                     const int k1 = begin + (warp + i * W) * KT;
                     if constexpr (E4M3)
                         load_kv_codes<D, KT, 32>(sm.k_codes[st], sm.v_codes[st], sm.k_scale[st],
                                                  sm.v_scale[st], k_cache, v_cache, k_scale,
                                                  v_scale, table, block_size, n_kv_heads, kv_head,
                                                  k1, end, lane);
                     else
                         load_kv_tile<D, KT, 32>(sm.k[st], sm.v[st], k_cache, v_cache, table,
                                                 block_size, n_kv_heads, kv_head, k1, end, lane);
        };
    /* the first tile's copies go out before q is read: the two L2 trips overlap */
    if (my_tiles > 0) load_stage(0, 0);
    cp_async_commit();
    const int head0 = kv_head * group;
    const float log2e = 1.4426950408889634f;
    uint32_t qf[ATTN_TC_DECODE_BF16_TERMS][D / 16][4];
    q_fragments<D, ATTN_TC_DECODE_BF16_TERMS>(
        qf, frag_row < group ? q + ((size_t)t * n_heads + head0 + frag_row) * D : nullptr,
        frag_row + 8 < group ? q + ((size_t)t * n_heads + head0 + frag_row + 8) * D : nullptr,
        frag_col);
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    /* running max seeded with the row's sink (finite, see the prefill kernel); padding rows 0 */
    float max0 = frag_row < group ? fmaxf(sinks[head0 + frag_row] * log2e, -1e30f) : 0.0f;
    float max1 = frag_row + 8 < group ? fmaxf(sinks[head0 + frag_row + 8] * log2e, -1e30f) : 0.0f;
    float sum0 = 0.0f, sum1 = 0.0f;

    const uint32_t k_lane = k_lane_offset<ROW>(lane), v_lane = v_lane_offset<ROW>(lane);
    for (int i = 0; i < my_tiles; i++) {
        const int stage = i & 1;
        if (i + 1 < my_tiles) load_stage(stage ^ 1, i + 1);
        cp_async_commit(); /* possibly empty: keeps "all but the newest group" = this tile */
        cp_async_wait<1>();
        __syncwarp();
        if constexpr (E4M3) {
            decode_kv_tile<D, KT, 32>(sm.k[0], sm.v[0], sm.k_codes[stage], sm.v_codes[stage], lane);
            __syncwarp();
        }
        const int tile = E4M3 ? 0 : stage;
        const int k0 = begin + (warp + i * W) * KT;
        float s[KT / 8][4];
        qk_step<D, KT, ROW, ATTN_TC_DECODE_BF16_TERMS>(s, qf, smem_addr(sm.k[tile]) + k_lane);
        if constexpr (E4M3) scale_keys<KT>(s, sm.k_scale[stage], frag_col);
        if (k0 + KT > end) { /* the last tile: keys past the split are zero-filled, masked here */
#pragma unroll
            for (int n = 0; n < KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (k0 + 8 * n + 2 * frag_col + (e & 1) >= end) s[n][e] = -INFINITY;
        }
        const float *v_sc = nullptr;
        if constexpr (E4M3) v_sc = sm.v_scale[stage];
        softmax_pv_step<D, KT, ROW, E4M3, ATTN_TC_DECODE_BF16_TERMS>(
            s, o, max0, max1, sum0, sum1, smem_addr(sm.v[tile]) + v_lane, v_sc, frag_col);
        __syncwarp(); /* this stage is refilled by the next iteration's load */
    }

    /* merge the warps: each writes (O, max, sum) of its 16 rows over its own tiles */
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    __syncthreads(); /* every warp is done with its tiles */
    {
        float *red = (float *)&sm;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *(float2 *)&red[frag_row * D + 8 * n + 2 * frag_col] = make_float2(o[n][0], o[n][1]);
            *(float2 *)&red[(frag_row + 8) * D + 8 * n + 2 * frag_col] =
                make_float2(o[n][2], o[n][3]);
        }
        if (frag_col == 0) {
            red[16 * D + frag_row] = max0;
            red[16 * D + frag_row + 8] = max1;
            red[16 * D + 16 + frag_row] = sum0;
            red[16 * D + 16 + frag_row + 8] = sum1;
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * D; idx += 32 * W) {
        const int r = idx / D, d = idx % D;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++)
            m = fmaxf(m, ((const float *)&all[w])[16 * D + r]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float *red = (const float *)&all[w];
            const float f = exp2_fast(red[16 * D + r] - m);
            num += red[r * D + d] * f;
            den += red[16 * D + 16 + r] * f;
        }
        const int head = head0 + r;
        if (n_splits == 1) {
            out[((size_t)t * n_heads + head) * D + d] =
                __float2bfloat16(num / (den + exp2_fast(fmaxf(sinks[head] * log2e, -1e30f) - m)));
        } else {
            float *pp = partial + (((size_t)t * n_heads + head) * n_splits + split) * (D + 2);
            pp[d] = num;
            if (d == 0) {
                pp[D] = m * 0.6931471805599453f; /* natural-log units, as the merge reads them */
                pp[D + 1] = den;
            }
        }
    }
}

/* ---- launcher ---------------------------------------------------------------------------- */

/* Checks the shape and launches the kernel for either page type (scales NULL for bf16). */
template <bool E4M3>
static int
attention_tc_launch(const float *q, const atc_kv_t<E4M3> *k_cache, const atc_kv_t<E4M3> *v_cache,
                    const float *k_scale, const float *v_scale, const int32_t *positions,
                    const int32_t *token_seq, const int32_t *block_tables, int32_t max_blocks,
                    int32_t block_size, const float *sinks, int32_t n_tokens, int32_t n_heads,
                    int32_t n_kv_heads, int32_t head_dim, int32_t window, bf16 *out, bool one_token,
                    cudaStream_t stream) {
    if (n_tokens <= 0) return 0;
    if (n_heads <= 0 || n_kv_heads <= 0 || n_kv_heads > 65535 || n_heads % n_kv_heads != 0)
        return -1;
    int32_t group = n_heads / n_kv_heads;
    if (group > ATTN_TC_PREFILL_MAX_WARPS || block_size <= 0 || max_blocks <= 0) return -1;
    if ((((uintptr_t)k_cache | (uintptr_t)v_cache) & 15) != 0 || ((uintptr_t)q & 7) != 0 ||
        ((uintptr_t)out & 3) != 0)
        return -1;
    if (E4M3 && (((uintptr_t)k_scale | (uintptr_t)v_scale) & 3) != 0) return -1;
    int32_t subtiles =
        ATTN_TC_PREFILL_MAX_WARPS / group; /* token tiles of 16 per block: 8 warps when group | 8 */
    int32_t tokens_per_block = one_token ? 1 : 16 * subtiles;
    dim3 grid((unsigned)((n_tokens + tokens_per_block - 1) / tokens_per_block),
              (unsigned)n_kv_heads);
    dim3 block(ATTN_TC_PREFILL_THREADS);
#define LAUNCH_ATT_TC(DIM)                                                                         \
    launch_pdl(attention_tc_kernel<DIM, E4M3>, grid, block, 0, stream, q, k_cache, v_cache,        \
               k_scale, v_scale, positions, token_seq, block_tables, max_blocks, block_size,       \
               sinks, n_tokens, n_heads, n_kv_heads, group, subtiles, tokens_per_block, window,    \
               out)
    switch (head_dim) {
    case 16:
        LAUNCH_ATT_TC(16);
        break;
    case 32:
        LAUNCH_ATT_TC(32);
        break;
    case 64:
        LAUNCH_ATT_TC(64);
        break;
    case 128:
        LAUNCH_ATT_TC(128);
        break;
    default:
        return -1;
    }
#undef LAUNCH_ATT_TC
    return 0;
}

int gptoss_cuda_attention_tc(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                             const int32_t *positions, const int32_t *token_seq,
                             const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                             const float *sinks, int32_t n_tokens, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim, int32_t window, bf16 *out,
                             cudaStream_t stream) {
    return attention_tc_launch<false>(q, k_cache, v_cache, nullptr, nullptr, positions, token_seq,
                                      block_tables, max_blocks, block_size, sinks, n_tokens,
                                      n_heads, n_kv_heads, head_dim, window, out, false, stream);
}

int gptoss_cuda_attention_tc_each(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                                  const int32_t *positions, const int32_t *token_seq,
                                  const int32_t *block_tables, int32_t max_blocks,
                                  int32_t block_size, const float *sinks, int32_t n_tokens,
                                  int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                  int32_t window, bf16 *out, cudaStream_t stream) {
    return attention_tc_launch<false>(q, k_cache, v_cache, nullptr, nullptr, positions, token_seq,
                                      block_tables, max_blocks, block_size, sinks, n_tokens,
                                      n_heads, n_kv_heads, head_dim, window, out, true, stream);
}

int gptoss_cuda_attention_tc_fp8(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                                 const float *k_scale, const float *v_scale,
                                 const int32_t *positions, const int32_t *token_seq,
                                 const int32_t *block_tables, int32_t max_blocks,
                                 int32_t block_size, const float *sinks, int32_t n_tokens,
                                 int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                 int32_t window, bf16 *out, cudaStream_t stream) {
    return attention_tc_launch<true>(q, k_cache, v_cache, k_scale, v_scale, positions, token_seq,
                                     block_tables, max_blocks, block_size, sinks, n_tokens, n_heads,
                                     n_kv_heads, head_dim, window, out, false, stream);
}

int gptoss_cuda_attention_tc_fp8_each(const float *q, const uint8_t *k_cache,
                                      const uint8_t *v_cache, const float *k_scale,
                                      const float *v_scale, const int32_t *positions,
                                      const int32_t *token_seq, const int32_t *block_tables,
                                      int32_t max_blocks, int32_t block_size, const float *sinks,
                                      int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                      int32_t head_dim, int32_t window, bf16 *out,
                                      cudaStream_t stream) {
    return attention_tc_launch<true>(q, k_cache, v_cache, k_scale, v_scale, positions, token_seq,
                                     block_tables, max_blocks, block_size, sinks, n_tokens, n_heads,
                                     n_kv_heads, head_dim, window, out, true, stream);
}

/* Raises the kernels' dynamic shared-memory limit (73 KB for D = 64 with 4 warps, 147 KB with
 * 8): once per head_dim, before the first launch, which may sit inside a graph capture. The
 * 8-warp form is optional (GPUs with under 147 KB per block run 4 warps everywhere). */
cudaError_t gptoss_cuda_attention_decode_prepare(int32_t head_dim) {
    gptoss_cuda_kernel_ctx *kc =
        gptoss_cuda_kernel_ctx_current(); /* adc_prepared, adc_wide_ok by head_dim */
    cudaError_t e = cudaSuccess;
    if (head_dim >= 0 && head_dim <= 128 && kc->adc_prepared[head_dim]) return cudaSuccess;
#define SET_SMEM(DIM, E4M3, W)                                                                     \
    gptoss_cuda_kernel_smem((const void *)attention_decode_kernel<DIM, E4M3, W>,                   \
                            W * sizeof(adc_warp_smem<DIM, E4M3>))
#define PREPARE_DEC(DIM)                                                                           \
    e = SET_SMEM(DIM, false, 4);                                                                   \
    if (e == cudaSuccess) e = SET_SMEM(DIM, true, 4);                                              \
    kc->adc_wide_ok[DIM] =                                                                         \
        SET_SMEM(DIM, false, 8) == cudaSuccess && SET_SMEM(DIM, true, 8) == cudaSuccess;           \
    (void)cudaGetLastError(); /* a refused 8-warp size is not an error: 4 warps run */
    switch (head_dim) {
    case 16:
        PREPARE_DEC(16);
        break;
    case 32:
        PREPARE_DEC(32);
        break;
    case 64:
        PREPARE_DEC(64);
        break;
    case 128:
        PREPARE_DEC(128);
        break;
    default:
        return cudaErrorInvalidValue;
    }
#undef PREPARE_DEC
#undef SET_SMEM
    if (e == cudaSuccess) kc->adc_prepared[head_dim] = true;
    return e;
}

/* Checks the shape and launches the decode kernel (and the merge of its splits) for either
 * page type (scales NULL for bf16). */
template <bool E4M3>
static int attention_decode_launch(const float *q, const atc_kv_t<E4M3> *k_cache,
                                   const atc_kv_t<E4M3> *v_cache, const float *k_scale,
                                   const float *v_scale, const int32_t *positions,
                                   const int32_t *token_seq, const int32_t *block_tables,
                                   int32_t max_blocks, int32_t block_size, const float *sinks,
                                   int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                   int32_t head_dim, int32_t window, int32_t n_splits,
                                   float *partial, bf16 *out, cudaStream_t stream) {
    if (n_tokens <= 0) return 0;
    if (n_heads <= 0 || n_kv_heads <= 0 || n_kv_heads > 65535 || n_heads % n_kv_heads != 0)
        return -1;
    int32_t group = n_heads / n_kv_heads;
    if (group > 16 || block_size <= 0 || max_blocks <= 0 || n_splits < 1 || n_splits > 256)
        return -1;
    if (n_splits > 1 && partial == nullptr) return -1;
    if ((((uintptr_t)k_cache | (uintptr_t)v_cache) & 15) != 0 || ((uintptr_t)q & 7) != 0 ||
        ((uintptr_t)out & 1) != 0)
        return -1;
    if (E4M3 && (((uintptr_t)k_scale | (uintptr_t)v_scale) & 3) != 0) return -1;
    if (head_dim != 16 && head_dim != 32 && head_dim != 64 && head_dim != 128) return -1;
    if (gptoss_cuda_attention_decode_prepare(head_dim) != cudaSuccess) return -1;
    dim3 grid((unsigned)n_tokens, (unsigned)n_kv_heads, (unsigned)n_splits);
    /* warps per block: the rule at ATTN_TC_DECODE_SMALL_GRID; the adc_warps knob (4 or 8) forces
     * one */
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    const int64_t n_blocks = (int64_t)n_tokens * n_kv_heads * n_splits;
    const int warps = !kc->adc_wide_ok[head_dim]              ? 4
                      : kc->adc_warps                         ? kc->adc_warps
                      : n_blocks <= ATTN_TC_DECODE_SMALL_GRID ? 8
                                                              : 4;
#define LAUNCH_DEC_W(DIM, W)                                                                       \
    launch_pdl(attention_decode_kernel<DIM, E4M3, W>, grid, dim3(32 * W),                          \
               W * sizeof(adc_warp_smem<DIM, E4M3>), stream, q, k_cache, v_cache, k_scale,         \
               v_scale, positions, token_seq, block_tables, max_blocks, block_size, sinks,         \
               n_heads, n_kv_heads, group, window, n_splits, partial, out)
#define LAUNCH_DEC(DIM)                                                                            \
    if (warps == 8)                                                                                \
        LAUNCH_DEC_W(DIM, 8);                                                                      \
    else                                                                                           \
        LAUNCH_DEC_W(DIM, 4)
    switch (head_dim) {
    case 16:
        LAUNCH_DEC(16);
        break;
    case 32:
        LAUNCH_DEC(32);
        break;
    case 64:
        LAUNCH_DEC(64);
        break;
    default:
        LAUNCH_DEC(128);
        break;
    }
#undef LAUNCH_DEC
#undef LAUNCH_DEC_W
    if (n_splits > 1)
        gptoss_cuda_attention_merge(partial, sinks, n_tokens, n_heads, head_dim, n_splits, out,
                                    stream);
    return 0;
}

int gptoss_cuda_attention_decode(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                                 const int32_t *positions, const int32_t *token_seq,
                                 const int32_t *block_tables, int32_t max_blocks,
                                 int32_t block_size, const float *sinks, int32_t n_tokens,
                                 int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                 int32_t window, int32_t n_splits, float *partial, bf16 *out,
                                 cudaStream_t stream) {
    return attention_decode_launch<false>(q, k_cache, v_cache, nullptr, nullptr, positions,
                                          token_seq, block_tables, max_blocks, block_size, sinks,
                                          n_tokens, n_heads, n_kv_heads, head_dim, window, n_splits,
                                          partial, out, stream);
}

int gptoss_cuda_attention_decode_fp8(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                                     const float *k_scale, const float *v_scale,
                                     const int32_t *positions, const int32_t *token_seq,
                                     const int32_t *block_tables, int32_t max_blocks,
                                     int32_t block_size, const float *sinks, int32_t n_tokens,
                                     int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                     int32_t window, int32_t n_splits, float *partial, bf16 *out,
                                     cudaStream_t stream) {
    return attention_decode_launch<true>(q, k_cache, v_cache, k_scale, v_scale, positions,
                                         token_seq, block_tables, max_blocks, block_size, sinks,
                                         n_tokens, n_heads, n_kv_heads, head_dim, window, n_splits,
                                         partial, out, stream);
}
