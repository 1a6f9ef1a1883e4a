/*
 * load_eagle3.c - an EAGLE3 head folder read and bound (model/eagle3.h declares the functions):
 * config.json through gptoss_eagle3_config_parse, every *.safetensors mapped, each tensor's
 * dtype and shape checked against the config.
 *
 * Owns: the head's mapped safetensors files, its widened norms and its draft-to-target table.
 */
#include "model/eagle3.h"
#include "format/safetensors.h"
#include "util/error.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 64

struct gptoss_eagle3_head {
    gptoss_eagle3_config config;
    gptoss_eagle3_weights weights;
    gptoss_st_file *files[MAX_FILES];
    int32_t n_files;
};

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
    w->input_norm_f32 = gptoss_tensor_to_f32(&w->input_norm);
    w->hidden_norm_f32 = gptoss_tensor_to_f32(&w->hidden_norm);
    w->post_norm_f32 = gptoss_tensor_to_f32(&w->post_norm);
    w->final_norm_f32 = gptoss_tensor_to_f32(&w->final_norm);
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
