/*
 * responses_request.c - the fields of a Responses API request (responses_request.h): tools,
 * text.format, reasoning, metadata, include, sampling, instructions, store and
 * previous_response_id, translated to the Chat Completions shape, with the input items read by
 * responses_input.c. Errors name the field as the request spelled it.
 */
#include "server/responses_request.h"
#include "server/responses_input.h"
#include "server/server_internal.h"

#include "chat/openai_chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void responses_request_free(resp_request *r) {
    if (!r) return;
    json_decref(r->echo);
    json_decref(r->items);
    free(r);
}

void responses_rename_param(field_error *e) {
    static const char *const renames[][2] = {
        {"response_format.json_schema", "text.format"},
        {"response_format", "text.format"},
        {"max_tokens", "max_output_tokens"},
        {"reasoning_effort", "reasoning.effort"},
        {"messages", "input"},
    };
    char param[128];
    param_of_message(e->message, param, sizeof param);
    if (!param[0]) snprintf(param, sizeof param, "%s", e->param);
    char renamed[160] = "";
    for (size_t i = 0; i < sizeof renames / sizeof renames[0] && !renamed[0]; i++) {
        size_t n = strlen(renames[i][0]);
        if (!strncmp(param, renames[i][0], n))
            snprintf(renamed, sizeof renamed, "%s%s", renames[i][1],
                     !strcmp(renames[i][0], "messages") ? "" : param + n);
    }
    const char *fn = strstr(param, "].function.");
    if (!renamed[0] && !strncmp(param, "tools[", 6) && fn)
        snprintf(renamed, sizeof renamed, "%.*s]%s", (int)(fn - param), param, fn + 10);
    if (!renamed[0]) return;
    size_t plen = strlen(param);
    char message[sizeof e->message];
    if (!strncmp(e->message, param, plen))
        snprintf(message, sizeof message, "%s%s", renamed, e->message + plen);
    else
        snprintf(message, sizeof message, "%s", e->message);
    snprintf(e->message, sizeof e->message, "%s", message);
    snprintf(e->param, sizeof e->param, "%s", renamed);
}

static bool read_tools(const json_t *req, json_t *chat, json_t *echo, field_error *e) {
    const json_t *tools = json_member(req, "tools");
    json_t *echo_tools = json_array();
    json_object_set_new(echo, "tools", echo_tools);
    if (tools && !json_is_array(tools)) return field_fail(e, "tools", "tools: expected an array");
    json_t *chat_tools = json_array();
    json_object_set_new(chat, "tools", chat_tools);
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool) {
        char w[64], f[96];
        snprintf(w, sizeof w, "tools[%zu]", i);
        if (!json_is_object(tool)) return field_fail(e, w, "%s: expected an object", w);
        const char *type = json_string_value(json_object_get(tool, "type"));
        snprintf(f, sizeof f, "%s.type", w);
        if (!type) return field_fail(e, f, "%s: expected a string", f);
        if (strcmp(type, "function") != 0)
            return field_fail(e, f, "%s: '%.64s' is not supported (only 'function')", f, type);
        const char *name = json_string_value(json_object_get(tool, "name"));
        snprintf(f, sizeof f, "%s.name", w);
        if (!name || !gptoss_chat_valid_function_name(name))
            return field_fail(
                e, f, "%s: expected 1 to 64 characters from a-z, A-Z, 0-9, '_', '-', '.'", f);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(tools, j), "name")), name))
                return field_fail(e, f, "%s: '%s' is defined twice", f, name);
        json_t *desc = json_member(tool, "description");
        json_t *params = json_member(tool, "parameters");
        json_t *strict = json_member(tool, "strict");
        snprintf(f, sizeof f, "%s.description", w);
        if (desc && !json_is_string(desc)) return field_fail(e, f, "%s: expected a string", f);
        snprintf(f, sizeof f, "%s.parameters", w);
        if (params && !json_is_object(params))
            return field_fail(e, f, "%s: expected a JSON Schema object", f);
        snprintf(f, sizeof f, "%s.strict", w);
        if (strict && !json_is_boolean(strict))
            return field_fail(e, f, "%s: expected a boolean", f);
        json_t *fn = json_pack("{s:s}", "name", name);
        if (desc) json_object_set(fn, "description", desc);
        if (params) json_object_set(fn, "parameters", params);
        if (strict) json_object_set(fn, "strict", strict);
        json_array_append_new(chat_tools,
                              json_pack("{s:s, s:o}", "type", "function", "function", fn));
        json_array_append_new(echo_tools,
                              json_pack("{s:s, s:s, s:O, s:O, s:O}", "type", "function", "name",
                                        name, "description", desc ? desc : json_null(),
                                        "parameters", params ? params : json_null(), "strict",
                                        strict ? strict : json_null()));
    }
    const json_t *choice = json_member(req, "tool_choice");
    if (!choice) {
        json_object_set_new(echo, "tool_choice", json_string("auto"));
    } else if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (strcmp(c, "auto") && strcmp(c, "none") && strcmp(c, "required"))
            return field_fail(e, "tool_choice",
                              "tool_choice: expected \"auto\", \"none\", \"required\" or "
                              "{\"type\": \"function\", \"name\": ...}");
        if (!strcmp(c, "required") && json_array_size(tools) == 0)
            return field_fail(e, "tool_choice", "tool_choice: \"required\" needs tools");
        json_object_set(chat, "tool_choice", (json_t *)choice);
        json_object_set(echo, "tool_choice", (json_t *)choice);
    } else {
        const char *type = json_string_value(json_object_get(choice, "type"));
        const char *name = json_string_value(json_object_get(choice, "name"));
        if (!json_is_object(choice) || !type || strcmp(type, "function") != 0)
            return field_fail(e, "tool_choice.type",
                              "tool_choice.type: only \"function\" choices are supported");
        bool known = false;
        for (size_t j = 0; name && j < json_array_size(tools); j++)
            known =
                known ||
                !strcmp(json_string_value(json_object_get(json_array_get(tools, j), "name")), name);
        if (!known)
            return field_fail(e, "tool_choice.name", "tool_choice.name: no tool named '%.64s'",
                              name ? name : "");
        json_object_set_new(
            chat, "tool_choice",
            json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name));
        json_object_set_new(echo, "tool_choice",
                            json_pack("{s:s, s:s}", "type", "function", "name", name));
    }
    bool parallel = true;
    if (!param_bool(req, "parallel_tool_calls", &parallel, e)) return false;
    json_object_set_new(echo, "parallel_tool_calls", json_boolean(parallel));
    if (json_member(req, "parallel_tool_calls"))
        json_object_set_new(chat, "parallel_tool_calls", json_boolean(parallel));
    return true;
}

static bool read_text_format(const json_t *req, json_t *chat, json_t *echo, field_error *e) {
    const json_t *text = json_member(req, "text");
    if (text && !json_is_object(text)) return field_fail(e, "text", "text: expected an object");
    const json_t *format = text ? json_member(text, "format") : NULL;
    json_t *echo_text = text ? json_deep_copy(text) : json_object();
    json_object_set_new(echo, "text", echo_text);
    if (!format) {
        json_object_set_new(echo_text, "format", json_pack("{s:s}", "type", "text"));
        return true;
    }
    const char *type = json_string_value(json_object_get(format, "type"));
    if (!json_is_object(format) || !type)
        return field_fail(e, "text.format", "text.format: expected an object with a string 'type'");
    if (!strcmp(type, "text") || !strcmp(type, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", type));
        return true;
    }
    if (strcmp(type, "json_schema") != 0)
        return field_fail(e, "text.format.type",
                          "text.format.type: '%.64s' is not supported (text, json_object, "
                          "json_schema)",
                          type);
    const json_t *name = json_object_get(format, "name");
    const json_t *schema = json_object_get(format, "schema");
    const json_t *strict = json_member(format, "strict");
    const json_t *desc = json_member(format, "description");
    if (!json_is_string(name))
        return field_fail(e, "text.format.name", "text.format.name: expected a string");
    if (!json_is_object(schema))
        return field_fail(e, "text.format.schema",
                          "text.format.schema: expected a JSON Schema object");
    if (strict && !json_is_boolean(strict))
        return field_fail(e, "text.format.strict", "text.format.strict: expected a boolean");
    if (desc && !json_is_string(desc))
        return field_fail(e, "text.format.description",
                          "text.format.description: expected a string");
    json_t *js = json_pack("{s:O, s:O}", "name", name, "schema", schema);
    if (strict) json_object_set(js, "strict", (json_t *)strict);
    if (desc) json_object_set(js, "description", (json_t *)desc);
    json_object_set_new(chat, "response_format",
                        json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return true;
}

static bool read_reasoning(const json_t *req, json_t *chat, json_t *echo, field_error *e) {
    const json_t *reasoning = json_member(req, "reasoning");
    if (reasoning && !json_is_object(reasoning))
        return field_fail(e, "reasoning", "reasoning: expected an object");
    const json_t *effort = reasoning ? json_member(reasoning, "effort") : NULL;
    const char *level = "medium";
    if (effort) {
        const char *w = json_string_value(effort);
        /* harmony knows low, medium and high: lighter requests get low */
        if (w && (!strcmp(w, "minimal") || !strcmp(w, "none") || !strcmp(w, "low")))
            level = "low";
        else if (w && (!strcmp(w, "medium") || !strcmp(w, "high")))
            level = w;
        else
            return field_fail(e, "reasoning.effort",
                              "reasoning.effort: expected \"minimal\", \"low\", \"medium\" or "
                              "\"high\"");
    }
    json_object_set_new(chat, "reasoning_effort", json_string(level));
    json_object_set_new(echo, "reasoning", json_pack("{s:s, s:n}", "effort", level, "summary"));
    return true;
}

static bool read_metadata(const json_t *req, json_t *echo, field_error *e) {
    const json_t *metadata = json_member(req, "metadata");
    if (!metadata) {
        json_object_set_new(echo, "metadata", json_object());
        return true;
    }
    if (!json_is_object(metadata) || json_object_size(metadata) > 16)
        return field_fail(e, "metadata", "metadata: expected an object of at most 16 pairs");
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)metadata, key, value) {
        if (strlen(key) > 64 || !json_is_string(value) || json_string_length(value) > 512)
            return field_fail(e, "metadata",
                              "metadata.%.64s: keys are at most 64 characters, values strings "
                              "of at most 512",
                              key);
    }
    json_object_set(echo, "metadata", (json_t *)metadata);
    return true;
}

/* include: what the output adds. The values OpenAI defines for its hosted tools and image
 * inputs name things this server never makes: refused, as are unknown ones. */
static bool read_include(const json_t *req, resp_request *rr, json_t *echo, field_error *e) {
    const json_t *include = json_member(req, "include");
    bool present = false;
    if (!param_int(req, "top_logprobs", 0, GPTOSS_MAX_TOP_LOGPROBS, &rr->top_logprobs, &present, e))
        return false;
    json_object_set_new(echo, "top_logprobs",
                        present ? json_integer(rr->top_logprobs) : json_null());
    if (!include) return true;
    if (!json_is_array(include))
        return field_fail(e, "include", "include: expected an array of strings");
    static const char *const hosted[] = {"file_search_call.results",
                                         "web_search_call.results",
                                         "web_search_call.action.sources",
                                         "message.input_image.image_url",
                                         "computer_call_output.output.image_url",
                                         "code_interpreter_call.outputs"};
    size_t i;
    const json_t *v;
    json_array_foreach(include, i, v) {
        const char *w = json_string_value(v);
        if (!w) return field_fail(e, "include", "include[%zu]: expected a string", i);
        if (!strcmp(w, "message.output_text.logprobs")) {
            rr->logprobs = true;
            continue;
        }
        if (!strcmp(w, "reasoning.encrypted_content")) {
            rr->encrypted_reasoning = true;
            continue;
        }
        for (size_t k = 0; k < sizeof hosted / sizeof hosted[0]; k++)
            if (!strcmp(w, hosted[k]))
                return field_fail(e, "include",
                                  "include[%zu]: '%.64s' is not supported: this server has no "
                                  "hosted tools or image inputs",
                                  i, w);
        return field_fail(e, "include",
                          "include[%zu]: unknown value '%.64s' (supported: "
                          "\"message.output_text.logprobs\", \"reasoning.encrypted_content\")",
                          i, w);
    }
    return true;
}

bool responses_read_request(gptoss_server *s, const json_t *req, json_t *chat, resp_request *rr,
                            unsigned *status, field_error *e) {
    json_t *echo = rr->echo;
    *status = 400;
    float temperature = 1.0f, top_p = 1.0f;
    int32_t max_output = 0;
    bool has_max = false, stream = false;
    rr->store_it = true;
    if (!param_number(req, "temperature", 0, 2, &temperature, e) ||
        !param_number(req, "top_p", 0, 1, &top_p, e) ||
        !param_int(req, "max_output_tokens", 1, INT32_MAX, &max_output, &has_max, e) ||
        !param_bool(req, "stream", &stream, e) || !param_bool(req, "store", &rr->store_it, e) ||
        !param_bool(req, "background", &rr->background, e))
        return false;
    rr->stream = stream;
    if (rr->background && !rr->store_it)
        return field_fail(e, "store", "store: a background response must be stored");
    if (json_member(req, "conversation"))
        return field_fail(e, "conversation",
                          "conversation: not supported; chain responses with "
                          "previous_response_id");
    json_object_set_new(chat, "temperature", json_real(temperature));
    json_object_set_new(chat, "top_p", json_real(top_p));
    if (has_max) json_object_set_new(chat, "max_tokens", json_integer(max_output));
    json_object_set_new(chat, "stream", json_boolean(stream));
    /* The sampling extensions both other endpoints take pass through under their own names
     * (request_params.c checks them): the Responses API has no field for these. */
    static const char *const extensions[] = {"seed",
                                             "top_k",
                                             "min_p",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "repetition_penalty",
                                             "stop",
                                             "stop_token_ids",
                                             "min_tokens",
                                             "ignore_eos",
                                             "logit_bias"};
    for (size_t i = 0; i < sizeof extensions / sizeof extensions[0]; i++) {
        json_t *v = json_member(req, extensions[i]);
        if (v) json_object_set(chat, extensions[i], v);
    }

    const json_t *instructions = json_member(req, "instructions");
    if (instructions && !json_is_string(instructions))
        return field_fail(e, "instructions", "instructions: expected a string");
    json_object_set_new(echo, "instructions",
                        instructions ? json_incref((json_t *)instructions) : json_null());
    json_object_set_new(echo, "max_output_tokens",
                        has_max ? json_integer(max_output) : json_null());
    json_object_set_new(echo, "model", json_string(s->model_name));
    json_object_set_new(echo, "store", json_boolean(rr->store_it));
    /* echoed as sent (a float would turn 0.7 into 0.699999988) */
    json_t *t = json_member(req, "temperature"), *p = json_member(req, "top_p");
    json_object_set_new(echo, "temperature", t ? json_incref(t) : json_real(1.0));
    json_object_set_new(echo, "top_p", p ? json_incref(p) : json_real(1.0));
    const json_t *truncation = json_member(req, "truncation");
    json_object_set_new(
        echo, "truncation",
        json_string(json_is_string(truncation) ? json_string_value(truncation) : "disabled"));
    if (!read_tools(req, chat, echo, e) || !read_text_format(req, chat, echo, e) ||
        !read_reasoning(req, chat, echo, e) || !read_metadata(req, echo, e) ||
        !read_include(req, rr, echo, e))
        return false;

    /* the conversation: the previous chain's items, then this input */
    const json_t *previous = json_member(req, "previous_response_id");
    json_t *prior = NULL;
    json_object_set_new(echo, "previous_response_id",
                        previous ? json_incref((json_t *)previous) : json_null());
    if (previous) {
        if (!json_is_string(previous))
            return field_fail(e, "previous_response_id", "previous_response_id: expected a string");
        char *items_text = NULL;
        bool running = false;
        const char *id = json_string_value(previous);
        bool found = response_store_get(s->responses, id, NULL, &items_text, &running);
        if (found && running) {
            free(items_text);
            return field_fail(e, "previous_response_id",
                              "previous_response_id: response '%.100s' is still in progress", id);
        }
        prior = items_text ? json_loads(items_text, 0, NULL) : NULL;
        free(items_text);
        if (!json_is_array(prior)) {
            json_decref(prior);
            *status = 404;
            return field_fail(e, "previous_response_id",
                              "Previous response with id '%.100s' not found: it was stored with "
                              "store: false, deleted, evicted from the response store "
                              "(--responses-store-bytes), or never existed",
                              id);
        }
        json_array_extend(rr->items, prior);
    }
    const json_t *input = json_member(req, "input");
    bool ok = input ? responses_input_read(input, prior, rr->items, e)
                    : field_fail(e, "input", "input: required (a string or an array of items)");
    json_decref(prior);
    if (!ok) return false;
    if (json_array_size(rr->items) == 0)
        return field_fail(e, "input", "input: must contain at least one item");
    json_object_set_new(chat, "messages",
                        responses_items_to_messages(
                            instructions ? json_string_value(instructions) : NULL, rr->items));
    return true;
}
