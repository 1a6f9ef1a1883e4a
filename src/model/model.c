/*
 * model.c - a gpt-oss model: its validated config, its tensors bound to their layer slots, and
 * the storage a loader handed over (see model.h).
 *
 * Owns the storage list for the model's lifetime; gptoss_weights points into it. Binding
 * reports every missing and unexpected tensor at once, and the first tensor whose dtype or
 * shape disagrees with config.json, with both shapes. Knows nothing of files: loaders
 * (loader/) open them and pass tensor views, and may leave the experts for a conversion the
 * model runs once, when a reader asks (gptoss_model_unpack_experts).
 */
#include "model/model.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct model_storage {
    void *handle; /* opaque to the model */
    gptoss_storage_close_fn close;
} model_storage;

struct gptoss_model {
    char *dir;              /* folder the model came from */
    gptoss_config config;   /* validated */
    gptoss_weights weights; /* views into the storage */
    model_storage *storage; /* [n_storage] what the views point into; closed on free */
    size_t n_storage;
    char **tensor_names; /* [n_bound] names the views point at (owned) */
    size_t n_bound;
    gptoss_model_unpack_fn unpack; /* pending expert conversion (NULL: none or done) */
    pthread_mutex_t unpack_lock;
};

const float gptoss_fp4_e2m1_values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

int32_t gptoss_weights_expected_count(const gptoss_config *config) {
    return config->n_layers * 19 + 3;
}

const gptoss_config *gptoss_model_config(const gptoss_model *model) {
    return &model->config;
}

const gptoss_weights *gptoss_model_weights(const gptoss_model *model) {
    return &model->weights;
}

const char *gptoss_model_dir(const gptoss_model *model) {
    return model->dir;
}

gptoss_status gptoss_model_create(const char *dir, const gptoss_config *config, gptoss_model **out,
                                  gptoss_error *error) {
    *out = NULL;
    gptoss_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir ? dir : ""))) {
        free(m);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    m->config = *config;
    pthread_mutex_init(&m->unpack_lock, NULL);
    *out = m;
    return GPTOSS_OK;
}

gptoss_status gptoss_model_add_storage(gptoss_model *m, void *handle, gptoss_storage_close_fn close,
                                       gptoss_error *error) {
    model_storage *grown = realloc(m->storage, (m->n_storage + 1) * sizeof *grown);
    if (!grown) {
        if (close) close(handle);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    m->storage = grown;
    m->storage[m->n_storage++] = (model_storage){handle, close};
    return GPTOSS_OK;
}

/* ---- the name -> tensor index across storage -------------------------------------------- */

typedef struct indexed_tensor {
    const gptoss_tensor *tensor; /* a view from the loader */
    const char *origin;          /* where it came from, for messages */
    bool used;                   /* bound to a slot */
} indexed_tensor;

static int compare_indexed(const void *a, const void *b) {
    const indexed_tensor *x = a, *y = b;
    return strcmp(x->tensor->name, y->tensor->name);
}

static indexed_tensor *find_indexed(indexed_tensor *index, size_t n, const char *name) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(index[mid].tensor->name, name);
        if (c == 0) return &index[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- expected tensors ------------------------------------------------------------------- */

typedef enum tensor_kind {
    KIND_MATRIX, /* large bf16 matrix */
    KIND_VECTOR, /* bf16 or f32 */
    KIND_U8,     /* MXFP4 blocks or scales */
} tensor_kind;

typedef struct expected_tensor {
    char name[160];
    tensor_kind kind;
    int32_t n_dims;
    int64_t shape[4];
    gptoss_tensor *slot;
} expected_tensor;

static void expect(expected_tensor *e, size_t *n, gptoss_tensor *slot, tensor_kind kind,
                   const char *name, int32_t n_dims, int64_t d0, int64_t d1, int64_t d2,
                   int64_t d3) {
    expected_tensor *t = &e[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->shape[3] = d3;
    t->slot = slot;
}

static size_t build_expected(const gptoss_config *c, gptoss_weights *w, expected_tensor *e) {
    size_t n = 0;
    int64_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts;
    int64_t q = gptoss_config_q_dim(c), kv = gptoss_config_kv_dim(c);
    expect(e, &n, &w->embedding, KIND_MATRIX, "model.embed_tokens.weight", 2, c->vocab_size, H, 0,
           0);
    expect(e, &n, &w->final_norm, KIND_VECTOR, "model.norm.weight", 1, H, 0, 0, 0);
    expect(e, &n, &w->lm_head, KIND_MATRIX, "lm_head.weight", 2, c->vocab_size, H, 0, 0);
    for (int32_t l = 0; l < c->n_layers; l++) {
        gptoss_layer_weights *lw = &w->layers[l];
        char p[64];
        char name[160];
        snprintf(p, sizeof p, "model.layers.%d.", l);
#define EXPECT(slot, kind, suffix, nd, a, b, cc, d)                                                \
    do {                                                                                           \
        snprintf(name, sizeof name, "%s%s", p, suffix);                                            \
        expect(e, &n, &lw->slot, kind, name, nd, a, b, cc, d);                                     \
    } while (0)
        EXPECT(attn_norm, KIND_VECTOR, "input_layernorm.weight", 1, H, 0, 0, 0);
        EXPECT(q_weight, KIND_MATRIX, "self_attn.q_proj.weight", 2, q, H, 0, 0);
        EXPECT(q_bias, KIND_VECTOR, "self_attn.q_proj.bias", 1, q, 0, 0, 0);
        EXPECT(k_weight, KIND_MATRIX, "self_attn.k_proj.weight", 2, kv, H, 0, 0);
        EXPECT(k_bias, KIND_VECTOR, "self_attn.k_proj.bias", 1, kv, 0, 0, 0);
        EXPECT(v_weight, KIND_MATRIX, "self_attn.v_proj.weight", 2, kv, H, 0, 0);
        EXPECT(v_bias, KIND_VECTOR, "self_attn.v_proj.bias", 1, kv, 0, 0, 0);
        EXPECT(o_weight, KIND_MATRIX, "self_attn.o_proj.weight", 2, H, q, 0, 0);
        EXPECT(o_bias, KIND_VECTOR, "self_attn.o_proj.bias", 1, H, 0, 0, 0);
        EXPECT(sinks, KIND_VECTOR, "self_attn.sinks", 1, c->n_heads, 0, 0, 0);
        EXPECT(mlp_norm, KIND_VECTOR, "post_attention_layernorm.weight", 1, H, 0, 0, 0);
        EXPECT(router_weight, KIND_MATRIX, "mlp.router.weight", 2, E, H, 0, 0);
        EXPECT(router_bias, KIND_VECTOR, "mlp.router.bias", 1, E, 0, 0, 0);
        EXPECT(gate_up_blocks, KIND_U8, "mlp.experts.gate_up_proj_blocks", 4, E, 2 * I, H / 32, 16);
        EXPECT(gate_up_scales, KIND_U8, "mlp.experts.gate_up_proj_scales", 3, E, 2 * I, H / 32, 0);
        EXPECT(gate_up_bias, KIND_VECTOR, "mlp.experts.gate_up_proj_bias", 2, E, 2 * I, 0, 0);
        EXPECT(down_blocks, KIND_U8, "mlp.experts.down_proj_blocks", 4, E, H, I / 32, 16);
        EXPECT(down_scales, KIND_U8, "mlp.experts.down_proj_scales", 3, E, H, I / 32, 0);
        EXPECT(down_bias, KIND_VECTOR, "mlp.experts.down_proj_bias", 2, E, H, 0, 0);
#undef EXPECT
    }
    return n;
}

static void format_shape(char *buf, size_t size, int32_t n_dims, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int32_t d = 0; d < n_dims && used < size; d++)
        used +=
            (size_t)snprintf(buf + used, size - used, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

/* Appends "name" to a comma-separated list in buf, eliding after a few entries. */
static void list_append(char *buf, size_t size, size_t *count, const char *name) {
    if (*count < 6) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", *count ? ", " : "", name);
    } else if (*count == 6) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, ", ...");
    }
    (*count)++;
}

static gptoss_status bind_tensors(gptoss_model *m, indexed_tensor *index, size_t n_index,
                                  gptoss_error *error) {
    const gptoss_config *c = &m->config;
    size_t n_expected_max = (size_t)gptoss_weights_expected_count(c);
    expected_tensor *expected = calloc(n_expected_max, sizeof *expected);
    m->weights.layers = calloc((size_t)c->n_layers, sizeof *m->weights.layers);
    m->tensor_names = calloc(n_expected_max, sizeof *m->tensor_names);
    if (!expected || !m->weights.layers || !m->tensor_names) {
        free(expected);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory binding tensors");
    }
    m->weights.n_layers = c->n_layers;
    size_t n_expected = build_expected(c, &m->weights, expected);

    char missing[512] = "", unexpected[512] = "";
    size_t n_missing = 0, n_unexpected = 0;
    gptoss_status st = GPTOSS_OK;
    for (size_t i = 0; i < n_expected; i++) {
        expected_tensor *e = &expected[i];
        indexed_tensor *found = find_indexed(index, n_index, e->name);
        if (!found) {
            list_append(missing, sizeof missing, &n_missing, e->name);
            continue;
        }
        found->used = true;
        const gptoss_tensor *t = found->tensor;
        if (st != GPTOSS_OK) continue; /* keep collecting missing names */
        bool dtype_ok = e->kind == KIND_U8 ? t->dtype == GPTOSS_DTYPE_U8
                        : e->kind == KIND_MATRIX
                            ? t->dtype == GPTOSS_DTYPE_BF16
                            : (t->dtype == GPTOSS_DTYPE_BF16 || t->dtype == GPTOSS_DTYPE_F32);
        if (!dtype_ok) {
            st = gptoss_set_error(error, GPTOSS_ERR_MODEL, "tensor %s: dtype %s, expected %s",
                                  e->name, gptoss_dtype_name(t->dtype),
                                  e->kind == KIND_U8       ? "U8"
                                  : e->kind == KIND_MATRIX ? "BF16"
                                                           : "BF16 or F32");
            continue;
        }
        bool shape_ok = t->n_dims == e->n_dims;
        for (int32_t d = 0; shape_ok && d < e->n_dims; d++)
            shape_ok = t->shape[d] == e->shape[d];
        if (!shape_ok) {
            char want[96], have[96];
            format_shape(want, sizeof want, e->n_dims, e->shape);
            format_shape(have, sizeof have, t->n_dims, t->shape);
            st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                  "tensor %s: expected shape %s from config.json, file has %s",
                                  e->name, want, have);
            continue;
        }
        gptoss_tensor *slot = e->slot;
        m->tensor_names[m->n_bound] = strdup(t->name);
        slot->name = m->tensor_names[m->n_bound++];
        slot->data = t->data;
        slot->dtype = t->dtype;
        slot->n_dims = t->n_dims;
        memcpy(slot->shape, t->shape, sizeof slot->shape);
        slot->n_bytes = t->n_bytes;
    }
    for (size_t i = 0; i < n_index; i++)
        if (!index[i].used)
            list_append(unexpected, sizeof unexpected, &n_unexpected, index[i].tensor->name);
    free(expected);
    if (n_missing || n_unexpected) {
        char msg[1100] = "";
        if (n_missing) snprintf(msg, sizeof msg, "%zu tensor(s) missing: %s", n_missing, missing);
        if (n_unexpected) {
            size_t used = strlen(msg);
            snprintf(msg + used, sizeof msg - used, "%s%zu unexpected tensor(s): %s",
                     n_missing ? "; " : "", n_unexpected, unexpected);
        }
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "checkpoint does not match config.json: %s", msg);
    }
    return st;
}

gptoss_status gptoss_model_bind(gptoss_model *m, const gptoss_tensor *tensors,
                                const char *const *origins, size_t n_tensors, gptoss_error *error) {
    indexed_tensor *index = calloc(n_tensors ? n_tensors : 1, sizeof *index);
    if (!index) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n_tensors; i++) {
        index[i].tensor = &tensors[i];
        index[i].origin = origins ? origins[i] : "";
    }
    qsort(index, n_tensors, sizeof *index, compare_indexed);
    gptoss_status st = GPTOSS_OK;
    for (size_t i = 1; i < n_tensors; i++)
        if (strcmp(index[i - 1].tensor->name, index[i].tensor->name) == 0) {
            st = gptoss_set_error(error, GPTOSS_ERR_MODEL, "tensor %s appears in both %s and %s",
                                  index[i].tensor->name, index[i - 1].origin, index[i].origin);
            break;
        }
    if (st == GPTOSS_OK) st = bind_tensors(m, index, n_tensors, error);
    free(index);
    return st;
}

void gptoss_model_free(gptoss_model *m) {
    if (!m) return;
    for (size_t i = m->n_storage; i-- > 0;)
        if (m->storage[i].close) m->storage[i].close(m->storage[i].handle);
    free(m->storage);
    for (size_t i = 0; i < m->n_bound; i++)
        free(m->tensor_names[i]);
    free(m->tensor_names);
    free(m->weights.layers);
    free(m->dir);
    pthread_mutex_destroy(&m->unpack_lock);
    free(m);
}

void gptoss_model_defer_experts(gptoss_model *m, const gptoss_ggml_experts *ggml,
                                gptoss_model_unpack_fn unpack) {
    m->weights.ggml_experts = ggml;
    m->unpack = unpack;
}

gptoss_status gptoss_model_unpack_experts(const gptoss_model *model, gptoss_error *error) {
    /* The conversion fills views the model already owns: it completes the model rather than
     * changing it, so it is offered on a const model (backends receive one). */
    gptoss_model *m = (gptoss_model *)model;
    gptoss_status st = GPTOSS_OK;
    pthread_mutex_lock(&m->unpack_lock);
    if (m->unpack) {
        st = m->unpack(m, &m->weights, error);
        if (st == GPTOSS_OK) m->unpack = NULL;
    }
    pthread_mutex_unlock(&m->unpack_lock);
    return st;
}
