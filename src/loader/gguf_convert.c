/*
 * gguf_convert.c - gptoss_gguf_convert: a Hugging Face gpt-oss folder written as one GGUF file
 * in llama.cpp's gpt-oss layout (spec 4.3).
 *
 * Owns: the choice of names, types and metadata keys written. The folder is loaded (and so
 * validated) through gptoss_model_load, and every tensor is taken from the bound HF views.
 * Types: matrices BF16 (the published files use Q8_0 for these; BF16 keeps the conversion
 * lossless), the router matrix and every vector F32, experts MXFP4 with ggml's nibble order.
 * Keys llama.cpp does not define are written only when a value differs from what llama.cpp
 * hard-codes for gpt-oss (swiglu_limit, swiglu_alpha, the sliding-layer pattern, YaRN
 * truncation), so a file of the real models carries only llama.cpp's keys.
 */
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/tensor.h"
#include "loader/gguf_model.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef enum job_kind {
    JOB_BF16,      /* BF16 matrix copied as is */
    JOB_F32,       /* any vector or matrix as F32 */
    JOB_BIAS_HALF, /* every other element (parity) of gate_up_bias rows, as F32 */
    JOB_MXFP4,     /* HF blocks/scales rows (every row_step-th from row_offset) to ggml blocks */
} job_kind;

typedef struct job {
    job_kind kind;
    const gptoss_tensor *src;    /* blocks for MXFP4 */
    const gptoss_tensor *scales; /* MXFP4 only */
    int64_t E, R, K;             /* MXFP4: experts, rows written, row length; bias: E, I */
    int64_t row_step, row_offset;
} job;

typedef struct convert_ctx {
    job *jobs;
    size_t n_jobs;
} convert_ctx;

static float elem_f32(const gptoss_tensor *t, size_t i) {
    if (t->dtype == GPTOSS_DTYPE_F32) {
        float f;
        memcpy(&f, (const uint8_t *)t->data + 4 * i, 4);
        return f;
    }
    const uint8_t *p = (const uint8_t *)t->data + 2 * i;
    return gptoss_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static gptoss_status fill(void *user, size_t index, uint8_t *out, size_t n_bytes,
                          gptoss_error *error) {
    const convert_ctx *ctx = user;
    const job *j = &ctx->jobs[index];
    (void)error;
    switch (j->kind) {
    case JOB_BF16:
        memcpy(out, j->src->data, n_bytes);
        break;
    case JOB_F32:
        for (size_t i = 0; i < n_bytes / 4; i++) {
            float f = elem_f32(j->src, i);
            memcpy(out + 4 * i, &f, 4);
        }
        break;
    case JOB_BIAS_HALF:
        for (int64_t i = 0; i < j->E * j->K; i++) {
            float f = elem_f32(j->src, (size_t)(2 * i + j->row_offset));
            memcpy(out + 4 * i, &f, 4);
        }
        break;
    case JOB_MXFP4: {
        int64_t G = j->K / 32, src_rows = j->R * j->row_step;
        const uint8_t *blocks = j->src->data, *scales = j->scales->data;
#pragma omp parallel for schedule(static)
        for (int64_t er = 0; er < j->E * j->R; er++) {
            int64_t e = er / j->R, r = er % j->R;
            int64_t srow = e * src_rows + r * j->row_step + j->row_offset;
            const uint8_t *ib = blocks + (size_t)srow * (size_t)G * 16;
            const uint8_t *is = scales + (size_t)srow * (size_t)G;
            uint8_t *o = out + (size_t)er * (size_t)G * 17;
            for (int64_t g = 0; g < G; g++) {
                uint8_t lane[32];
                for (int b = 0; b < 16; b++) {
                    lane[2 * b] = ib[g * 16 + b] & 15;
                    lane[2 * b + 1] = ib[g * 16 + b] >> 4;
                }
                o[g * 17] = is[g];
                for (int q = 0; q < 16; q++)
                    o[g * 17 + 1 + q] = (uint8_t)(lane[q] | lane[q + 16] << 4);
            }
        }
        break;
    }
    }
    return GPTOSS_OK;
}

/* ---- metadata ----------------------------------------------------------------------------- */

/* f32 when it reads back exactly (gptoss_gguf_f32_decimal), else the key as f64 would be
 * needed; gpt-oss's values all fit f32. */
static gptoss_status add_float(gptoss_gguf_writer *w, const char *key, double v,
                               gptoss_error *error) {
    if (gptoss_gguf_f32_decimal((float)v) != v)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "%s = %.17g does not survive a round trip through f32", key, v);
    gptoss_gguf_add_f32(w, key, (float)v);
    return GPTOSS_OK;
}

static gptoss_status add_config(gptoss_gguf_writer *w, const gptoss_config *c, const char *name,
                                gptoss_error *error) {
    gptoss_gguf_add_string(w, "general.architecture", "gpt-oss", 7);
    gptoss_gguf_add_string(w, "general.name", name, strlen(name));
    gptoss_gguf_add_u32(w, "general.quantization_version", 2);
    gptoss_gguf_add_u32(w, "gpt-oss.block_count", (uint32_t)c->n_layers);
    gptoss_gguf_add_u32(w, "gpt-oss.context_length", (uint32_t)c->max_position_embeddings);
    gptoss_gguf_add_u32(w, "gpt-oss.embedding_length", (uint32_t)c->hidden_size);
    gptoss_gguf_add_u32(w, "gpt-oss.feed_forward_length", (uint32_t)c->intermediate_size);
    gptoss_gguf_add_u32(w, "gpt-oss.attention.head_count", (uint32_t)c->n_heads);
    gptoss_gguf_add_u32(w, "gpt-oss.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    gptoss_status st;
    if ((st = add_float(w, "gpt-oss.rope.freq_base", c->rope_theta, error)) ||
        (st = add_float(w, "gpt-oss.attention.layer_norm_rms_epsilon", c->rms_norm_eps, error)))
        return st;
    gptoss_gguf_add_u32(w, "gpt-oss.expert_count", (uint32_t)c->n_experts);
    gptoss_gguf_add_u32(w, "gpt-oss.expert_used_count", (uint32_t)c->n_experts_per_token);
    gptoss_gguf_add_u32(w, "gpt-oss.attention.key_length", (uint32_t)c->head_dim);
    gptoss_gguf_add_u32(w, "gpt-oss.attention.value_length", (uint32_t)c->head_dim);
    gptoss_gguf_add_u32(w, "gpt-oss.attention.sliding_window", (uint32_t)c->sliding_window);
    gptoss_gguf_add_u32(w, "gpt-oss.expert_feed_forward_length", (uint32_t)c->intermediate_size);
    gptoss_gguf_add_string(w, "gpt-oss.rope.scaling.type", "yarn", 4);
    if ((st = add_float(w, "gpt-oss.rope.scaling.factor", c->rope_scaling_factor, error)))
        return st;
    gptoss_gguf_add_u32(w, "gpt-oss.rope.scaling.original_context_length",
                        (uint32_t)c->rope_original_max_position_embeddings);
    if ((st = add_float(w, "gpt-oss.rope.scaling.yarn_beta_fast", c->rope_beta_fast, error)) ||
        (st = add_float(w, "gpt-oss.rope.scaling.yarn_beta_slow", c->rope_beta_slow, error)))
        return st;
    /* Beyond llama.cpp's keys, only where the model differs from what it hard-codes. */
    if (c->swiglu_limit != 7.0 &&
        (st = add_float(w, "gpt-oss.swiglu_limit", c->swiglu_limit, error)))
        return st;
    if (c->swiglu_alpha != 1.702 &&
        (st = add_float(w, "gpt-oss.swiglu_alpha", c->swiglu_alpha, error)))
        return st;
    if (c->rope_truncate) gptoss_gguf_add_bool(w, "gpt-oss.rope.scaling.truncate", true);
    bool default_pattern = true;
    for (int32_t l = 0; l < c->n_layers; l++)
        default_pattern &= c->layer_is_sliding[l] == ((l % 2) == 0);
    if (!default_pattern)
        gptoss_gguf_add_array_bool(w, "gpt-oss.attention.sliding_window_pattern",
                                   (size_t)c->n_layers, c->layer_is_sliding);
    return GPTOSS_OK;
}

/* The tokenizer of tokenizer.json as llama.cpp's "gpt2" vocabulary: every id below n gets a
 * string (byte-level BPE strings for ordinary tokens, the text for added ones, "[PAD<id>]"
 * for ids the tokenizer does not define) and a type. */
static gptoss_status add_tokenizer(gptoss_gguf_writer *w, const char *dir, const gptoss_config *c,
                                   gptoss_error *error) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", path,
                                jerr.text, jerr.line);
    gptoss_status st = GPTOSS_OK;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    const char **texts = NULL, **merge_texts = NULL;
    char **owned = NULL;
    size_t *lens = NULL;
    int32_t *types = NULL;
    size_t n = (size_t)c->vocab_size, n_merges = 0;
    if (!json_is_object(vocab) || (added && !json_is_array(added))) {
        st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                              "%s: model.vocab or added_tokens is missing or malformed", path);
        goto done;
    }
    const char *key;
    json_t *value;
    size_t i_added;
    json_object_foreach(vocab, key, value) {
        json_int_t id = json_integer_value(value);
        if (json_is_integer(value) && id >= 0 && id < (1 << 24) && (size_t)id + 1 > n)
            n = (size_t)id + 1;
    }
    json_array_foreach(added, i_added, value) {
        json_int_t id = json_integer_value(json_object_get(value, "id"));
        if (id >= 0 && id < (1 << 24) && (size_t)id + 1 > n) n = (size_t)id + 1;
    }
    texts = calloc(n, sizeof *texts);
    owned = calloc(n, sizeof *owned);
    lens = calloc(n, sizeof *lens);
    types = calloc(n, sizeof *types);
    if (!texts || !owned || !lens || !types) {
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    json_object_foreach(vocab, key, value) {
        json_int_t id = json_integer_value(value);
        if (!json_is_integer(value) || id < 0 || (size_t)id >= n) {
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: vocab entry \"%s\" has a bad id",
                                  path, key);
            goto done;
        }
        texts[id] = key;
        lens[id] = strlen(key);
        types[id] = 1; /* normal */
    }
    int32_t bos = -1;
    json_array_foreach(added, i_added, value) {
        json_t *content = json_object_get(value, "content");
        json_int_t id = json_integer_value(json_object_get(value, "id"));
        if (!json_is_string(content) || id < 0 || (size_t)id >= n) {
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: added token #%zu is malformed",
                                  path, i_added);
            goto done;
        }
        texts[id] = json_string_value(content);
        lens[id] = json_string_length(content);
        types[id] = json_is_false(json_object_get(value, "special")) ? 4 : 3; /* user / control */
        if (strcmp(texts[id], "<|startoftext|>") == 0) bos = (int32_t)id;
    }
    for (size_t id = 0; id < n; id++)
        if (!texts[id]) {
            char buf[32];
            snprintf(buf, sizeof buf, "[PAD%zu]", id);
            owned[id] = strdup(buf);
            if (!owned[id]) {
                st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            texts[id] = owned[id];
            lens[id] = strlen(buf);
            types[id] = 5; /* unused */
        }
    if (json_is_array(merges)) {
        n_merges = json_array_size(merges);
        merge_texts = calloc(n_merges ? n_merges : 1, sizeof *merge_texts);
        if (!merge_texts) {
            st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < n_merges; i++) {
            json_t *m = json_array_get(merges, i);
            if (json_is_string(m)) {
                merge_texts[i] = strdup(json_string_value(m));
            } else if (json_is_array(m) && json_array_size(m) == 2 &&
                       json_is_string(json_array_get(m, 0)) &&
                       json_is_string(json_array_get(m, 1))) {
                const char *a = json_string_value(json_array_get(m, 0));
                const char *b = json_string_value(json_array_get(m, 1));
                char *s = malloc(strlen(a) + strlen(b) + 2);
                if (s) sprintf(s, "%s %s", a, b);
                merge_texts[i] = s;
            } else {
                st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: merge #%zu is malformed", path,
                                      i);
                goto done;
            }
            if (!merge_texts[i]) {
                st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
        }
    }
    gptoss_gguf_add_string(w, "tokenizer.ggml.model", "gpt2", 4);
    gptoss_gguf_add_string(w, "tokenizer.ggml.pre", "gpt-4o", 6);
    gptoss_gguf_add_array_strings(w, "tokenizer.ggml.tokens", n, texts, lens);
    gptoss_gguf_add_array_i32(w, "tokenizer.ggml.token_type", n, types);
    gptoss_gguf_add_array_strings(w, "tokenizer.ggml.merges", n_merges, merge_texts, NULL);
    if (bos >= 0) gptoss_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    gptoss_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_token_id);
    if (c->pad_token_id >= 0)
        gptoss_gguf_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)c->pad_token_id);
done:
    if (merge_texts)
        for (size_t i = 0; i < n_merges; i++)
            free((char *)merge_texts[i]);
    free(merge_texts);
    if (owned)
        for (size_t i = 0; i < n; i++)
            free(owned[i]);
    free(owned);
    free(texts);
    free(lens);
    free(types);
    json_decref(root);
    return st;
}

static gptoss_status add_chat_template(gptoss_gguf_writer *w, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return GPTOSS_OK; /* optional */
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 65536;
            char *grown = realloc(buf, cap);
            if (!grown) break;
            buf = grown;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    fclose(f);
    if (buf) gptoss_gguf_add_string(w, "tokenizer.chat_template", buf, len);
    free(buf);
    return GPTOSS_OK;
}

/* ---- tensors ------------------------------------------------------------------------------ */

static void declare(gptoss_gguf_writer *w, convert_ctx *ctx, const char *name, uint32_t type,
                    job j) {
    int64_t ne[4];
    uint32_t n_dims;
    if (j.kind == JOB_MXFP4) {
        n_dims = 3, ne[0] = j.K, ne[1] = j.R, ne[2] = j.E;
    } else if (j.kind == JOB_BIAS_HALF) {
        n_dims = 2, ne[0] = j.K, ne[1] = j.E;
    } else {
        n_dims = (uint32_t)j.src->n_dims;
        for (uint32_t d = 0; d < n_dims; d++)
            ne[d] = j.src->shape[n_dims - 1 - d];
    }
    ctx->jobs[ctx->n_jobs++] = j;
    gptoss_gguf_add_tensor(w, name, n_dims, ne, type);
}

static job plain(job_kind kind, const gptoss_tensor *t) {
    return (job){.kind = kind, .src = t};
}

gptoss_status gptoss_gguf_convert(const char *model_dir, const char *out_path,
                                  gptoss_error *error) {
    struct stat sb;
    if (stat(model_dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "%s: convert reads a Hugging Face folder, not a file", model_dir);
    gptoss_model *model = NULL;
    gptoss_status st = gptoss_model_load(model_dir, &model, error);
    if (st) return st;
    const gptoss_config *c = gptoss_model_config(model);
    const gptoss_weights *wt = gptoss_model_weights(model);
    gptoss_gguf_writer *w = gptoss_gguf_writer_new();
    convert_ctx ctx = {.jobs = calloc((size_t)gptoss_weights_expected_count(c), sizeof(job))};
    if (!w || !ctx.jobs) {
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    const char *base = strrchr(model_dir, '/');
    base = base && base[1] ? base + 1 : model_dir;
    if ((st = add_config(w, c, base, error))) goto done;
    if ((st = add_tokenizer(w, model_dir, c, error))) goto done;
    add_chat_template(w, model_dir);

    declare(w, &ctx, "token_embd.weight", GPTOSS_GGML_BF16, plain(JOB_BF16, &wt->embedding));
    declare(w, &ctx, "output_norm.weight", GPTOSS_GGML_F32, plain(JOB_F32, &wt->final_norm));
    declare(w, &ctx, "output.weight", GPTOSS_GGML_BF16, plain(JOB_BF16, &wt->lm_head));
    int64_t E = c->n_experts, H = c->hidden_size, I = c->intermediate_size;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const gptoss_layer_weights *L = &wt->layers[l];
        char name[96];
#define T(suffix, type, j)                                                                         \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                       \
        declare(w, &ctx, name, type, j);                                                           \
    } while (0)
        T("attn_norm.weight", GPTOSS_GGML_F32, plain(JOB_F32, &L->attn_norm));
        T("attn_q.weight", GPTOSS_GGML_BF16, plain(JOB_BF16, &L->q_weight));
        T("attn_q.bias", GPTOSS_GGML_F32, plain(JOB_F32, &L->q_bias));
        T("attn_k.weight", GPTOSS_GGML_BF16, plain(JOB_BF16, &L->k_weight));
        T("attn_k.bias", GPTOSS_GGML_F32, plain(JOB_F32, &L->k_bias));
        T("attn_v.weight", GPTOSS_GGML_BF16, plain(JOB_BF16, &L->v_weight));
        T("attn_v.bias", GPTOSS_GGML_F32, plain(JOB_F32, &L->v_bias));
        T("attn_output.weight", GPTOSS_GGML_BF16, plain(JOB_BF16, &L->o_weight));
        T("attn_output.bias", GPTOSS_GGML_F32, plain(JOB_F32, &L->o_bias));
        T("attn_sinks.weight", GPTOSS_GGML_F32, plain(JOB_F32, &L->sinks));
        T("post_attention_norm.weight", GPTOSS_GGML_F32, plain(JOB_F32, &L->mlp_norm));
        T("ffn_gate_inp.weight", GPTOSS_GGML_F32, plain(JOB_F32, &L->router_weight));
        T("ffn_gate_inp.bias", GPTOSS_GGML_F32, plain(JOB_F32, &L->router_bias));
        job gate = {JOB_MXFP4, &L->gate_up_blocks, &L->gate_up_scales, E, I, H, 2, 0};
        job up = gate;
        up.row_offset = 1;
        T("ffn_gate_exps.weight", GPTOSS_GGML_MXFP4, gate);
        T("ffn_up_exps.weight", GPTOSS_GGML_MXFP4, up);
        T("ffn_down_exps.weight", GPTOSS_GGML_MXFP4,
          ((job){JOB_MXFP4, &L->down_blocks, &L->down_scales, E, H, I, 1, 0}));
        T("ffn_gate_exps.bias", GPTOSS_GGML_F32,
          ((job){.kind = JOB_BIAS_HALF, .src = &L->gate_up_bias, .E = E, .K = I, .row_offset = 0}));
        T("ffn_up_exps.bias", GPTOSS_GGML_F32,
          ((job){.kind = JOB_BIAS_HALF, .src = &L->gate_up_bias, .E = E, .K = I, .row_offset = 1}));
        T("ffn_down_exps.bias", GPTOSS_GGML_F32, plain(JOB_F32, &L->down_bias));
#undef T
    }
    st = gptoss_gguf_writer_write(w, out_path, fill, &ctx, error);
done:
    gptoss_gguf_writer_free(w);
    free(ctx.jobs);
    gptoss_model_free(model);
    return st;
}
