/*
 * eagle3.cu - an EAGLE3 draft head's own kernels (eagle3.h). The head is small (one decoder
 * layer) and its caches short, so these are plain: one block per row (norms, RoPE) or per
 * (row, head) (attention, four warps each with its own online softmax over a quarter of the
 * positions, merged at the end), fp32 arithmetic throughout.
 */
#include "backend/cuda/kernels/eagle3.h"

#include <math.h>

#define E3_THREADS 256
#define E3_ATTN_WARPS 4

static __device__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < n_warps; w++)
        total += red[w];
    return total;
}

static __global__ void to_bf16_kernel(const float *in, size_t n, bf16 *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}

void gptoss_cuda_e3_to_bf16(const float *in, size_t n, bf16 *out, cudaStream_t stream) {
    if (n == 0) return;
    size_t blocks = (n + E3_THREADS - 1) / E3_THREADS;
    if (blocks > 4096) blocks = 4096;
    to_bf16_kernel<<<(unsigned)blocks, E3_THREADS, 0, stream>>>(in, n, out);
}

static __global__ void inputs_kernel(const int32_t *meta, int32_t n, const bf16 *embedding,
                                     const float *fc_out, const float *chain, const float *g_embed,
                                     const float *g_hidden, float eps, int32_t H, float *hidden_out,
                                     bf16 *x2) {
    __shared__ float red[E3_THREADS / 32];
    const int r = blockIdx.x;
    const int32_t token = meta[GPTOSS_E3_TOKEN * n + r], aux = meta[GPTOSS_E3_AUX_ROW * n + r];
    const bf16 *e = embedding + (size_t)token * H;
    const float *h = aux >= 0 ? fc_out + (size_t)aux * H : chain + (size_t)r * H;
    float se = 0.0f, sh = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float a = __bfloat162float(e[i]), b = h[i];
        se += a * a;
        sh += b * b;
    }
    const float inv_e = rsqrtf(block_sum(se, red) / H + eps);
    const float inv_h = rsqrtf(block_sum(sh, red) / H + eps);
    bf16 *x = x2 + (size_t)r * 2 * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float b = h[i];
        hidden_out[(size_t)r * H + i] = b;
        x[i] = __float2bfloat16(__bfloat162float(e[i]) * inv_e * g_embed[i]);
        x[H + i] = __float2bfloat16(b * inv_h * g_hidden[i]);
    }
}

void gptoss_cuda_e3_inputs(const int32_t *meta, int32_t n, const bf16 *embedding,
                           const float *fc_out, const float *chain, const float *g_embed,
                           const float *g_hidden, float eps, int32_t hidden, float *hidden_out,
                           bf16 *x2, cudaStream_t stream) {
    if (n <= 0) return;
    inputs_kernel<<<n, E3_THREADS, 0, stream>>>(meta, n, embedding, fc_out, chain, g_embed,
                                                g_hidden, eps, hidden, hidden_out, x2);
}

/* One block per row: (NH + NKV) * D/2 rotations, then K and V into the cache. */
static __global__ void rope_kv_kernel(float *qkv, const int32_t *meta, float *const *kv, int32_t n,
                                      const float *inv_freq, int32_t NH, int32_t NKV, int32_t D) {
    const int r = blockIdx.x, half = D / 2;
    const int32_t pos = meta[GPTOSS_E3_POSITION * n + r], slot = meta[GPTOSS_E3_WRITE * n + r];
    const int32_t width = (NH + 2 * NKV) * D, kv_dim = NKV * D;
    float *row = qkv + (size_t)r * width;
    for (int i = threadIdx.x; i < (NH + NKV) * half; i += blockDim.x) {
        const int head = i / half, j = i % half;
        float *v = row + (size_t)head * D;
        const float angle = (float)pos * inv_freq[j];
        const float c = cosf(angle), s = sinf(angle);
        const float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
    __syncthreads();
    float *k_cache = kv[r] + (size_t)slot * kv_dim, *v_cache = kv[n + r] + (size_t)slot * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k_cache[i] = row[(size_t)NH * D + i];
        v_cache[i] = row[(size_t)(NH + NKV) * D + i];
    }
}

void gptoss_cuda_e3_rope_kv(float *qkv, const int32_t *meta, float *const *kv, int32_t n,
                            const float *inv_freq, int32_t n_heads, int32_t n_kv_heads,
                            int32_t head_dim, cudaStream_t stream) {
    if (n <= 0) return;
    rope_kv_kernel<<<n, E3_THREADS, 0, stream>>>(qkv, meta, kv, n, inv_freq, n_heads, n_kv_heads,
                                                 head_dim);
}

/* Block (row, head): warp w takes positions w, w + 4, ...; lane l holds dims l, l + 32, ... */
template <int DPL>
static __global__ void attention_kernel(const float *qkv, const int32_t *meta, float *const *kv,
                                        int32_t n, int32_t NH, int32_t NKV, bf16 *out) {
    constexpr int D = DPL * 32;
    __shared__ float m_w[E3_ATTN_WARPS], l_w[E3_ATTN_WARPS], acc_w[E3_ATTN_WARPS][D];
    const int r = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = h / (NH / NKV), kv_dim = NKV * D;
    const int32_t n_ctx = meta[GPTOSS_E3_CTX * n + r];
    const float *q = qkv + (size_t)r * (NH + 2 * NKV) * D + (size_t)h * D;
    const float scale = rsqrtf((float)D);
    float qr[DPL], acc[DPL];
    for (int i = 0; i < DPL; i++) {
        qr[i] = q[lane + 32 * i] * scale;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const float *K = kv[r] + (size_t)g * D, *V = kv[n + r] + (size_t)g * D;
    for (int j = warp; j < n_ctx; j += E3_ATTN_WARPS) {
        const float *k = K + (size_t)j * kv_dim, *v = V + (size_t)j * kv_dim;
        float s = 0.0f;
        for (int i = 0; i < DPL; i++)
            s += qr[i] * k[lane + 32 * i];
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        const float m_new = fmaxf(m, s), corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        for (int i = 0; i < DPL; i++)
            acc[i] = acc[i] * corr + p * v[lane + 32 * i];
        m = m_new;
    }
    if (lane == 0) m_w[warp] = m, l_w[warp] = l;
    for (int i = 0; i < DPL; i++)
        acc_w[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < E3_ATTN_WARPS; w++)
        M = fmaxf(M, m_w[w]);
    float L = 0.0f;
    for (int w = 0; w < E3_ATTN_WARPS; w++)
        L += m_w[w] == -INFINITY ? 0.0f : l_w[w] * expf(m_w[w] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < E3_ATTN_WARPS; w++)
            if (m_w[w] != -INFINITY) o += acc_w[w][d] * expf(m_w[w] - M);
        out[(size_t)r * NH * D + (size_t)h * D + d] = __float2bfloat16(o / L);
    }
}

int gptoss_cuda_e3_attention(const float *qkv, const int32_t *meta, float *const *kv, int32_t n,
                             int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, bf16 *out,
                             cudaStream_t stream) {
    if (n <= 0) return 0;
    dim3 grid(n, n_heads);
    const int threads = 32 * E3_ATTN_WARPS;
    if (head_dim == 32)
        attention_kernel<1>
            <<<grid, threads, 0, stream>>>(qkv, meta, kv, n, n_heads, n_kv_heads, out);
    else if (head_dim == 64)
        attention_kernel<2>
            <<<grid, threads, 0, stream>>>(qkv, meta, kv, n, n_heads, n_kv_heads, out);
    else if (head_dim == 128)
        attention_kernel<4>
            <<<grid, threads, 0, stream>>>(qkv, meta, kv, n, n_heads, n_kv_heads, out);
    else
        return 1;
    return 0;
}

static __global__ void swiglu_kernel(const float *gu, int32_t n, int32_t I, bf16 *act) {
    const size_t total = (size_t)n * I;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / I, c = i % I;
        const float g = gu[r * 2 * I + c], u = gu[r * 2 * I + I + c];
        act[i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
    }
}

void gptoss_cuda_e3_swiglu(const float *gu, int32_t n, int32_t inter, bf16 *act,
                           cudaStream_t stream) {
    if (n <= 0) return;
    size_t blocks = ((size_t)n * inter + E3_THREADS - 1) / E3_THREADS;
    if (blocks > 4096) blocks = 4096;
    swiglu_kernel<<<(unsigned)blocks, E3_THREADS, 0, stream>>>(gu, n, inter, act);
}

static __global__ void gather_f32_kernel(const float *src, const int32_t *rows, int32_t width,
                                         float *out) {
    const float *from = src + (size_t)rows[blockIdx.x] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        out[(size_t)blockIdx.x * width + i] = from[i];
}

void gptoss_cuda_e3_gather_f32(const float *src, const int32_t *rows, int32_t n_rows, int32_t width,
                               float *out, cudaStream_t stream) {
    if (n_rows <= 0) return;
    gather_f32_kernel<<<n_rows, E3_THREADS, 0, stream>>>(src, rows, width, out);
}

static __global__ void sum_chunks_kernel(const float *parts, int32_t C, int32_t G, int32_t n,
                                         float *y) {
    const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float sum = 0.0f;
    for (int32_t c = 0; c < C; c++) {
        const int32_t g = c / G, i = c % G, cg = C - g * G < G ? C - g * G : G;
        sum += parts[(size_t)g * G * G * n + (size_t)i * cg * n + (size_t)i * n + j];
    }
    y[j] = sum;
}

void gptoss_cuda_e3_sum_chunks(const float *parts, int32_t n_chunks, int32_t group, int32_t n,
                               float *y, cudaStream_t stream) {
    if (n <= 0 || n_chunks <= 0) return;
    sum_chunks_kernel<<<(n + E3_THREADS - 1) / E3_THREADS, E3_THREADS, 0, stream>>>(parts, n_chunks,
                                                                                    group, n, y);
}
