/*
 * eagle3.c - EAGLE3 head config.json, tensor binding and validation (see eagle3.h).
 *
 * Owns: the head's mapped safetensors files, its widened norms and its draft-to-target table.
 */
#include "model/eagle3.h"
#include "format/safetensors.h"
#include "util/error.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 64
#define MAX_WIDTH 65536
#define MAX_VOCAB 16777216

struct gptoss_eagle3_head {
    gptoss_eagle3_config config;
    gptoss_eagle3_weights weights;
    gptoss_st_file *files[MAX_FILES];
    int32_t n_files;
};

/* ---- config.json --------------------------------------------------------------------------- */

static gptoss_status get_int(json_t *root, const char *field, bool required, int64_t fallback,
                             int64_t lo, int64_t hi, int32_t *out, gptoss_error *error) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) {
        if (required)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "config.json: required field \"%s\" is missing", field);
        *out = (int32_t)fallback;
        return GPTOSS_OK;
    }
    if (!json_is_integer(v))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "config.json: \"%s\" must be an integer",
                                field);
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: \"%s\" is %lld, outside [%lld, %lld]", field,
                                (long long)x, (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return GPTOSS_OK;
}

static gptoss_status get_num(json_t *root, const char *field, double fallback, double *out,
                             gptoss_error *error) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) {
        *out = fallback;
        return GPTOSS_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: \"%s\" must be a positive number", field);
    *out = json_number_value(v);
    return GPTOSS_OK;
}

static gptoss_status parse_layer_ids(json_t *root, gptoss_eagle3_config *c, gptoss_error *error) {
    json_t *eagle = json_object_get(root, "eagle_config");
    json_t *ids = eagle && json_is_object(eagle)
                      ? json_object_get(eagle, "eagle_aux_hidden_state_layer_ids")
                      : NULL;
    if (!ids || json_is_null(ids)) ids = json_object_get(root, "eagle_aux_hidden_state_layer_ids");
    for (int i = 0; i < GPTOSS_EAGLE3_N_AUX; i++)
        c->aux_layer_ids[i] = -1;
    if (!ids || json_is_null(ids)) return GPTOSS_OK;
    if (!json_is_array(ids) || json_array_size(ids) != GPTOSS_EAGLE3_N_AUX)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: eagle_aux_hidden_state_layer_ids must list %d layer "
                                "ids (fc reads %d hidden states)",
                                GPTOSS_EAGLE3_N_AUX, GPTOSS_EAGLE3_N_AUX);
    for (int i = 0; i < GPTOSS_EAGLE3_N_AUX; i++) {
        json_t *v = json_array_get(ids, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 4096)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "config.json: eagle_aux_hidden_state_layer_ids[%d] must be a "
                                    "layer id in [0, 4096]",
                                    i);
        c->aux_layer_ids[i] = (int32_t)json_integer_value(v);
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_eagle3_config_parse(const char *json_text, size_t len, gptoss_eagle3_config *c,
                                         gptoss_error *error) {
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loadb(json_text, len, 0, &jerr);
    if (!root)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "config.json: line %d column %d: %s",
                                jerr.line, jerr.column, jerr.text);
    gptoss_status st = GPTOSS_OK;
    const gptoss_status bad = GPTOSS_ERR_MODEL;
    if (!json_is_object(root)) {
        st = gptoss_set_error(error, bad, "config.json: not a JSON object");
        goto done;
    }
    json_t *arch = json_object_get(root, "architectures");
    bool known = false;
    for (size_t i = 0; json_is_array(arch) && i < json_array_size(arch); i++) {
        const char *name = json_string_value(json_array_get(arch, i));
        if (name && (strcmp(name, "LlamaForCausalLMEagle3") == 0 ||
                     strcmp(name, "Eagle3LlamaForCausalLM") == 0))
            known = true;
    }
    if (!known) {
        st = gptoss_set_error(error, bad,
                              "config.json: architectures must name LlamaForCausalLMEagle3 (an "
                              "EAGLE3 head in the Hugging Face layout)");
        goto done;
    }
    int32_t n_layers = 0;
    if ((st = get_int(root, "hidden_size", true, 0, 1, MAX_WIDTH, &c->hidden_size, error)) ||
        (st = get_int(root, "intermediate_size", true, 0, 1, 1 << 20, &c->intermediate_size,
                      error)) ||
        (st = get_int(root, "num_attention_heads", true, 0, 1, 1024, &c->n_heads, error)) ||
        (st = get_int(root, "num_key_value_heads", false, c->n_heads, 1, 1024, &c->n_kv_heads,
                      error)) ||
        (st = get_int(root, "head_dim", false, c->hidden_size / c->n_heads, 2, 1024, &c->head_dim,
                      error)) ||
        (st = get_int(root, "num_hidden_layers", false, 1, 1, 1, &n_layers, error)) ||
        (st = get_int(root, "vocab_size", true, 0, 1, MAX_VOCAB, &c->vocab_size, error)) ||
        (st = get_int(root, "draft_vocab_size", false, c->vocab_size, 1, c->vocab_size,
                      &c->draft_vocab_size, error)) ||
        (st = get_num(root, "rms_norm_eps", 1e-6, &c->rms_norm_eps, error)) ||
        (st = get_num(root, "rope_theta", 10000.0, &c->rope_theta, error)) ||
        (st = parse_layer_ids(root, c, error)))
        goto done;
    if (c->n_heads % c->n_kv_heads != 0 || c->head_dim % 2 != 0) {
        st = gptoss_set_error(error, bad,
                              "config.json: num_attention_heads %d must be a multiple of "
                              "num_key_value_heads %d and head_dim %d even",
                              c->n_heads, c->n_kv_heads, c->head_dim);
        goto done;
    }
    json_t *rope = json_object_get(root, "rope_scaling");
    json_t *rope_type = json_is_object(rope) ? json_object_get(rope, "rope_type") : NULL;
    if (json_is_object(rope) && !rope_type) rope_type = json_object_get(rope, "type");
    bool plain_rope =
        !rope || json_is_null(rope) ||
        (json_is_string(rope_type) && strcmp(json_string_value(rope_type), "default") == 0);
    if (!plain_rope) {
        st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                              "config.json: rope_scaling is set; EAGLE3 heads with scaled RoPE "
                              "are not supported (plain RoPE with rope_theta only)");
        goto done;
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        st = gptoss_set_error(error, bad, "config.json: hidden_act must be \"silu\"");
        goto done;
    }
    json_t *nbf = json_object_get(root, "norm_before_fc");
    if (nbf && json_is_true(nbf)) {
        st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                              "config.json: norm_before_fc heads (a norm over the concatenated "
                              "hidden states) are not supported");
        goto done;
    }
    json_t *bias = json_object_get(root, "attention_bias");
    if ((bias && json_is_true(bias)) ||
        ((bias = json_object_get(root, "mlp_bias")) && json_is_true(bias))) {
        st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                              "config.json: heads with attention or MLP biases are not supported");
        goto done;
    }
    json_t *th = json_object_get(root, "target_hidden_size");
    if (th && !json_is_null(th) &&
        (!json_is_integer(th) || json_integer_value(th) != c->hidden_size)) {
        st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                              "config.json: target_hidden_size differs from hidden_size %d "
                              "(not supported)",
                              c->hidden_size);
        goto done;
    }
done:
    json_decref(root);
    return st;
}

char *gptoss_eagle3_config_to_json(const gptoss_eagle3_config *c) {
    json_t *root = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("LlamaForCausalLMEagle3"));
    json_object_set_new(root, "architectures", arch);
    json_object_set_new(root, "model_type", json_string("llama"));
    json_object_set_new(root, "hidden_act", json_string("silu"));
    json_object_set_new(root, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(root, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(root, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(root, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(root, "head_dim", json_integer(c->head_dim));
    json_object_set_new(root, "num_hidden_layers", json_integer(1));
    json_object_set_new(root, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(root, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(root, "rope_scaling", json_null());
    json_object_set_new(root, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(root, "draft_vocab_size", json_integer(c->draft_vocab_size));
    json_object_set_new(root, "max_position_embeddings", json_integer(131072));
    json_object_set_new(root, "tie_word_embeddings", json_false());
    json_object_set_new(root, "torch_dtype", json_string("bfloat16"));
    if (c->aux_layer_ids[0] >= 0) {
        json_t *eagle = json_object(), *ids = json_array();
        for (int i = 0; i < GPTOSS_EAGLE3_N_AUX; i++)
            json_array_append_new(ids, json_integer(c->aux_layer_ids[i]));
        json_object_set_new(eagle, "eagle_aux_hidden_state_layer_ids", ids);
        json_object_set_new(eagle, "use_aux_hidden_state", json_true());
        json_object_set_new(root, "eagle_config", eagle);
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

gptoss_status gptoss_eagle3_boundaries(const gptoss_eagle3_config *c, int32_t n_layers,
                                       int32_t b[GPTOSS_EAGLE3_N_AUX], gptoss_error *error) {
    if (c->aux_layer_ids[0] < 0) {
        b[0] = 2, b[1] = n_layers / 2, b[2] = n_layers - 3;
    } else {
        int32_t shift = c->aux_layer_ids[0] == 1 ? 1 : 0;
        for (int i = 0; i < GPTOSS_EAGLE3_N_AUX; i++)
            b[i] = c->aux_layer_ids[i] + shift;
    }
    for (int i = 0; i < GPTOSS_EAGLE3_N_AUX; i++)
        if (b[i] < 0 || b[i] > n_layers)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "EAGLE3 head: aux hidden state %d reads the residual stream "
                                    "after %d layers, but the target has %d layers",
                                    i, b[i], n_layers);
    return GPTOSS_OK;
}

/* ---- tensors ------------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && n < (16l << 20) && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)n + 1))) {
            *len = fread(buf, 1, (size_t)n, f);
            buf[*len] = 0;
        }
    }
    fclose(f);
    return buf;
}

static const gptoss_st_tensor *find(const gptoss_eagle3_head *h, const char *name) {
    for (int32_t i = 0; i < h->n_files; i++) {
        const gptoss_st_tensor *t = gptoss_st_find(h->files[i], name);
        if (t) return t;
    }
    return NULL;
}

/* Binds `name` (trying the midlayer./layers.0. spellings of "%s") with the expected dtype and
 * shape (dims < 0: any). */
static gptoss_status bind(gptoss_eagle3_head *h, const char *layer_name, gptoss_dtype dtype,
                          int32_t n_dims, int64_t d0, int64_t d1, bool optional, gptoss_tensor *out,
                          gptoss_error *error) {
    char name[256];
    const gptoss_st_tensor *t = NULL;
    if (strncmp(layer_name, "midlayer.", 9) == 0) {
        t = find(h, layer_name);
        if (!t) {
            snprintf(name, sizeof name, "layers.0.%s", layer_name + 9);
            t = find(h, name);
        }
    } else {
        t = find(h, layer_name);
        if (!t) {
            snprintf(name, sizeof name, "model.%s", layer_name);
            t = find(h, name);
        }
    }
    memset(out, 0, sizeof *out);
    if (!t) {
        if (optional) return GPTOSS_OK;
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "EAGLE3 head: tensor %s is missing",
                                layer_name);
    }
    bool float_ok = dtype == GPTOSS_DTYPE_BF16 && (t->dtype == GPTOSS_DTYPE_BF16);
    bool norm_ok = n_dims == 1 && dtype == GPTOSS_DTYPE_BF16 && t->dtype == GPTOSS_DTYPE_F32;
    if (!float_ok && !norm_ok && t->dtype != dtype)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "EAGLE3 head: tensor %s: expected dtype %s, file has %s", t->name,
                                gptoss_dtype_name(dtype), gptoss_dtype_name(t->dtype));
    int64_t want[2] = {d0, d1};
    bool shape_ok = t->n_dims == n_dims;
    for (int32_t d = 0; shape_ok && d < n_dims; d++)
        shape_ok = t->shape[d] == want[d];
    if (!shape_ok) {
        char got[128] = "", exp[64];
        for (int32_t d = 0; d < t->n_dims; d++) {
            size_t used = strlen(got);
            snprintf(got + used, sizeof got - used, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        }
        if (n_dims == 1)
            snprintf(exp, sizeof exp, "[%lld]", (long long)d0);
        else
            snprintf(exp, sizeof exp, "[%lld,%lld]", (long long)d0, (long long)d1);
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "EAGLE3 head: tensor %s: expected shape %s, file has [%s]", t->name,
                                exp, got);
    }
    out->name = t->name;
    out->data = t->data;
    out->dtype = t->dtype;
    out->n_dims = t->n_dims;
    for (int32_t d = 0; d < t->n_dims; d++)
        out->shape[d] = t->shape[d];
    out->n_bytes = (size_t)(t->end - t->begin);
    return GPTOSS_OK;
}

static float *widen_vector(const gptoss_tensor *t) {
    size_t n = (size_t)t->shape[0];
    float *out = malloc(n * sizeof *out);
    if (!out) return NULL;
    const uint8_t *p = t->data;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == GPTOSS_DTYPE_F32)
            memcpy(&out[i], p + 4 * i, 4);
        else
            out[i] = gptoss_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    }
    return out;
}

static gptoss_status bind_all(gptoss_eagle3_head *h, gptoss_error *error) {
    const gptoss_eagle3_config *c = &h->config;
    gptoss_eagle3_weights *w = &h->weights;
    const int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size,
                  DV = c->draft_vocab_size, q = (int64_t)c->n_heads * c->head_dim,
                  kv = (int64_t)c->n_kv_heads * c->head_dim;
    const gptoss_dtype bf = GPTOSS_DTYPE_BF16;
    gptoss_status st;
    gptoss_tensor d2t, t2d;
    if ((st = bind(h, "fc.weight", bf, 2, H, 3 * H, false, &w->fc, error)) ||
        (st = bind(h, "midlayer.input_layernorm.weight", bf, 1, H, 0, false, &w->input_norm,
                   error)) ||
        (st = bind(h, "midlayer.hidden_norm.weight", bf, 1, H, 0, false, &w->hidden_norm, error)) ||
        (st = bind(h, "midlayer.self_attn.q_proj.weight", bf, 2, q, 2 * H, false, &w->q, error)) ||
        (st = bind(h, "midlayer.self_attn.k_proj.weight", bf, 2, kv, 2 * H, false, &w->k, error)) ||
        (st = bind(h, "midlayer.self_attn.v_proj.weight", bf, 2, kv, 2 * H, false, &w->v, error)) ||
        (st = bind(h, "midlayer.self_attn.o_proj.weight", bf, 2, H, q, false, &w->o, error)) ||
        (st = bind(h, "midlayer.post_attention_layernorm.weight", bf, 1, H, 0, false, &w->post_norm,
                   error)) ||
        (st = bind(h, "midlayer.mlp.gate_proj.weight", bf, 2, I, H, false, &w->gate, error)) ||
        (st = bind(h, "midlayer.mlp.up_proj.weight", bf, 2, I, H, false, &w->up, error)) ||
        (st = bind(h, "midlayer.mlp.down_proj.weight", bf, 2, H, I, false, &w->down, error)) ||
        (st = bind(h, "norm.weight", bf, 1, H, 0, false, &w->final_norm, error)) ||
        (st = bind(h, "lm_head.weight", bf, 2, DV, H, false, &w->lm_head, error)) ||
        (st = bind(h, "embed_tokens.weight", bf, 2, V, H, true, &w->embed, error)) ||
        (st = bind(h, "d2t", GPTOSS_DTYPE_I64, 1, DV, 0, DV == V, &d2t, error)) ||
        (st = bind(h, "t2d", GPTOSS_DTYPE_BOOL, 1, V, 0, DV == V, &t2d, error)))
        return st;
    w->input_norm_f32 = widen_vector(&w->input_norm);
    w->hidden_norm_f32 = widen_vector(&w->hidden_norm);
    w->post_norm_f32 = widen_vector(&w->post_norm);
    w->final_norm_f32 = widen_vector(&w->final_norm);
    w->draft_to_target = malloc((size_t)DV * sizeof *w->draft_to_target);
    if (!w->input_norm_f32 || !w->hidden_norm_f32 || !w->post_norm_f32 || !w->final_norm_f32 ||
        !w->draft_to_target)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (EAGLE3 head)");
    const uint8_t *mask = t2d.data;
    for (int64_t d = 0; d < DV; d++) {
        int64_t offset = 0; /* a head over the whole vocabulary may leave d2t and t2d out */
        if (d2t.data) memcpy(&offset, (const uint8_t *)d2t.data + 8 * d, 8);
        int64_t target = d + offset;
        if (offset < -V || offset > V || target < 0 || target >= V)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "EAGLE3 head: d2t[%lld] = %lld maps draft token %lld to %lld, "
                                    "outside the vocabulary of %lld",
                                    (long long)d, (long long)offset, (long long)d,
                                    (long long)target, (long long)V);
        if (mask && !mask[target])
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "EAGLE3 head: d2t maps draft token %lld to %lld, which t2d "
                                    "does not mark as a draft token",
                                    (long long)d, (long long)target);
        w->draft_to_target[d] = (int32_t)target;
    }
    return GPTOSS_OK;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

gptoss_status gptoss_eagle3_load(const char *dir, gptoss_eagle3_head **out, gptoss_error *error) {
    *out = NULL;
    gptoss_eagle3_head *h = calloc(1, sizeof *h);
    if (!h) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len = 0;
    char *text = read_file(path, &len);
    gptoss_status st;
    if (!text) {
        st = gptoss_set_error(error, GPTOSS_ERR_IO,
                              "cannot read %s (an EAGLE3 head folder holds "
                              "config.json and *.safetensors)",
                              path);
        goto fail;
    }
    st = gptoss_eagle3_config_parse(text, len, &h->config, error);
    free(text);
    if (st != GPTOSS_OK) goto fail;

    /* Every *.safetensors of the folder, in name order. */
    DIR *d = opendir(dir);
    if (!d) {
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "cannot open folder %s", dir);
        goto fail;
    }
    char *names[MAX_FILES];
    int32_t n_names = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0 && n_names < MAX_FILES)
            names[n_names++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n_names, sizeof *names, compare_names);
    st = GPTOSS_OK;
    for (int32_t i = 0; i < n_names; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i] ? names[i] : "");
        if (st == GPTOSS_OK && names[i] &&
            (st = gptoss_st_open(path, &h->files[h->n_files], error)) == GPTOSS_OK)
            h->n_files++;
        free(names[i]);
    }
    if (st != GPTOSS_OK) goto fail;
    if (h->n_files == 0) {
        st = gptoss_set_error(error, GPTOSS_ERR_MODEL, "%s holds no *.safetensors file", dir);
        goto fail;
    }
    if ((st = bind_all(h, error)) != GPTOSS_OK) goto fail;
    *out = h;
    return GPTOSS_OK;
fail:
    gptoss_error_prefix(error, "%s: ", dir);
    gptoss_eagle3_free(h);
    return st;
}

void gptoss_eagle3_free(gptoss_eagle3_head *h) {
    if (!h) return;
    for (int32_t i = 0; i < h->n_files; i++)
        gptoss_st_close(h->files[i]);
    free(h->weights.input_norm_f32);
    free(h->weights.hidden_norm_f32);
    free(h->weights.post_norm_f32);
    free(h->weights.final_norm_f32);
    free(h->weights.draft_to_target);
    free(h);
}

const gptoss_eagle3_config *gptoss_eagle3_head_config(const gptoss_eagle3_head *head) {
    return &head->config;
}

const gptoss_eagle3_weights *gptoss_eagle3_head_weights(const gptoss_eagle3_head *head) {
    return &head->weights;
}

gptoss_status gptoss_eagle3_check_target(const gptoss_eagle3_head *head, int32_t target_hidden,
                                         int32_t target_vocab, int32_t target_layers,
                                         int32_t boundaries[GPTOSS_EAGLE3_N_AUX],
                                         gptoss_error *error) {
    const gptoss_eagle3_config *c = &head->config;
    if (c->hidden_size != target_hidden)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "EAGLE3 head: hidden_size %d does not match the target model's "
                                "hidden size %d",
                                c->hidden_size, target_hidden);
    if (c->vocab_size != target_vocab)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "EAGLE3 head: vocab_size %d does not match the target model's "
                                "vocabulary of %d tokens",
                                c->vocab_size, target_vocab);
    return gptoss_eagle3_boundaries(c, target_layers, boundaries, error);
}
