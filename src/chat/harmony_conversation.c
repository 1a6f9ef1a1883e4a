/*
 * harmony_conversation.c - building, freeing and reading (reference JSON form) harmony
 * conversations; harmony's default system content and built-in tool namespaces.
 *
 * Owns: every allocation reachable from a gptoss_harmony_conversation. Must not render or
 * parse (harmony_render.c, harmony_parser.c do).
 */
#include "chat/harmony.h"

#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_names[] = {"system", "developer", "user", "assistant", "tool"};

const char *gptoss_harmony_role_name(gptoss_harmony_role role) {
    if ((unsigned)role > GPTOSS_ROLE_TOOL) return "unknown";
    return role_names[role];
}

bool gptoss_harmony_role_parse(const char *word, size_t len, gptoss_harmony_role *role) {
    for (int i = 0; i <= GPTOSS_ROLE_TOOL; i++) {
        if (strlen(role_names[i]) == len && memcmp(role_names[i], word, len) == 0) {
            *role = (gptoss_harmony_role)i;
            return true;
        }
    }
    return false;
}

const char *gptoss_reasoning_effort_name(gptoss_reasoning_effort effort) {
    switch (effort) {
    case GPTOSS_EFFORT_LOW:
        return "low";
    case GPTOSS_EFFORT_MEDIUM:
        return "medium";
    case GPTOSS_EFFORT_HIGH:
        return "high";
    case GPTOSS_EFFORT_NONE:
        break;
    }
    return NULL;
}

bool gptoss_reasoning_effort_parse(const char *word, gptoss_reasoning_effort *effort) {
    if (strcmp(word, "low") == 0)
        *effort = GPTOSS_EFFORT_LOW;
    else if (strcmp(word, "medium") == 0)
        *effort = GPTOSS_EFFORT_MEDIUM;
    else if (strcmp(word, "high") == 0)
        *effort = GPTOSS_EFFORT_HIGH;
    else
        return false;
    return true;
}

static gptoss_status oom(gptoss_error *error) {
    return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                            "out of memory building a conversation");
}

/* Grows *items (of item_size bytes each) to hold one more; the new item is zeroed. */
static void *grow(void **items, size_t *n, size_t item_size) {
    void *bigger = realloc(*items, (*n + 1) * item_size);
    if (!bigger) return NULL;
    *items = bigger;
    void *item = (char *)bigger + *n * item_size;
    memset(item, 0, item_size);
    (*n)++;
    return item;
}

static void tools_free(gptoss_harmony_tools *tools) {
    for (size_t i = 0; i < tools->n_namespaces; i++) {
        gptoss_harmony_namespace *ns = &tools->namespaces[i];
        for (size_t j = 0; j < ns->n_tools; j++) {
            free(ns->tools[j].name);
            free(ns->tools[j].description);
            json_decref(ns->tools[j].parameters);
        }
        free(ns->tools);
        free(ns->name);
        free(ns->description);
    }
    free(tools->namespaces);
    memset(tools, 0, sizeof *tools);
}

static void content_free(gptoss_harmony_content *content) {
    free(content->text);
    gptoss_harmony_system_content *sys = &content->system;
    free(sys->model_identity);
    free(sys->knowledge_cutoff);
    free(sys->conversation_start_date);
    tools_free(&sys->tools);
    for (size_t i = 0; i < sys->n_valid_channels; i++)
        free(sys->valid_channels[i]);
    free(sys->valid_channels);
    free(content->developer.instructions);
    tools_free(&content->developer.tools);
}

void gptoss_harmony_conversation_init(gptoss_harmony_conversation *conversation) {
    memset(conversation, 0, sizeof *conversation);
}

void gptoss_harmony_conversation_free(gptoss_harmony_conversation *conversation) {
    if (!conversation) return;
    for (size_t i = 0; i < conversation->n_messages; i++) {
        gptoss_harmony_message *m = &conversation->messages[i];
        free(m->name);
        free(m->recipient);
        free(m->channel);
        free(m->content_type);
        for (size_t j = 0; j < m->n_content; j++)
            content_free(&m->content[j]);
        free(m->content);
    }
    free(conversation->messages);
    memset(conversation, 0, sizeof *conversation);
}

gptoss_status gptoss_harmony_conversation_push(gptoss_harmony_conversation *conversation,
                                               gptoss_harmony_role role,
                                               gptoss_harmony_message **out, gptoss_error *error) {
    if (conversation->n_messages == conversation->capacity) {
        size_t capacity = conversation->capacity ? conversation->capacity * 2 : 8;
        gptoss_harmony_message *bigger = realloc(conversation->messages, capacity * sizeof *bigger);
        if (!bigger) return oom(error);
        conversation->messages = bigger;
        conversation->capacity = capacity;
    }
    gptoss_harmony_message *m = &conversation->messages[conversation->n_messages++];
    memset(m, 0, sizeof *m);
    m->role = role;
    if (out) *out = m;
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_set_string(char **field, const char *value, gptoss_error *error) {
    char *copy = NULL;
    if (value && !(copy = strdup(value))) return oom(error);
    free(*field);
    *field = copy;
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_message_add_text(gptoss_harmony_message *message, const char *text,
                                              size_t len, gptoss_error *error) {
    char *copy = malloc(len + 1);
    if (!copy) return oom(error);
    if (len) memcpy(copy, text, len);
    copy[len] = '\0';
    gptoss_harmony_content *c = grow((void **)&message->content, &message->n_content, sizeof *c);
    if (!c) {
        free(copy);
        return oom(error);
    }
    c->kind = GPTOSS_CONTENT_TEXT;
    c->text = copy;
    c->text_len = len;
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_message_add_system(gptoss_harmony_message *message,
                                                gptoss_harmony_system_content **out,
                                                gptoss_error *error) {
    gptoss_harmony_content *c = grow((void **)&message->content, &message->n_content, sizeof *c);
    if (!c) return oom(error);
    c->kind = GPTOSS_CONTENT_SYSTEM;
    *out = &c->system;
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_message_add_developer(gptoss_harmony_message *message,
                                                   gptoss_harmony_developer_content **out,
                                                   gptoss_error *error) {
    gptoss_harmony_content *c = grow((void **)&message->content, &message->n_content, sizeof *c);
    if (!c) return oom(error);
    c->kind = GPTOSS_CONTENT_DEVELOPER;
    *out = &c->developer;
    return GPTOSS_OK;
}

static gptoss_status add_channel(gptoss_harmony_system_content *system, const char *name,
                                 gptoss_error *error) {
    char *copy = strdup(name);
    if (!copy) return oom(error);
    char **slot = grow((void **)&system->valid_channels, &system->n_valid_channels, sizeof *slot);
    if (!slot) {
        free(copy);
        return oom(error);
    }
    *slot = copy;
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_system_defaults(gptoss_harmony_system_content *system,
                                             gptoss_error *error) {
    gptoss_status st;
    if ((st = gptoss_harmony_set_string(
             &system->model_identity, "You are ChatGPT, a large language model trained by OpenAI.",
             error)) ||
        (st = gptoss_harmony_set_string(&system->knowledge_cutoff, "2024-06", error)))
        return st;
    system->reasoning_effort = GPTOSS_EFFORT_MEDIUM;
    system->has_channel_config = true;
    system->channel_required = true;
    static const char *const channels[] = {"analysis", "commentary", "final"};
    for (size_t i = 0; i < 3; i++)
        if ((st = add_channel(system, channels[i], error))) return st;
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_tools_add_namespace(gptoss_harmony_tools *tools, const char *name,
                                                 const char *description,
                                                 gptoss_harmony_namespace **out,
                                                 gptoss_error *error) {
    char *name_copy = strdup(name);
    char *desc_copy = description ? strdup(description) : NULL;
    gptoss_harmony_namespace *ns = NULL;
    if (name_copy && (desc_copy || !description))
        ns = grow((void **)&tools->namespaces, &tools->n_namespaces, sizeof *ns);
    if (!ns) {
        free(name_copy);
        free(desc_copy);
        return oom(error);
    }
    ns->name = name_copy;
    ns->description = desc_copy;
    if (out) *out = ns;
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_namespace_add_tool(gptoss_harmony_namespace *ns, const char *name,
                                                const char *description, json_t *parameters,
                                                gptoss_error *error) {
    char *name_copy = strdup(name);
    char *desc_copy = description ? strdup(description) : NULL;
    gptoss_harmony_tool *tool = NULL;
    if (name_copy && (desc_copy || !description))
        tool = grow((void **)&ns->tools, &ns->n_tools, sizeof *tool);
    if (!tool) {
        free(name_copy);
        free(desc_copy);
        return oom(error);
    }
    tool->name = name_copy;
    tool->description = desc_copy;
    tool->parameters = parameters ? json_incref(parameters) : NULL;
    return GPTOSS_OK;
}

/* ---- reading the reference JSON form --------------------------------------------------- */

/* Reads an optional string member: absent or null leaves *out NULL. */
static gptoss_status opt_string(const json_t *object, const char *key, const char *where,
                                char **out, gptoss_error *error) {
    const json_t *value = json_object_get(object, key);
    if (!value || json_is_null(value)) return GPTOSS_OK;
    if (!json_is_string(value))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s.%s: expected a string or null", where,
                                key);
    return gptoss_harmony_set_string(out, json_string_value(value), error);
}

static gptoss_status read_tools(const json_t *list, const char *where, gptoss_harmony_tools *tools,
                                gptoss_error *error) {
    if (!list || json_is_null(list)) return GPTOSS_OK;
    if (!json_is_array(list))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s.tool_namespaces: expected a list",
                                where);
    size_t i;
    const json_t *item;
    json_array_foreach(list, i, item) {
        const json_t *name = json_object_get(item, "name");
        if (!json_is_string(name))
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s.tool_namespaces[%zu].name: expected a string", where, i);
        const json_t *desc = json_object_get(item, "description");
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return gptoss_set_error(
                error, GPTOSS_ERR_FORMAT,
                "%s.tool_namespaces[%zu].description: expected a string or null", where, i);
        gptoss_harmony_namespace *ns = NULL;
        gptoss_status st = gptoss_harmony_tools_add_namespace(
            tools, json_string_value(name), json_is_string(desc) ? json_string_value(desc) : NULL,
            &ns, error);
        if (st) return st;
        const json_t *tool_list = json_object_get(item, "tools");
        if (tool_list && !json_is_array(tool_list))
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s.tool_namespaces[%zu].tools: expected a list", where, i);
        size_t j;
        const json_t *tool;
        json_array_foreach(tool_list, j, tool) {
            const json_t *tool_name = json_object_get(tool, "name");
            const json_t *tool_desc = json_object_get(tool, "description");
            json_t *params = json_object_get(tool, "parameters");
            if (!json_is_string(tool_name))
                return gptoss_set_error(
                    error, GPTOSS_ERR_FORMAT,
                    "%s.tool_namespaces[%zu].tools[%zu].name: expected a string", where, i, j);
            if (tool_desc && !json_is_null(tool_desc) && !json_is_string(tool_desc))
                return gptoss_set_error(
                    error, GPTOSS_ERR_FORMAT,
                    "%s.tool_namespaces[%zu].tools[%zu].description: expected a string", where, i,
                    j);
            if (json_is_null(params)) params = NULL;
            st = gptoss_harmony_namespace_add_tool(
                ns, json_string_value(tool_name),
                json_is_string(tool_desc) ? json_string_value(tool_desc) : NULL, params, error);
            if (st) return st;
        }
    }
    return GPTOSS_OK;
}

static gptoss_status read_content(const json_t *item, const char *where, gptoss_harmony_message *m,
                                  gptoss_error *error) {
    const char *type = json_string_value(json_object_get(item, "type"));
    gptoss_status st;
    if (!type)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s.type: expected a string", where);
    if (strcmp(type, "text") == 0) {
        const json_t *text = json_object_get(item, "text");
        if (!json_is_string(text))
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s.text: expected a string", where);
        return gptoss_harmony_message_add_text(m, json_string_value(text), json_string_length(text),
                                               error);
    }
    if (strcmp(type, "system") == 0) {
        gptoss_harmony_system_content *sys = NULL;
        if ((st = gptoss_harmony_message_add_system(m, &sys, error)) ||
            (st = opt_string(item, "model_identity", where, &sys->model_identity, error)) ||
            (st = opt_string(item, "knowledge_cutoff", where, &sys->knowledge_cutoff, error)) ||
            (st = opt_string(item, "conversation_start_date", where, &sys->conversation_start_date,
                             error)))
            return st;
        const json_t *effort = json_object_get(item, "reasoning_effort");
        if (effort && !json_is_null(effort) &&
            !(json_is_string(effort) &&
              gptoss_reasoning_effort_parse(json_string_value(effort), &sys->reasoning_effort)))
            return gptoss_set_error(
                error, GPTOSS_ERR_FORMAT,
                "%s.reasoning_effort: expected \"low\", \"medium\", \"high\" or null", where);
        if ((st = read_tools(json_object_get(item, "tool_namespaces"), where, &sys->tools, error)))
            return st;
        const json_t *config = json_object_get(item, "channel_config");
        if (config && !json_is_null(config)) {
            const json_t *channels = json_object_get(config, "valid_channels");
            if (!json_is_array(channels))
                return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                        "%s.channel_config.valid_channels: expected a list", where);
            sys->has_channel_config = true;
            sys->channel_required = json_is_true(json_object_get(config, "channel_required"));
            size_t i;
            const json_t *ch;
            json_array_foreach(channels, i, ch) {
                if (!json_is_string(ch))
                    return gptoss_set_error(
                        error, GPTOSS_ERR_FORMAT,
                        "%s.channel_config.valid_channels[%zu]: expected a string", where, i);
                if ((st = add_channel(sys, json_string_value(ch), error))) return st;
            }
        }
        return GPTOSS_OK;
    }
    if (strcmp(type, "developer") == 0) {
        gptoss_harmony_developer_content *dev = NULL;
        if ((st = gptoss_harmony_message_add_developer(m, &dev, error)) ||
            (st = opt_string(item, "instructions", where, &dev->instructions, error)))
            return st;
        return read_tools(json_object_get(item, "tool_namespaces"), where, &dev->tools, error);
    }
    return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                            "%s.type: '%s' is not a content type (text, system, developer)", where,
                            type);
}

gptoss_status gptoss_harmony_conversation_from_json(const json_t *messages,
                                                    gptoss_harmony_conversation *conversation,
                                                    gptoss_error *error) {
    if (!json_is_array(messages))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "conversation: expected a list of messages");
    size_t i;
    const json_t *item;
    json_array_foreach(messages, i, item) {
        char where[96];
        snprintf(where, sizeof where, "[%zu]", i);
        if (!json_is_object(item))
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: expected an object", where);
        const char *role_name = json_string_value(json_object_get(item, "role"));
        gptoss_harmony_role role;
        if (!role_name || !gptoss_harmony_role_parse(role_name, strlen(role_name), &role))
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s.role: expected system, developer, user, assistant or tool",
                                    where);
        gptoss_harmony_message *m = NULL;
        gptoss_status st = gptoss_harmony_conversation_push(conversation, role, &m, error);
        if (st || (st = opt_string(item, "name", where, &m->name, error)) ||
            (st = opt_string(item, "recipient", where, &m->recipient, error)) ||
            (st = opt_string(item, "channel", where, &m->channel, error)) ||
            (st = opt_string(item, "content_type", where, &m->content_type, error)))
            return st;
        const json_t *content = json_object_get(item, "content");
        if (!json_is_array(content))
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s.content: expected a list", where);
        size_t j;
        const json_t *part;
        json_array_foreach(content, j, part) {
            char part_where[128];
            snprintf(part_where, sizeof part_where, "%s.content[%zu]", where, j);
            if ((st = read_content(part, part_where, m, error))) return st;
        }
    }
    return GPTOSS_OK;
}

/* ---- built-in tools ----------------------------------------------------------------------
 * The browser and python namespaces exactly as the model saw them in training (harmony's
 * built-in tool descriptions). Kept as JSON so the schemas go through the same renderer as
 * developer functions. */
static const char builtin_tools_json[] =
    "["
    "{\"name\":\"browser\",\"description\":\"Tool for browsing.\\nThe `cursor` appears in brackets "
    "before each browsing display: `[{cursor}]`.\\nCite information from the tool using the "
    "following format:\\n`\\u3010{cursor}\\u2020L{line_start}(-L{line_end})?\\u3011`, for example: "
    "`\\u30106\\u2020L9-L11\\u3011` or `\\u30108\\u2020L3\\u3011`.\\nDo not quote more than 10 "
    "words "
    "directly from the tool output.\\nsources=web (default: web)\",\"tools\":["
    "{\"name\":\"search\",\"description\":\"Searches for information related to `query` and "
    "displays `topn` results.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"query\":{"
    "\"type\":\"string\"},\"topn\":{\"type\":\"number\",\"default\":10},\"source\":{\"type\":"
    "\"string\"}},\"required\":[\"query\"]}},"
    "{\"name\":\"open\",\"description\":\"Opens the link `id` from the page indicated by `cursor` "
    "starting at line number `loc`, showing `num_lines` lines.\\nValid link ids are displayed with "
    "the formatting: `\\u3010{id}\\u2020.*\\u3011`.\\nIf `cursor` is not provided, the most recent "
    "page is implied.\\nIf `id` is a string, it is treated as a fully qualified URL associated "
    "with "
    "`source`.\\nIf `loc` is not provided, the viewport will be positioned at the beginning of the "
    "document or centered on the most relevant passage, if available.\\nUse this function without "
    "`id` to scroll to a new location of an opened page.\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"id\":{\"type\":[\"number\",\"string\"],\"default\":-1},\"cursor\":{\"type\":"
    "\"number\",\"default\":-1},\"loc\":{\"type\":\"number\",\"default\":-1},\"num_lines\":{"
    "\"type\":"
    "\"number\",\"default\":-1},\"view_source\":{\"type\":\"boolean\",\"default\":false},"
    "\"source\":{"
    "\"type\":\"string\"}}}},"
    "{\"name\":\"find\",\"description\":\"Finds exact matches of `pattern` in the current page, or "
    "the page given by "
    "`cursor`.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"pattern\":{"
    "\"type\":\"string\"},\"cursor\":{\"type\":\"number\",\"default\":-1}},\"required\":["
    "\"pattern\"]"
    "}}]},"
    "{\"name\":\"python\",\"description\":\"Use this tool to execute Python code in your chain of "
    "thought. The code will not be shown to the user. This tool should be used for internal "
    "reasoning, but not for code that is intended to be visible to the user (e.g. when creating "
    "plots, tables, or files).\\n\\nWhen you send a message containing Python code to python, it "
    "will be executed in a stateful Jupyter notebook environment. python will respond with the "
    "output of the execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used "
    "to save and persist user files. Internet access for this session is UNKNOWN. Depends on the "
    "cluster.\",\"tools\":[]}"
    "]";

gptoss_status gptoss_harmony_tools_add_builtin(gptoss_harmony_tools *tools, const char *name,
                                               gptoss_error *error) {
    json_error_t jerr;
    json_t *all = json_loads(builtin_tools_json, 0, &jerr);
    if (!all) return oom(error);
    json_t *selected = json_array();
    size_t i;
    json_t *ns;
    json_array_foreach(all, i, ns) {
        if (strcmp(json_string_value(json_object_get(ns, "name")), name) == 0)
            json_array_append(selected, ns);
    }
    gptoss_status st;
    if (json_array_size(selected) == 0)
        st = gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                              "built-in tool '%s': expected \"browser\" or \"python\"", name);
    else
        st = read_tools(selected, "builtin", tools, error);
    json_decref(selected);
    json_decref(all);
    return st;
}
