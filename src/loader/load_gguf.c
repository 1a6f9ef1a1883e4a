/*
 * load_gguf.c - gptoss_model_load for a gpt-oss GGUF file (see gguf_model.h, spec 4.3).
 *
 * Owns: reading the gpt-oss metadata into gptoss_config, and turning llama.cpp's tensors into
 * the Hugging Face views the model binds. BF16 tensors stay zero-copy views into the mapping;
 * the MXFP4 experts are converted when a reader asks, everything else once at load, into
 * buffers the model owns:
 *   - MXFP4 experts: ggml's 17-byte blocks (scale byte, then qs[j] = lane j | lane j+16 << 4)
 *     become HF blocks (byte b = lane 2b | lane 2b+1 << 4) and a separate scale array, and
 *     ffn_gate_exps / ffn_up_exps rows are interleaved back into gate_up (gate, up, gate, ...).
 *     The loader binds them without data and hands the file's bytes to the model
 *     (gptoss_weights.ggml_experts): the CPU backend reads that layout in place, the CUDA
 *     backend uploads the bytes and converts them on the device, and
 *     gptoss_model_unpack_experts converts them for any other reader; so serving makes no host
 *     copy of the experts (which was most of a GGUF load's time);
 *   - F32/F16/Q8_0 matrices become BF16 (round to nearest even: exact for values that were BF16,
 *     else within 2^-9 relative);
 *   - vectors become BF16 when every value is exactly a BF16, else stay F32 (both exact).
 */
#include "loader/gguf_model.h"
#include "format/tensor.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_POSITIONS (64 * 1024 * 1024)

/* ---- metadata -> config ------------------------------------------------------------------- */

/* f32 metadata reads back as the decimal it was written from (gptoss_gguf_f32_decimal), so
 * both load paths compute with the same doubles; f64 and integer values pass unchanged. */
static double f32_to_decimal(double v) {
    float f = (float)v;
    return (double)f == v ? gptoss_gguf_f32_decimal(f) : v;
}

typedef struct meta_reader {
    const gptoss_gguf_file *file;
    char arch[16]; /* "gpt-oss" or "gptoss" */
} meta_reader;

static gptoss_status get_i32(const meta_reader *m, const char *key, bool required, int64_t lo,
                             int64_t hi, int32_t *out, gptoss_error *error) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", m->arch, key);
    int64_t v = *out;
    gptoss_status st = gptoss_gguf_get_int(m->file, full, required, lo, hi, &v, error);
    if (st == GPTOSS_OK) *out = (int32_t)v;
    return st;
}

static gptoss_status get_f(const meta_reader *m, const char *key, bool required, double *out,
                           gptoss_error *error) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", m->arch, key);
    double v = *out;
    gptoss_status st = gptoss_gguf_get_float(m->file, full, required, &v, error);
    if (st == GPTOSS_OK) *out = f32_to_decimal(v);
    return st;
}

static gptoss_status read_config(const gptoss_gguf_file *file, const gptoss_gguf_tensor *embd,
                                 gptoss_config *c, gptoss_error *error) {
    memset(c, 0, sizeof *c);
    meta_reader m = {.file = file};
    gptoss_gguf_str arch = {0};
    gptoss_status st = gptoss_gguf_get_string(file, "general.architecture", true, &arch, error);
    if (st) return st;
    if (gptoss_gguf_str_is(arch, "gpt-oss") || gptoss_gguf_str_is(arch, "gptoss"))
        snprintf(m.arch, sizeof m.arch, "%.*s", (int)arch.len, arch.ptr);
    else
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "general.architecture is \"%.*s\"; only gpt-oss models are "
                                "supported",
                                (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    if (!embd || embd->n_dims != 2)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "token_embd.weight is missing or not 2-dimensional");
    if (embd->ne[1] < 1 || embd->ne[1] > 16777216)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "token_embd.weight has %lld rows",
                                (long long)embd->ne[1]);
    c->vocab_size = (int32_t)embd->ne[1];
    c->rope_beta_fast = 32.0;
    c->rope_beta_slow = 1.0;
    c->rope_scaling_factor = 1.0;
    c->swiglu_limit = 7.0;
    c->swiglu_alpha = 1.702;
    c->rope_truncate = false;
    c->pad_token_id = -1;
    const int64_t big = 1 << 30;
    if ((st = get_i32(&m, "block_count", true, 1, GPTOSS_MAX_LAYERS, &c->n_layers, error)) ||
        (st = get_i32(&m, "context_length", true, 1, MAX_POSITIONS, &c->max_position_embeddings,
                      error)) ||
        (st = get_i32(&m, "embedding_length", true, 1, big, &c->hidden_size, error)) ||
        (st = get_i32(&m, "feed_forward_length", false, 1, big, &c->intermediate_size, error)) ||
        (st = get_i32(&m, "expert_feed_forward_length", false, 1, big, &c->intermediate_size,
                      error)) ||
        (st = get_i32(&m, "attention.head_count", true, 1, big, &c->n_heads, error)) ||
        (st = get_i32(&m, "attention.head_count_kv", true, 1, big, &c->n_kv_heads, error)) ||
        (st = get_i32(&m, "expert_count", true, 1, big, &c->n_experts, error)) ||
        (st = get_i32(&m, "expert_used_count", true, 1, big, &c->n_experts_per_token, error)) ||
        (st = get_i32(&m, "attention.sliding_window", true, 1, MAX_POSITIONS, &c->sliding_window,
                      error)) ||
        (st = get_f(&m, "rope.freq_base", true, &c->rope_theta, error)) ||
        (st = get_f(&m, "attention.layer_norm_rms_epsilon", true, &c->rms_norm_eps, error)) ||
        (st = get_f(&m, "rope.scaling.factor", false, &c->rope_scaling_factor, error)) ||
        (st = get_f(&m, "rope.scaling.yarn_beta_fast", false, &c->rope_beta_fast, error)) ||
        (st = get_f(&m, "rope.scaling.yarn_beta_slow", false, &c->rope_beta_slow, error)) ||
        (st = get_f(&m, "swiglu_limit", false, &c->swiglu_limit, error)) ||
        (st = get_f(&m, "swiglu_alpha", false, &c->swiglu_alpha, error)))
        return st;
    if (c->intermediate_size == 0)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "metadata key %s.expert_feed_forward_length is missing", m.arch);
    c->head_dim = c->hidden_size / c->n_heads;
    int32_t value_length = 0;
    if ((st = get_i32(&m, "attention.key_length", false, 1, 4096, &c->head_dim, error)) ||
        (st = get_i32(&m, "attention.value_length", false, 1, 4096, &value_length, error)))
        return st;
    if (value_length && value_length != c->head_dim)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "attention.key_length %d and value_length %d differ", c->head_dim,
                                value_length);
    c->rope_original_max_position_embeddings = c->max_position_embeddings;
    if ((st = get_i32(&m, "rope.scaling.original_context_length", false, 1, MAX_POSITIONS,
                      &c->rope_original_max_position_embeddings, error)))
        return st;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m.arch);
    gptoss_gguf_str type = {0};
    if ((st = gptoss_gguf_get_string(file, key, false, &type, error))) return st;
    if (type.ptr && !gptoss_gguf_str_is(type, "yarn") && !gptoss_gguf_str_is(type, "none"))
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "%s is \"%.*s\"; gpt-oss uses \"yarn\"", key,
                                (int)(type.len > 32 ? 32 : type.len), type.ptr);
    snprintf(key, sizeof key, "%s.rope.scaling.truncate", m.arch);
    if ((st = gptoss_gguf_get_bool(file, key, false, &c->rope_truncate, error))) return st;
    /* llama.cpp hard-codes gpt-oss's pattern (even layers slide); a file may spell it out. */
    for (int32_t l = 0; l < c->n_layers; l++)
        c->layer_is_sliding[l] = (l % 2) == 0;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m.arch);
    if (gptoss_gguf_find_kv(file, key)) {
        const gptoss_gguf_kv *pattern;
        if ((st = gptoss_gguf_get_array(file, key, GPTOSS_GGUF_BOOL, &pattern, error))) return st;
        if (pattern->count != (uint64_t)c->n_layers)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL, "%s has %llu entries for %d layers",
                                    key, (unsigned long long)pattern->count, c->n_layers);
        for (int32_t l = 0; l < c->n_layers; l++)
            c->layer_is_sliding[l] = pattern->data[l] != 0;
    }
    int64_t id = -1;
    if ((st = gptoss_gguf_get_int(file, "tokenizer.ggml.eos_token_id", false, 0, INT32_MAX, &id,
                                  error)))
        return st;
    c->eos_token_id = (int32_t)id;
    if (id < 0) c->eos_token_id = c->vocab_size > 200002 ? 200002 : 0;
    id = -1;
    if ((st = gptoss_gguf_get_int(file, "tokenizer.ggml.padding_token_id", false, 0, INT32_MAX, &id,
                                  error)))
        return st;
    c->pad_token_id = (int32_t)id;
    return gptoss_config_validate(c, error);
}

gptoss_status gptoss_gguf_read_config(const gptoss_gguf_file *file, gptoss_config *config,
                                      gptoss_error *error) {
    return read_config(file, gptoss_gguf_find_tensor(file, "token_embd.weight"), config, error);
}

/* ---- tensor conversion -------------------------------------------------------------------- */

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    union {
        uint32_t u;
        float f;
    } v;
    if (exp == 0x1f) {
        v.u = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {
        float f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    } else {
        v.u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    return v.f;
}

static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

/* Element i of a dense (F32, F16, BF16, Q8_0) tensor as float. */
static float dense_at(const gptoss_gguf_tensor *t, uint64_t i) {
    const uint8_t *p = t->data;
    switch (t->type) {
    case GPTOSS_GGML_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case GPTOSS_GGML_F16:
        return f16_to_f32(rd16(p + 2 * i));
    case GPTOSS_GGML_BF16:
        return gptoss_bf16_to_f32(rd16(p + 2 * i));
    default: { /* Q8_0: 34-byte blocks, f16 scale then 32 int8 */
        const uint8_t *b = p + (i / 32) * 34;
        return f16_to_f32(rd16(b)) * (float)(int8_t)b[2 + i % 32];
    }
    }
}

static bool is_dense_type(uint32_t type) {
    return type == GPTOSS_GGML_F32 || type == GPTOSS_GGML_F16 || type == GPTOSS_GGML_BF16 ||
           type == GPTOSS_GGML_Q8_0;
}

#define MAX_SPLITS 256

typedef struct gguf_loader {
    const char *path;
    gptoss_gguf_file *files[MAX_SPLITS]; /* the file, or every part of a split one */
    int n_files;
    gptoss_model *model;
    const gptoss_config *config;
    gptoss_tensor *views; /* HF-named views for gptoss_model_bind */
    char (*names)[96];
    size_t n_views;
    bool *used[MAX_SPLITS];    /* [files[i]->n_tensors] tensors taken */
    gptoss_ggml_experts *ggml; /* [n_layers] the expert tensors as the file holds them */
    double t_experts;          /* seconds spent on the expert tensors (load-stage timing) */
} gguf_loader;

static const gptoss_gguf_tensor *find_any(const gguf_loader *ld, const char *name, int *file) {
    for (int f = 0; f < ld->n_files; f++) {
        const gptoss_gguf_tensor *t = gptoss_gguf_find_tensor(ld->files[f], name);
        if (t) {
            if (file) *file = f;
            return t;
        }
    }
    return NULL;
}

static void free_buffer(void *p) {
    free(p);
}

/* A buffer the model will own. Large ones (the experts) ask for huge pages: filling tens of GB
 * in 4 KiB pages costs millions of page faults at load. */
static gptoss_status model_buffer(gptoss_model *model, size_t bytes, void **out,
                                  gptoss_error *error) {
    const size_t huge = (size_t)2 << 20;
    *out = NULL;
    if (bytes >= 32 * huge) {
        if (posix_memalign(out, huge, bytes) != 0)
            *out = NULL;
        else
            madvise(*out, bytes, MADV_HUGEPAGE); /* advice only: failure is harmless */
    } else {
        *out = malloc(bytes ? bytes : 1);
    }
    if (!*out)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory (%zu bytes) converting the GGUF tensors", bytes);
    return gptoss_model_add_storage(model, *out, free_buffer, error);
}

static gptoss_tensor *new_view(gguf_loader *ld, const char *hf_name, int32_t n_dims,
                               const int64_t *shape) {
    gptoss_tensor *v = &ld->views[ld->n_views];
    snprintf(ld->names[ld->n_views], sizeof ld->names[0], "%s", hf_name);
    ld->n_views++;
    memset(v, 0, sizeof *v);
    v->name = ld->names[ld->n_views - 1];
    v->n_dims = n_dims;
    for (int32_t d = 0; d < n_dims; d++)
        v->shape[d] = shape[d];
    return v;
}

/* Finds a GGUF tensor and checks its ne against the expected HF shape (reversed). */
static gptoss_status find(gguf_loader *ld, const char *name, int32_t n_dims, const int64_t *shape,
                          const gptoss_gguf_tensor **out, gptoss_error *error) {
    int f = 0;
    const gptoss_gguf_tensor *t = find_any(ld, name, &f);
    if (!t) return gptoss_set_error(error, GPTOSS_ERR_MODEL, "tensor %s is missing", name);
    ld->used[f][t - ld->files[f]->tensors] = true;
    bool ok = t->n_dims == (uint32_t)n_dims;
    for (int32_t d = 0; ok && d < n_dims; d++)
        ok = t->ne[d] == shape[n_dims - 1 - d];
    if (!ok) {
        char want[80] = "", have[80] = "";
        size_t a = 0, b = 0;
        for (int32_t d = 0; d < n_dims; d++)
            a += (size_t)snprintf(want + a, sizeof want - a, "%s%lld", d ? ", " : "",
                                  (long long)shape[n_dims - 1 - d]);
        for (uint32_t d = 0; d < t->n_dims; d++)
            b += (size_t)snprintf(have + b, sizeof have - b, "%s%lld", d ? ", " : "",
                                  (long long)t->ne[d]);
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "tensor %s: ne [%s], expected [%s] from the metadata", name, have,
                                want);
    }
    *out = t;
    return GPTOSS_OK;
}

static gptoss_status unsupported_type(const char *name, uint32_t type, const char *allowed,
                                      gptoss_error *error) {
    char buf[24];
    return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                            "tensor %s: ggml type %s is not supported here (supported: %s)", name,
                            gptoss_ggml_type_name(type, buf, sizeof buf), allowed);
}

/* A large matrix: BF16 stays a view, other dense types become BF16. */
static gptoss_status add_matrix(gguf_loader *ld, const char *gguf_name, const char *hf_name,
                                int64_t rows, int64_t cols, gptoss_error *error) {
    int64_t shape[2] = {rows, cols};
    const gptoss_gguf_tensor *t = NULL;
    gptoss_status st = find(ld, gguf_name, 2, shape, &t, error);
    if (st) return st;
    if (!is_dense_type(t->type))
        return unsupported_type(gguf_name, t->type, "F32, F16, BF16, Q8_0", error);
    gptoss_tensor *v = new_view(ld, hf_name, 2, shape);
    v->dtype = GPTOSS_DTYPE_BF16;
    v->n_bytes = (size_t)(rows * cols * 2);
    if (t->type == GPTOSS_GGML_BF16) {
        v->data = t->data;
        return GPTOSS_OK;
    }
    uint16_t *out;
    if ((st = model_buffer(ld->model, v->n_bytes, (void **)&out, error))) return st;
    int64_t n = rows * cols;
    /* Threads only for large matrices: waking the team for a router matrix (92k values) costs
     * more than converting it, and its spinning threads slow the rest of the load. */
#pragma omp parallel for schedule(static) if (n >= (1 << 22))
    for (int64_t i = 0; i < n; i++)
        out[i] = gptoss_f32_to_bf16(dense_at(t, (uint64_t)i));
    v->data = out;
    return GPTOSS_OK;
}

/* Values of a vector (already in HF order) into a BF16 view when all are exact BF16, else F32. */
static gptoss_status add_vector_values(gguf_loader *ld, const char *hf_name, int32_t n_dims,
                                       const int64_t *shape, const float *values, int64_t n,
                                       gptoss_error *error) {
    bool exact = true;
    for (int64_t i = 0; i < n && exact; i++)
        exact = gptoss_bf16_to_f32(gptoss_f32_to_bf16(values[i])) == values[i] ||
                values[i] != values[i];
    gptoss_tensor *v = new_view(ld, hf_name, n_dims, shape);
    v->dtype = exact ? GPTOSS_DTYPE_BF16 : GPTOSS_DTYPE_F32;
    v->n_bytes = (size_t)n * (exact ? 2 : 4);
    void *out;
    gptoss_status st = model_buffer(ld->model, v->n_bytes, &out, error);
    if (st) return st;
    if (exact)
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)out)[i] = gptoss_f32_to_bf16(values[i]);
    else
        memcpy(out, values, (size_t)n * 4);
    v->data = out;
    return GPTOSS_OK;
}

static gptoss_status read_dense_f32(gguf_loader *ld, const char *gguf_name, int32_t n_dims,
                                    const int64_t *shape, float **out, gptoss_error *error) {
    const gptoss_gguf_tensor *t = NULL;
    gptoss_status st = find(ld, gguf_name, n_dims, shape, &t, error);
    if (st) return st;
    if (!is_dense_type(t->type))
        return unsupported_type(gguf_name, t->type, "F32, F16, BF16, Q8_0", error);
    int64_t n = 1;
    for (int32_t d = 0; d < n_dims; d++)
        n *= shape[d];
    *out = malloc((size_t)(n ? n : 1) * sizeof **out);
    if (!*out) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < n; i++)
        (*out)[i] = dense_at(t, (uint64_t)i);
    return GPTOSS_OK;
}

static gptoss_status add_vector(gguf_loader *ld, const char *gguf_name, const char *hf_name,
                                int32_t n_dims, int64_t d0, int64_t d1, gptoss_error *error) {
    int64_t shape[2] = {d0, d1};
    float *values;
    gptoss_status st = read_dense_f32(ld, gguf_name, n_dims, shape, &values, error);
    if (st) return st;
    st = add_vector_values(ld, hf_name, n_dims, shape, values, n_dims == 2 ? d0 * d1 : d0, error);
    free(values);
    return st;
}

/* The MXFP4 expert tensor src (ne [K, R, E]) into HF blocks/scales rows: source row r of
 * expert e goes to destination row r * row_step + row_offset of [E, R * row_step, K/32]. */
static void repack_mxfp4(const uint8_t *src, int64_t E, int64_t R, int64_t K, int64_t row_step,
                         int64_t row_offset, uint8_t *blocks, uint8_t *scales) {
    int64_t G = K / 32, dst_rows = R * row_step;
#pragma omp parallel for schedule(static)
    for (int64_t er = 0; er < E * R; er++) {
        int64_t e = er / R, r = er % R;
        const uint8_t *in = src + (size_t)er * (size_t)G * 17;
        int64_t drow = e * dst_rows + r * row_step + row_offset;
        uint8_t *ob = blocks + (size_t)drow * (size_t)G * 16;
        uint8_t *os = scales + (size_t)drow * (size_t)G;
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *blk = in + g * 17, *qs = blk + 1;
            uint8_t *o = ob + g * 16;
            os[g] = blk[0];
            /* Lanes 0..15 are the low nibbles of qs, lanes 16..31 the high ones. */
            for (int b = 0; b < 8; b++) {
                o[b] = (uint8_t)((qs[2 * b] & 15) | (qs[2 * b + 1] & 15) << 4);
                o[b + 8] = (uint8_t)((qs[2 * b] >> 4) | (qs[2 * b + 1] & 0xf0));
            }
        }
    }
}

static gptoss_status find_mxfp4(gguf_loader *ld, const char *name, int64_t E, int64_t R, int64_t K,
                                const gptoss_gguf_tensor **out, gptoss_error *error) {
    int64_t shape[3] = {E, R, K};
    gptoss_status st = find(ld, name, 3, shape, out, error);
    if (st) return st;
    if ((*out)->type != GPTOSS_GGML_MXFP4)
        return unsupported_type(name, (*out)->type, "MXFP4", error);
    return GPTOSS_OK;
}

static gptoss_status add_experts(gguf_loader *ld, int32_t l, gptoss_error *error) {
    const gptoss_config *c = ld->config;
    int64_t E = c->n_experts, H = c->hidden_size, I = c->intermediate_size;
    char name[96], hf[96];
    const gptoss_gguf_tensor *gate = NULL, *up = NULL, *down = NULL;
    gptoss_status st;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
    if ((st = find_mxfp4(ld, name, E, I, H, &gate, error))) return st;
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", l);
    if ((st = find_mxfp4(ld, name, E, I, H, &up, error))) return st;
    snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", l);
    if ((st = find_mxfp4(ld, name, E, H, I, &down, error))) return st;

    /* The blocks stay in the file until a reader asks (gptoss_model_unpack_experts): a backend
     * that converts ggml's layout itself uploads the mapped bytes without a host copy. */
    ld->ggml[l] = (gptoss_ggml_experts){gate->data, up->data, down->data};
    size_t gu_scales = (size_t)(E * 2 * I * (H / 32)), d_scales = (size_t)(E * H * (I / 32));
    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
    gptoss_tensor *v = new_view(ld, hf, 4, (int64_t[]){E, 2 * I, H / 32, 16});
    v->dtype = GPTOSS_DTYPE_U8, v->n_bytes = gu_scales * 16;
    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.gate_up_proj_scales", l);
    v = new_view(ld, hf, 3, (int64_t[]){E, 2 * I, H / 32});
    v->dtype = GPTOSS_DTYPE_U8, v->n_bytes = gu_scales;
    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.down_proj_blocks", l);
    v = new_view(ld, hf, 4, (int64_t[]){E, H, I / 32, 16});
    v->dtype = GPTOSS_DTYPE_U8, v->n_bytes = d_scales * 16;
    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.down_proj_scales", l);
    v = new_view(ld, hf, 3, (int64_t[]){E, H, I / 32});
    v->dtype = GPTOSS_DTYPE_U8, v->n_bytes = d_scales;

    /* Biases: gate and up [E, I] interleave into gate_up [E, 2I]. */
    float *gb = NULL, *ub = NULL, *both = NULL;
    int64_t shape[2] = {E, I};
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.bias", l);
    st = read_dense_f32(ld, name, 2, shape, &gb, error);
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.bias", l);
    if (!st) st = read_dense_f32(ld, name, 2, shape, &ub, error);
    if (!st && !(both = malloc((size_t)(E * 2 * I) * sizeof *both)))
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    if (!st) {
        for (int64_t i = 0; i < E * I; i++) {
            both[2 * i] = gb[i];
            both[2 * i + 1] = ub[i];
        }
        snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        st = add_vector_values(ld, hf, 2, (int64_t[]){E, 2 * I}, both, E * 2 * I, error);
    }
    free(gb);
    free(ub);
    free(both);
    if (st) return st;
    snprintf(name, sizeof name, "blk.%d.ffn_down_exps.bias", l);
    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.down_proj_bias", l);
    return add_vector(ld, name, hf, 2, E, H, error);
}

/* gptoss_model_unpack_fn: every layer's ggml experts into Hugging Face blocks and scales (a
 * layer that a failed earlier call finished is kept). Filling the new buffers (about the
 * experts' size) is mostly the kernel zeroing fresh pages, then the nibble shuffle. */
static gptoss_status unpack_experts(gptoss_model *model, gptoss_weights *w, gptoss_error *error) {
    const gptoss_config *c = gptoss_model_config(model);
    int64_t E = c->n_experts, H = c->hidden_size, I = c->intermediate_size;
    double t0 = gptoss_now_seconds();
    size_t total = 0;
    for (int32_t l = 0; l < w->n_layers; l++) {
        gptoss_layer_weights *L = &w->layers[l];
        const gptoss_ggml_experts *g = &w->ggml_experts[l];
        if (L->down_scales.data) continue;
        uint8_t *gu_blocks, *gu_scales, *d_blocks, *d_scales;
        gptoss_status st;
        if ((st = model_buffer(model, L->gate_up_blocks.n_bytes, (void **)&gu_blocks, error)) ||
            (st = model_buffer(model, L->gate_up_scales.n_bytes, (void **)&gu_scales, error)) ||
            (st = model_buffer(model, L->down_blocks.n_bytes, (void **)&d_blocks, error)) ||
            (st = model_buffer(model, L->down_scales.n_bytes, (void **)&d_scales, error)))
            return st;
        repack_mxfp4(g->gate, E, I, H, 2, 0, gu_blocks, gu_scales);
        repack_mxfp4(g->up, E, I, H, 2, 1, gu_blocks, gu_scales);
        repack_mxfp4(g->down, E, H, I, 1, 0, d_blocks, d_scales);
        L->gate_up_blocks.data = gu_blocks;
        L->gate_up_scales.data = gu_scales;
        L->down_blocks.data = d_blocks;
        L->down_scales.data = d_scales;
        total += L->gate_up_blocks.n_bytes + L->gate_up_scales.n_bytes + L->down_blocks.n_bytes +
                 L->down_scales.n_bytes;
    }
    GPTOSS_LOG_I("gguf", "experts unpacked into the Hugging Face layout: %.2f GB in %.2f s",
                 (double)total / 1e9, gptoss_now_seconds() - t0);
    return GPTOSS_OK;
}

static gptoss_status add_layer(gguf_loader *ld, int32_t l, gptoss_error *error) {
    const gptoss_config *c = ld->config;
    int64_t H = c->hidden_size, E = c->n_experts;
    int64_t q = gptoss_config_q_dim(c), kv = gptoss_config_kv_dim(c);
    char g[96], h[96];
    gptoss_status st = GPTOSS_OK;
#define NAMES(gs, hs)                                                                              \
    (snprintf(g, sizeof g, "blk.%d.%s", l, gs), snprintf(h, sizeof h, "model.layers.%d.%s", l, hs))
#define VEC(gs, hs, n)                                                                             \
    if (!st) {                                                                                     \
        NAMES(gs, hs);                                                                             \
        st = add_vector(ld, g, h, 1, n, 0, error);                                                 \
    }
#define MAT(gs, hs, r, cc)                                                                         \
    if (!st) {                                                                                     \
        NAMES(gs, hs);                                                                             \
        st = add_matrix(ld, g, h, r, cc, error);                                                   \
    }
    VEC("attn_norm.weight", "input_layernorm.weight", H);
    MAT("attn_q.weight", "self_attn.q_proj.weight", q, H);
    VEC("attn_q.bias", "self_attn.q_proj.bias", q);
    MAT("attn_k.weight", "self_attn.k_proj.weight", kv, H);
    VEC("attn_k.bias", "self_attn.k_proj.bias", kv);
    MAT("attn_v.weight", "self_attn.v_proj.weight", kv, H);
    VEC("attn_v.bias", "self_attn.v_proj.bias", kv);
    MAT("attn_output.weight", "self_attn.o_proj.weight", H, q);
    VEC("attn_output.bias", "self_attn.o_proj.bias", H);
    VEC("attn_sinks.weight", "self_attn.sinks", c->n_heads);
    VEC("post_attention_norm.weight", "post_attention_layernorm.weight", H);
    MAT("ffn_gate_inp.weight", "mlp.router.weight", E, H);
    VEC("ffn_gate_inp.bias", "mlp.router.bias", E);
#undef VEC
#undef MAT
#undef NAMES
    double t0 = gptoss_now_seconds();
    if (!st) st = add_experts(ld, l, error);
    ld->t_experts += gptoss_now_seconds() - t0;
    return st;
}

static void close_file(void *handle) {
    gptoss_gguf_close(handle);
}

/* The parts of a split file (llama.cpp's gguf-split: PREFIX-00001-of-0000N.gguf, each part
 * with split.no and split.count; metadata in the first): opens parts 2..N beside the first. */
static gptoss_status open_parts(gguf_loader *ld, int64_t n_parts, gptoss_error *error) {
    const char *path = ld->path;
    int64_t no = -1;
    gptoss_status st =
        gptoss_gguf_get_int(ld->files[0], "split.no", true, 0, n_parts - 1, &no, error);
    if (st) return st;
    char suffix[64];
    snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", 1, (int)n_parts);
    size_t len = strlen(path), slen = strlen(suffix);
    if (no != 0 || len <= slen || strcmp(path + len - slen, suffix) != 0)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "%s is part %lld of a GGUF split into %lld files: give the first "
                                "part, named PREFIX%s",
                                path, (long long)no + 1, (long long)n_parts, suffix);
    if (n_parts > MAX_SPLITS)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "%s: split into %lld files (at most %d)", path, (long long)n_parts,
                                MAX_SPLITS);
    for (int64_t i = 1; i < n_parts; i++) {
        char part[4096];
        snprintf(part, sizeof part, "%.*s-%05d-of-%05d.gguf", (int)(len - slen), path, (int)i + 1,
                 (int)n_parts);
        gptoss_gguf_file *f = NULL;
        if ((st = gptoss_gguf_open(part, &f, error))) return st;
        ld->files[ld->n_files++] = f;
        int64_t count = 0, pno = -1;
        if ((st = gptoss_gguf_get_int(f, "split.count", true, 0, INT32_MAX, &count, error)) ||
            (st = gptoss_gguf_get_int(f, "split.no", true, 0, INT32_MAX, &pno, error)))
            return gptoss_error_prefix(error, "%s: ", part);
        if (count != n_parts || pno != i)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "%s: split.no %lld of split.count %lld, expected part %lld of "
                                    "%lld",
                                    part, (long long)pno, (long long)count, (long long)i,
                                    (long long)n_parts);
    }
    int64_t total = 0, expected = -1;
    for (int f = 0; f < ld->n_files; f++)
        total += (int64_t)ld->files[f]->n_tensors;
    if ((st = gptoss_gguf_get_int(ld->files[0], "split.tensors.count", false, 0, INT32_MAX,
                                  &expected, error)))
        return st;
    if (expected >= 0 && expected != total)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "%s: split.tensors.count is %lld but the %lld parts hold %lld",
                                path, (long long)expected, (long long)n_parts, (long long)total);
    for (int f = 0; f < ld->n_files; f++)
        for (int g = 0; g < f; g++)
            for (uint64_t t = 0; t < ld->files[f]->n_tensors; t++) {
                const gptoss_gguf_str *name = &ld->files[f]->tensors[t].name;
                char buf[128];
                snprintf(buf, sizeof buf, "%.*s", (int)(name->len > 120 ? 120 : name->len),
                         name->ptr);
                if (gptoss_gguf_find_tensor(ld->files[g], buf))
                    return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                            "%s: tensor %s is in two parts of the split", path,
                                            buf);
            }
    return GPTOSS_OK;
}

gptoss_status gptoss_gguf_model_load(const char *path, gptoss_model **out, gptoss_error *error) {
    *out = NULL;
    double t0 = gptoss_now_seconds();
    gguf_loader ld = {.path = path};
    gptoss_status st = gptoss_gguf_open(path, &ld.files[0], error);
    if (st) return st;
    ld.n_files = 1;
    int64_t n_parts = 1;
    st = gptoss_gguf_get_int(ld.files[0], "split.count", false, 1, INT32_MAX, &n_parts, error);
    if (!st && n_parts > 1) st = open_parts(&ld, n_parts, error);
    gptoss_config config;
    if (!st)
        st = read_config(ld.files[0], find_any(&ld, "token_embd.weight", NULL), &config, error);
    if (!st) st = gptoss_model_create(path, &config, &ld.model, error);
    /* From here the model owns the files (and closes them on failure too). */
    for (int f = 0; f < ld.n_files; f++) {
        if (!st && ld.model)
            st = gptoss_model_add_storage(ld.model, ld.files[f], close_file, error);
        else if (!ld.model || st)
            gptoss_gguf_close(ld.files[f]);
    }
    if (st) {
        gptoss_model_free(ld.model);
        if (strncmp(error ? error->message : "", path, strlen(path)) != 0)
            gptoss_error_prefix(error, "%s: ", path);
        return st;
    }
    double t_open = gptoss_now_seconds();
    ld.config = gptoss_model_config(ld.model);
    size_t n_expected = (size_t)gptoss_weights_expected_count(ld.config);
    ld.views = calloc(n_expected, sizeof *ld.views);
    ld.names = calloc(n_expected, sizeof *ld.names);
    void *ggml = NULL;
    if (!(st = model_buffer(ld.model, (size_t)ld.config->n_layers * sizeof *ld.ggml, &ggml, error)))
        ld.ggml = ggml;
    bool used_ok = true;
    for (int f = 0; f < ld.n_files; f++)
        used_ok &= (ld.used[f] = calloc(ld.files[f]->n_tensors ? ld.files[f]->n_tensors : 1,
                                        sizeof *ld.used[f])) != NULL;
    if (!st && (!ld.views || !ld.names || !used_ok))
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    const gptoss_config *c = ld.config;
    if (!st)
        st = add_matrix(&ld, "token_embd.weight", "model.embed_tokens.weight", c->vocab_size,
                        c->hidden_size, error);
    if (!st)
        st =
            add_vector(&ld, "output_norm.weight", "model.norm.weight", 1, c->hidden_size, 0, error);
    if (!st)
        st = add_matrix(&ld, "output.weight", "lm_head.weight", c->vocab_size, c->hidden_size,
                        error);
    for (int32_t l = 0; l < c->n_layers && !st; l++)
        st = add_layer(&ld, l, error);
    for (int f = 0; f < ld.n_files && !st; f++)
        for (uint64_t i = 0; i < ld.files[f]->n_tensors && !st; i++)
            if (!ld.used[f][i]) {
                const gptoss_gguf_str *name = &ld.files[f]->tensors[i].name;
                st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                      "unexpected tensor %.*s (not part of a gpt-oss model with "
                                      "this metadata)",
                                      (int)(name->len > 80 ? 80 : name->len), name->ptr);
            }
    double t_tensors = gptoss_now_seconds();
    if (!st) st = gptoss_model_bind(ld.model, ld.views, NULL, ld.n_views, error);
    if (!st) gptoss_model_defer_experts(ld.model, ld.ggml, unpack_experts);
    free(ld.views);
    free(ld.names);
    for (int f = 0; f < ld.n_files; f++)
        free(ld.used[f]);
    if (st) {
        gptoss_model_free(ld.model);
        return gptoss_error_prefix(error, "%s: ", path);
    }
    double t_end = gptoss_now_seconds();
    GPTOSS_LOG_I("gguf",
                 "%s: %d layers, %d experts, %d file(s), loaded in %.2f s: open %.2f s, experts "
                 "%.2f s, other tensors %.2f s, bind %.2f s",
                 path, c->n_layers, c->n_experts, ld.n_files, t_end - t0, t_open - t0, ld.t_experts,
                 t_tensors - t_open - ld.t_experts, t_end - t_tensors);
    *out = ld.model;
    return GPTOSS_OK;
}
