/*
 * request_params.c - the shared request fields of the generation endpoints: JSON ->
 * gptoss_sampling_params, stop strings, stream flags and logit_bias.
 *
 * Owns: every check of those fields (a bad value is answered 400 naming the field) and the
 * memory the parsed parameters point to, until request_params_free.
 */
#include "server/request_params.h"

#include "chat/chat_buf.h"
#include "server/output_constraint.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool field_fail(field_error *e, const char *param, const char *fmt, ...) {
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

json_t *json_member(const json_t *req, const char *key) {
    json_t *v = json_object_get(req, key);
    return v && !json_is_null(v) ? v : NULL;
}

bool param_number(const json_t *req, const char *key, double lo, double hi, float *out,
                  field_error *e) {
    json_t *v = json_member(req, key);
    if (!v) return true;
    if (!json_is_number(v)) return field_fail(e, key, "%s: expected a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return field_fail(e, key, "%s: %g is out of range [%g, %g]", key, x, lo, hi);
    *out = (float)x;
    return true;
}

bool param_int(const json_t *req, const char *key, int64_t lo, int64_t hi, int32_t *out,
               bool *present, field_error *e) {
    json_t *v = json_member(req, key);
    if (present) *present = v != NULL;
    if (!v) return true;
    if (!json_is_integer(v)) return field_fail(e, key, "%s: expected an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return field_fail(e, key, "%s: %lld is out of range [%lld, %lld]", key, (long long)x,
                          (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return true;
}

bool param_bool(const json_t *req, const char *key, bool *out, field_error *e) {
    json_t *v = json_member(req, key);
    if (!v) return true;
    if (!json_is_boolean(v)) return field_fail(e, key, "%s: expected true or false", key);
    *out = json_is_true(v);
    return true;
}

void request_params_free(request_params *p) {
    for (int i = 0; i < p->n_stops; i++)
        free(p->stops[i]);
    p->n_stops = 0;
    free(p->bias_tokens);
    free(p->bias_values);
    p->bias_tokens = NULL, p->bias_values = NULL;
    p->sampling.logit_bias_tokens = NULL, p->sampling.logit_bias_values = NULL;
    p->sampling.n_logit_bias = 0;
    output_constraint_free(p->constraint);
    p->constraint = NULL;
}

static bool parse_stop(const json_t *req, request_params *o, field_error *e) {
    json_t *v = json_member(req, "stop");
    if (!v) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return true;
        if (json_string_length(v) > SERVER_MAX_STOP_BYTES)
            return field_fail(e, "stop", "stop: a stop string is limited to %d bytes",
                              SERVER_MAX_STOP_BYTES);
        o->stops[0] = gptoss_chat_strndup(json_string_value(v), json_string_length(v));
        if (!o->stops[0]) return field_fail(e, "stop", "out of memory");
        o->stop_lens[0] = json_string_length(v);
        o->n_stops = 1;
        return true;
    }
    if (!json_is_array(v))
        return field_fail(e, "stop", "stop: expected a string or an array of strings");
    if (json_array_size(v) > SERVER_MAX_STOP_STRINGS)
        return field_fail(e, "stop", "stop: at most %d stop strings", SERVER_MAX_STOP_STRINGS);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return field_fail(e, "stop", "stop[%zu]: expected a string", i);
        if (json_string_length(s) == 0)
            return field_fail(e, "stop", "stop[%zu]: must not be empty", i);
        if (json_string_length(s) > SERVER_MAX_STOP_BYTES)
            return field_fail(e, "stop", "stop[%zu]: a stop string is limited to %d bytes", i,
                              SERVER_MAX_STOP_BYTES);
        char *copy = gptoss_chat_strndup(json_string_value(s), json_string_length(s));
        if (!copy) return field_fail(e, "stop", "out of memory");
        o->stops[o->n_stops] = copy;
        o->stop_lens[o->n_stops++] = json_string_length(s);
    }
    return true;
}

/* OpenAI's logit_bias: {"<token id>": bias}, the id as a decimal string. */
static bool parse_logit_bias(const json_t *req, int32_t vocab, request_params *o, field_error *e) {
    json_t *v = json_member(req, "logit_bias");
    if (!v) return true;
    if (!json_is_object(v))
        return field_fail(e, "logit_bias",
                          "logit_bias: expected an object mapping token ids to biases, "
                          "e.g. {\"50256\": -100}");
    size_t n = json_object_size(v);
    if (n == 0) return true;
    if (n > GPTOSS_MAX_LOGIT_BIAS)
        return field_fail(e, "logit_bias", "logit_bias: at most %d entries, got %zu",
                          GPTOSS_MAX_LOGIT_BIAS, n);
    o->bias_tokens = malloc(n * sizeof *o->bias_tokens);
    o->bias_values = malloc(n * sizeof *o->bias_values);
    if (!o->bias_tokens || !o->bias_values) return field_fail(e, "logit_bias", "out of memory");
    int32_t count = 0;
    const char *key;
    json_t *bias;
    json_object_foreach((json_t *)v, key, bias) {
        char *end = NULL;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        if (key[0] < '0' || key[0] > '9' || *end != '\0' || errno != 0)
            return field_fail(e, "logit_bias",
                              "logit_bias: key \"%.64s\" is not a token id (a decimal integer)",
                              key);
        if (id < 0 || id >= vocab)
            return field_fail(e, "logit_bias", "logit_bias: token id %lld is out of range [0, %d)",
                              id, vocab);
        if (!json_is_number(bias))
            return field_fail(e, "logit_bias", "logit_bias[\"%s\"]: expected a number", key);
        double x = json_number_value(bias);
        if (!(x >= -100 && x <= 100))
            return field_fail(e, "logit_bias", "logit_bias[\"%s\"]: %g is out of range [-100, 100]",
                              key, x);
        for (int32_t j = 0; j < count; j++)
            if (o->bias_tokens[j] == (int32_t)id)
                return field_fail(e, "logit_bias", "logit_bias: token id %lld is given twice", id);
        o->bias_tokens[count] = (int32_t)id;
        o->bias_values[count++] = (float)x;
    }
    o->sampling.logit_bias_tokens = o->bias_tokens;
    o->sampling.logit_bias_values = o->bias_values;
    o->sampling.n_logit_bias = count;
    return true;
}

/* The OpenAI fields no endpoint reads: each is checked, accepted when the server honours it
 * (nothing to do) and refused naming it when it would be silently not done. */
static bool check_openai_fields(const json_t *req, field_error *e) {
    static const char *const strings[] = {"user", "prompt_cache_key", "safety_identifier"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        json_t *v = json_member(req, strings[i]);
        if (v && !json_is_string(v))
            return field_fail(e, strings[i], "%s: expected a string", strings[i]);
    }
    json_t *v = json_member(req, "metadata");
    if (v) {
        if (!json_is_object(v) || json_object_size(v) > 16)
            return field_fail(e, "metadata",
                              "metadata: expected an object of at most 16 string values");
        const char *key;
        json_t *value;
        json_object_foreach(v, key, value) {
            if (!json_is_string(value) || strlen(key) > 64 || json_string_length(value) > 512)
                return field_fail(e, "metadata",
                                  "metadata[\"%.64s\"]: expected a string of at most 512 "
                                  "characters under a key of at most 64",
                                  key);
        }
    }
    v = json_member(req, "store");
    if (v && !json_is_boolean(v)) return field_fail(e, "store", "store: expected true or false");
    if (v && json_is_true(v))
        return field_fail(e, "store", "store: stored completions are not supported by this server");
    v = json_member(req, "service_tier");
    if (v && !json_is_string(v))
        return field_fail(e, "service_tier", "service_tier: expected a string");
    if (v && strcmp(json_string_value(v), "auto") && strcmp(json_string_value(v), "default"))
        return field_fail(e, "service_tier",
                          "service_tier: '%.64s' is not supported; this server has one tier "
                          "(\"auto\" or \"default\")",
                          json_string_value(v));
    v = json_member(req, "parallel_tool_calls");
    if (v && !json_is_boolean(v))
        return field_fail(e, "parallel_tool_calls", "parallel_tool_calls: expected true or false");
    v = json_member(req, "modalities");
    if (v) {
        if (!json_is_array(v))
            return field_fail(e, "modalities", "modalities: expected an array of strings");
        size_t i;
        json_t *m;
        json_array_foreach(v, i, m) {
            if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
                return field_fail(e, "modalities",
                                  "modalities[%zu]: only \"text\" is supported by this server", i);
        }
    }
    /* Known, and not done by this server: refused rather than ignored. */
    static const struct {
        const char *name, *why;
    } unsupported[] = {
        {"audio", "audio output is not supported by gpt-oss"},
        {"prediction", "predicted outputs are not supported by this server"},
        {"web_search_options", "web search is not supported by this server"},
        {"functions", "deprecated and not supported; describe functions in \"tools\""},
        {"function_call", "deprecated and not supported; use \"tool_choice\""},
        {"verbosity", "not supported by gpt-oss"},
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (json_member(req, unsupported[i].name))
            return field_fail(e, unsupported[i].name, "%s: %s", unsupported[i].name,
                              unsupported[i].why);
    return true;
}

bool request_params_parse(const json_t *req, int32_t vocab, int32_t max_n, request_params *o,
                          field_error *e) {
    memset(o, 0, sizeof *o);
    gptoss_sampling_params *p = &o->sampling;
    *p = gptoss_sampling_params_default();
    if (!param_bool(req, "stream", &o->stream, e)) return false;
    json_t *so = json_member(req, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return field_fail(e, "stream_options", "stream_options: expected an object");
        if (!o->stream)
            return field_fail(e, "stream_options",
                              "stream_options: only allowed when \"stream\" is true");
        const char *key;
        json_t *member;
        json_object_foreach(so, key, member) {
            if (strcmp(key, "include_usage") && strcmp(key, "include_obfuscation"))
                return field_fail(e, "stream_options",
                                  "stream_options: unknown option \"%.64s\" (known: include_usage, "
                                  "include_obfuscation)",
                                  key);
            if (!json_is_null(member) && !json_is_boolean(member))
                return field_fail(e, "stream_options", "stream_options.%s: expected true or false",
                                  key);
        }
        json_t *iu = json_member(so, "include_usage");
        o->include_usage = iu && json_is_true(iu);
    }
    if (!check_openai_fields(req, e)) return false;
    if (!param_number(req, "temperature", 0, 2, &p->temperature, e)) return false;
    if (!param_number(req, "top_p", 0, 1, &p->top_p, e)) return false;
    if (json_member(req, "top_p") && p->top_p <= 0)
        return field_fail(e, "top_p", "top_p: must be in (0, 1]");
    if (!param_int(req, "top_k", -1, 1 << 30, &p->top_k, NULL, e)) return false;
    if (!param_number(req, "min_p", 0, 1, &p->min_p, e)) return false;
    if (!param_number(req, "presence_penalty", -2, 2, &p->presence_penalty, e)) return false;
    if (!param_number(req, "frequency_penalty", -2, 2, &p->frequency_penalty, e)) return false;
    if (!param_number(req, "repetition_penalty", 1e-6, 1e6, &p->repetition_penalty, e))
        return false;
    json_t *seed = json_member(req, "seed");
    if (seed) {
        if (!json_is_integer(seed)) return field_fail(e, "seed", "seed: expected an integer");
        /* Any int64, as OpenAI takes: a negative seed is used as its two's complement, so
         * each value still names its own sequence of draws. */
        p->has_seed = true;
        p->seed = (uint64_t)json_integer_value(seed);
    }
    if (!param_int(req, "max_tokens", 1, INT32_MAX, &p->max_tokens, &o->has_max_tokens, e))
        return false;
    if (!param_int(req, "min_tokens", 0, INT32_MAX, &p->min_tokens, NULL, e)) return false;
    if (!param_bool(req, "ignore_eos", &p->ignore_eos, e)) return false;
    if (!param_int(req, "n", 1, max_n, &p->n, NULL, e)) return false;
    json_t *ids = json_member(req, "stop_token_ids");
    if (ids) {
        if (!json_is_array(ids))
            return field_fail(e, "stop_token_ids", "stop_token_ids: expected an array of integers");
        if (json_array_size(ids) > GPTOSS_MAX_STOP_TOKENS)
            return field_fail(e, "stop_token_ids", "stop_token_ids: at most %d ids",
                              GPTOSS_MAX_STOP_TOKENS);
        size_t i;
        json_t *id;
        json_array_foreach(ids, i, id) {
            if (!json_is_integer(id) || json_integer_value(id) < 0 ||
                json_integer_value(id) >= vocab)
                return field_fail(e, "stop_token_ids",
                                  "stop_token_ids[%zu]: expected a token id in [0, %d)", i, vocab);
            p->stop_token_ids[p->n_stop_token_ids++] = (int32_t)json_integer_value(id);
        }
    }
    if (!parse_stop(req, o, e)) return false;
    /* A JSON answer is constrained to end where its value does; a stop string matched inside
     * it would cut it into JSON that does not parse. */
    const json_t *format = json_member(req, "response_format");
    const char *format_type = json_string_value(json_object_get(format, "type"));
    if (o->n_stops > 0 && format_type &&
        (!strcmp(format_type, "json_schema") || !strcmp(format_type, "json_object")))
        return field_fail(e, "stop",
                          "stop: cannot be combined with a JSON response format (%s): a stop "
                          "string inside the JSON would cut it, and the answer already ends "
                          "where the JSON value does",
                          format_type);
    return parse_logit_bias(req, vocab, o, e);
}

void param_of_message(const char *message, char *param, size_t size) {
    param[0] = '\0';
    const char *colon = strchr(message, ':');
    if (!colon || (size_t)(colon - message) >= size ||
        memchr(message, ' ', (size_t)(colon - message)))
        return;
    memcpy(param, message, (size_t)(colon - message));
    param[colon - message] = '\0';
}

bool request_params_finish(request_params *o, int32_t vocab, field_error *e) {
    gptoss_error err = {0};
    if (gptoss_sampling_params_validate(&o->sampling, vocab, &err) != GPTOSS_OK) {
        char param[128];
        param_of_message(err.message, param, sizeof param);
        return field_fail(e, param, "%s", err.message);
    }
    return true;
}
