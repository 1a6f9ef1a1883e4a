/*
 * harmony_render.c - renders a harmony conversation as a stream of text fragments and
 * special tokens (spec 6.1-6.6), and the text form of that stream.
 *
 * Owns: the rendering rules (message header layout, system and developer content sections,
 * tools sections, dropping earlier analysis, completion and training endings). Must not
 * tokenize: the token form lives in harmony_render_tokens.c so that text rendering needs no
 * tokenizer. The fragment boundaries match harmony's (role, ":name", " to=R", channel name,
 * content type and each content item are separate fragments), so encoding fragment by
 * fragment gives harmony's token ids.
 */
#include "chat/chat_buf.h"
#include "chat/harmony.h"

#include "util/error.h"

#include <stdlib.h>
#include <string.h>

static const char *const constrain_marker = "<|constrain|>";

const char *gptoss_harmony_special_name(int32_t id) {
    switch (id) {
    case GPTOSS_TOKEN_STARTOFTEXT:
        return "<|startoftext|>";
    case GPTOSS_TOKEN_ENDOFTEXT:
        return "<|endoftext|>";
    case GPTOSS_TOKEN_RETURN:
        return "<|return|>";
    case GPTOSS_TOKEN_CONSTRAIN:
        return "<|constrain|>";
    case GPTOSS_TOKEN_CHANNEL:
        return "<|channel|>";
    case GPTOSS_TOKEN_START:
        return "<|start|>";
    case GPTOSS_TOKEN_END:
        return "<|end|>";
    case GPTOSS_TOKEN_MESSAGE:
        return "<|message|>";
    case GPTOSS_TOKEN_CALL:
        return "<|call|>";
    }
    return NULL;
}

gptoss_harmony_render_options gptoss_harmony_render_options_default(void) {
    gptoss_harmony_render_options options = {
        .mode = GPTOSS_RENDER_COMPLETION,
        .next_turn_role = GPTOSS_ROLE_ASSISTANT,
        .auto_drop_analysis = true,
    };
    return options;
}

static gptoss_status oom(gptoss_error *error) {
    return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory while rendering");
}

static gptoss_status emit_text(const gptoss_harmony_sink *sink, const char *text, size_t len,
                               gptoss_error *error) {
    return sink->text(sink->user, text, len, error);
}

static gptoss_status emit_str(const gptoss_harmony_sink *sink, const char *text,
                              gptoss_error *error) {
    return sink->text(sink->user, text, strlen(text), error);
}

/* Appends the lines of text (split at '\n', a trailing '\r' removed, no empty last line for a
 * trailing '\n', none at all for "") each as its own item prefixed by `prefix`. */
static bool push_lines(gptoss_chat_buf *out, bool *first_item, const char *text,
                       const char *prefix) {
    if (!text) return true;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        size_t shown = (n > 0 && p[n - 1] == '\r') ? n - 1 : n;
        if (!*first_item && !gptoss_chat_buf_puts(out, "\n")) return false;
        *first_item = false;
        if (!gptoss_chat_buf_puts(out, prefix) || !gptoss_chat_buf_append(out, p, shown))
            return false;
        p += n;
        if (*p == '\n') p++;
    }
    return true;
}

/* Items of a namespace block are joined by "\n"; item() starts a new one. */
static bool item(gptoss_chat_buf *out, bool *first_item, const char *text) {
    if (!*first_item && !gptoss_chat_buf_puts(out, "\n")) return false;
    *first_item = false;
    return gptoss_chat_buf_puts(out, text);
}

static int compare_namespaces(const void *a, const void *b) {
    const gptoss_harmony_namespace *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* "# Tools\n\n" + one block per namespace (sorted by name), blocks joined by "\n\n". */
static bool tools_section(const gptoss_harmony_tools *tools, gptoss_chat_buf *out) {
    const gptoss_harmony_namespace **sorted = malloc(tools->n_namespaces * sizeof *sorted);
    if (!sorted) return false;
    for (size_t i = 0; i < tools->n_namespaces; i++)
        sorted[i] = &tools->namespaces[i];
    /* qsort is not stable, but equal names never happen in a well-formed set. */
    qsort(sorted, tools->n_namespaces, sizeof *sorted, compare_namespaces);
    bool ok = gptoss_chat_buf_puts(out, "# Tools");
    for (size_t i = 0; ok && i < tools->n_namespaces; i++) {
        const gptoss_harmony_namespace *ns = sorted[i];
        bool has_tools = ns->n_tools > 0;
        bool first = true;
        ok = gptoss_chat_buf_puts(out, "\n\n") && item(out, &first, "## ") &&
             gptoss_chat_buf_puts(out, ns->name) && gptoss_chat_buf_puts(out, "\n") &&
             push_lines(out, &first, ns->description, has_tools ? "// " : "");
        if (!ok || !has_tools) continue;
        ok = item(out, &first, "namespace ") && gptoss_chat_buf_puts(out, ns->name) &&
             gptoss_chat_buf_puts(out, " {\n");
        for (size_t j = 0; ok && j < ns->n_tools; j++) {
            const gptoss_harmony_tool *tool = &ns->tools[j];
            ok = push_lines(out, &first, tool->description, "// ") && item(out, &first, "type ") &&
                 gptoss_chat_buf_puts(out, tool->name);
            if (ok && tool->parameters)
                ok = gptoss_chat_buf_puts(out, " = (_: ") &&
                     gptoss_harmony_schema_to_typescript(tool->parameters, "", out) &&
                     gptoss_chat_buf_puts(out, ") => any;\n");
            else if (ok)
                ok = gptoss_chat_buf_puts(out, " = () => any;\n");
        }
        ok = ok && item(out, &first, "} // namespace ") && gptoss_chat_buf_puts(out, ns->name);
    }
    free(sorted);
    return ok;
}

/* Sections are joined by a blank line; section() starts a new one. */
static bool section(gptoss_chat_buf *out, bool *first_section) {
    if (!*first_section && !gptoss_chat_buf_puts(out, "\n\n")) return false;
    *first_section = false;
    return true;
}

static bool system_text(const gptoss_harmony_system_content *sys, bool has_function_tools,
                        gptoss_chat_buf *out) {
    bool first_section = true;
    bool ok = true;
    const char *top[3] = {sys->model_identity, sys->knowledge_cutoff, sys->conversation_start_date};
    const char *labels[3] = {"", "Knowledge cutoff: ", "Current date: "};
    bool first_line = true;
    for (int i = 0; ok && i < 3; i++) {
        if (!top[i]) continue;
        if (first_line)
            ok = section(out, &first_section);
        else
            ok = gptoss_chat_buf_puts(out, "\n");
        first_line = false;
        ok = ok && gptoss_chat_buf_puts(out, labels[i]) && gptoss_chat_buf_puts(out, top[i]);
    }
    const char *effort = gptoss_reasoning_effort_name(sys->reasoning_effort);
    if (ok && effort)
        ok = section(out, &first_section) && gptoss_chat_buf_printf(out, "Reasoning: %s", effort);
    if (ok && sys->tools.n_namespaces > 0)
        ok = section(out, &first_section) && tools_section(&sys->tools, out);
    if (ok && sys->has_channel_config && sys->n_valid_channels > 0) {
        ok = section(out, &first_section) && gptoss_chat_buf_puts(out, "# Valid channels: ");
        for (size_t i = 0; ok && i < sys->n_valid_channels; i++)
            ok = gptoss_chat_buf_printf(out, "%s%s", i ? ", " : "", sys->valid_channels[i]);
        ok = ok && gptoss_chat_buf_puts(out, ".");
        if (ok && sys->channel_required)
            ok = gptoss_chat_buf_puts(out, " Channel must be included for every message.");
        if (ok && has_function_tools)
            ok = gptoss_chat_buf_puts(
                out, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    }
    return ok && gptoss_chat_buf_terminate(out);
}

static bool developer_text(const gptoss_harmony_developer_content *dev, gptoss_chat_buf *out) {
    bool first_section = true;
    bool ok = true;
    if (dev->instructions)
        ok = section(out, &first_section) && gptoss_chat_buf_puts(out, "# Instructions") &&
             section(out, &first_section) && gptoss_chat_buf_puts(out, dev->instructions);
    if (ok && dev->tools.n_namespaces > 0)
        ok = section(out, &first_section) && tools_section(&dev->tools, out);
    return ok && gptoss_chat_buf_terminate(out);
}

static bool has_function_tools(const gptoss_harmony_conversation *conversation) {
    for (size_t i = 0; i < conversation->n_messages; i++) {
        const gptoss_harmony_message *m = &conversation->messages[i];
        for (size_t j = 0; j < m->n_content; j++) {
            if (m->content[j].kind != GPTOSS_CONTENT_DEVELOPER) continue;
            const gptoss_harmony_tools *tools = &m->content[j].developer.tools;
            for (size_t k = 0; k < tools->n_namespaces; k++)
                if (strcmp(tools->namespaces[k].name, "functions") == 0 &&
                    tools->namespaces[k].n_tools > 0)
                    return true;
        }
    }
    return false;
}

static bool is_channel(const gptoss_harmony_message *m, const char *channel) {
    return m->channel && strcmp(m->channel, channel) == 0;
}

static gptoss_status render_message(const gptoss_harmony_message *m, size_t index,
                                    bool function_tools, bool end_with_return,
                                    const gptoss_harmony_sink *sink, gptoss_error *error) {
    gptoss_status st;
    if ((st = sink->special(sink->user, GPTOSS_TOKEN_START, error))) return st;
    if (m->role == GPTOSS_ROLE_TOOL) {
        if (!m->name)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "message %zu: a tool message needs the tool's name as its author", index);
        if ((st = emit_str(sink, m->name, error))) return st;
    } else {
        if ((st = emit_str(sink, gptoss_harmony_role_name(m->role), error))) return st;
        if (m->name) {
            gptoss_chat_buf b = {0};
            if (!gptoss_chat_buf_printf(&b, ":%s", m->name)) return oom(error);
            st = emit_text(sink, b.data, b.len, error);
            gptoss_chat_buf_free(&b);
            if (st) return st;
        }
    }
    if (m->recipient && strcmp(m->recipient, "all") != 0) {
        gptoss_chat_buf b = {0};
        if (!gptoss_chat_buf_printf(&b, " to=%s", m->recipient)) return oom(error);
        st = emit_text(sink, b.data, b.len, error);
        gptoss_chat_buf_free(&b);
        if (st) return st;
    }
    if (m->channel) {
        if ((st = sink->special(sink->user, GPTOSS_TOKEN_CHANNEL, error)) ||
            (st = emit_str(sink, m->channel, error)))
            return st;
    }
    if (m->content_type) {
        size_t marker_len = strlen(constrain_marker);
        if (strncmp(m->content_type, constrain_marker, marker_len) == 0) {
            if ((st = emit_str(sink, " ", error)) ||
                (st = sink->special(sink->user, GPTOSS_TOKEN_CONSTRAIN, error)) ||
                (st = emit_str(sink, m->content_type + marker_len, error)))
                return st;
        } else {
            gptoss_chat_buf b = {0};
            if (!gptoss_chat_buf_printf(&b, " %s", m->content_type)) return oom(error);
            st = emit_text(sink, b.data, b.len, error);
            gptoss_chat_buf_free(&b);
            if (st) return st;
        }
    }
    if ((st = sink->special(sink->user, GPTOSS_TOKEN_MESSAGE, error))) return st;
    for (size_t i = 0; i < m->n_content; i++) {
        const gptoss_harmony_content *c = &m->content[i];
        if (c->kind == GPTOSS_CONTENT_TEXT) {
            if ((st = emit_text(sink, c->text, c->text_len, error))) return st;
            continue;
        }
        if (c->kind == GPTOSS_CONTENT_SYSTEM && m->role != GPTOSS_ROLE_SYSTEM)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "message %zu: system content may only appear in a system message", index);
        if (c->kind == GPTOSS_CONTENT_DEVELOPER && m->role != GPTOSS_ROLE_DEVELOPER)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "message %zu: developer content may only appear in a developer message", index);
        gptoss_chat_buf b = {0};
        bool ok = c->kind == GPTOSS_CONTENT_SYSTEM ? system_text(&c->system, function_tools, &b)
                                                   : developer_text(&c->developer, &b);
        if (!ok) {
            gptoss_chat_buf_free(&b);
            return oom(error);
        }
        st = emit_text(sink, b.data, b.len, error);
        gptoss_chat_buf_free(&b);
        if (st) return st;
    }
    int32_t end = GPTOSS_TOKEN_END;
    if (m->role == GPTOSS_ROLE_ASSISTANT && m->recipient) end = GPTOSS_TOKEN_CALL;
    if (end_with_return) end = GPTOSS_TOKEN_RETURN;
    return sink->special(sink->user, end, error);
}

gptoss_status gptoss_harmony_render_to_sink(const gptoss_harmony_conversation *conversation,
                                            const gptoss_harmony_render_options *options,
                                            const gptoss_harmony_sink *sink, gptoss_error *error) {
    size_t n = conversation->n_messages;
    const gptoss_harmony_message *messages = conversation->messages;
    bool function_tools = has_function_tools(conversation);

    /* Dropping earlier chain of thought (spec 6.6): only when the last assistant message is
     * on the final channel, and then only analysis before the first final message. */
    bool last_assistant_is_final = false;
    for (size_t i = n; i-- > 0;) {
        if (messages[i].role == GPTOSS_ROLE_ASSISTANT) {
            last_assistant_is_final = is_channel(&messages[i], "final");
            break;
        }
    }
    size_t first_final = n;
    for (size_t i = 0; i < n; i++) {
        if (is_channel(&messages[i], "final")) {
            first_final = i;
            break;
        }
    }
    bool drop = options->auto_drop_analysis && last_assistant_is_final;
    bool training_return = options->mode == GPTOSS_RENDER_TRAINING && n > 0 &&
                           messages[n - 1].role == GPTOSS_ROLE_ASSISTANT &&
                           is_channel(&messages[n - 1], "final");

    for (size_t i = 0; i < n; i++) {
        if (drop && i < first_final && is_channel(&messages[i], "analysis")) continue;
        gptoss_status st = render_message(&messages[i], i, function_tools,
                                          training_return && i == n - 1, sink, error);
        if (st) return st;
    }
    if (options->mode == GPTOSS_RENDER_COMPLETION) {
        gptoss_status st = sink->special(sink->user, GPTOSS_TOKEN_START, error);
        if (st) return st;
        return emit_str(sink, gptoss_harmony_role_name(options->next_turn_role), error);
    }
    return GPTOSS_OK;
}

/* ---- text form ---------------------------------------------------------------------------- */

static gptoss_status text_sink_text(void *user, const char *bytes, size_t len,
                                    gptoss_error *error) {
    return gptoss_chat_buf_append(user, bytes, len) ? GPTOSS_OK : oom(error);
}

static gptoss_status text_sink_special(void *user, int32_t id, gptoss_error *error) {
    const char *name = gptoss_harmony_special_name(id);
    if (!name)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "token %d is not a harmony token", (int)id);
    return gptoss_chat_buf_puts(user, name) ? GPTOSS_OK : oom(error);
}

gptoss_status gptoss_harmony_render_text(const gptoss_harmony_conversation *conversation,
                                         const gptoss_harmony_render_options *options, char **text,
                                         size_t *len, gptoss_error *error) {
    gptoss_chat_buf out = {0};
    gptoss_harmony_sink sink = {text_sink_text, text_sink_special, &out};
    gptoss_status st = gptoss_harmony_render_to_sink(conversation, options, &sink, error);
    if (st) {
        gptoss_chat_buf_free(&out);
        return st;
    }
    *text = gptoss_chat_buf_take(&out, len);
    return *text ? GPTOSS_OK : oom(error);
}
