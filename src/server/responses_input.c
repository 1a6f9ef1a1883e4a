/*
 * responses_input.c - /v1/responses input items -> normalized items -> Chat Completions
 * messages (see responses_input.h).
 *
 * Owns: the item checks and the grouping of an assistant turn. A Responses conversation lists
 * an assistant turn as separate items (reasoning, message, function_call...); harmony renders
 * a turn as analysis, then a commentary preamble or a final message, then the calls. Gathering
 * the items of one turn into one Chat Completions assistant message lets chat/ apply the same
 * rules to both endpoints: reasoning -> analysis, text followed by calls -> commentary
 * preamble, text alone -> final, a call -> commentary to=functions.NAME.
 */
#include "server/responses_input.h"
#include "chat/openai_chat.h"
#include "util/json_type.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Text of a string or of an array of text parts (the types in `allowed`, each {type, text});
 * the parts are joined with nothing between them, as harmony renders several content items. */
static json_t *read_text(const json_t *content, const char *field, const char *const *allowed,
                         field_error *e) {
    if (json_is_string(content)) return json_incref((json_t *)content);
    if (!json_is_array(content)) {
        field_fail(e, field, "%s: expected a string or an array of content parts, got %s", field,
                   content ? gptoss_json_type_name(content) : "nothing");
        return NULL;
    }
    json_t *text = json_string("");
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        char where[160];
        snprintf(where, sizeof where, "%s[%zu]", field, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type) {
            field_fail(e, where, "%s: expected a content part object with a string 'type'", where);
            json_decref(text);
            return NULL;
        }
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            ok = ok || !strcmp(type, *a);
        const char *key = !strcmp(type, "refusal") ? "refusal" : "text";
        const json_t *t = json_object_get(part, key);
        if (!ok) {
            char w[200];
            snprintf(w, sizeof w, "%s.type", where);
            field_fail(e, w, "%s.type: '%.64s' is not supported here (text parts only: %s%s%s)",
                       where, type, allowed[0], allowed[1] ? ", " : "",
                       allowed[1] ? allowed[1] : "");
            json_decref(text);
            return NULL;
        }
        if (!json_is_string(t)) {
            char w[200];
            snprintf(w, sizeof w, "%s.%s", where, key);
            field_fail(e, w, "%s.%s: expected a string", where, key);
            json_decref(text);
            return NULL;
        }
        size_t old = json_string_length(text), add = json_string_length(t);
        char *joined = malloc(old + add + 1);
        if (!joined) {
            json_decref(text);
            field_fail(e, "", "out of memory");
            return NULL;
        }
        memcpy(joined, json_string_value(text), old);
        memcpy(joined + old, json_string_value(t), add);
        json_string_setn_nocheck(text, joined, old + add);
        free(joined);
    }
    return text;
}

/* Whether a function_call with this call id is in `items` (or `prior`). */
static bool call_issued(const json_t *prior, const json_t *items, const char *call_id) {
    const json_t *lists[2] = {prior, items};
    for (int l = 0; l < 2; l++) {
        size_t i;
        const json_t *it;
        json_array_foreach(lists[l], i, it) {
            const char *type = json_string_value(json_object_get(it, "type"));
            const char *id = json_string_value(json_object_get(it, "call_id"));
            if (type && id && !strcmp(type, "function_call") && !strcmp(id, call_id)) return true;
        }
    }
    return false;
}

static const json_t *find_item(const json_t *prior, const json_t *items, const char *id) {
    const json_t *lists[2] = {prior, items};
    for (int l = 0; l < 2; l++) {
        size_t i;
        const json_t *it;
        json_array_foreach(lists[l], i, it) {
            const char *item_id = json_string_value(json_object_get(it, "id"));
            if (item_id && !strcmp(item_id, id)) return it;
        }
    }
    return NULL;
}

/* A string member that must be present: its value, or NULL after failing naming it. */
static const char *need_string(const json_t *item, const char *key, const char *where,
                               field_error *e) {
    const json_t *v = json_object_get(item, key);
    char field[160];
    snprintf(field, sizeof field, "%s.%s", where, key);
    if (!json_is_string(v)) {
        field_fail(e, field, "%s: expected a string, got %s", field,
                   v ? gptoss_json_type_name(v) : "nothing");
        return NULL;
    }
    return json_string_value(v);
}

static json_t *read_message(const json_t *item, const char *where, field_error *e) {
    const char *role = need_string(item, "role", where, e);
    if (!role) return NULL;
    char field[160];
    if (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
        strcmp(role, "assistant")) {
        snprintf(field, sizeof field, "%s.role", where);
        field_fail(e, field, "%s: '%.64s' is not a role (user, system, developer, assistant)",
                   field, role);
        return NULL;
    }
    static const char *const user_parts[] = {"input_text", "output_text", NULL};
    static const char *const assistant_parts[] = {"output_text", "refusal", NULL};
    snprintf(field, sizeof field, "%s.content", where);
    json_t *text = read_text(json_object_get(item, "content"), field,
                             strcmp(role, "assistant") ? user_parts : assistant_parts, e);
    if (!text) return NULL;
    return json_pack("{s:s, s:s, s:o}", "type", "message", "role", role, "content", text);
}

static json_t *read_function_call(const json_t *item, const char *where, field_error *e) {
    const char *call_id = need_string(item, "call_id", where, e);
    const char *name = call_id ? need_string(item, "name", where, e) : NULL;
    if (!name) return NULL;
    char field[160];
    if (!call_id[0] || strlen(call_id) > 256) {
        snprintf(field, sizeof field, "%s.call_id", where);
        field_fail(e, field, "%s: expected 1 to 256 characters", field);
        return NULL;
    }
    if (!gptoss_chat_valid_function_name(name)) {
        snprintf(field, sizeof field, "%s.name", where);
        field_fail(e, field, "%s: expected 1 to 64 characters from a-z, A-Z, 0-9, '_', '-', '.'",
                   field);
        return NULL;
    }
    const json_t *args = json_object_get(item, "arguments");
    if (args && !json_is_string(args)) {
        snprintf(field, sizeof field, "%s.arguments", where);
        field_fail(e, field, "%s: expected a JSON text in a string, got %s", field,
                   gptoss_json_type_name(args));
        return NULL;
    }
    return json_pack("{s:s, s:s, s:s, s:s}", "type", "function_call", "call_id", call_id, "name",
                     name, "arguments", args ? json_string_value(args) : "");
}

static json_t *read_reasoning(const json_t *item, const char *where, field_error *e) {
    static const char *const parts[] = {"reasoning_text", NULL};
    const json_t *content = json_object_get(item, "content");
    const json_t *summary = json_object_get(item, "summary");
    char field[160];
    if (summary && !json_is_null(summary) && !json_is_array(summary)) {
        snprintf(field, sizeof field, "%s.summary", where);
        field_fail(e, field, "%s: expected an array", field);
        return NULL;
    }
    /* The summary is a rewrite for people, not what the model thought: only `content` is
     * rendered back as the turn's analysis, or, without it, the text in an encrypted_content
     * this server made. Other encrypted_content (another server's) means nothing here. */
    const json_t *encrypted = json_object_get(item, "encrypted_content");
    const char *mark = RESPONSES_REASONING_MARK;
    bool ours =
        json_is_string(encrypted) && !strncmp(json_string_value(encrypted), mark, strlen(mark));
    bool no_content = !content || json_is_null(content) ||
                      (json_is_array(content) && json_array_size(content) == 0);
    json_t *text = NULL;
    if (no_content && ours) {
        text = json_stringn(json_string_value(encrypted) + strlen(mark),
                            json_string_length(encrypted) - strlen(mark));
    } else if (no_content) {
        text = json_string("");
    } else {
        snprintf(field, sizeof field, "%s.content", where);
        if (!json_is_array(content)) {
            field_fail(e, field, "%s: expected an array of reasoning_text parts", field);
            return NULL;
        }
        text = read_text(content, field, parts, e);
        if (!text) return NULL;
    }
    return json_pack("{s:s, s:o}", "type", "reasoning", "text", text);
}

static json_t *read_function_output(const json_t *item, const char *where, const json_t *prior,
                                    const json_t *items, field_error *e) {
    const char *call_id = need_string(item, "call_id", where, e);
    if (!call_id) return NULL;
    char field[160];
    if (!call_issued(prior, items, call_id)) {
        snprintf(field, sizeof field, "%s.call_id", where);
        field_fail(e, field,
                   "%s: no function_call with call_id '%.200s' in this input or the previous "
                   "response chain",
                   field, call_id);
        return NULL;
    }
    static const char *const parts[] = {"input_text", "output_text", NULL};
    snprintf(field, sizeof field, "%s.output", where);
    json_t *text = read_text(json_object_get(item, "output"), field, parts, e);
    if (!text) return NULL;
    return json_pack("{s:s, s:s, s:o}", "type", "function_call_output", "call_id", call_id,
                     "output", text);
}

bool responses_input_read(const json_t *input, const json_t *prior, json_t *items, field_error *e) {
    if (json_is_string(input)) {
        json_array_append_new(items, json_pack("{s:s, s:s, s:O}", "type", "message", "role", "user",
                                               "content", input));
        return true;
    }
    if (!json_is_array(input))
        return field_fail(e, "input", "input: expected a string or an array of items, got %s",
                          input ? gptoss_json_type_name(input) : "nothing");
    size_t i;
    const json_t *item;
    json_array_foreach(input, i, item) {
        char where[64];
        snprintf(where, sizeof where, "input[%zu]", i);
        if (!json_is_object(item))
            return field_fail(e, where, "%s: expected an item object, got %s", where,
                              gptoss_json_type_name(item));
        const json_t *type_json = json_object_get(item, "type");
        const char *type = json_string_value(type_json);
        char field[96];
        snprintf(field, sizeof field, "%s.type", where);
        if (type_json && !type) return field_fail(e, field, "%s: expected a string", field);
        json_t *normalized = NULL;
        if (!type || !strcmp(type, "message")) { /* an easy input message has no type */
            normalized = read_message(item, where, e);
        } else if (!strcmp(type, "function_call")) {
            normalized = read_function_call(item, where, e);
        } else if (!strcmp(type, "function_call_output")) {
            normalized = read_function_output(item, where, prior, items, e);
        } else if (!strcmp(type, "reasoning")) {
            normalized = read_reasoning(item, where, e);
        } else if (!strcmp(type, "item_reference")) {
            const char *id = need_string(item, "id", where, e);
            if (!id) return false;
            const json_t *found = find_item(prior, items, id);
            if (!found) {
                snprintf(field, sizeof field, "%s.id", where);
                return field_fail(e, field,
                                  "%s: no item with id '%.200s' in the previous response chain",
                                  field, id);
            }
            normalized = json_deep_copy(found);
        } else {
            return field_fail(e, field,
                              "%s: '%.64s' is not supported (message, function_call, "
                              "function_call_output, reasoning, item_reference)",
                              field, type);
        }
        if (!normalized) return false;
        const json_t *id = json_object_get(item, "id");
        if (json_is_string(id) && !json_object_get(normalized, "id"))
            json_object_set(normalized, "id", (json_t *)id);
        json_array_append_new(items, normalized);
    }
    return true;
}

/* ---- items -> Chat Completions messages ----------------------------------------------------- */

static void flush(json_t *messages, json_t **turn) {
    if (*turn) json_array_append_new(messages, *turn);
    *turn = NULL;
}

json_t *responses_items_to_messages(const char *instructions, const json_t *items) {
    json_t *messages = json_array();
    if (instructions)
        json_array_append_new(
            messages, json_pack("{s:s, s:s}", "role", "developer", "content", instructions));
    json_t *turn = NULL; /* the assistant message being gathered */
    size_t i;
    const json_t *it;
    json_array_foreach(items, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type) continue;
        if (!strcmp(type, "reasoning")) {
            const json_t *text = json_object_get(it, "text");
            if (json_string_length(text) == 0) continue;
            flush(messages, &turn);
            turn = json_pack("{s:s, s:O}", "role", "assistant", "reasoning_content", text);
        } else if (!strcmp(type, "function_call")) {
            if (!turn) turn = json_pack("{s:s}", "role", "assistant");
            json_t *calls = json_object_get(turn, "tool_calls");
            if (!calls) {
                calls = json_array();
                json_object_set_new(turn, "tool_calls", calls);
            }
            json_array_append_new(calls,
                                  json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                            json_object_get(it, "call_id"), "type", "function",
                                            "function", "name", json_object_get(it, "name"),
                                            "arguments", json_object_get(it, "arguments")));
        } else if (!strcmp(type, "message") &&
                   !strcmp(json_string_value(json_object_get(it, "role")), "assistant")) {
            if (turn && (json_object_get(turn, "content") || json_object_get(turn, "tool_calls")))
                flush(messages, &turn);
            if (!turn) turn = json_pack("{s:s}", "role", "assistant");
            json_object_set(turn, "content", json_object_get(it, "content"));
        } else if (!strcmp(type, "message")) {
            flush(messages, &turn);
            json_array_append_new(messages,
                                  json_pack("{s:O, s:O}", "role", json_object_get(it, "role"),
                                            "content", json_object_get(it, "content")));
        } else if (!strcmp(type, "function_call_output")) {
            flush(messages, &turn);
            json_array_append_new(messages,
                                  json_pack("{s:s, s:O, s:O}", "role", "tool", "tool_call_id",
                                            json_object_get(it, "call_id"), "content",
                                            json_object_get(it, "output")));
        }
    }
    flush(messages, &turn);
    return messages;
}
