/*
 * config.c - config.json parsing, validation, presets and writing (see config.h).
 *
 * Field names and defaults follow the published gpt-oss config.json (spec section 1.1),
 * accepting both the `rope_scaling` spelling and the newer `rope_parameters` one.
 */
#include "model/config.h"
#include "model/special_tokens.h"
#include "util/error.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds that no real or test model comes near; they stop absurd files early, before
 * any allocation is sized from them. */
#define MAX_HIDDEN 65536
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024
#define MAX_EXPERTS 4096
#define MAX_VOCAB 16777216
#define MAX_POSITIONS (64 * 1024 * 1024)

static gptoss_status get_int(json_t *root, const char *field, bool required, int64_t fallback,
                             int64_t *out, gptoss_error *error) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) {
        if (required)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "config.json: required field \"%s\" is missing", field);
        *out = fallback;
        return GPTOSS_OK;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || fabs(d) > 9e15)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "config.json: \"%s\" must be an integer, got %g", field, d);
        *out = (int64_t)d;
        return GPTOSS_OK;
    }
    if (!json_is_integer(v))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "config.json: \"%s\" must be an integer",
                                field);
    *out = json_integer_value(v);
    return GPTOSS_OK;
}

static gptoss_status get_num(json_t *root, const char *field, bool required, double fallback,
                             double *out, gptoss_error *error) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) {
        if (required)
            return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                    "config.json: required field \"%s\" is missing", field);
        *out = fallback;
        return GPTOSS_OK;
    }
    if (!json_is_number(v))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "config.json: \"%s\" must be a number",
                                field);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "config.json: \"%s\" is not finite",
                                field);
    return GPTOSS_OK;
}

/* An integer field that must fit [lo, hi]. */
static gptoss_status get_ranged(json_t *root, const char *field, bool required, int64_t fallback,
                                int64_t lo, int64_t hi, int32_t *out, gptoss_error *error) {
    int64_t v = 0;
    gptoss_status st = get_int(root, field, required, fallback, &v, error);
    if (st != GPTOSS_OK) return st;
    if (v < lo || v > hi)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: \"%s\" = %lld is outside [%lld, %lld]", field,
                                (long long)v, (long long)lo, (long long)hi);
    *out = (int32_t)v;
    return GPTOSS_OK;
}

/* A boolean field that, when present, must have the one value gpt-oss supports. */
static gptoss_status expect_bool(json_t *root, const char *field, bool expected,
                                 gptoss_error *error) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) return GPTOSS_OK;
    if (!json_is_boolean(v))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: \"%s\" must be true or false", field);
    if (json_is_true(v) != expected)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "config.json: \"%s\" = %s is not supported (gpt-oss has %s)", field,
                                expected ? "false" : "true", expected ? "true" : "false");
    return GPTOSS_OK;
}

static gptoss_status parse_rope(json_t *root, gptoss_config *c, gptoss_error *error) {
    json_t *rope = json_object_get(root, "rope_scaling");
    const char *field = "rope_scaling";
    if (!rope || json_is_null(rope)) {
        rope = json_object_get(root, "rope_parameters");
        field = "rope_parameters";
    }
    gptoss_status st = get_num(root, "rope_theta", false, NAN, &c->rope_theta, error);
    if (st != GPTOSS_OK) return st;
    if (!rope || !json_is_object(rope))
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config.json: \"rope_scaling\" (or \"rope_parameters\") is missing or not an object");
    json_t *type = json_object_get(rope, "rope_type");
    if (!type) type = json_object_get(rope, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "yarn") != 0)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "config.json: %s.rope_type must be \"yarn\"", field);
    if (isnan(c->rope_theta)) {
        st = get_num(rope, "rope_theta", true, 0, &c->rope_theta, error);
        if (st != GPTOSS_OK) return gptoss_error_prefix(error, "%s: ", field);
    }
    double orig = 0;
    if ((st = get_num(rope, "factor", true, 0, &c->rope_scaling_factor, error)) ||
        (st = get_num(rope, "beta_fast", false, 32.0, &c->rope_beta_fast, error)) ||
        (st = get_num(rope, "beta_slow", false, 1.0, &c->rope_beta_slow, error)) ||
        (st = get_num(rope, "original_max_position_embeddings", true, 0, &orig, error)))
        return gptoss_error_prefix(error, "%s: ", field);
    if (orig != floor(orig) || orig < 1 || orig > MAX_POSITIONS)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: %s.original_max_position_embeddings = %g is invalid",
                                field, orig);
    c->rope_original_max_position_embeddings = (int32_t)orig;
    json_t *truncate = json_object_get(rope, "truncate");
    c->rope_truncate = truncate ? json_is_true(truncate) : true;
    if (truncate && !json_is_boolean(truncate))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: %s.truncate must be a boolean", field);
    return GPTOSS_OK;
}

static gptoss_status parse_layer_types(json_t *root, gptoss_config *c, gptoss_error *error) {
    json_t *types = json_object_get(root, "layer_types");
    if (!types || json_is_null(types)) {
        /* Older configs: sliding on even layers (spec section 1.1). */
        for (int32_t l = 0; l < c->n_layers; l++)
            c->layer_is_sliding[l] = (l % 2) == 0;
        return GPTOSS_OK;
    }
    if (!json_is_array(types) || json_array_size(types) != (size_t)c->n_layers)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config.json: \"layer_types\" must be an array of num_hidden_layers (%d) strings",
            c->n_layers);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        if (t && strcmp(t, "sliding_attention") == 0)
            c->layer_is_sliding[l] = true;
        else if (t && strcmp(t, "full_attention") == 0)
            c->layer_is_sliding[l] = false;
        else
            return gptoss_set_error(
                error, GPTOSS_ERR_MODEL,
                "config.json: layer_types[%d] must be \"sliding_attention\" or \"full_attention\"",
                l);
    }
    return GPTOSS_OK;
}

static gptoss_status parse_token_id(json_t *root, const char *field, int32_t *out,
                                    gptoss_error *error) {
    json_t *v = json_object_get(root, field);
    *out = -1;
    if (!v || json_is_null(v)) return GPTOSS_OK;
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > MAX_VOCAB)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config.json: \"%s\" must be a token id or a list of them", field);
    *out = (int32_t)json_integer_value(v);
    return GPTOSS_OK;
}

gptoss_status gptoss_config_parse(const char *json_text, size_t len, gptoss_config *c,
                                  gptoss_error *error) {
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loadb(json_text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "config.json is not valid JSON: %s (line %d, column %d)", jerr.text,
                                jerr.line, jerr.column);
    gptoss_status st = GPTOSS_OK;
    if (!json_is_object(root)) {
        st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "config.json is not a JSON object");
        goto done;
    }

    /* Architecture: only GptOssForCausalLM / gpt_oss is this model. */
    json_t *arch = json_object_get(root, "architectures");
    json_t *model_type = json_object_get(root, "model_type");
    if (!json_is_string(model_type) || strcmp(json_string_value(model_type), "gpt_oss") != 0) {
        st = gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "config.json: model_type is %s%s%s, not \"gpt_oss\": this is not a gpt-oss checkpoint",
            json_is_string(model_type) ? "\"" : "",
            json_is_string(model_type) ? json_string_value(model_type) : "missing",
            json_is_string(model_type) ? "\"" : "");
        goto done;
    }
    if (arch) {
        bool found = false;
        size_t i;
        json_t *a;
        if (!json_is_array(arch)) {
            st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                  "config.json: \"architectures\" must be an array");
            goto done;
        }
        json_array_foreach(arch, i, a) if (json_is_string(a) &&
                                           strcmp(json_string_value(a), "GptOssForCausalLM") == 0)
            found = true;
        if (!found) {
            st = gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                  "config.json: architectures does not list \"GptOssForCausalLM\"");
            goto done;
        }
    }

    if ((st = get_ranged(root, "num_hidden_layers", true, 0, 1, GPTOSS_MAX_LAYERS, &c->n_layers,
                         error)) ||
        (st = get_ranged(root, "hidden_size", true, 0, 1, MAX_HIDDEN, &c->hidden_size, error)) ||
        (st = get_ranged(root, "intermediate_size", true, 0, 1, MAX_HIDDEN, &c->intermediate_size,
                         error)) ||
        (st = get_ranged(root, "num_attention_heads", true, 0, 1, MAX_HEADS, &c->n_heads, error)) ||
        (st = get_ranged(root, "num_key_value_heads", true, 0, 1, MAX_HEADS, &c->n_kv_heads,
                         error)) ||
        (st = get_ranged(root, "head_dim", true, 0, 2, MAX_HEAD_DIM, &c->head_dim, error)) ||
        (st = get_ranged(root, "vocab_size", true, 0, 1, MAX_VOCAB, &c->vocab_size, error)) ||
        (st = get_ranged(root, "sliding_window", true, 0, 1, MAX_POSITIONS, &c->sliding_window,
                         error)) ||
        (st = get_ranged(root, "max_position_embeddings", true, 0, 1, MAX_POSITIONS,
                         &c->max_position_embeddings, error)))
        goto done;
    /* num_local_experts (HF) or num_experts (OpenAI); experts_per_token duplicates top-k. */
    if (json_object_get(root, "num_local_experts"))
        st = get_ranged(root, "num_local_experts", true, 0, 1, MAX_EXPERTS, &c->n_experts, error);
    else
        st = get_ranged(root, "num_experts", true, 0, 1, MAX_EXPERTS, &c->n_experts, error);
    if (st) goto done;
    if (json_object_get(root, "num_experts_per_tok"))
        st = get_ranged(root, "num_experts_per_tok", true, 0, 1, MAX_EXPERTS,
                        &c->n_experts_per_token, error);
    else
        st = get_ranged(root, "experts_per_token", true, 0, 1, MAX_EXPERTS, &c->n_experts_per_token,
                        error);
    if (st) goto done;
    if (json_object_get(root, "experts_per_token") &&
        json_object_get(root, "num_experts_per_tok")) {
        int32_t dup;
        if ((st = get_ranged(root, "experts_per_token", true, 0, 1, MAX_EXPERTS, &dup, error)))
            goto done;
        if (dup != c->n_experts_per_token) {
            st = gptoss_set_error(
                error, GPTOSS_ERR_MODEL,
                "config.json: experts_per_token (%d) disagrees with num_experts_per_tok (%d)", dup,
                c->n_experts_per_token);
            goto done;
        }
    }
    if ((st = get_num(root, "rms_norm_eps", true, 0, &c->rms_norm_eps, error)) ||
        (st = get_num(root, "swiglu_limit", true, 0, &c->swiglu_limit, error)) ||
        (st = get_num(root, "swiglu_alpha", false, 1.702, &c->swiglu_alpha, error)))
        goto done;
    if ((st = parse_rope(root, c, error))) goto done;
    if ((st = parse_layer_types(root, c, error))) goto done;
    if ((st = parse_token_id(root, "eos_token_id", &c->eos_token_id, error)) ||
        (st = parse_token_id(root, "pad_token_id", &c->pad_token_id, error)))
        goto done;
    if ((st = expect_bool(root, "tie_word_embeddings", false, error)) ||
        (st = expect_bool(root, "attention_bias", true, error)))
        goto done;
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_string(act)) {
        st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                              "config.json: \"hidden_act\" must be a string");
        goto done;
    }
    json_t *quant = json_object_get(root, "quantization_config");
    if (quant && !json_is_null(quant)) {
        json_t *method = json_is_object(quant) ? json_object_get(quant, "quant_method") : NULL;
        if (!json_is_string(method) || strcmp(json_string_value(method), "mxfp4") != 0) {
            st = gptoss_set_error(
                error, GPTOSS_ERR_UNSUPPORTED,
                "config.json: quantization_config.quant_method must be \"mxfp4\" (only MXFP4 "
                "expert weights are supported)");
            goto done;
        }
    }
    st = gptoss_config_validate(c, error);
done:
    json_decref(root);
    return st;
}

gptoss_status gptoss_config_validate(const gptoss_config *c, gptoss_error *error) {
    if (c->n_layers < 1 || c->n_layers > GPTOSS_MAX_LAYERS)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config: num_hidden_layers = %d must be in [1, %d]", c->n_layers,
                                GPTOSS_MAX_LAYERS);
    if (c->hidden_size < 32 || c->hidden_size % 32)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config: hidden_size = %d must be a positive multiple of 32 (MXFP4 blocks of 32)",
            c->hidden_size);
    if (c->intermediate_size < 32 || c->intermediate_size % 32)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config: intermediate_size = %d must be a positive multiple of 32 (MXFP4 blocks of 32)",
            c->intermediate_size);
    if (c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config: num_attention_heads (%d) must be a positive multiple of "
                                "num_key_value_heads (%d)",
                                c->n_heads, c->n_kv_heads);
    if (c->head_dim < 2 || c->head_dim % 2)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config: head_dim = %d must be even (half-split RoPE)",
                                c->head_dim);
    if (c->n_experts < 1 || c->n_experts_per_token < 1 || c->n_experts_per_token > c->n_experts)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config: num_experts_per_tok (%d) must be in [1, num_local_experts = %d]",
            c->n_experts_per_token, c->n_experts);
    if (c->vocab_size < 1 || c->sliding_window < 1 || c->max_position_embeddings < 1)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config: vocab_size, sliding_window and max_position_embeddings must be positive");
    if (!(c->rope_theta > 1.0) || !(c->rope_scaling_factor >= 1.0) || !(c->rope_beta_fast > 0) ||
        !(c->rope_beta_slow > 0) || c->rope_original_max_position_embeddings < 1)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config: RoPE parameters out of range (rope_theta > 1, factor >= 1, betas > 0, "
            "original_max_position_embeddings >= 1)");
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config: rms_norm_eps = %g must be in (0, 1)", c->rms_norm_eps);
    if (!(c->swiglu_limit > 0) || !(c->swiglu_alpha > 0))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config: swiglu_limit and swiglu_alpha must be positive");
    if (c->eos_token_id >= c->vocab_size || c->pad_token_id >= c->vocab_size)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL,
            "config: eos_token_id (%d) and pad_token_id (%d) must be below vocab_size (%d)",
            c->eos_token_id, c->pad_token_id, c->vocab_size);
    /* Absurd totals: refuse models whose tensors could not be addressed. */
    double bytes = (double)c->vocab_size * c->hidden_size * 4.0 +
                   (double)c->n_layers * c->n_experts * 3.0 * c->intermediate_size * c->hidden_size;
    if (bytes > 1e12)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "config: the model would need %.0f GB of weights; refusing",
                                bytes / 1e9);
    return GPTOSS_OK;
}

gptoss_status gptoss_config_load(const char *dir, gptoss_config *config, gptoss_error *error) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            if (cap > (16u << 20)) {
                free(text);
                fclose(f);
                return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                        "%s: larger than 16 MB; not a config file", path);
            }
            cap = cap ? cap * 2 : 8192;
            char *grown = realloc(text, cap);
            if (!grown) {
                free(text);
                fclose(f);
                return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
            }
            text = grown;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    gptoss_status st = gptoss_config_parse(text, len, config, error);
    free(text);
    if (st != GPTOSS_OK) gptoss_error_prefix(error, "%s: ", dir);
    return st;
}

static void fill_common(gptoss_config *c) {
    c->hidden_size = 2880;
    c->intermediate_size = 2880;
    c->n_heads = 64;
    c->n_kv_heads = 8;
    c->head_dim = 64;
    c->n_experts_per_token = 4;
    c->vocab_size = 201088;
    c->sliding_window = 128;
    c->max_position_embeddings = 131072;
    c->rope_theta = 150000.0;
    c->rope_scaling_factor = 32.0;
    c->rope_beta_fast = 32.0;
    c->rope_beta_slow = 1.0;
    c->rope_original_max_position_embeddings = 4096;
    c->rope_truncate = false;
    c->rms_norm_eps = 1e-5;
    c->swiglu_limit = 7.0;
    c->swiglu_alpha = 1.702;
    c->eos_token_id = GPTOSS_TOKEN_RETURN;
    c->pad_token_id = GPTOSS_TOKEN_ENDOFTEXT;
}

gptoss_status gptoss_config_preset(const char *name, gptoss_config *c, gptoss_error *error) {
    memset(c, 0, sizeof *c);
    fill_common(c);
    if (strcmp(name, "20b") == 0) {
        c->n_layers = 24;
        c->n_experts = 32;
    } else if (strcmp(name, "120b") == 0) {
        c->n_layers = 36;
        c->n_experts = 128;
    } else if (strcmp(name, "tiny") == 0) {
        /* Small enough for CI and a laptop, with the real vocabulary so text works, and
         * every structural feature of the real models (GQA, sliding layers, YaRN, top-k). */
        c->n_layers = 4;
        c->hidden_size = 128;
        c->intermediate_size = 128;
        c->n_heads = 8;
        c->n_kv_heads = 2;
        c->head_dim = 32;
        c->n_experts = 8;
        c->sliding_window = 16;
        c->max_position_embeddings = 131072;
    } else {
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "unknown preset '%s' (tiny, 20b, 120b)", name);
    }
    for (int32_t l = 0; l < c->n_layers; l++)
        c->layer_is_sliding[l] = (l % 2) == 0;
    return gptoss_config_validate(c, error);
}

char *gptoss_config_to_json(const gptoss_config *c) {
    json_t *root = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("GptOssForCausalLM"));
    json_object_set_new(root, "architectures", arch);
    json_object_set_new(root, "attention_bias", json_true());
    json_object_set_new(root, "attention_dropout", json_real(0.0));
    /* absent ids (-1) as null, which the parser reads back as absent */
    json_object_set_new(root, "eos_token_id",
                        c->eos_token_id >= 0 ? json_integer(c->eos_token_id) : json_null());
    json_object_set_new(root, "experts_per_token", json_integer(c->n_experts_per_token));
    json_object_set_new(root, "head_dim", json_integer(c->head_dim));
    json_object_set_new(root, "hidden_act", json_string("silu"));
    json_object_set_new(root, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(root, "initial_context_length",
                        json_integer(c->rope_original_max_position_embeddings));
    json_object_set_new(root, "initializer_range", json_real(0.02));
    json_object_set_new(root, "intermediate_size", json_integer(c->intermediate_size));
    json_t *types = json_array();
    for (int32_t l = 0; l < c->n_layers; l++)
        json_array_append_new(
            types, json_string(c->layer_is_sliding[l] ? "sliding_attention" : "full_attention"));
    json_object_set_new(root, "layer_types", types);
    json_object_set_new(root, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(root, "model_type", json_string("gpt_oss"));
    json_object_set_new(root, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(root, "num_experts_per_tok", json_integer(c->n_experts_per_token));
    json_object_set_new(root, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(root, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(root, "num_local_experts", json_integer(c->n_experts));
    json_object_set_new(root, "output_router_logits", json_false());
    json_object_set_new(root, "pad_token_id",
                        c->pad_token_id >= 0 ? json_integer(c->pad_token_id) : json_null());
    json_t *quant = json_object();
    json_t *skip = json_array();
    json_array_append_new(skip, json_string("model.layers.*.self_attn"));
    json_array_append_new(skip, json_string("model.layers.*.mlp.router"));
    json_array_append_new(skip, json_string("model.embed_tokens"));
    json_array_append_new(skip, json_string("lm_head"));
    json_object_set_new(quant, "modules_to_not_convert", skip);
    json_object_set_new(quant, "quant_method", json_string("mxfp4"));
    json_object_set_new(root, "quantization_config", quant);
    json_object_set_new(root, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(root, "rope_scaling",
                        json_pack("{s:f,s:f,s:f,s:i,s:s,s:b}", "beta_fast", c->rope_beta_fast,
                                  "beta_slow", c->rope_beta_slow, "factor", c->rope_scaling_factor,
                                  "original_max_position_embeddings",
                                  c->rope_original_max_position_embeddings, "rope_type", "yarn",
                                  "truncate", c->rope_truncate));
    if (c->rope_theta == floor(c->rope_theta) && c->rope_theta < 9e15)
        json_object_set_new(root, "rope_theta", json_integer((json_int_t)c->rope_theta));
    else
        json_object_set_new(root, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(root, "router_aux_loss_coef", json_real(0.9));
    json_object_set_new(root, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(root, "swiglu_limit", json_real(c->swiglu_limit));
    json_object_set_new(root, "tie_word_embeddings", json_false());
    json_object_set_new(root, "transformers_version", json_string("4.55.0.dev0"));
    json_object_set_new(root, "use_cache", json_true());
    json_object_set_new(root, "vocab_size", json_integer(c->vocab_size));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    return text;
}

int64_t gptoss_config_q_dim(const gptoss_config *c) {
    return (int64_t)c->n_heads * c->head_dim;
}

int64_t gptoss_config_kv_dim(const gptoss_config *c) {
    return (int64_t)c->n_kv_heads * c->head_dim;
}

int32_t gptoss_config_n_sliding_layers(const gptoss_config *c) {
    int32_t n = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        n += c->layer_is_sliding[l] && c->sliding_window > 0;
    return n;
}

static int64_t attention_params(const gptoss_config *c) {
    int64_t H = c->hidden_size, q = gptoss_config_q_dim(c), kv = gptoss_config_kv_dim(c);
    return (q + 2 * kv) * H + (q + 2 * kv) /* qkv + biases */ + H * q + H /* o */ +
           c->n_heads /* sinks */ + 2 * H /* norms */ + (int64_t)c->n_experts * H +
           c->n_experts /* router */;
}

static int64_t expert_params(const gptoss_config *c) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    return 2 * I * H + 2 * I /* gate_up + bias */ + H * I + H /* down + bias */;
}

int64_t gptoss_config_n_params(const gptoss_config *c) {
    int64_t per_layer = attention_params(c) + (int64_t)c->n_experts * expert_params(c);
    return (int64_t)c->n_layers * per_layer + 2 * (int64_t)c->vocab_size * c->hidden_size +
           c->hidden_size;
}

int64_t gptoss_config_n_bytes(const gptoss_config *c) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    /* MXFP4: 16 bytes of codes + 1 scale byte per 32 values; everything else bf16. */
    int64_t mx_values = (int64_t)c->n_experts * (2 * I * H + H * I);
    int64_t mx_bytes = mx_values / 2 + mx_values / 32;
    int64_t bf16_per_layer = attention_params(c) + (int64_t)c->n_experts * (2 * I + H);
    return (int64_t)c->n_layers * (2 * bf16_per_layer + mx_bytes) +
           2 * (2 * (int64_t)c->vocab_size * H + H);
}

int64_t gptoss_config_n_active_params(const gptoss_config *c) {
    int64_t per_layer = attention_params(c) + (int64_t)c->n_experts_per_token * expert_params(c);
    return (int64_t)c->n_layers * per_layer + (int64_t)c->vocab_size * c->hidden_size +
           c->hidden_size;
}

void gptoss_rope_yarn_inv_freq(const gptoss_config *c, float *inv_freq, float *concentration) {
    int32_t half = c->head_dim / 2;
    double base = c->rope_theta, f = c->rope_scaling_factor,
           L0 = c->rope_original_max_position_embeddings;
    const double two_pi = 6.283185307179586476925286766559;
    double low = half * log(L0 / (c->rope_beta_fast * two_pi)) / log(base);
    double high = half * log(L0 / (c->rope_beta_slow * two_pi)) / log(base);
    if (c->rope_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > c->head_dim - 1) high = c->head_dim - 1;
    if (high == low) high += 0.001; /* the references avoid a zero-width ramp the same way */
    for (int32_t j = 0; j < half; j++) {
        double freq = pow(base, (2.0 * j) / c->head_dim);
        double ramp = (j - low) / (high - low);
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        double extrapolation = 1.0 - ramp;
        inv_freq[j] =
            (float)((1.0 / freq) * extrapolation + (1.0 / (f * freq)) * (1.0 - extrapolation));
    }
    *concentration = f > 1.0 ? (float)(0.1 * log(f) + 1.0) : 1.0f;
}
