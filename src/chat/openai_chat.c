/*
 * openai_chat.c - OpenAI chat-completions request -> harmony conversation.
 *
 * Owns: the mapping rules below and their validation. Must not render, tokenize or look at
 * sampling parameters (the server reads those).
 *
 * The rules (what servers for gpt-oss do, with harmony's format winning where the Hugging
 * Face template disagrees):
 *   1. One system message first, always: harmony's identity (or options->model_identity),
 *      knowledge cutoff 2024-06, "Current date:" when options give one, "Reasoning:" from the
 *      request's reasoning_effort ("low" | "medium" | "high", default "medium"), built-in
 *      browser/python tools when the options ask for them, and the three required channels.
 *      The request's own system messages do NOT go here: the model's identity is fixed.
 *   2. Leading "system" and "developer" messages (those before the first other message)
 *      become the developer message's instructions, joined by "\n\n" (when all are empty,
 *      there are no instructions). A later system or developer message becomes a developer
 *      message with those instructions, in place.
 *   3. `tools` ([{type:"function", function:{name, description?, parameters?}}]) become the
 *      developer message's "functions" namespace, in the order given (property order of
 *      every schema kept). tool_choice "none" leaves them out; the server enforces the
 *      others on the output (server/output_constraint.c). A developer message is emitted
 *      when there are instructions or tools.
 *   4. "user": content as a string, or an array of {type:"text", text} parts rendered one
 *      after another with no separator (as harmony renders several content items). Other
 *      part types are refused. `name` is accepted and ignored (harmony's "user:NAME" is not
 *      something the model was trained to see).
 *   5. "assistant": `reasoning_content` (or `reasoning`) becomes an analysis message first;
 *      then, with tool_calls, a non-empty `content` is a commentary preamble, and each tool
 *      call a commentary message to "functions.NAME" with content type "<|constrain|>json"
 *      whose content is the arguments string verbatim (an object is serialized compactly);
 *      without tool_calls, `content` is the final message. A message with none of these is
 *      refused.
 *   6. "tool": the result of an earlier tool call, found through `tool_call_id`; rendered as
 *      a message authored by "functions.NAME" to "assistant" on the commentary channel
 *      (spec 6.5), content verbatim.
 *   7. Earlier reasoning is dropped by the renderer exactly as harmony does (spec 6.6); the
 *      mapping keeps every message.
 *   8. response_format json_schema: "# Response Formats", "## NAME", "// DESCRIPTION" and the
 *      schema (compact JSON) end the developer message's instructions.
 */
#include "chat/openai_chat.h"
#include "util/json_type.h"

#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_buf.h"

typedef struct tool_call_ref {
    char *id;   /* tool_calls[].id */
    char *name; /* tool_calls[].function.name */
} tool_call_ref;

typedef struct mapping {
    const json_t *request;
    gptoss_harmony_conversation *conversation;
    tool_call_ref *calls; /* [n_calls] every tool call seen so far */
    size_t n_calls;
    gptoss_error *error;
} mapping;

static gptoss_status bad(gptoss_error *error, const char *fmt, const char *field,
                         const char *detail) {
    return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, fmt, field, detail);
}

/* Function names end up in a harmony header ("to=functions.NAME"): whitespace or '<' there
 * would change how the model's header parses, so only OpenAI's name alphabet (plus '.'). */
bool gptoss_chat_valid_function_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* Content as a string or an array of text parts, concatenated into *out. null -> absent. */
static gptoss_status read_text_content(const json_t *content, const char *field,
                                       gptoss_chat_buf *out, bool *present, gptoss_error *error) {
    *present = false;
    if (!content || json_is_null(content)) return GPTOSS_OK;
    *present = true;
    if (json_is_string(content)) {
        if (!gptoss_chat_buf_append(out, json_string_value(content), json_string_length(content)) ||
            !gptoss_chat_buf_terminate(out))
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        return GPTOSS_OK;
    }
    if (!json_is_array(content))
        return bad(error, "%s: expected a string or an array of text parts, got %s", field,
                   gptoss_json_type_name(content));
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        char where[128];
        snprintf(where, sizeof where, "%s[%zu]", field, i);
        if (!json_is_object(part))
            return bad(error, "%s: expected an object, got %s", where, gptoss_json_type_name(part));
        if (!type) return bad(error, "%s.type: %s", where, "expected a string");
        if (strcmp(type, "text") != 0)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "%s.type: '%.100s' is not supported (only 'text')", where,
                                    type);
        if (!json_is_string(text)) return bad(error, "%s.text: %s", where, "expected a string");
        if (!gptoss_chat_buf_append(out, json_string_value(text), json_string_length(text)))
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (!gptoss_chat_buf_terminate(out))
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    return GPTOSS_OK;
}

static gptoss_status push_text(mapping *m, gptoss_harmony_role role, const char *name,
                               const char *recipient, const char *channel, const char *content_type,
                               const char *text, size_t len) {
    gptoss_harmony_message *msg;
    gptoss_status st;
    if ((st = gptoss_harmony_conversation_push(m->conversation, role, &msg, m->error)) ||
        (st = gptoss_harmony_set_string(&msg->name, name, m->error)) ||
        (st = gptoss_harmony_set_string(&msg->recipient, recipient, m->error)) ||
        (st = gptoss_harmony_set_string(&msg->channel, channel, m->error)) ||
        (st = gptoss_harmony_set_string(&msg->content_type, content_type, m->error)))
        return st;
    return gptoss_harmony_message_add_text(msg, text, len, m->error);
}

static gptoss_status map_tools(const json_t *tools, gptoss_harmony_developer_content *dev,
                               gptoss_error *error) {
    gptoss_harmony_namespace *ns = NULL;
    gptoss_status st =
        gptoss_harmony_tools_add_namespace(&dev->tools, "functions", NULL, &ns, error);
    if (st) return st;
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool) {
        char where[64];
        snprintf(where, sizeof where, "tools[%zu]", i);
        if (!json_is_object(tool))
            return bad(error, "%s: expected an object, got %s", where, gptoss_json_type_name(tool));
        const char *type = json_string_value(json_object_get(tool, "type"));
        if (!type || strcmp(type, "function") != 0)
            return bad(error, "%s.type: %s", where, "expected \"function\"");
        const json_t *fn = json_object_get(tool, "function");
        if (!json_is_object(fn)) return bad(error, "%s.function: %s", where, "expected an object");
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_string(name) || !gptoss_chat_valid_function_name(json_string_value(name)))
            return bad(error, "%s.function.name: %s", where,
                       "expected 1 to 64 characters from a-z, A-Z, 0-9, '_', '-', '.'");
        const json_t *desc = json_object_get(fn, "description");
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return bad(error, "%s.function.description: %s", where, "expected a string");
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params))
            return bad(error, "%s.function.parameters: %s", where, "expected a JSON Schema object");
        for (size_t j = 0; j < ns->n_tools; j++)
            if (strcmp(ns->tools[j].name, json_string_value(name)) == 0)
                return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                        "%s.function.name: '%s' is defined twice", where,
                                        json_string_value(name));
        st = gptoss_harmony_namespace_add_tool(
            ns, json_string_value(name), json_is_string(desc) ? json_string_value(desc) : NULL,
            json_is_object(params) ? params : NULL, error);
        if (st) return st;
    }
    return GPTOSS_OK;
}

static gptoss_status map_assistant(mapping *m, const json_t *msg, const char *where) {
    gptoss_status st;
    gptoss_error *error = m->error;
    const json_t *reasoning = json_object_get(msg, "reasoning_content");
    const char *reasoning_key = "reasoning_content";
    if (!reasoning || json_is_null(reasoning)) {
        reasoning = json_object_get(msg, "reasoning");
        reasoning_key = "reasoning";
    }
    bool has_reasoning = reasoning && !json_is_null(reasoning);
    if (has_reasoning && !json_is_string(reasoning))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "%s.%s: expected a string, got %s", where, reasoning_key,
                                gptoss_json_type_name(reasoning));
    char field[128];
    snprintf(field, sizeof field, "%s.content", where);
    gptoss_chat_buf content = {0};
    bool has_content;
    if ((st = read_text_content(json_object_get(msg, "content"), field, &content, &has_content,
                                error))) {
        gptoss_chat_buf_free(&content);
        return st;
    }
    const json_t *calls = json_object_get(msg, "tool_calls");
    if (calls && json_is_null(calls)) calls = NULL;
    if (calls && !json_is_array(calls)) {
        gptoss_chat_buf_free(&content);
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "%s.tool_calls: expected an array, got %s", where,
                                gptoss_json_type_name(calls));
    }
    bool has_calls = calls && json_array_size(calls) > 0;
    if (!has_reasoning && !has_content && !has_calls) {
        gptoss_chat_buf_free(&content);
        return gptoss_set_error(
            error, GPTOSS_ERR_INVALID_ARGUMENT,
            "%s: an assistant message needs content, reasoning_content or tool_calls", where);
    }
    st = GPTOSS_OK;
    if (has_reasoning)
        st = push_text(m, GPTOSS_ROLE_ASSISTANT, NULL, NULL, "analysis", NULL,
                       json_string_value(reasoning), json_string_length(reasoning));
    if (!st && has_content && !has_calls)
        st = push_text(m, GPTOSS_ROLE_ASSISTANT, NULL, NULL, "final", NULL,
                       content.data ? content.data : "", content.len);
    if (!st && has_content && has_calls && content.len > 0)
        st = push_text(m, GPTOSS_ROLE_ASSISTANT, NULL, NULL, "commentary", NULL, content.data,
                       content.len);
    gptoss_chat_buf_free(&content);
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        if (st) break;
        char cw[160];
        snprintf(cw, sizeof cw, "%s.tool_calls[%zu]", where, i);
        if (!json_is_object(call))
            return bad(error, "%s: expected an object, got %s", cw, gptoss_json_type_name(call));
        const char *type = json_string_value(json_object_get(call, "type"));
        if (type && strcmp(type, "function") != 0)
            return bad(error, "%s.type: %s", cw, "expected \"function\"");
        const json_t *id = json_object_get(call, "id");
        if (id && !json_is_string(id)) return bad(error, "%s.id: %s", cw, "expected a string");
        const json_t *fn = json_object_get(call, "function");
        if (!json_is_object(fn)) return bad(error, "%s.function: %s", cw, "expected an object");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || !gptoss_chat_valid_function_name(name))
            return bad(error, "%s.function.name: %s", cw,
                       "expected 1 to 64 characters from a-z, A-Z, 0-9, '_', '-', '.'");
        const json_t *args = json_object_get(fn, "arguments");
        char *dumped = NULL;
        const char *args_text = "";
        size_t args_len = 0;
        if (json_is_string(args)) {
            args_text = json_string_value(args);
            args_len = json_string_length(args);
        } else if (json_is_object(args)) {
            dumped = json_dumps(args, JSON_COMPACT);
            if (!dumped) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
            args_text = dumped;
            args_len = strlen(dumped);
        } else if (args && !json_is_null(args)) {
            return bad(error, "%s.function.arguments: %s", cw, "expected a JSON string");
        }
        char recipient[96];
        snprintf(recipient, sizeof recipient, "functions.%s", name);
        st = push_text(m, GPTOSS_ROLE_ASSISTANT, NULL, recipient, "commentary", "<|constrain|>json",
                       args_text, args_len);
        free(dumped);
        if (st) return st;
        if (id) {
            tool_call_ref *bigger = realloc(m->calls, (m->n_calls + 1) * sizeof *bigger);
            if (!bigger) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
            m->calls = bigger;
            m->calls[m->n_calls].id = strdup(json_string_value(id));
            m->calls[m->n_calls].name = strdup(name);
            m->n_calls++;
        }
    }
    return st;
}

static gptoss_status map_tool_result(mapping *m, const json_t *msg, const char *where) {
    gptoss_error *error = m->error;
    const json_t *id = json_object_get(msg, "tool_call_id");
    if (!json_is_string(id))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "%s.tool_call_id: expected a string", where);
    const char *name = NULL;
    for (size_t i = m->n_calls; i-- > 0;)
        if (m->calls[i].id && strcmp(m->calls[i].id, json_string_value(id)) == 0) {
            name = m->calls[i].name;
            break;
        }
    if (!name)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "%s.tool_call_id: no earlier tool call has id '%.200s'", where,
                                json_string_value(id));
    char field[128];
    snprintf(field, sizeof field, "%s.content", where);
    gptoss_chat_buf content = {0};
    bool present;
    gptoss_status st =
        read_text_content(json_object_get(msg, "content"), field, &content, &present, error);
    if (!st) {
        char author[96];
        snprintf(author, sizeof author, "functions.%s", name);
        st = push_text(m, GPTOSS_ROLE_TOOL, author, "assistant", "commentary", NULL,
                       content.data ? content.data : "", content.len);
    }
    gptoss_chat_buf_free(&content);
    return st;
}

/* response_format json_schema: the schema is shown to the model as harmony's guide does, in a
 * "# Response Formats" section of the developer message (after the instructions; the server
 * constrains the answer to it either way). Field checks are the server's (output_constraint). */
static void append_response_format(const json_t *request, gptoss_chat_buf *instructions) {
    const json_t *format = json_object_get(request, "response_format");
    const json_t *type = json_is_object(format) ? json_object_get(format, "type") : NULL;
    if (!json_is_string(type) || strcmp(json_string_value(type), "json_schema") != 0) return;
    const json_t *js = json_object_get(format, "json_schema");
    const json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
    if (!json_is_object(schema)) return;
    char *text = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        instructions->failed = true;
        return;
    }
    const char *name = json_string_value(json_object_get(js, "name"));
    const char *description = json_string_value(json_object_get(js, "description"));
    if (instructions->len) gptoss_chat_buf_puts(instructions, "\n\n");
    gptoss_chat_buf_printf(instructions, "# Response Formats\n\n## %s\n\n",
                           name ? name : "response");
    if (description) gptoss_chat_buf_printf(instructions, "// %s\n", description);
    gptoss_chat_buf_puts(instructions, text);
    gptoss_chat_buf_terminate(instructions);
    free(text);
}

static gptoss_status map_messages(mapping *m, const json_t *messages,
                                  const gptoss_openai_chat_options *options) {
    gptoss_error *error = m->error;
    gptoss_status st;
    const json_t *request = m->request;

    /* 1. the system message */
    gptoss_reasoning_effort effort = GPTOSS_EFFORT_MEDIUM;
    const json_t *effort_json = json_object_get(request, "reasoning_effort");
    if (effort_json && !json_is_null(effort_json) &&
        !(json_is_string(effort_json) &&
          gptoss_reasoning_effort_parse(json_string_value(effort_json), &effort)))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "reasoning_effort: expected \"low\", \"medium\" or \"high\"");
    gptoss_harmony_message *sys_msg;
    gptoss_harmony_system_content *sys;
    if ((st = gptoss_harmony_conversation_push(m->conversation, GPTOSS_ROLE_SYSTEM, &sys_msg,
                                               error)) ||
        (st = gptoss_harmony_message_add_system(sys_msg, &sys, error)) ||
        (st = gptoss_harmony_system_defaults(sys, error)))
        return st;
    sys->reasoning_effort = effort;
    if (options && options->model_identity &&
        (st = gptoss_harmony_set_string(&sys->model_identity, options->model_identity, error)))
        return st;
    if (options && options->knowledge_cutoff &&
        (st = gptoss_harmony_set_string(&sys->knowledge_cutoff, options->knowledge_cutoff, error)))
        return st;
    if (options && options->current_date &&
        (st = gptoss_harmony_set_string(&sys->conversation_start_date, options->current_date,
                                        error)))
        return st;
    if (options && options->builtin_browser &&
        (st = gptoss_harmony_tools_add_builtin(&sys->tools, "browser", error)))
        return st;
    if (options && options->builtin_python &&
        (st = gptoss_harmony_tools_add_builtin(&sys->tools, "python", error)))
        return st;

    /* 2./3. the developer message */
    const json_t *tools = json_object_get(request, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tools: expected an array, got %s", gptoss_json_type_name(tools));
    const json_t *choice = json_object_get(request, "tool_choice");
    if (choice && !json_is_null(choice) && !json_is_string(choice) && !json_is_object(choice))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tool_choice: expected a string or an object");
    bool use_tools = json_array_size(tools) > 0 &&
                     !(json_is_string(choice) && strcmp(json_string_value(choice), "none") == 0);
    gptoss_chat_buf instructions = {0};
    size_t first = 0;
    size_t n = json_array_size(messages);
    for (; first < n; first++) {
        const json_t *msg = json_array_get(messages, first);
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (!role || (strcmp(role, "system") != 0 && strcmp(role, "developer") != 0)) break;
        char field[64];
        snprintf(field, sizeof field, "messages[%zu].content", first);
        gptoss_chat_buf text = {0};
        bool present;
        if ((st = read_text_content(json_object_get(msg, "content"), field, &text, &present,
                                    error))) {
            gptoss_chat_buf_free(&text);
            gptoss_chat_buf_free(&instructions);
            return st;
        }
        if (!present) {
            gptoss_chat_buf_free(&instructions);
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "%s: expected a string or an array of text parts", field);
        }
        if (first > 0) gptoss_chat_buf_puts(&instructions, "\n\n");
        gptoss_chat_buf_append(&instructions, text.data ? text.data : "", text.len);
        gptoss_chat_buf_terminate(&instructions);
        gptoss_chat_buf_free(&text);
    }
    append_response_format(request, &instructions);
    if (instructions.failed)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    /* Leading system/developer messages that are all empty give no "# Instructions" section
     * (an empty section is noise to the model; the template omits it too). */
    bool has_instructions = instructions.len > 0;
    if (has_instructions || use_tools) {
        gptoss_harmony_message *dev_msg;
        gptoss_harmony_developer_content *dev;
        st = gptoss_harmony_conversation_push(m->conversation, GPTOSS_ROLE_DEVELOPER, &dev_msg,
                                              error);
        if (!st) st = gptoss_harmony_message_add_developer(dev_msg, &dev, error);
        if (!st && has_instructions)
            st = gptoss_harmony_set_string(&dev->instructions, instructions.data, error);
        if (!st && use_tools) st = map_tools(tools, dev, error);
        if (st) {
            gptoss_chat_buf_free(&instructions);
            return st;
        }
    } else if (json_array_size(tools) > 0) {
        /* tool_choice "none": still validate the tools so a bad request is reported. */
        gptoss_harmony_developer_content scratch = {0};
        st = map_tools(tools, &scratch, error);
        gptoss_harmony_conversation tmp;
        gptoss_harmony_conversation_init(&tmp);
        gptoss_harmony_message *holder;
        if (!gptoss_harmony_conversation_push(&tmp, GPTOSS_ROLE_DEVELOPER, &holder, NULL)) {
            holder->content = calloc(1, sizeof *holder->content);
            if (holder->content) {
                holder->n_content = 1;
                holder->content[0].kind = GPTOSS_CONTENT_DEVELOPER;
                holder->content[0].developer = scratch; /* freed with tmp */
            }
        }
        gptoss_harmony_conversation_free(&tmp);
        if (st) {
            gptoss_chat_buf_free(&instructions);
            return st;
        }
    }
    gptoss_chat_buf_free(&instructions);

    /* 4.-6. the conversation */
    for (size_t i = first; i < n; i++) {
        const json_t *msg = json_array_get(messages, i);
        char where[64];
        snprintf(where, sizeof where, "messages[%zu]", i);
        if (!json_is_object(msg))
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "%s: expected an object, got %s", where,
                                    gptoss_json_type_name(msg));
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (!role)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "%s.role: expected a string", where);
        const json_t *name = json_object_get(msg, "name");
        if (name && !json_is_null(name) && !json_is_string(name))
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "%s.name: expected a string", where);
        char field[96];
        snprintf(field, sizeof field, "%s.content", where);
        if (strcmp(role, "user") == 0 || strcmp(role, "system") == 0 ||
            strcmp(role, "developer") == 0) {
            gptoss_chat_buf text = {0};
            bool present;
            st = read_text_content(json_object_get(msg, "content"), field, &text, &present, error);
            if (!st && !present)
                st = gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                      "%s: expected a string or an array of text parts", field);
            if (!st && strcmp(role, "user") == 0) {
                st = push_text(m, GPTOSS_ROLE_USER, NULL, NULL, NULL, NULL,
                               text.data ? text.data : "", text.len);
            } else if (!st) {
                gptoss_harmony_message *dev_msg;
                gptoss_harmony_developer_content *dev;
                st = gptoss_harmony_conversation_push(m->conversation, GPTOSS_ROLE_DEVELOPER,
                                                      &dev_msg, error);
                if (!st) st = gptoss_harmony_message_add_developer(dev_msg, &dev, error);
                if (!st)
                    st = gptoss_harmony_set_string(&dev->instructions, text.data ? text.data : "",
                                                   error);
            }
            gptoss_chat_buf_free(&text);
        } else if (strcmp(role, "assistant") == 0) {
            st = map_assistant(m, msg, where);
        } else if (strcmp(role, "tool") == 0) {
            st = map_tool_result(m, msg, where);
        } else {
            st = gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "%s.role: '%.64s' is not supported (system, developer, user, assistant, tool)",
                where, role);
        }
        if (st) return st;
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_openai_chat_to_harmony(const json_t *request,
                                            const gptoss_openai_chat_options *options,
                                            gptoss_harmony_conversation *conversation,
                                            gptoss_error *error) {
    if (!json_is_object(request))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "request: expected a JSON object");
    const json_t *messages = json_object_get(request, "messages");
    if (!json_is_array(messages))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "messages: expected an array of messages");
    if (json_array_size(messages) == 0)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "messages: must contain at least one message");
    mapping m = {request, conversation, NULL, 0, error};
    gptoss_status st = map_messages(&m, messages, options);
    for (size_t i = 0; i < m.n_calls; i++) {
        free(m.calls[i].id);
        free(m.calls[i].name);
    }
    free(m.calls);
    return st;
}
