/*
 * kv_pool.cu - the KV cache's pages on the device: how many fit (from the options, or from a
 * fraction of the GPU's memory), their buffers per layer (bf16, or e4m3 codes with one fp32
 * scale per token and KV head), and page sharing, where the k-th sliding layer uses the k-th
 * full layer's buffers so that one id space serves both pools. Owns the page buffers of the
 * layers that are not aliases (freed by gptoss_cuda_kv_free).
 */
#include "backend/cuda/cuda_backend.h"

extern "C" {
#include "model/config.h"
}

/* Bytes of one page over every layer of the full pool and of the sliding pool (0 with shared
 * pages: the sliding pool then costs no memory of its own). */
static void page_bytes(const gptoss_cuda_state *s, gptoss_kv_cache_dtype dtype, size_t *full_block,
                       size_t *sliding_block) {
    const gptoss_config *c = &s->config;
    size_t kv_token = gptoss_kv_cache_token_bytes(c, GPTOSS_BACKEND_CUDA, dtype); /* K and V */
    size_t n_sliding = 0;
    for (int l = 0; l < c->n_layers; l++)
        n_sliding += c->layer_is_sliding[l] && c->sliding_window > 0;
    *full_block =
        ((size_t)c->n_layers - n_sliding) * s->kv_block_size * kv_token; /* one page, all layers */
    *sliding_block = s->kv_shared ? 0 : n_sliding * s->kv_block_size * kv_token;
}

gptoss_status gptoss_cuda_kv_plan(gptoss_cuda_state *s, const gptoss_backend_options *options,
                                  size_t weight_bytes, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    s->kv_fp8 = options->kv_cache_dtype == GPTOSS_KV_CACHE_FP8;
    s->kv_block_size = options->kv_block_size;
    s->n_kv_blocks = options->n_kv_blocks;
    s->n_sliding_kv_blocks =
        options->n_sliding_kv_blocks > 0 ? options->n_sliding_kv_blocks : options->n_kv_blocks;
    size_t n_sliding = 0;
    for (int l = 0; l < c->n_layers; l++)
        n_sliding += c->layer_is_sliding[l] && c->sliding_window > 0;
    /* shared pages: the k-th sliding layer lives in the k-th full layer's buffers */
    s->kv_shared =
        options->kv_shared_pages && n_sliding > 0 && 2 * n_sliding == (size_t)c->n_layers;
    if (s->kv_shared) s->n_sliding_kv_blocks = s->n_kv_blocks;
    size_t full_block, sliding_block;
    page_bytes(s, options->kv_cache_dtype, &full_block, &sliding_block);
    const bool auto_kv = options->gpu_memory_utilization > 0;
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    size_t kv_need = auto_kv ? full_block + (size_t)s->n_sliding_kv_blocks * sliding_block
                             : (size_t)s->n_kv_blocks * full_block +
                                   (size_t)s->n_sliding_kv_blocks * sliding_block;
    if (weight_bytes + kv_need > free_b)
        return gptoss_set_error(
            error, GPTOSS_ERR_OUT_OF_MEMORY,
            "CUDA: the model needs %.2f GiB of weights and %.2f GiB of KV cache but %s "
            "has %.2f GiB free; lower n_kv_blocks or use a larger GPU",
            weight_bytes / 1073741824.0, kv_need / 1073741824.0, s->dev.name,
            free_b / 1073741824.0);
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_kv_alloc(gptoss_cuda_state *s, const gptoss_backend_options *options,
                                   gptoss_error *error) {
    const gptoss_config *c = &s->config;
    const size_t D = c->head_dim, NKV = c->n_kv_heads;
    size_t full_block, sliding_block;
    page_bytes(s, options->kv_cache_dtype, &full_block, &sliding_block);
    gptoss_status st;
    if (options->gpu_memory_utilization > 0) {
        /* Everything allocated so far (ours, other processes', the context) counts against
         * the fraction; keep 512 MiB for cuBLAS, graphs and the plan buffers. */
        size_t free_b = 0, total_b = 0;
        CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        double budget = options->gpu_memory_utilization * (double)total_b -
                        (double)(total_b - free_b) - 512.0 * (1 << 20) -
                        (double)s->n_sliding_kv_blocks * (double)sliding_block;
        double blocks = full_block ? budget / (double)full_block : 0;
        if (blocks > (double)(1 << 24)) blocks = (double)(1 << 24);
        if (blocks < 1)
            return gptoss_set_error(
                error, GPTOSS_ERR_OUT_OF_MEMORY,
                "CUDA: no KV cache page fits in %.0f%% of %s's %.1f GiB after %.2f GiB of weights "
                "and workspace; raise the memory fraction or use a larger GPU",
                options->gpu_memory_utilization * 100, s->dev.name, total_b / 1073741824.0,
                (s->weight_bytes + s->ws.bytes) / 1073741824.0);
        s->n_kv_blocks = (int32_t)blocks;
        if (s->kv_shared) s->n_sliding_kv_blocks = s->n_kv_blocks;
    }
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        if (s->kv_shared && L->sliding) continue; /* aliased below */
        size_t slots =
            (size_t)(L->sliding ? s->n_sliding_kv_blocks : s->n_kv_blocks) * s->kv_block_size * NKV;
        if (s->kv_fp8) { /* codes, then (256-byte aligned) the scales, in one allocation each for K
                            and V */
            size_t codes = (slots * D + 255) & ~(size_t)255, pool = codes + slots * sizeof(float);
            st = gptoss_cuda_alloc((void **)&L->k_fp8, pool, "the KV cache", error);
            if (st) return st;
            st = gptoss_cuda_alloc((void **)&L->v_fp8, pool, "the KV cache", error);
            if (st) return st;
            L->k_scale = (float *)(L->k_fp8 + codes);
            L->v_scale = (float *)(L->v_fp8 + codes);
            s->kv_bytes += 2 * pool;
        } else {
            size_t pool = slots * D * 2;
            st = gptoss_cuda_alloc((void **)&L->k_cache, pool, "the KV cache", error);
            if (st) return st;
            st = gptoss_cuda_alloc((void **)&L->v_cache, pool, "the KV cache", error);
            if (st) return st;
            s->kv_bytes += 2 * pool;
        }
    }
    if (s->kv_shared) { /* sliding layer k takes full layer k's buffers */
        int full = 0;
        for (int l = 0; l < c->n_layers; l++) {
            cuda_layer *L = &s->layers[l];
            if (!L->sliding) continue;
            while (s->layers[full].sliding)
                full++;
            const cuda_layer *F = &s->layers[full++];
            L->k_cache = F->k_cache;
            L->v_cache = F->v_cache;
            L->k_fp8 = F->k_fp8;
            L->v_fp8 = F->v_fp8;
            L->k_scale = F->k_scale;
            L->v_scale = F->v_scale;
            L->kv_alias = true;
        }
    }
    return GPTOSS_OK;
}

void gptoss_cuda_kv_free(gptoss_cuda_state *s) {
    if (!s->layers) return;
    for (int l = 0; l < s->config.n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        if (L->kv_alias) continue;
        cudaFree(L->k_cache);
        cudaFree(L->v_cache);
        cudaFree(L->k_fp8);
        cudaFree(L->v_fp8);
    }
}
