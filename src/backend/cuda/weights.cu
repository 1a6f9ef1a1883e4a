/*
 * weights.cu - the model's weights on the device: allocation (bf16, or e4m3 with row scales
 * for the FP8 dense layers), upload from a loaded model (FP8 matrices quantized on the way
 * through a bf16 scratch), random weights for the bench, and what is derived once they are
 * in place. Owns the weight buffers of a state and the FP8 layers' scratch (freed by
 * gptoss_cuda_weights_free), and the host blocks of weights in host memory.
 *
 * Weights in host memory (s->weights_host: an integrated GPU, or weights_in_host_memory):
 * the large matrices the kernels read as stored (embedding, lm_head and O in bf16, the
 * router matrix, the MXFP4 expert blocks and scales) are used in place: the checkpoint's
 * mapped ranges are registered with the driver (read-only, mapped) and the kernels get their
 * device addresses; a matrix not 16-byte aligned in the file, or in a range the driver does
 * not register, is copied into pinned host memory instead. What the backend converts at load
 * stays in device memory: QKV (joined from q, k and v), FP8 matrices, the fp32 norms, biases
 * and sinks, and the router's fp32 copy. Random weights go to pinned host memory.
 */
#include "backend/cuda/cuda_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "model/config.h"
#include "util/clock.h"
#include "util/log.h"
}

static size_t dense_bytes(size_t n, size_t k, bool fp8) {
    return fp8 ? gptoss_cuda_e4m3_bytes(n, k) : n * k * 2;
}

static size_t layer_weight_bytes(const gptoss_config *c, uint32_t fp8_layers) {
    size_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts;
    size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim,
           q = (size_t)c->n_heads * c->head_dim;
    size_t b = 0;
    b += 2 * H * 4 + dense_bytes(qkv, H, fp8_layers & GPTOSS_FP8_QKV) + qkv * 4 +
         dense_bytes(H, q, fp8_layers & GPTOSS_FP8_O) + H * 4 + c->n_heads * 4 + E * H * (2 + 4) +
         E * 4;
    b += E * 2 * I * (H / 32) * 17 + E * 2 * I * 4 + E * H * (I / 32) * 17 + E * H * 4;
    return b + 16 * 256; /* alignment slack */
}

/* A dense [n, k] matrix in the form fp8 asks for (see gptoss_cuda_dense_weight), counted as
 * weights. */
static gptoss_status dense_alloc(gptoss_cuda_state *s, gptoss_cuda_dense_weight *w, size_t n,
                                 size_t k, bool fp8, const char *what, gptoss_error *error) {
    memset(w, 0, sizeof *w);
    if (fp8 && k % 16)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA: %s cannot be held in FP8: rows of %zu weights (a multiple of 16 is needed)",
            what, k);
    size_t bytes = dense_bytes(n, k, fp8);
    gptoss_status st =
        gptoss_cuda_alloc(fp8 ? (void **)&w->w_e4m3 : (void **)&w->w_bf16, bytes, what, error);
    if (st) return st;
    if (fp8) w->row_scale = (float *)(w->w_e4m3 + gptoss_cuda_e4m3_scale_offset(n, k));
    s->weight_bytes += bytes;
    return GPTOSS_OK;
}

static void dense_free(gptoss_cuda_dense_weight *w) {
    cudaFree(w->w_bf16);
    cudaFree(w->w_e4m3);
}

/* bf16 elements of the FP8 layers' scratch: a whole QKV or O matrix (staged there at load
 * time, decoded there for prefill GEMMs), and lm_head in blocks of up to 4096 rows. */
static size_t dense_scratch_elems(const gptoss_config *c, uint32_t fp8_layers) {
    size_t H = c->hidden_size, V = c->vocab_size, q = (size_t)c->n_heads * c->head_dim;
    size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim, e = 0;
    if ((fp8_layers & GPTOSS_FP8_QKV) && qkv * H > e) e = qkv * H;
    if ((fp8_layers & GPTOSS_FP8_O) && H * q > e) e = H * q;
    if ((fp8_layers & GPTOSS_FP8_LM_HEAD) && (V < 4096 ? V : 4096) * H > e)
        e = (V < 4096 ? V : 4096) * H;
    return e;
}

/* Bytes of the matrices held in host memory with weights_host (host_slots lists them). */
static size_t host_matrix_bytes(const gptoss_config *c, uint32_t fp8_layers) {
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t q = (size_t)c->n_heads * c->head_dim;
    size_t layer = E * H * 2 + E * 2 * I * (H / 32) * 17 + E * H * (I / 32) * 17;
    if (!(fp8_layers & GPTOSS_FP8_O)) layer += H * q * 2;
    return V * H * 2 + (fp8_layers & GPTOSS_FP8_LM_HEAD ? 0 : V * H * 2) +
           (size_t)c->n_layers * layer;
}

size_t gptoss_cuda_weights_bytes(const gptoss_config *c, uint32_t fp8_layers, bool weights_host) {
    size_t H = c->hidden_size, V = c->vocab_size;
    return V * H * 2 + dense_bytes(V, H, fp8_layers & GPTOSS_FP8_LM_HEAD) +
           (size_t)c->n_layers * layer_weight_bytes(c, fp8_layers) +
           dense_scratch_elems(c, fp8_layers) * 2 -
           (weights_host ? host_matrix_bytes(c, fp8_layers) : 0);
}

/* ---- weights in host memory ------------------------------------------------------------- */

/* Something weights_free gives back: a registered range, or a pinned buffer. */
typedef struct gptoss_cuda_host_block {
    void *p;
    bool registered; /* cudaHostUnregister; else cudaFreeHost */
} gptoss_cuda_host_block;

/* One matrix held in host memory: the pointer the kernels use, its bytes, its tensor (NULL
 * for random weights) and whether it must be bf16. */
typedef struct host_slot {
    void **dst;
    size_t bytes;
    const gptoss_tensor *src;
    bool bf16;
} host_slot;

/* The matrices held in host memory, in a fixed order; out (may be NULL) gets them. Returns how
 * many. w may be NULL (random weights, or freeing). */
static int32_t host_slots(gptoss_cuda_state *s, const gptoss_weights *w, host_slot *out) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t q = (size_t)c->n_heads * c->head_dim;
    int32_t n = 0;
#define SLOT(ptr, nbytes, tensor, is_bf16)                                                         \
    do {                                                                                           \
        if (out) out[n] = (host_slot){(void **)&(ptr), (nbytes), w ? &(tensor) : NULL, (is_bf16)}; \
        n++;                                                                                       \
    } while (0)
    SLOT(s->embedding, V * H * 2, w->embedding, true);
    if (!(s->fp8_layers & GPTOSS_FP8_LM_HEAD)) SLOT(s->lm_head.w_bf16, V * H * 2, w->lm_head, true);
    for (int l = 0; l < c->n_layers && s->layers; l++) {
        cuda_layer *L = &s->layers[l];
        const gptoss_layer_weights *lw = w ? &w->layers[l] : NULL;
        if (!(s->fp8_layers & GPTOSS_FP8_O))
            SLOT(L->o_weight.w_bf16, H * q * 2, lw->o_weight, true);
        SLOT(L->router_weight, E * H * 2, lw->router_weight, true);
        SLOT(L->moe.gate_up_blocks, E * 2 * I * (H / 32) * 16, lw->gate_up_blocks, false);
        SLOT(L->moe.gate_up_scales, E * 2 * I * (H / 32), lw->gate_up_scales, false);
        SLOT(L->moe.down_blocks, E * H * (I / 32) * 16, lw->down_blocks, false);
        SLOT(L->moe.down_scales, E * H * (I / 32), lw->down_scales, false);
    }
#undef SLOT
    return n;
}

static gptoss_status host_block_add(gptoss_cuda_state *s, void *p, bool registered,
                                    gptoss_error *error) {
    gptoss_cuda_host_block *grown = (gptoss_cuda_host_block *)realloc(
        s->host_blocks, (size_t)(s->n_host_blocks + 1) * sizeof *grown);
    if (!grown) {
        if (registered)
            cudaHostUnregister(p);
        else
            cudaFreeHost(p);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    s->host_blocks = grown;
    s->host_blocks[s->n_host_blocks++] = (gptoss_cuda_host_block){p, registered};
    return GPTOSS_OK;
}

/* A pinned, mapped host buffer of bytes for slot (copied from its tensor when it has one). */
static gptoss_status host_pinned(gptoss_cuda_state *s, const host_slot *slot, gptoss_error *error) {
    void *h = NULL, *d = NULL;
    CUDA_TRY(cudaHostAlloc(&h, slot->bytes ? slot->bytes : 16, cudaHostAllocMapped),
             "cudaHostAlloc (weights in host memory)");
    gptoss_status st = host_block_add(s, h, false, error);
    if (st) return st;
    if (slot->src) memcpy(h, slot->src->data, slot->bytes);
    CUDA_TRY(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");
    *slot->dst = d;
    s->host_weight_bytes += slot->bytes;
    return GPTOSS_OK;
}

static const host_slot *sort_slots_base;
static int by_address(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)sort_slots_base[*(const int32_t *)a].src->data,
              y = (uintptr_t)sort_slots_base[*(const int32_t *)b].src->data;
    return x < y ? -1 : x > y;
}

/* The checkpoint's matrices in place: every 16-byte aligned one through a registered range
 * (the page-rounded spans of overlapping matrices merged into one range), the rest copied
 * into pinned host memory. Checks each tensor's size and dtype as the upload does. */
static gptoss_status place_host_checkpoint(gptoss_cuda_state *s, const gptoss_weights *w,
                                           gptoss_error *error) {
    const int32_t n = host_slots(s, w, NULL);
    host_slot *slots = (host_slot *)calloc((size_t)n, sizeof *slots);
    int32_t *order = (int32_t *)calloc((size_t)n, sizeof *order);
    bool *placed = (bool *)calloc((size_t)n, sizeof *placed);
    gptoss_status st = GPTOSS_OK;
    if (!slots || !order || !placed) {
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    host_slots(s, w, slots);
    for (int32_t i = 0; i < n && !st; i++) {
        const gptoss_tensor *t = slots[i].src;
        if (slots[i].bf16 && t->dtype != GPTOSS_DTYPE_BF16)
            st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                  "CUDA upload: tensor %s is %s; the CUDA backend needs BF16 for "
                                  "dense matrices",
                                  t->name ? t->name : "?", gptoss_dtype_name(t->dtype));
        else if (t->n_bytes != slots[i].bytes)
            st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                  "CUDA upload: tensor %s has %zu bytes, expected %zu",
                                  t->name ? t->name : "?", t->n_bytes, slots[i].bytes);
    }
    if (st) goto done;
    {
        int ro = 0;
        if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, s->dev.ordinal) !=
            cudaSuccess)
            ro = 0;
        const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE) > 0
                                   ? (uintptr_t)sysconf(_SC_PAGESIZE)
                                   : (uintptr_t)4096;
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if ((uintptr_t)slots[i].src->data % 16 == 0 && slots[i].bytes > 0) order[m++] = i;
        sort_slots_base = slots;
        qsort(order, (size_t)m, sizeof *order, by_address);
        int32_t n_ranges = 0;
        size_t registered = 0;
        for (int32_t a = 0; a < m;) {
            uintptr_t lo = (uintptr_t)slots[order[a]].src->data & ~(page - 1);
            uintptr_t hi =
                ((uintptr_t)slots[order[a]].src->data + slots[order[a]].bytes + page - 1) &
                ~(page - 1);
            int32_t b = a + 1;
            for (; b < m && ((uintptr_t)slots[order[b]].src->data & ~(page - 1)) < hi; b++) {
                uintptr_t end =
                    ((uintptr_t)slots[order[b]].src->data + slots[order[b]].bytes + page - 1) &
                    ~(page - 1);
                if (end > hi) hi = end;
            }
            void *base = (void *)lo, *dbase = NULL;
            unsigned flags = cudaHostRegisterMapped | (ro ? cudaHostRegisterReadOnly : 0u);
            if (cudaHostRegister(base, hi - lo, flags) == cudaSuccess) {
                st = host_block_add(s, base, true, error);
                if (st) goto done;
                cudaError_t ce = cudaHostGetDevicePointer(&dbase, base, 0);
                if (ce != cudaSuccess) {
                    st = gptoss_cuda_error(error, ce, "cudaHostGetDevicePointer");
                    goto done;
                }
                for (int32_t k = a; k < b; k++) {
                    const host_slot *sl = &slots[order[k]];
                    *sl->dst = (char *)dbase + ((uintptr_t)sl->src->data - lo);
                    placed[order[k]] = true;
                    registered += sl->bytes;
                }
                n_ranges++;
            } else {
                (void)cudaGetLastError(); /* copied below */
            }
            a = b;
        }
        s->host_weight_bytes += registered;
        size_t copied = 0;
        for (int32_t i = 0; i < n && !st; i++)
            if (!placed[i]) {
                st = host_pinned(s, &slots[i], error);
                copied += slots[i].bytes;
            }
        if (st) goto done;
        GPTOSS_LOG_I("cuda",
                     "weights in host memory: %.2f GiB used in place from the checkpoint (%d "
                     "ranges registered%s), %.2f GiB copied to pinned memory (unaligned or not "
                     "registered), %.2f GiB in device memory",
                     registered / 1073741824.0, n_ranges, ro ? " read-only" : "",
                     copied / 1073741824.0, s->weight_bytes / 1073741824.0);
    }
done:
    free(slots);
    free(order);
    free(placed);
    return st;
}

/* Random weights in host memory: pinned buffers for the matrices, generated in place. */
static gptoss_status place_host_random(gptoss_cuda_state *s, gptoss_error *error) {
    const int32_t n = host_slots(s, NULL, NULL);
    host_slot *slots = (host_slot *)calloc((size_t)n, sizeof *slots);
    if (!slots) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    host_slots(s, NULL, slots);
    gptoss_status st = GPTOSS_OK;
    for (int32_t i = 0; i < n && !st; i++)
        st = host_pinned(s, &slots[i], error);
    free(slots);
    return st;
}

/* Experts held here: all of them, or a tensor-parallel rank's share (tp.cu). */
static size_t moe_experts(const gptoss_cuda_state *s) {
    return s->tp_n_experts > 0 ? (size_t)s->tp_n_experts : (size_t)s->config.n_experts;
}

gptoss_status gptoss_cuda_weights_alloc(gptoss_cuda_state *s, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    size_t QKV = (NH + 2 * NKV) * D;
    const size_t EM = moe_experts(s);
    gptoss_status st;
#define ALLOC(ptr, bytes, what)                                                                    \
    do {                                                                                           \
        st = gptoss_cuda_alloc((void **)&(ptr), (bytes), (what), error);                           \
        if (st) return st;                                                                         \
        s->weight_bytes += (bytes);                                                                \
    } while (0)
/* a matrix host_slots lists: placed later when the weights are in host memory */
#define ALLOC_DEV(ptr, bytes, what)                                                                \
    do {                                                                                           \
        if (!s->weights_host) ALLOC(ptr, bytes, what);                                             \
    } while (0)
    ALLOC_DEV(s->embedding, V * H * 2, "the embedding");
    if (!s->weights_host || (s->fp8_layers & GPTOSS_FP8_LM_HEAD)) {
        st = dense_alloc(s, &s->lm_head, (size_t)s->lm_rows, H, s->fp8_layers & GPTOSS_FP8_LM_HEAD,
                         "lm_head", error);
        if (st) return st;
    }
    ALLOC(s->final_norm, H * 4, "the final norm");
    ALLOC(s->inv_freq, D / 2 * 4, "RoPE tables");
    s->layers = (cuda_layer *)calloc((size_t)c->n_layers, sizeof(cuda_layer));
    if (!s->layers) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        L->sliding = c->layer_is_sliding[l] && c->sliding_window > 0;
        ALLOC(L->attn_norm, H * 4, "norms");
        ALLOC(L->mlp_norm, H * 4, "norms");
        st = dense_alloc(s, &L->qkv_weight, QKV, H, s->fp8_layers & GPTOSS_FP8_QKV, "QKV weights",
                         error);
        if (st) return st;
        ALLOC(L->qkv_bias, QKV * 4, "QKV bias");
        if (!s->weights_host || (s->fp8_layers & GPTOSS_FP8_O)) {
            st = dense_alloc(s, &L->o_weight, H, NH * D, s->fp8_layers & GPTOSS_FP8_O, "O weights",
                             error);
            if (st) return st;
        }
        ALLOC(L->o_bias, H * 4, "O bias");
        ALLOC(L->sinks, NH * 4, "sinks");
        ALLOC_DEV(L->router_weight, E * H * 2, "router");
        ALLOC(L->router_weight_f32, E * H * 4, "router");
        ALLOC(L->router_bias, E * 4, "router bias");
        gptoss_cuda_moe_weights *m = &L->moe;
        ALLOC_DEV(m->gate_up_blocks, EM * 2 * I * (H / 32) * 16, "expert gate_up blocks");
        ALLOC_DEV(m->gate_up_scales, EM * 2 * I * (H / 32), "expert gate_up scales");
        ALLOC(m->gate_up_bias, EM * 2 * I * 4, "expert gate_up bias");
        ALLOC_DEV(m->down_blocks, EM * H * (I / 32) * 16, "expert down blocks");
        ALLOC_DEV(m->down_scales, EM * H * (I / 32), "expert down scales");
        ALLOC(m->down_bias, EM * H * 4, "expert down bias");
        m->n_experts = (int32_t)EM;
        m->masked_slots = (int32_t)EM < c->n_experts;
        m->hidden = (int32_t)H;
        m->intermediate = (int32_t)I;
        m->swiglu_limit = (float)c->swiglu_limit;
        m->swiglu_alpha = (float)c->swiglu_alpha;
    }
#undef ALLOC_DEV
#undef ALLOC
    s->dense_scratch_elems = dense_scratch_elems(c, s->fp8_layers);
    if (s->dense_scratch_elems) {
        st = gptoss_cuda_alloc((void **)&s->dense_scratch, s->dense_scratch_elems * 2,
                               "the FP8 layers' scratch", error);
        if (st) return st;
    }
    float inv_freq[512];
    float conc = 1.0f;
    gptoss_rope_yarn_inv_freq(c, inv_freq, &conc);
    s->concentration = conc;
    CUDA_TRY(cudaMemcpy(s->inv_freq, inv_freq, D / 2 * sizeof(float), cudaMemcpyHostToDevice),
             "upload RoPE");
    return GPTOSS_OK;
}

void gptoss_cuda_weights_free(gptoss_cuda_state *s) {
    if (s->weights_host) { /* the host slots' pointers are no device allocations */
        const int32_t n = host_slots(s, NULL, NULL);
        host_slot *slots = (host_slot *)calloc((size_t)n, sizeof *slots);
        if (slots) {
            host_slots(s, NULL, slots);
            for (int32_t i = 0; i < n; i++)
                *slots[i].dst = NULL;
            free(slots);
        }
    }
    for (int32_t i = 0; i < s->n_host_blocks; i++) {
        if (s->host_blocks[i].registered)
            cudaHostUnregister(s->host_blocks[i].p);
        else
            cudaFreeHost(s->host_blocks[i].p);
    }
    free(s->host_blocks);
    s->host_blocks = NULL;
    s->n_host_blocks = 0;
    cudaFree(s->embedding);
    dense_free(&s->lm_head);
    cudaFree(s->dense_scratch);
    cudaFree(s->final_norm);
    cudaFree(s->inv_freq);
    if (!s->layers) return;
    for (int l = 0; l < s->config.n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        cudaFree(L->attn_norm);
        cudaFree(L->mlp_norm);
        dense_free(&L->qkv_weight);
        cudaFree(L->qkv_bias);
        dense_free(&L->o_weight);
        cudaFree(L->o_bias);
        cudaFree(L->sinks);
        cudaFree(L->router_weight);
        cudaFree(L->router_weight_f32);
        cudaFree(L->router_bias);
        cudaFree((void *)L->moe.gate_up_blocks);
        cudaFree((void *)L->moe.gate_up_scales);
        cudaFree((void *)L->moe.gate_up_bias);
        cudaFree((void *)L->moe.down_blocks);
        cudaFree((void *)L->moe.down_scales);
        cudaFree((void *)L->moe.down_bias);
    }
}

/* ---- weight upload ---------------------------------------------------------------------- */

typedef struct upload_ctx {
    gptoss_cuda_state *s;
    const gptoss_backend_options *options;
    size_t done, total; /* bytes */
    float *host_f32;    /* staging for small vectors converted to f32 */
    size_t host_cap;
} upload_ctx;

static void upload_progress(upload_ctx *u, size_t bytes) {
    u->done += bytes;
    if (u->options->progress)
        u->options->progress(u->options->progress_user, "uploading weights",
                             u->total ? (double)u->done / u->total : 1.0);
}

static gptoss_status upload_raw(upload_ctx *u, void *dst, const gptoss_tensor *t,
                                size_t expect_bytes, gptoss_error *error) {
    if (t->n_bytes != expect_bytes)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "CUDA upload: tensor %s has %zu bytes, expected %zu",
                                t->name ? t->name : "?", t->n_bytes, expect_bytes);
    CUDA_TRY(cudaMemcpy(dst, t->data, expect_bytes, cudaMemcpyHostToDevice), "weight upload");
    upload_progress(u, expect_bytes);
    return GPTOSS_OK;
}

/* A dense matrix tensor must be bf16 with n elements. */
static gptoss_status check_bf16_matrix(const gptoss_tensor *t, size_t n, gptoss_error *error) {
    if (t->dtype != GPTOSS_DTYPE_BF16)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA upload: tensor %s is %s; the CUDA backend "
                                "needs BF16 for dense matrices",
                                t->name ? t->name : "?", gptoss_dtype_name(t->dtype));
    if (t->n_bytes != n * 2)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "CUDA upload: tensor %s has %zu bytes, expected %zu",
                                t->name ? t->name : "?", t->n_bytes, n * 2);
    return GPTOSS_OK;
}

static gptoss_status upload_bf16_matrix(upload_ctx *u, bf16 *dst, const gptoss_tensor *t, size_t n,
                                        gptoss_error *error) {
    gptoss_status st = check_bf16_matrix(t, n, error);
    return st ? st : upload_raw(u, dst, t, n * 2, error);
}

/* Rows [row0, row0 + rows) of a dense [*, k] matrix from a bf16 tensor [rows, k]: copied in
 * place, or, for an FP8 matrix, staged through s->dense_scratch in blocks of rows and
 * quantized into place (a row's scale needs only that row). */
static gptoss_status upload_dense(upload_ctx *u, gptoss_cuda_dense_weight *dst, size_t row0,
                                  size_t rows, size_t k, const gptoss_tensor *t,
                                  gptoss_error *error) {
    if (dst->w_bf16) return upload_bf16_matrix(u, dst->w_bf16 + row0 * k, t, rows * k, error);
    gptoss_cuda_state *s = u->s;
    gptoss_status st = check_bf16_matrix(t, rows * k, error);
    if (st) return st;
    const size_t block = s->dense_scratch_elems / k;
    const unsigned char *src = (const unsigned char *)t->data;
    for (size_t r = 0; r < rows; r += block) {
        size_t n = rows - r < block ? rows - r : block;
        CUDA_TRY(cudaMemcpyAsync(s->dense_scratch, src + r * k * 2, n * k * 2,
                                 cudaMemcpyHostToDevice, s->stream),
                 "weight upload");
        gptoss_cuda_quantize_e4m3_rows(s->dense_scratch, (int32_t)n, (int32_t)k,
                                       dst->w_e4m3 + (row0 + r) * k, dst->row_scale + row0 + r,
                                       s->stream);
        upload_progress(u, n * k * 2);
    }
    CUDA_TRY(cudaStreamSynchronize(s->stream), "FP8 quantization");
    CUDA_TRY(cudaGetLastError(), "FP8 quantization");
    return GPTOSS_OK;
}

/* Small vectors (norms, biases, sinks) become f32 on the device whatever their file dtype. */
static gptoss_status upload_vector_f32(upload_ctx *u, float *dst, const gptoss_tensor *t, size_t n,
                                       gptoss_error *error) {
    if (n > u->host_cap) {
        float *grown = (float *)realloc(u->host_f32, n * sizeof(float));
        if (!grown) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        u->host_f32 = grown;
        u->host_cap = n;
    }
    const unsigned char *p = (const unsigned char *)t->data;
    size_t esz = gptoss_dtype_size(t->dtype);
    if (t->n_bytes != n * esz || (t->dtype != GPTOSS_DTYPE_BF16 && t->dtype != GPTOSS_DTYPE_F32))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "CUDA upload: tensor %s: expected %zu BF16 or F32 values",
                                t->name ? t->name : "?", n);
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == GPTOSS_DTYPE_BF16) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            u->host_f32[i] = gptoss_bf16_to_f32(h);
        } else {
            memcpy(&u->host_f32[i], p + 4 * i, 4);
        }
    }
    CUDA_TRY(cudaMemcpy(dst, u->host_f32, n * sizeof(float), cudaMemcpyHostToDevice),
             "weight upload");
    upload_progress(u, t->n_bytes);
    return GPTOSS_OK;
}

/* A layer's experts from the ggml layout (a GGUF file's mapped bytes, gptoss_ggml_experts):
 * each tensor goes up as it is, in pieces through a device staging buffer, and is converted on
 * the device (gptoss_cuda_mxfp4_from_ggml), so no converted copy is made in host memory. */
static gptoss_status upload_ggml_experts(upload_ctx *u, cuda_layer *L,
                                         const gptoss_layer_weights *lw,
                                         const gptoss_ggml_experts *g, gptoss_error *error) {
    gptoss_cuda_state *s = u->s;
    const int64_t E = s->config.n_experts, H = s->config.hidden_size,
                  I = s->config.intermediate_size;
    struct {
        const uint8_t *src;
        int64_t R, G, step, offset;
        uint8_t *blocks, *scales;
        const gptoss_tensor *hf_blocks, *hf_scales;
    } parts[3] = {
        {g->gate, I, H / 32, 2, 0, (uint8_t *)L->moe.gate_up_blocks,
         (uint8_t *)L->moe.gate_up_scales, &lw->gate_up_blocks, &lw->gate_up_scales},
        {g->up, I, H / 32, 2, 1, (uint8_t *)L->moe.gate_up_blocks, (uint8_t *)L->moe.gate_up_scales,
         NULL, NULL},
        {g->down, H, I / 32, 1, 0, (uint8_t *)L->moe.down_blocks, (uint8_t *)L->moe.down_scales,
         &lw->down_blocks, &lw->down_scales},
    };
    if (lw->gate_up_blocks.n_bytes != (size_t)(E * 2 * I * (H / 32) * 16) ||
        lw->down_blocks.n_bytes != (size_t)(E * H * (I / 32) * 16) || !g->gate || !g->up ||
        !g->down)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "CUDA upload: the ggml expert tensors do not match the config");
    const size_t stage_cap = (size_t)64 << 20;
    uint8_t *stage = NULL;
    gptoss_status st =
        gptoss_cuda_alloc((void **)&stage, stage_cap, "the expert upload staging buffer", error);
    if (st) return st;
    for (int p = 0; p < 3 && !st; p++) {
        const size_t row_bytes = (size_t)parts[p].G * 17, rows = (size_t)(E * parts[p].R);
        const size_t piece = stage_cap / row_bytes;
        if (!piece) {
            st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                  "CUDA upload: expert rows of %zu bytes are too long", row_bytes);
            break;
        }
        for (size_t r = 0; r < rows && !st; r += piece) {
            size_t n = rows - r < piece ? rows - r : piece;
            cudaError_t ce = cudaMemcpyAsync(stage, parts[p].src + r * row_bytes, n * row_bytes,
                                             cudaMemcpyHostToDevice, s->stream);
            if (ce != cudaSuccess) {
                st = gptoss_cuda_error(error, ce, "weight upload");
            } else if (gptoss_cuda_mxfp4_from_ggml(stage, (int64_t)r, (int64_t)n, parts[p].R,
                                                   parts[p].G, parts[p].step, parts[p].offset,
                                                   parts[p].blocks, parts[p].scales, s->stream)) {
                st = gptoss_set_error(error, GPTOSS_ERR_BACKEND,
                                      "CUDA upload: expert buffers are not 16-byte aligned");
            }
        }
        if (!st && parts[p].hf_blocks)
            upload_progress(u, parts[p].hf_blocks->n_bytes + parts[p].hf_scales->n_bytes);
    }
    cudaError_t ce = cudaStreamSynchronize(s->stream);
    if (ce == cudaSuccess) ce = cudaGetLastError();
    cudaFree(stage);
    if (!st && ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "expert conversion");
    return st;
}

gptoss_status gptoss_cuda_weights_upload(gptoss_cuda_state *s, const gptoss_weights *w,
                                         const gptoss_backend_options *options,
                                         gptoss_error *error) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    const size_t EM = moe_experts(s); /* the expert tensors hold these (tp.cu slices them) */
    upload_ctx u = {s, options, 0, 0, NULL, 0};
    const double t0 = gptoss_now_seconds();
    u.total = w->embedding.n_bytes + w->lm_head.n_bytes + w->final_norm.n_bytes;
    for (int l = 0; l < w->n_layers; l++) {
        const gptoss_tensor *ts = &w->layers[l].attn_norm;
        for (size_t i = 0; i < sizeof(gptoss_layer_weights) / sizeof(gptoss_tensor); i++)
            u.total += ts[i].n_bytes;
    }
    gptoss_status st = GPTOSS_OK;
    const bool host = s->weights_host;
    const bool host_lm = host && !(s->fp8_layers & GPTOSS_FP8_LM_HEAD),
               host_o = host && !(s->fp8_layers & GPTOSS_FP8_O);
#define TRY(x)                                                                                     \
    do {                                                                                           \
        st = (x);                                                                                  \
        if (st) goto done;                                                                         \
    } while (0)
    if (w->n_layers != c->n_layers) {
        st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                              "CUDA upload: weights have %d layers, config %d", w->n_layers,
                              c->n_layers);
        goto done;
    }
    if (host && w->ggml_experts && w->n_layers > 0 && !w->layers[0].gate_up_blocks.data) {
        st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                              "CUDA: weights in host memory need the GGUF experts unpacked first");
        goto done;
    }
    /* with the weights in host memory, host_slots' matrices are placed here, not uploaded */
    if (host) TRY(place_host_checkpoint(s, w, error));
    if (!host) TRY(upload_bf16_matrix(&u, s->embedding, &w->embedding, V * H, error));
    if (!host_lm) TRY(upload_dense(&u, &s->lm_head, 0, (size_t)s->lm_rows, H, &w->lm_head, error));
    TRY(upload_vector_f32(&u, s->final_norm, &w->final_norm, H, error));
    for (int l = 0; l < c->n_layers; l++) {
        const gptoss_layer_weights *lw = &w->layers[l];
        cuda_layer *L = &s->layers[l];
        TRY(upload_vector_f32(&u, L->attn_norm, &lw->attn_norm, H, error));
        TRY(upload_vector_f32(&u, L->mlp_norm, &lw->mlp_norm, H, error));
        TRY(upload_dense(&u, &L->qkv_weight, 0, NH * D, H, &lw->q_weight, error));
        TRY(upload_dense(&u, &L->qkv_weight, NH * D, NKV * D, H, &lw->k_weight, error));
        TRY(upload_dense(&u, &L->qkv_weight, (NH + NKV) * D, NKV * D, H, &lw->v_weight, error));
        TRY(upload_vector_f32(&u, L->qkv_bias, &lw->q_bias, NH * D, error));
        TRY(upload_vector_f32(&u, L->qkv_bias + NH * D, &lw->k_bias, NKV * D, error));
        TRY(upload_vector_f32(&u, L->qkv_bias + (NH + NKV) * D, &lw->v_bias, NKV * D, error));
        if (!host_o) TRY(upload_dense(&u, &L->o_weight, 0, H, NH * D, &lw->o_weight, error));
        TRY(upload_vector_f32(&u, L->o_bias, &lw->o_bias, H, error));
        TRY(upload_vector_f32(&u, L->sinks, &lw->sinks, NH, error));
        if (!host) TRY(upload_bf16_matrix(&u, L->router_weight, &lw->router_weight, E * H, error));
        TRY(upload_vector_f32(&u, L->router_bias, &lw->router_bias, E, error));
        if (host) {
            /* placed from the checkpoint by place_host_checkpoint (GGUF experts were unpacked
             * into host buffers first: cuda_create) */
        } else if (w->ggml_experts) { /* a whole model: tensor-parallel views carry none */
            TRY(upload_ggml_experts(&u, L, lw, &w->ggml_experts[l], error));
        } else {
            TRY(upload_raw(&u, (void *)L->moe.gate_up_blocks, &lw->gate_up_blocks,
                           EM * 2 * I * (H / 32) * 16, error));
            TRY(upload_raw(&u, (void *)L->moe.gate_up_scales, &lw->gate_up_scales,
                           EM * 2 * I * (H / 32), error));
            TRY(upload_raw(&u, (void *)L->moe.down_blocks, &lw->down_blocks, EM * H * (I / 32) * 16,
                           error));
            TRY(upload_raw(&u, (void *)L->moe.down_scales, &lw->down_scales, EM * H * (I / 32),
                           error));
        }
        TRY(upload_vector_f32(&u, (float *)L->moe.gate_up_bias, &lw->gate_up_bias, EM * 2 * I,
                              error));
        TRY(upload_vector_f32(&u, (float *)L->moe.down_bias, &lw->down_bias, EM * H, error));
    }
#undef TRY
    GPTOSS_LOG_I("cuda", "weights uploaded: %.2f GB in %.2f s%s", (double)u.total / 1e9,
                 gptoss_now_seconds() - t0,
                 w->ggml_experts && !host ? " (experts converted from ggml's layout on the device)"
                                          : "");
done:
    free(u.host_f32);
    return st;
}

/* What is derived from the weights once they are in place (uploaded or generated): the fp32
 * copy of the router matrices, and per layer whether the tensor-core MoE path is exact
 * (gptoss_cuda_moe_check_mma); layers where it is not keep the WMMA/GEMV paths, and the
 * caller hears how many. */
gptoss_status gptoss_cuda_weights_finish(gptoss_cuda_state *s, gptoss_error *error) {
    for (int l = 0; l < s->config.n_layers; l++)
        gptoss_cuda_bf16_to_f32(s->layers[l].router_weight,
                                (size_t)s->config.n_experts * s->config.hidden_size,
                                s->layers[l].router_weight_f32, s->stream);
    unsigned *scratch = NULL;
    gptoss_status st = gptoss_cuda_alloc((void **)&scratch, 16, "a check buffer", error);
    if (st) return st;
    int slow = 0;
    cudaError_t ce = cudaSuccess;
    for (int l = 0; l < s->config.n_layers && ce == cudaSuccess; l++) {
        ce =
            gptoss_cuda_moe_check_mma(&s->layers[l].moe, s->layers[l].mlp_norm, scratch, s->stream);
        slow += !s->layers[l].moe.mma_ok;
    }
    cudaFree(scratch);
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "MoE weight check");
    if (slow)
        GPTOSS_LOG_W(
            "cuda",
            "%d of %d MoE layers have scales outside [2^-23, 2^1] (or inputs too wide for fp16) "
            "and use the slower WMMA/GEMV kernels",
            slow, s->config.n_layers);
    return GPTOSS_OK;
}

/* ---- random weights (bench) ----------------------------------------------------------- */

/* N(0, sd) values for a dense [n, k] matrix, rows [row0, row0 + n) of the matrix the seed
 * gives: generated in place, or, for an FP8 matrix, in blocks of rows in the scratch and
 * quantized into place (from the values the bf16 matrix gets from the same seed). Enqueued on
 * s->stream; the caller checks for errors. */
static void fill_dense_random(gptoss_cuda_state *s, gptoss_cuda_dense_weight *w, size_t n, size_t k,
                              size_t row0, uint64_t seed, float sd) {
    if (w->w_bf16) {
        gptoss_cuda_fill_normal_bf16_at(w->w_bf16, n * k, row0 * k, seed, 0.0f, sd, s->stream);
        return;
    }
    const size_t block = s->dense_scratch_elems / k;
    for (size_t r = 0; r < n; r += block) {
        size_t rows = n - r < block ? n - r : block;
        gptoss_cuda_fill_normal_bf16_at(s->dense_scratch, rows * k, (row0 + r) * k, seed, 0.0f, sd,
                                        s->stream);
        gptoss_cuda_quantize_e4m3_rows(s->dense_scratch, (int32_t)rows, (int32_t)k,
                                       w->w_e4m3 + r * k, w->row_scale + r, s->stream);
    }
}

gptoss_status gptoss_cuda_weights_random(gptoss_cuda_state *s,
                                         const gptoss_backend_options *options, uint64_t seed,
                                         gptoss_error *error) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads, QKV = (NH + 2 * NKV) * D;
    const size_t EM = moe_experts(s);
    cudaStream_t k = s->stream;
    uint64_t n = seed * 1000003ull;
    if (s->weights_host) {
        gptoss_status st = place_host_random(s, error);
        if (st) return st;
        GPTOSS_LOG_I("cuda", "random weights: %.2f GiB in pinned host memory, %.2f GiB on the GPU",
                     s->host_weight_bytes / 1073741824.0, s->weight_bytes / 1073741824.0);
    }
    /* make-model's distributions (model/random_init.h): embedding N(0, 1), Linear weights
     * N(0, 1/sqrt(in)), biases N(0, 0.02), norm gains 1 + N(0, 0.05), sinks N(0, 1), MXFP4
     * codes uniform, scale bytes s0 + {-1, 0, 1} with s0 = 127 + round(log2(1/(2.93 sqrt(in)))).
     * The values differ from make-model's (another hash); the cost does not depend on them. */
    float lin_h = 1.0f / sqrtf((float)H), lin_q = 1.0f / sqrtf((float)(NH * D));
    int s0_h = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)H))));
    int s0_i = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)I))));
    gptoss_cuda_fill_normal_bf16(s->embedding, V * H, n++, 0.0f, 1.0f, k);
    /* the rows held of the whole model's lm_head (tensor parallelism may hold a share) */
    fill_dense_random(s, &s->lm_head, (size_t)s->lm_rows, H, (size_t)s->lm_row0, n++, lin_h);
    gptoss_cuda_fill_normal_f32(s->final_norm, H, n++, 1.0f, 0.05f, k);
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        gptoss_cuda_fill_normal_f32(L->attn_norm, H, n++, 1.0f, 0.05f, k);
        gptoss_cuda_fill_normal_f32(L->mlp_norm, H, n++, 1.0f, 0.05f, k);
        fill_dense_random(s, &L->qkv_weight, QKV, H, 0, n++, lin_h);
        gptoss_cuda_fill_normal_f32(L->qkv_bias, QKV, n++, 0.0f, 0.02f, k);
        fill_dense_random(s, &L->o_weight, H, NH * D, 0, n++, lin_q);
        gptoss_cuda_fill_normal_f32(L->o_bias, H, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_normal_f32(L->sinks, NH, n++, 0.0f, 1.0f, k);
        gptoss_cuda_fill_normal_bf16(L->router_weight, E * H, n++, 0.0f, lin_h, k);
        gptoss_cuda_fill_normal_f32(L->router_bias, E, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.gate_up_blocks, EM * 2 * I * (H / 32) * 16,
                                    n++, 0, 255, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.gate_up_scales, EM * 2 * I * (H / 32), n++,
                                    s0_h - 1, s0_h + 1, k);
        gptoss_cuda_fill_normal_f32((float *)L->moe.gate_up_bias, EM * 2 * I, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.down_blocks, EM * H * (I / 32) * 16, n++, 0,
                                    255, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.down_scales, EM * H * (I / 32), n++, s0_i - 1,
                                    s0_i + 1, k);
        gptoss_cuda_fill_normal_f32((float *)L->moe.down_bias, EM * H, n++, 0.0f, 0.02f, k);
        if (options->progress)
            options->progress(options->progress_user, "generating weights",
                              (l + 1.0) / c->n_layers);
    }
    cudaError_t ce = cudaStreamSynchronize(k);
    if (ce == cudaSuccess) ce = cudaGetLastError();
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "random weight generation");
    return GPTOSS_OK;
}
