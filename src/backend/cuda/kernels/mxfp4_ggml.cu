/*
 * mxfp4_ggml.cu - MXFP4 expert rows from ggml's layout (a GGUF file's bytes, uploaded as they
 * are) into the Hugging Face layout the MoE kernels read, so a GGUF model's experts need no
 * converted copy in host memory (see gptoss_ggml_experts in model/weights.h).
 */
#include "backend/cuda/cuda_kernels.h"

/* One thread per 32-value block. ggml: the E8M0 scale byte, then qs[j] = lane j | lane j+16 << 4.
 * Hugging Face: 16 code bytes, byte b = lane 2b | lane 2b+1 << 4, and the scale apart. The same
 * shuffle as the loader's host conversion (loader/load_gguf.c repack_mxfp4). */
static __global__ void mxfp4_from_ggml_kernel(const uint8_t *src, size_t n_blocks, int64_t G,
                                              int64_t row0, int64_t R, int64_t row_step,
                                              int64_t row_offset, uint8_t *blocks,
                                              uint8_t *scales) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_blocks;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint8_t *in = src + i * 17, *qs = in + 1;
        int64_t row = row0 + (int64_t)(i / (size_t)G), g = (int64_t)(i % (size_t)G);
        int64_t e = row / R, r = row % R;
        size_t d = (size_t)(e * R * row_step + r * row_step + row_offset) * (size_t)G + (size_t)g;
        uint32_t w[4] = {0, 0, 0, 0};
        for (int b = 0; b < 8; b++) {
            uint32_t lo = (uint32_t)((qs[2 * b] & 15) | (qs[2 * b + 1] & 15) << 4);
            uint32_t hi = (uint32_t)((qs[2 * b] >> 4) | (qs[2 * b + 1] & 0xf0));
            w[b / 4] |= lo << (8 * (b % 4));
            w[2 + b / 4] |= hi << (8 * (b % 4));
        }
        *(uint4 *)(blocks + d * 16) = make_uint4(w[0], w[1], w[2], w[3]);
        scales[d] = in[0];
    }
}

int gptoss_cuda_mxfp4_from_ggml(const uint8_t *src, int64_t row0, int64_t n_rows, int64_t R,
                                int64_t G, int64_t row_step, int64_t row_offset, uint8_t *blocks,
                                uint8_t *scales, cudaStream_t stream) {
    if ((uintptr_t)blocks % 16 || R < 1 || G < 1 || row_step < 1 || row_offset < 0 ||
        row_offset >= row_step)
        return 1;
    size_t n = (size_t)n_rows * (size_t)G;
    if (!n) return 0;
    size_t grid = (n + 255) / 256;
    mxfp4_from_ggml_kernel<<<(unsigned)(grid < 65536 ? grid : 65536), 256, 0, stream>>>(
        src, n, G, row0, R, row_step, row_offset, blocks, scales);
    return 0;
}
