/*
 * output_constraint.c - structured output for a request (see output_constraint.h).
 *
 * This version constrains nothing: it accepts a plain-text request and refuses, with a 400
 * naming the field, every field it cannot honour yet, instead of ignoring it.
 */
#include "server/output_constraint.h"

#include <string.h>

bool output_constraint_create(const json_t *request, const gptoss_tokenizer *tokenizer,
                              int32_t n_choices, int32_t max_tokens, output_constraint **out,
                              field_error *e) {
    (void)tokenizer;
    (void)n_choices;
    (void)max_tokens;
    *out = NULL;
    const json_t *format = json_member(request, "response_format");
    if (format) {
        const json_t *type = json_is_object(format) ? json_object_get(format, "type") : NULL;
        if (!json_is_string(type))
            return field_fail(e, "response_format",
                              "response_format: expected an object with a "
                              "string 'type'");
        if (strcmp(json_string_value(type), "text") != 0)
            return field_fail(e, "response_format.type",
                              "response_format.type '%s' is not supported by this server",
                              json_string_value(type));
    }
    return true;
}

void output_constraint_bind(output_constraint *c, gptoss_request_options *options) {
    (void)c;
    (void)options; /* nothing to constrain yet: every request has c == NULL */
}

void output_constraint_free(output_constraint *c) {
    (void)c;
}
