/*
 * eagle3.c - an EAGLE3 head's config.json and the target layers it reads (see eagle3.h); the
 * head's files are read by loader/load_eagle3.c.
 */
#include "model/eagle3.h"
#include "util/error.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WIDTH 65536
#define MAX_VOCAB 16777216

/* ---- config.json --------------------------------------------------------------------------- */

static gptoss_status get_int(json_t *root, const char *field, bool required, int64_t fallback,
                             int64_t lo, int64_t hi, int32_t *out, gptoss_error *error) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) {
        if (required)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "config.json: required field \"%s\" is missing", field);
        /* a default derived from other fields must lie in the range too */
        if (fallback < lo || fallback > hi)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "config.json: \"%s\" is absent and its default from the "
                                    "other fields, %lld, is outside [%lld, %lld]",
                                    field, (long long)fallback, (long long)lo, (long long)hi);
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
