/*
 * tp_weights.cu - a tensor-parallel rank's share of the weights (tp_split.h says which): views
 * and host copies of a checkpoint's slices, and random weights equal to the whole model's from
 * the same seed. tp.cu creates each rank through gptoss_cuda_tp_rank_state.
 */
extern "C" {
#include "backend/tp_split.h"
#include "model/config.h"
}
#include "backend/cuda/cuda_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A view of tensor t's elements [first, first + count) along its leading dimension (rows of
 * `row` elements). */
static gptoss_tensor tensor_rows(const gptoss_tensor *t, size_t first, size_t count, size_t row) {
    gptoss_tensor v = *t;
    size_t esz = gptoss_dtype_size(t->dtype);
    v.data = (const unsigned char *)t->data + first * row * esz;
    v.n_bytes = count * row * esz;
    v.shape[0] = (int64_t)count;
    return v;
}

/* A view of experts [first, first + count) of an expert tensor [E, ...] (any dtype). */
static gptoss_tensor tensor_experts(const gptoss_tensor *t, size_t first, size_t count, size_t E) {
    gptoss_tensor v = *t;
    size_t per = t->n_bytes / E;
    v.data = (const unsigned char *)t->data + first * per;
    v.n_bytes = count * per;
    v.shape[0] = (int64_t)count;
    return v;
}

/* The MoE split by rows (gptoss_moe_parallel TP) from a checkpoint: host copies of every
 * expert's unit rows [inter0, inter0 + n_inter) of gate_up (the gate and up rows of a unit are
 * adjacent) and the same input columns of down (whole 32-wide groups), and the down bias on
 * the rank that adds it, zeros on the others. bufs[0..5] receive the allocations (freed by
 * the caller). The experts must be MXFP4 blocks and scales with bf16 or f32 biases. */
static gptoss_status experts_by_rows(const gptoss_tensor *const ex[6], gptoss_tensor *const vx[6],
                                     const gptoss_config *c, const gptoss_tp_slice *sl, void **bufs,
                                     gptoss_error *error) {
    const size_t E = (size_t)c->n_experts, H = (size_t)c->hidden_size,
                 I = (size_t)c->intermediate_size, i0 = (size_t)sl->inter0,
                 ni = (size_t)sl->n_inter;
    const size_t gu_block_row = (H / 32) * 16, gu_scale_row = H / 32;
    const size_t esz_gub = gptoss_dtype_size(ex[2]->dtype),
                 esz_db = gptoss_dtype_size(ex[5]->dtype);
    if (ex[0]->n_bytes != E * 2 * I * gu_block_row || ex[1]->n_bytes != E * 2 * I * gu_scale_row ||
        ex[2]->n_bytes != E * 2 * I * esz_gub || ex[3]->n_bytes != E * H * (I / 32) * 16 ||
        ex[4]->n_bytes != E * H * (I / 32) || ex[5]->n_bytes != E * H * esz_db || !esz_gub ||
        !esz_db)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "tensor parallelism by rows: the experts are not MXFP4 blocks "
                                "and scales of the config's shape");
    /* gate_up: per expert, rows [2 i0, 2 (i0 + ni)) of 2I; down: per (expert, output row),
     * groups [i0 / 32, (i0 + ni) / 32) of I / 32 */
    const size_t rows_e[6] = {E, E, E, E * H, E * H, 0};
    const size_t row_bytes[6] = {
        2 * I * gu_block_row, 2 * I * gu_scale_row, 2 * I * esz_gub, (I / 32) * 16, I / 32, 0};
    const size_t off[6] = {
        2 * i0 * gu_block_row, 2 * i0 * gu_scale_row, 2 * i0 * esz_gub, (i0 / 32) * 16, i0 / 32, 0};
    const size_t len[6] = {
        2 * ni * gu_block_row, 2 * ni * gu_scale_row, 2 * ni * esz_gub, (ni / 32) * 16, ni / 32, 0};
    for (int i = 0; i < 6; i++) {
        const size_t bytes = i < 5 ? rows_e[i] * len[i] : ex[5]->n_bytes;
        bufs[i] = malloc(bytes ? bytes : 1);
        if (!bufs[i])
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        if (i < 5)
            gptoss_tp_copy_row_slices(ex[i]->data, rows_e[i], row_bytes[i], off[i], len[i],
                                      bufs[i]);
        else if (sl->down_bias)
            memcpy(bufs[i], ex[5]->data, bytes);
        else
            memset(bufs[i], 0, bytes); /* +0.0 in bf16 and f32 alike */
        *vx[i] = *ex[i];
        vx[i]->data = bufs[i];
        vx[i]->n_bytes = bytes;
    }
    /* the intermediate dimension in the shapes (gate_up [E, 2 ni, ...], down [E, H, ni/32, ..]) */
    vx[0]->shape[1] = vx[1]->shape[1] = vx[2]->shape[1] = (int64_t)(2 * ni);
    vx[3]->shape[2] = vx[4]->shape[2] = (int64_t)(ni / 32);
    return GPTOSS_OK;
}

/* Random weights: the rank's slices get the values the whole model gets from the same seed
 * (gptoss_cuda_weights_random generated them for the rank's own shapes), so a tensor-parallel
 * backend from create_random computes the same model as a one-GPU backend from that seed.
 * Follows gptoss_cuda_weights_random's seed order and distributions: 3 seeds before the
 * layers, 15 per layer. FP8 dense layers keep the rank's own values (the cost is the same). */
static gptoss_status rank_random_as_whole(gptoss_cuda_state *s, const gptoss_config *c,
                                          const gptoss_tp_slice *sl, uint64_t seed,
                                          gptoss_error *error) {
    const size_t H = c->hidden_size, I = c->intermediate_size, D = c->head_dim, NH = c->n_heads,
                 NKV = c->n_kv_heads;
    const size_t nh = sl->n_heads, nkv = sl->n_kv_heads, h0 = sl->head0, kv0 = sl->kv_head0,
                 e0 = sl->expert0, ne = sl->n_experts;
    const float lin_h = 1.0f / sqrtf((float)H), lin_q = 1.0f / sqrtf((float)(NH * D));
    const int s0_h = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)H))));
    const int s0_i = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)I))));
    cudaStream_t k = s->stream;
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        const uint64_t n = seed * 1000003ull + 3 + 15 * (uint64_t)l;
        if (L->qkv_weight.w_bf16) {
            bf16 *w = L->qkv_weight.w_bf16;
            gptoss_cuda_fill_normal_bf16_at(w, nh * D * H, h0 * D * H, n + 2, 0.0f, lin_h, k);
            gptoss_cuda_fill_normal_bf16_at(w + nh * D * H, nkv * D * H, (NH + kv0) * D * H, n + 2,
                                            0.0f, lin_h, k);
            gptoss_cuda_fill_normal_bf16_at(w + (nh + nkv) * D * H, nkv * D * H,
                                            (NH + NKV + kv0) * D * H, n + 2, 0.0f, lin_h, k);
        }
        float *b = L->qkv_bias;
        gptoss_cuda_fill_normal_f32_at(b, nh * D, h0 * D, n + 3, 0.0f, 0.02f, k);
        gptoss_cuda_fill_normal_f32_at(b + nh * D, nkv * D, (NH + kv0) * D, n + 3, 0.0f, 0.02f, k);
        gptoss_cuda_fill_normal_f32_at(b + (nh + nkv) * D, nkv * D, (NH + NKV + kv0) * D, n + 3,
                                       0.0f, 0.02f, k);
        if (L->o_weight.w_bf16)
            gptoss_cuda_fill_normal_bf16_rows(L->o_weight.w_bf16, H, nh * D, h0 * D, NH * D, n + 4,
                                              0.0f, lin_q, k);
        gptoss_cuda_fill_normal_f32_at(L->sinks, nh, h0, n + 6, 0.0f, 1.0f, k);
        const size_t gu_b = 2 * I * (H / 32) * 16, gu_s = 2 * I * (H / 32), d_b = H * (I / 32) * 16,
                     d_s = H * (I / 32);
        gptoss_cuda_moe_weights *m = &L->moe;
        if ((size_t)sl->n_inter != I) { /* by rows: every expert's unit rows, down's columns */
            const size_t E = c->n_experts, i0 = sl->inter0, ni = sl->n_inter, G = H / 32;
            gptoss_cuda_fill_uniform_u8_rows((uint8_t *)m->gate_up_blocks, E, 2 * ni * G * 16,
                                             2 * i0 * G * 16, gu_b, n + 9, 0, 255, k);
            gptoss_cuda_fill_uniform_u8_rows((uint8_t *)m->gate_up_scales, E, 2 * ni * G,
                                             2 * i0 * G, gu_s, n + 10, s0_h - 1, s0_h + 1, k);
            gptoss_cuda_fill_normal_f32_rows((float *)m->gate_up_bias, E, 2 * ni, 2 * i0, 2 * I,
                                             n + 11, 0.0f, 0.02f, k);
            gptoss_cuda_fill_uniform_u8_rows((uint8_t *)m->down_blocks, E * H, (ni / 32) * 16,
                                             (i0 / 32) * 16, (I / 32) * 16, n + 12, 0, 255, k);
            gptoss_cuda_fill_uniform_u8_rows((uint8_t *)m->down_scales, E * H, ni / 32, i0 / 32,
                                             I / 32, n + 13, s0_i - 1, s0_i + 1, k);
            if (sl->down_bias)
                gptoss_cuda_fill_normal_f32_at((float *)m->down_bias, E * H, 0, n + 14, 0.0f, 0.02f,
                                               k);
            else
                cudaMemsetAsync((void *)m->down_bias, 0, E * H * sizeof(float), k);
            continue;
        }
        gptoss_cuda_fill_uniform_u8_at((uint8_t *)m->gate_up_blocks, ne * gu_b, e0 * gu_b, n + 9, 0,
                                       255, k);
        gptoss_cuda_fill_uniform_u8_at((uint8_t *)m->gate_up_scales, ne * gu_s, e0 * gu_s, n + 10,
                                       s0_h - 1, s0_h + 1, k);
        gptoss_cuda_fill_normal_f32_at((float *)m->gate_up_bias, ne * 2 * I, e0 * 2 * I, n + 11,
                                       0.0f, 0.02f, k);
        gptoss_cuda_fill_uniform_u8_at((uint8_t *)m->down_blocks, ne * d_b, e0 * d_b, n + 12, 0,
                                       255, k);
        gptoss_cuda_fill_uniform_u8_at((uint8_t *)m->down_scales, ne * d_s, e0 * d_s, n + 13,
                                       s0_i - 1, s0_i + 1, k);
        gptoss_cuda_fill_normal_f32_at((float *)m->down_bias, ne * H, e0 * H, n + 14, 0.0f, 0.02f,
                                       k);
    }
    cudaError_t ce = cudaStreamSynchronize(k);
    if (ce == cudaSuccess) ce = cudaGetLastError();
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "random weight slices");
    /* the MoE check ran on the rank's own values */
    return gptoss_cuda_weights_finish(s, error);
}

gptoss_status gptoss_cuda_tp_rank_state(const gptoss_config *c, const gptoss_tp_slice *sl_in,
                                        const gptoss_backend_options *o_in, const gptoss_weights *w,
                                        uint64_t seed, int32_t lm_row0, int32_t lm_rows,
                                        gptoss_cuda_state **out, gptoss_error *error) {
    const gptoss_tp_slice sl = *sl_in;
    gptoss_backend_options o = *o_in;
    const bool lm_split = lm_rows > 0;
    gptoss_config rc = *c;
    rc.n_heads = sl.n_heads;
    rc.n_kv_heads = sl.n_kv_heads;
    rc.intermediate_size = sl.n_inter;
    gptoss_status st;
    if (!w) {
        st = gptoss_cuda_state_create_rank(&rc, &o, NULL, seed, sl.expert0, sl.n_experts, lm_row0,
                                           lm_rows, out, error);
        if (!st) st = rank_random_as_whole(*out, c, &sl, seed, error);
    } else {
        const size_t H = c->hidden_size, D = c->head_dim, NH = c->n_heads;
        gptoss_weights v = *w;
        v.ggml_experts = NULL; /* the experts are unpacked (backend.c) and sliced below */
        if (lm_split) v.lm_head = tensor_rows(&w->lm_head, (size_t)lm_row0, (size_t)lm_rows, H);
        v.layers = (gptoss_layer_weights *)calloc((size_t)w->n_layers, sizeof *v.layers);
        const size_t o_elems = H * sl.n_heads * D;
        void *o_cols = malloc((size_t)w->n_layers * o_elems * 2);
        void **moe_bufs = (void **)calloc(6 * (size_t)w->n_layers, sizeof(void *));
        if (!v.layers || !o_cols || !moe_bufs) {
            free(v.layers);
            free(o_cols);
            free(moe_bufs);
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        }
        st = GPTOSS_OK;
        for (int32_t l = 0; l < w->n_layers && !st; l++) {
            const gptoss_layer_weights *lw = &w->layers[l];
            gptoss_layer_weights *lv = &v.layers[l];
            *lv = *lw;
            lv->q_weight = tensor_rows(&lw->q_weight, sl.head0 * D, sl.n_heads * D, H);
            lv->q_bias = tensor_rows(&lw->q_bias, sl.head0 * D, sl.n_heads * D, 1);
            lv->k_weight = tensor_rows(&lw->k_weight, sl.kv_head0 * D, sl.n_kv_heads * D, H);
            lv->k_bias = tensor_rows(&lw->k_bias, sl.kv_head0 * D, sl.n_kv_heads * D, 1);
            lv->v_weight = tensor_rows(&lw->v_weight, sl.kv_head0 * D, sl.n_kv_heads * D, H);
            lv->v_bias = tensor_rows(&lw->v_bias, sl.kv_head0 * D, sl.n_kv_heads * D, 1);
            lv->sinks = tensor_rows(&lw->sinks, sl.head0, sl.n_heads, 1);
            const gptoss_tensor *ex[6] = {&lw->gate_up_blocks, &lw->gate_up_scales,
                                          &lw->gate_up_bias,   &lw->down_blocks,
                                          &lw->down_scales,    &lw->down_bias};
            gptoss_tensor *vx[6] = {&lv->gate_up_blocks, &lv->gate_up_scales, &lv->gate_up_bias,
                                    &lv->down_blocks,    &lv->down_scales,    &lv->down_bias};
            if (sl.n_inter == c->intermediate_size) {
                for (int i = 0; i < 6; i++)
                    *vx[i] = tensor_experts(ex[i], sl.expert0, sl.n_experts, c->n_experts);
            } else {
                st = experts_by_rows(ex, vx, c, &sl, &moe_bufs[6 * (size_t)l], error);
                if (st) break;
            }
            if (lw->o_weight.dtype != GPTOSS_DTYPE_BF16 || lw->o_weight.n_bytes != H * NH * D * 2) {
                st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                      "tensor parallelism: o_proj of layer %d is not a bf16 "
                                      "[%zu, %zu] matrix",
                                      (int)l, H, NH * D);
                break;
            }
            void *dst = (unsigned char *)o_cols + (size_t)l * o_elems * 2;
            gptoss_tp_copy_columns16(lw->o_weight.data, H, NH * D, sl.head0 * D, sl.n_heads * D,
                                     dst);
            lv->o_weight.data = dst;
            lv->o_weight.n_bytes = o_elems * 2;
            lv->o_weight.shape[1] = (int64_t)(sl.n_heads * D);
        }
        if (!st)
            st = gptoss_cuda_state_create_rank(&rc, &o, &v, 0, sl.expert0, sl.n_experts, lm_row0,
                                               lm_rows, out, error);
        free(o_cols);
        for (size_t i = 0; i < 6 * (size_t)w->n_layers; i++)
            free(moe_bufs[i]);
        free(moe_bufs);
        free(v.layers);
    }
    return st;
}
