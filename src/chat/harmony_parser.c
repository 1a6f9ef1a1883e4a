/*
 * harmony_parser.c - incremental harmony output parser (see harmony_parser.h for the
 * contract, the strict-mode errors and the non-strict recoveries).
 *
 * Owns: the state machine EXPECT_START -> HEADER -> CONTENT -> EXPECT_START, header
 * parsing (spec 6.7), UTF-8 assembly of content bytes, the completed messages and the
 * events of the last step. Must not allocate per token beyond amortized buffer growth.
 */
#include "chat/harmony_parser.h"

#include "chat/chat_buf.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PROBE (repair mode): text where <|start|> was expected that may be the role "assistant" of
 * a header whose <|start|> the model left out; held in `probe` until that is decided. */
enum parse_state { EXPECT_START, HEADER, CONTENT, PROBE };

static const char replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */
static const char channel_marker[] = "<|channel|>";
static const char constrain_marker[] = "<|constrain|>";

struct gptoss_harmony_parser {
    const gptoss_tokenizer *tokenizer;     /* token id -> bytes */
    gptoss_harmony_parser_options options; /* strict, initial role */
    enum parse_state state;
    bool has_next_role;                      /* the next header's role is already known */
    gptoss_harmony_role next_role;           /* ... and this is it */
    gptoss_chat_buf header;                  /* raw bytes of the header being read */
    gptoss_chat_buf probe;                   /* PROBE: the held text */
    gptoss_harmony_parsed_message current;   /* header fields of the open message */
    gptoss_chat_buf content;                 /* valid UTF-8 content of the open message */
    gptoss_chat_event_kind current_kind;     /* delta kind of the open message */
    bool current_recovered;                  /* the open message came from a recovery */
    unsigned char pending[4];                /* bytes of an unfinished UTF-8 character */
    size_t n_pending;                        /* [0, 4) */
    size_t n_pending_needed;                 /* length of the character being assembled */
    gptoss_chat_buf delta;                   /* content text the current step produced */
    bool has_delta;                          /* the current step produced content text */
    gptoss_harmony_parsed_message *messages; /* [n_messages] completed */
    size_t n_messages;
    size_t messages_capacity;
    gptoss_chat_event *events;  /* [n_events] of the current step */
    size_t *event_text_offsets; /* [n_events] offset in event_text, or SIZE_MAX */
    size_t n_events;
    size_t events_capacity;
    gptoss_chat_buf event_text; /* text of the current step's delta events */
    bool last_event_turn_end;   /* the last event emitted was TURN_END */
    int32_t last_token;         /* last id pushed, -1 before any */
    bool failed;                /* strict mode hit an error; stays failed */
    gptoss_error failure;       /* ... this one */
    bool out_of_memory;         /* an allocation failed during the step */
};

const char *gptoss_chat_event_kind_name(gptoss_chat_event_kind kind) {
    switch (kind) {
    case GPTOSS_CHAT_EVENT_REASONING_DELTA:
        return "reasoning_delta";
    case GPTOSS_CHAT_EVENT_ANSWER_DELTA:
        return "answer_delta";
    case GPTOSS_CHAT_EVENT_COMMENTARY_DELTA:
        return "commentary_delta";
    case GPTOSS_CHAT_EVENT_TOOL_CALL_START:
        return "tool_call_start";
    case GPTOSS_CHAT_EVENT_TOOL_CALL_ARGS_DELTA:
        return "tool_call_args_delta";
    case GPTOSS_CHAT_EVENT_MESSAGE_END:
        return "message_end";
    case GPTOSS_CHAT_EVENT_TURN_END:
        return "turn_end";
    }
    return "unknown";
}

const char *gptoss_chat_end_reason_name(gptoss_chat_end_reason reason) {
    switch (reason) {
    case GPTOSS_CHAT_END_NONE:
        return "none";
    case GPTOSS_CHAT_END_RETURN:
        return "return";
    case GPTOSS_CHAT_END_CALL:
        return "call";
    case GPTOSS_CHAT_END_END:
        return "end";
    case GPTOSS_CHAT_END_EOS:
        return "eos";
    case GPTOSS_CHAT_END_LENGTH:
        return "length";
    }
    return "unknown";
}

static bool is_stop(int32_t id) {
    return id == GPTOSS_TOKEN_END || id == GPTOSS_TOKEN_RETURN || id == GPTOSS_TOKEN_CALL;
}

static gptoss_chat_end_reason reason_of(int32_t id) {
    switch (id) {
    case GPTOSS_TOKEN_RETURN:
        return GPTOSS_CHAT_END_RETURN;
    case GPTOSS_TOKEN_CALL:
        return GPTOSS_CHAT_END_CALL;
    case GPTOSS_TOKEN_END:
        return GPTOSS_CHAT_END_END;
    case GPTOSS_TOKEN_ENDOFTEXT:
        return GPTOSS_CHAT_END_EOS;
    }
    return GPTOSS_CHAT_END_LENGTH;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Tokens with a meaning in harmony's grammar; other special tokens (<|startoftext|>, the
 * reserved ones) are noise to the repair mode. */
static bool is_markup(int32_t id) {
    return is_stop(id) || id == GPTOSS_TOKEN_START || id == GPTOSS_TOKEN_MESSAGE ||
           id == GPTOSS_TOKEN_CHANNEL || id == GPTOSS_TOKEN_CONSTRAIN ||
           id == GPTOSS_TOKEN_ENDOFTEXT;
}

/* ---- events ------------------------------------------------------------------------------ */

static gptoss_chat_event *new_event(gptoss_harmony_parser *p, gptoss_chat_event_kind kind) {
    if (p->n_events == p->events_capacity) {
        size_t capacity = p->events_capacity ? p->events_capacity * 2 : 8;
        gptoss_chat_event *events = realloc(p->events, capacity * sizeof *events);
        if (!events) {
            p->out_of_memory = true;
            return NULL;
        }
        p->events = events;
        size_t *offsets = realloc(p->event_text_offsets, capacity * sizeof *offsets);
        if (!offsets) {
            p->out_of_memory = true;
            return NULL;
        }
        p->event_text_offsets = offsets;
        p->events_capacity = capacity;
    }
    gptoss_chat_event *ev = &p->events[p->n_events];
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->role = p->current.role;
    ev->channel = p->current.channel;
    ev->recipient = p->current.recipient;
    ev->content_type = p->current.content_type;
    ev->message_index = p->n_messages;
    ev->recovered = p->current_recovered;
    p->event_text_offsets[p->n_events] = SIZE_MAX;
    p->n_events++;
    p->last_event_turn_end = kind == GPTOSS_CHAT_EVENT_TURN_END;
    return ev;
}

static void turn_end(gptoss_harmony_parser *p, gptoss_chat_end_reason reason) {
    gptoss_chat_event *ev = new_event(p, GPTOSS_CHAT_EVENT_TURN_END);
    if (ev) ev->reason = reason;
}

/* Valid UTF-8 text of the open message: into its content, the step's delta and an event
 * (consecutive text of one message in one step is merged into one event). */
static void emit_text(gptoss_harmony_parser *p, const char *bytes, size_t n) {
    if (!gptoss_chat_buf_append(&p->content, bytes, n) ||
        !gptoss_chat_buf_append(&p->delta, bytes, n)) {
        p->out_of_memory = true;
        return;
    }
    p->has_delta = true;
    gptoss_chat_event *last = p->n_events ? &p->events[p->n_events - 1] : NULL;
    if (!(last && last->kind == p->current_kind && last->message_index == p->n_messages &&
          p->event_text_offsets[p->n_events - 1] != SIZE_MAX &&
          last->recovered == p->current_recovered)) {
        last = new_event(p, p->current_kind);
        if (!last) return;
        p->event_text_offsets[p->n_events - 1] = p->event_text.len;
    }
    if (!gptoss_chat_buf_append(&p->event_text, bytes, n))
        p->out_of_memory = true;
    else
        last->len += n;
}

/* ---- UTF-8 assembly ------------------------------------------------------------------------ */

static size_t sequence_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

/* Whether c may follow the pending bytes (Unicode's well-formed table: no overlongs, no
 * surrogates, nothing past U+10FFFF). */
static bool valid_continuation(const gptoss_harmony_parser *p, unsigned char c) {
    if (p->n_pending == 1) {
        switch (p->pending[0]) {
        case 0xE0:
            return c >= 0xA0 && c <= 0xBF;
        case 0xED:
            return c >= 0x80 && c <= 0x9F;
        case 0xF0:
            return c >= 0x90 && c <= 0xBF;
        case 0xF4:
            return c >= 0x80 && c <= 0x8F;
        }
    }
    return c >= 0x80 && c <= 0xBF;
}

static void flush_pending(gptoss_harmony_parser *p) {
    if (p->n_pending == 0) return;
    p->n_pending = 0;
    emit_text(p, replacement, 3);
}

static void feed_bytes(gptoss_harmony_parser *p, const unsigned char *bytes, size_t n) {
    size_t run_start = 0; /* start of a run of ASCII/complete characters emitted at once */
    size_t i = 0;
    while (i < n) {
        unsigned char c = bytes[i];
        if (p->n_pending == 0) {
            size_t need = sequence_length(c);
            if (need == 1) {
                i++;
                continue;
            }
            if (i > run_start) emit_text(p, (const char *)bytes + run_start, i - run_start);
            if (need == 0) {
                emit_text(p, replacement, 3);
            } else {
                p->pending[0] = c;
                p->n_pending = 1;
                p->n_pending_needed = need;
            }
            i++;
            run_start = i;
            continue;
        }
        if (!valid_continuation(p, c)) {
            flush_pending(p); /* one U+FFFD for the maximal invalid subsequence */
            run_start = i;    /* c is looked at again as a fresh start */
            continue;
        }
        p->pending[p->n_pending++] = c;
        i++;
        run_start = i;
        if (p->n_pending == p->n_pending_needed) {
            emit_text(p, (const char *)p->pending, p->n_pending);
            p->n_pending = 0;
        }
    }
    if (n > run_start && p->n_pending == 0)
        emit_text(p, (const char *)bytes + run_start, n - run_start);
}

static void content_token(gptoss_harmony_parser *p, int32_t id) {
    size_t len = 0;
    const char *bytes = gptoss_tokenizer_token_bytes(p->tokenizer, id, &len);
    if (!bytes) {
        flush_pending(p);
        emit_text(p, replacement, 3);
        return;
    }
    feed_bytes(p, (const unsigned char *)bytes, len);
}

/* ---- messages ----------------------------------------------------------------------------- */

static void clear_current(gptoss_harmony_parser *p) {
    free(p->current.name);
    free(p->current.recipient);
    free(p->current.channel);
    free(p->current.content_type);
    memset(&p->current, 0, sizeof p->current);
    gptoss_chat_buf_free(&p->content);
    p->n_pending = 0;
    p->current_recovered = false;
}

static bool is_tool_call(const gptoss_harmony_parsed_message *m) {
    return m->role == GPTOSS_ROLE_ASSISTANT && m->recipient && strcmp(m->recipient, "all") != 0 &&
           strcmp(m->recipient, "user") != 0 && strcmp(m->recipient, "assistant") != 0;
}

/* Enters CONTENT for a message whose header fields are in p->current. */
static void begin_message(gptoss_harmony_parser *p) {
    p->state = CONTENT;
    p->has_next_role = false;
    gptoss_chat_buf_free(&p->header);
    const gptoss_harmony_parsed_message *m = &p->current;
    if (is_tool_call(m)) {
        p->current_kind = GPTOSS_CHAT_EVENT_TOOL_CALL_ARGS_DELTA;
        gptoss_chat_event *ev = new_event(p, GPTOSS_CHAT_EVENT_TOOL_CALL_START);
        if (ev) {
            ev->text = m->recipient;
            ev->len = strlen(m->recipient);
        }
    } else if (m->role == GPTOSS_ROLE_ASSISTANT && m->channel &&
               strcmp(m->channel, "analysis") == 0) {
        p->current_kind = GPTOSS_CHAT_EVENT_REASONING_DELTA;
    } else if (m->role == GPTOSS_ROLE_ASSISTANT && m->channel &&
               strcmp(m->channel, "commentary") == 0) {
        p->current_kind = GPTOSS_CHAT_EVENT_COMMENTARY_DELTA;
    } else {
        p->current_kind = GPTOSS_CHAT_EVENT_ANSWER_DELTA;
    }
}

/* Closes the open message: held bytes flushed, message stored, MESSAGE_END emitted. */
static void close_message(gptoss_harmony_parser *p, int32_t stop_token,
                          gptoss_chat_end_reason reason) {
    flush_pending(p);
    gptoss_chat_event *ev = new_event(p, GPTOSS_CHAT_EVENT_MESSAGE_END);
    if (ev) ev->reason = reason;
    if (p->n_messages == p->messages_capacity) {
        size_t capacity = p->messages_capacity ? p->messages_capacity * 2 : 8;
        gptoss_harmony_parsed_message *m = realloc(p->messages, capacity * sizeof *m);
        if (!m) {
            p->out_of_memory = true;
            clear_current(p);
            p->state = EXPECT_START;
            return;
        }
        p->messages = m;
        p->messages_capacity = capacity;
    }
    gptoss_harmony_parsed_message *m = &p->messages[p->n_messages++];
    *m = p->current;
    m->stop_token = stop_token;
    m->content = gptoss_chat_buf_take(&p->content, &m->content_len);
    if (!m->content) {
        p->out_of_memory = true;
        m->content = calloc(1, 1);
        m->content_len = 0;
    }
    memset(&p->current, 0, sizeof p->current); /* fields now owned by the message */
    p->current_recovered = false;
    p->n_pending = 0;
    p->state = EXPECT_START;
}

/* ---- headers ------------------------------------------------------------------------------ */

/* Working copy of the header: NULs (never valid in a header) become spaces. */
static char *header_string(const gptoss_harmony_parser *p) {
    char *s = gptoss_chat_strndup(p->header.data ? p->header.data : "", p->header.len);
    if (s)
        for (size_t i = 0; i < p->header.len; i++)
            if (s[i] == '\0') s[i] = ' ';
    return s;
}

/* Cuts "<|channel|>NAME" out of s (in place); *channel gets a copy of NAME, or stays NULL
 * when there is no marker. Returns false when the marker has no name after it; then, when
 * lenient (recovery), the bare marker is cut out instead, as markup rather than text. */
static bool cut_channel(char *s, char **channel, bool lenient) {
    char *marker = strstr(s, channel_marker);
    if (!marker) return true;
    char *value = marker + strlen(channel_marker);
    size_t n = 0;
    while (value[n] && !is_ws(value[n]) && value[n] != '<')
        n++;
    if (n == 0) {
        if (lenient) memmove(marker, value, strlen(value) + 1);
        return false;
    }
    *channel = gptoss_chat_strndup(value, n);
    memmove(marker, value + n, strlen(value + n) + 1);
    return true;
}

/* Splits s (in place) at ASCII whitespace; returns the number of words put in words[]. */
static size_t split_words(char *s, char ***words_out) {
    size_t n = 0, capacity = 0;
    char **words = NULL;
    char *p = s;
    while (*p) {
        while (*p && is_ws(*p))
            *p++ = '\0';
        if (!*p) break;
        if (n == capacity) {
            capacity = capacity ? capacity * 2 : 8;
            char **bigger = realloc(words, capacity * sizeof *bigger);
            if (!bigger) break;
            words = bigger;
        }
        words[n++] = p;
        while (*p && !is_ws(*p))
            p++;
    }
    *words_out = words;
    return n;
}

/* Puts " <|constrain|>" wherever "<|constrain|>" appears, so that a marker glued to the
 * previous word splits off as the content type. */
static char *space_constrain(const char *s) {
    gptoss_chat_buf out = {0};
    const char *p = s;
    const char *hit;
    while ((hit = strstr(p, constrain_marker))) {
        gptoss_chat_buf_append(&out, p, (size_t)(hit - p));
        gptoss_chat_buf_puts(&out, " ");
        gptoss_chat_buf_puts(&out, constrain_marker);
        p = hit + strlen(constrain_marker);
    }
    gptoss_chat_buf_puts(&out, p);
    return gptoss_chat_buf_take(&out, NULL);
}

static char *join_words(char **words, size_t n) {
    gptoss_chat_buf out = {0};
    for (size_t i = 0; i < n; i++) {
        if (i) gptoss_chat_buf_puts(&out, " ");
        gptoss_chat_buf_puts(&out, words[i]);
    }
    return gptoss_chat_buf_take(&out, NULL);
}

/* ---- repair mode: headers ------------------------------------------------------------------ */

/* Repair: what may name a recipient ("functions.get_weather", "browser.search"); anything else
 * in that place is text the model put in its header. */
static bool valid_recipient(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 128) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == ':'))
            return false;
    }
    return true;
}

/* Removes every "<|channel|>NAME" from s (in place; whitespace after the marker skipped, a
 * space left in its place); *channel gets the last non-empty NAME, or stays NULL. */
static void cut_channels(char *s, char **channel) {
    char *marker;
    while ((marker = strstr(s, channel_marker))) {
        char *value = marker + strlen(channel_marker);
        while (*value && is_ws(*value))
            value++;
        size_t n = 0;
        while (value[n] && !is_ws(value[n]) && value[n] != '<')
            n++;
        if (n) {
            free(*channel);
            *channel = gptoss_chat_strndup(value, n);
        }
        *marker = ' ';
        memmove(marker + 1, value + n, strlen(value + n) + 1);
    }
}

/* A channel that is really a recipient ("to=functions.f", "functions.f",
 * "commentary.to=functions.f"): returns the recipient (malloc'd) and leaves the channel
 * that remains ("commentary" when none does). */
static char *channel_recipient(char **channel) {
    char *c = *channel;
    if (!c) return NULL;
    char *recipient = NULL;
    char *glued = strstr(c, ".to=");
    if (strncmp(c, "to=", 3) == 0) {
        recipient = strdup(c + 3);
        c[0] = '\0';
    } else if (glued) {
        recipient = strdup(glued + 4);
        *glued = '\0';
    } else if (strncmp(c, "functions.", 10) == 0) {
        recipient = strdup(c);
        c[0] = '\0';
    }
    if (recipient && c[0] == '\0') {
        free(*channel);
        *channel = strdup("commentary");
    }
    return recipient;
}

static bool is_json_word(const char *w) {
    return strncmp(w, constrain_marker, strlen(constrain_marker)) == 0 ||
           ((w[0] == 'j' || w[0] == 'J') && (w[1] == 's' || w[1] == 'S') &&
            (w[2] == 'o' || w[2] == 'O') && (w[3] == 'n' || w[3] == 'N') && w[4] == '\0');
}

/* Rewrites a header into the form harmony parses, when it names a recipient or its channel
 * markers are untidy (see "Repair mode" in harmony_parser.h). Returns a malloc'd string. */
static char *repair_header(const char *raw, bool has_role) {
    char *s = strdup(raw);
    if (!s) return NULL;
    char *channel = NULL;
    cut_channels(s, &channel);
    char *recipient = channel_recipient(&channel);
    if (recipient && !valid_recipient(recipient)) {
        free(recipient);
        recipient = NULL;
    }
    char *spaced = strstr(s, constrain_marker) ? space_constrain(s) : strdup(s);
    free(s);
    char **words = NULL;
    size_t n = spaced ? split_words(spaced, &words) : 0;
    gptoss_chat_buf out = {0};
    size_t first = 0;
    if (!has_role && n > 0 && strncmp(words[0], "to=", 3) != 0) {
        gptoss_chat_buf_puts(&out, words[0]); /* a role, or a tool's name as author */
        first = 1;
    } else if (!has_role) {
        gptoss_chat_buf_puts(&out, "assistant");
    }
    const char *content_type = NULL;
    for (size_t i = first; i < n; i++) {
        if (!recipient && strncmp(words[i], "to=", 3) == 0 && valid_recipient(words[i] + 3))
            recipient = strdup(words[i] + 3);
        else if (is_json_word(words[i]) || strcmp(words[i], "code") == 0)
            content_type = words[i];
    }
    if (recipient) {
        gptoss_chat_buf_printf(&out, "%sto=%s", out.len ? " " : "", recipient);
        if (channel) gptoss_chat_buf_printf(&out, "%s%s", channel_marker, channel);
        if (content_type) gptoss_chat_buf_printf(&out, " %s", content_type);
    } else {
        for (size_t i = first; i < n; i++)
            gptoss_chat_buf_printf(&out, "%s%s", out.len ? " " : "", words[i]);
        if (channel) gptoss_chat_buf_printf(&out, "%s%s", channel_marker, channel);
    }
    free(words);
    free(spaced);
    free(channel);
    free(recipient);
    char *result = gptoss_chat_buf_take(&out, NULL);
    return result ? result : calloc(1, 1);
}

/* Removes channel and constrain markers from recovered text (in place). */
static void strip_markup(char *s) {
    static const char *const markers[] = {channel_marker, constrain_marker};
    for (size_t k = 0; k < 2; k++) {
        char *hit;
        const size_t len = strlen(markers[k]);
        while ((hit = strstr(s, markers[k])))
            memmove(hit, hit + len, strlen(hit + len) + 1);
    }
}

/* The recipient a header cut short names ("to=NAME" as a word), malloc'd, or NULL; *args
 * gets where arguments start (the first '{' after it; the end of s when none). */
static char *header_recipient(const char *s, const char **args) {
    for (const char *w = strstr(s, "to="); w; w = strstr(w + 1, "to=")) {
        if (w != s && !is_ws(w[-1]) && w[-1] != '.' && w[-1] != '>') continue;
        const char *name = w + 3;
        size_t n = 0;
        while (name[n] && !is_ws(name[n]) && name[n] != '<' && name[n] != '{')
            n++;
        if (n == 0) continue;
        char *found = gptoss_chat_strndup(name, n);
        if (!found || !valid_recipient(found)) {
            free(found);
            continue;
        }
        free(found);
        const char *brace = strchr(name + n, '{');
        *args = brace ? brace : name + strlen(name);
        return gptoss_chat_strndup(name, n);
    }
    return NULL;
}

/* Parses the header into p->current (spec 6.7). On failure fills *why and leaves in
 * *leftover (malloc'd, may be NULL) the header words that could not be placed, while
 * p->current keeps what could be (role, channel). */
static char *header_text(const gptoss_harmony_parser *p) {
    char *s = header_string(p);
    if (!s || !p->options.repair || p->options.strict) return s;
    char *repaired = repair_header(s, p->has_next_role);
    free(s);
    return repaired;
}

static bool parse_header(gptoss_harmony_parser *p, char *why, size_t why_size, char **leftover) {
    *leftover = NULL;
    gptoss_harmony_parsed_message *m = &p->current;
    m->role = p->has_next_role ? p->next_role : GPTOSS_ROLE_ASSISTANT;
    char *s = header_text(p);
    if (!s) {
        snprintf(why, why_size, "out of memory");
        return false;
    }
    if (!cut_channel(s, &m->channel, false)) {
        snprintf(why, why_size, "channel marker present but no channel value found in header");
        if (p->options.repair) strip_markup(s);
        *leftover = s;
        return false;
    }
    char *spaced = strstr(s, constrain_marker) ? space_constrain(s) : s;
    if (spaced != s) free(s);
    if (!spaced) {
        snprintf(why, why_size, "out of memory");
        return false;
    }
    char **words = NULL;
    size_t n = split_words(spaced, &words);
    size_t first = 0; /* words[first..n) remain */
    bool ok = true;
    char *role_word = NULL;
    if (!p->has_next_role) {
        if (n == 0) {
            snprintf(why, why_size, "message header did not contain a role");
            ok = false;
        } else if (gptoss_harmony_role_parse(words[0], strlen(words[0]), &m->role)) {
            /* the word is dropped below as equal to the role */
        } else if (n > 1 || strncmp(words[0], "to=", 3) == 0) {
            m->role = GPTOSS_ROLE_TOOL;
            role_word = words[0];
            first = 1;
        } else {
            snprintf(why, why_size, "unknown role '%.200s' in message header", words[0]);
            ok = false;
        }
    }
    if (ok && role_word) m->name = strdup(role_word);
    if (ok && first < n && strcmp(words[first], gptoss_harmony_role_name(m->role)) == 0) first++;
    if (ok && first < n) {
        size_t remaining = n - first;
        char *last = words[--n];
        if (strncmp(last, "to=", 3) == 0) {
            m->recipient = strdup(last + 3);
        } else if (remaining == 1) {
            m->recipient = strdup(last);
        } else {
            m->content_type = strdup(last);
            char *raw = words[--n];
            m->recipient = strdup(strncmp(raw, "to=", 3) == 0 ? raw + 3 : raw);
        }
        if (p->options.repair && !p->options.strict && m->recipient &&
            !valid_recipient(m->recipient)) {
            snprintf(why, why_size, "'%.200s' cannot name a recipient", m->recipient);
            ok = false;
        } else if (n > first) {
            gptoss_chat_buf list = {0};
            for (size_t i = first; i < n; i++)
                gptoss_chat_buf_printf(&list, "%s\"%s\"", i > first ? ", " : "", words[i]);
            snprintf(why, why_size, "unexpected tokens remaining in message header: [%.300s]",
                     list.data ? list.data : "");
            gptoss_chat_buf_free(&list);
            ok = false;
        }
    }
    if (!ok) {
        /* What could not be placed, for non-strict recovery: all words after the role. */
        size_t from = p->has_next_role ? 0 : (role_word ? 1 : 0);
        if (!p->has_next_role && from == 0 && n > 0) {
            gptoss_harmony_role r;
            if (gptoss_harmony_role_parse(words[0], strlen(words[0]), &r)) from = 1;
        }
        /* Recount: n may have been decremented above; re-split is simpler. */
        free(words);
        char **all = NULL;
        char *again = header_text(p);
        char *dummy = NULL;
        if (again && (cut_channel(again, &dummy, true) || true)) {
            size_t count = split_words(again, &all);
            if (from > count) from = count;
            *leftover = all ? join_words(all + from, count - from) : NULL;
            if (*leftover && p->options.repair) strip_markup(*leftover);
        }
        free(dummy);
        free(all);
        free(again);
        free(m->recipient);
        free(m->content_type);
        m->recipient = m->content_type = NULL;
        if (m->role == GPTOSS_ROLE_TOOL && !m->name) m->role = GPTOSS_ROLE_ASSISTANT;
    } else {
        free(words);
    }
    free(spaced);
    return ok;
}

static gptoss_status fail(gptoss_harmony_parser *p, gptoss_error *error, const char *fmt,
                          const char *detail) {
    p->failed = true;
    gptoss_set_error(&p->failure, GPTOSS_ERR_FORMAT, fmt, detail);
    return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s", p->failure.message);
}

/* Non-strict: the header read so far becomes a message (harmony's recovery when a stop
 * token arrives before <|message|>): channel kept, other words single-spaced as content. */
/* Repair: a header cut short that names a recipient becomes that tool call, its arguments the
 * text from the first '{' on; a close_reason of NONE leaves the message open (CONTENT). */
static bool recover_tool_call(gptoss_harmony_parser *p, const char *s, int32_t stop_token,
                              gptoss_chat_end_reason close_reason) {
    const char *args = NULL;
    char *recipient = header_recipient(s, &args);
    if (!recipient) return false;
    char *copy = strdup(s);
    char *channel = NULL;
    if (copy) cut_channels(copy, &channel);
    free(copy);
    char *spare = channel ? channel_recipient(&channel) : NULL;
    free(spare);
    clear_current(p);
    p->current.role = GPTOSS_ROLE_ASSISTANT;
    p->current.channel = channel ? channel : strdup("commentary");
    p->current.recipient = recipient;
    p->current.content_type = strdup("<|constrain|>json");
    begin_message(p);
    p->current_recovered = true;
    char *clean = strdup(args);
    if (clean) {
        strip_markup(clean);
        feed_bytes(p, (const unsigned char *)clean, strlen(clean));
        free(clean);
    }
    if (close_reason != GPTOSS_CHAT_END_NONE) close_message(p, stop_token, close_reason);
    return true;
}

/* Repair: a header longer than any real one. A tool call when it names a recipient and its
 * arguments have begun; otherwise its text (channel kept, markup removed) as a message. */
static void recover_long_header(gptoss_harmony_parser *p) {
    char *s = header_string(p);
    gptoss_chat_buf_free(&p->header);
    const char *args = NULL;
    char *recipient = s ? header_recipient(s, &args) : NULL;
    bool call = recipient && *args == '{';
    free(recipient);
    if (s && call && recover_tool_call(p, s, -1, GPTOSS_CHAT_END_NONE)) {
        free(s);
        return;
    }
    char *channel = NULL;
    if (s) cut_channels(s, &channel);
    clear_current(p);
    p->current.role = p->has_next_role ? p->next_role : GPTOSS_ROLE_ASSISTANT;
    p->current.channel = channel;
    begin_message(p);
    p->current_recovered = true;
    if (s) {
        strip_markup(s);
        const char *text = s;
        while (is_ws(*text))
            text++;
        feed_bytes(p, (const unsigned char *)text, strlen(text));
    }
    free(s);
}

static void recover_header(gptoss_harmony_parser *p, int32_t stop_token,
                           gptoss_chat_end_reason reason) {
    if (p->options.repair) {
        char *raw = header_string(p);
        bool done = raw && recover_tool_call(p, raw, stop_token, reason);
        free(raw);
        if (done) return;
    }
    clear_current(p);
    p->current.role = p->has_next_role ? p->next_role : GPTOSS_ROLE_ASSISTANT;
    char *s = header_string(p);
    char *channel = NULL;
    if (s && p->options.repair)
        cut_channels(s, &channel);
    else if (s && !cut_channel(s, &channel, true))
        channel = NULL;
    p->current.channel = channel;
    char **words = NULL;
    size_t n = s ? split_words(s, &words) : 0;
    size_t first = 0;
    gptoss_harmony_role role;
    if (!p->has_next_role && n > 0 &&
        gptoss_harmony_role_parse(words[0], strlen(words[0]), &role)) {
        p->current.role = role;
        first = 1;
    }
    char *text = words ? join_words(words + first, n - first) : NULL;
    if (text && p->options.repair) strip_markup(text);
    free(words);
    free(s);
    begin_message(p);
    p->current_recovered = true;
    if (text) feed_bytes(p, (const unsigned char *)text, strlen(text));
    free(text);
    close_message(p, stop_token, reason);
}

static gptoss_status on_message_token(gptoss_harmony_parser *p, gptoss_error *error) {
    char why[512];
    char *leftover = NULL;
    clear_current(p);
    bool ok = parse_header(p, why, sizeof why, &leftover);
    if (!ok && p->options.strict) {
        free(leftover);
        clear_current(p);
        return fail(p, error, "%s", why);
    }
    begin_message(p);
    if (!ok) {
        p->current_recovered = true;
        if (leftover) feed_bytes(p, (const unsigned char *)leftover, strlen(leftover));
    }
    free(leftover);
    return GPTOSS_OK;
}

/* Non-strict: begins an implicit assistant message (no header seen). */
static void begin_implicit(gptoss_harmony_parser *p) {
    clear_current(p);
    p->current.role = p->has_next_role ? p->next_role : GPTOSS_ROLE_ASSISTANT;
    begin_message(p);
    p->current_recovered = true;
}

/* ---- public API ---------------------------------------------------------------------------- */

gptoss_status gptoss_harmony_parser_create(const gptoss_tokenizer *tokenizer,
                                           const gptoss_harmony_parser_options *options,
                                           gptoss_harmony_parser **out, gptoss_error *error) {
    if (!tokenizer || !out)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "harmony parser: no tokenizer");
    gptoss_harmony_parser *p = calloc(1, sizeof *p);
    if (!p)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory creating a parser");
    p->tokenizer = tokenizer;
    if (options) p->options = *options;
    p->state = p->options.has_initial_role ? HEADER : EXPECT_START;
    p->has_next_role = p->options.has_initial_role;
    p->next_role = p->options.initial_role;
    p->last_token = -1;
    *out = p;
    return GPTOSS_OK;
}

void gptoss_harmony_parser_free(gptoss_harmony_parser *p) {
    if (!p) return;
    clear_current(p);
    for (size_t i = 0; i < p->n_messages; i++) {
        gptoss_harmony_parsed_message *m = &p->messages[i];
        free(m->name);
        free(m->recipient);
        free(m->channel);
        free(m->content_type);
        free(m->content);
    }
    free(p->messages);
    free(p->events);
    free(p->event_text_offsets);
    gptoss_chat_buf_free(&p->header);
    gptoss_chat_buf_free(&p->probe);
    gptoss_chat_buf_free(&p->delta);
    gptoss_chat_buf_free(&p->event_text);
    free(p);
}

static void begin_step(gptoss_harmony_parser *p) {
    p->n_events = 0;
    p->event_text.len = 0;
    p->delta.len = 0;
    p->has_delta = false;
    p->out_of_memory = false;
}

/* Resolves event text offsets to pointers once the step's text buffer stops moving. */
static gptoss_status end_step(gptoss_harmony_parser *p, gptoss_error *error) {
    for (size_t i = 0; i < p->n_events; i++)
        if (p->event_text_offsets[i] != SIZE_MAX)
            p->events[i].text = p->event_text.data + p->event_text_offsets[i];
    if (p->out_of_memory)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory parsing output");
    return GPTOSS_OK;
}

/* Repair: a header begins without <|start|> (the role is taken as assistant unless text
 * before it named one). */
static void begin_header(gptoss_harmony_parser *p, bool assistant) {
    p->state = HEADER;
    gptoss_chat_buf_free(&p->header);
    if (assistant) {
        p->has_next_role = true;
        p->next_role = GPTOSS_ROLE_ASSISTANT;
    }
}

static const char probe_role[] = "assistant";

/* Whether the bytes of id, after the held probe text, still spell a prefix of "assistant". */
static bool probe_extends(const gptoss_harmony_parser *p, int32_t id) {
    size_t len = 0;
    const char *bytes = gptoss_tokenizer_token_bytes(p->tokenizer, id, &len);
    if (!bytes || len == 0 || p->probe.len + len > strlen(probe_role)) return false;
    return memcmp(probe_role, p->probe.data ? p->probe.data : "", p->probe.len) == 0 &&
           memcmp(probe_role + p->probe.len, bytes, len) == 0;
}

static void append_token_bytes(gptoss_harmony_parser *p, gptoss_chat_buf *buf, int32_t id) {
    size_t len = 0;
    const char *bytes = gptoss_tokenizer_token_bytes(p->tokenizer, id, &len);
    if (!bytes) {
        bytes = replacement;
        len = 3;
    }
    if (!gptoss_chat_buf_append(buf, bytes, len)) p->out_of_memory = true;
}

/* Repair: the held probe text was not a role: it becomes the text of an implicit message. */
static void flush_probe(gptoss_harmony_parser *p) {
    gptoss_chat_buf held = p->probe;
    memset(&p->probe, 0, sizeof p->probe);
    begin_implicit(p);
    if (held.len) feed_bytes(p, (const unsigned char *)held.data, held.len);
    gptoss_chat_buf_free(&held);
}

static gptoss_status step(gptoss_harmony_parser *p, int32_t id, gptoss_error *error) {
    bool strict = p->options.strict;
    bool repair = p->options.repair && !strict;
    char detail[64];
    /* Special tokens outside harmony's grammar are never text nor header in repair mode. */
    if (repair && !is_markup(id) && gptoss_tokenizer_is_special(p->tokenizer, id)) return GPTOSS_OK;
    switch (p->state) {
    case PROBE:
        if (probe_extends(p, id)) {
            append_token_bytes(p, &p->probe, id);
            break;
        }
        if (p->probe.len == strlen(probe_role) && !is_stop(id) && id != GPTOSS_TOKEN_START &&
            id != GPTOSS_TOKEN_ENDOFTEXT) {
            size_t len = 0;
            const char *bytes = gptoss_tokenizer_token_bytes(p->tokenizer, id, &len);
            const bool header_next = id == GPTOSS_TOKEN_CHANNEL || id == GPTOSS_TOKEN_MESSAGE ||
                                     id == GPTOSS_TOKEN_CONSTRAIN ||
                                     (bytes && len > 0 && is_ws(bytes[0]));
            if (header_next) {
                gptoss_chat_buf held = p->probe;
                memset(&p->probe, 0, sizeof p->probe);
                begin_header(p, false);
                p->has_next_role = false;
                p->header = held; /* "assistant": the role word */
                return step(p, id, error);
            }
        }
        flush_probe(p);
        return step(p, id, error);
    case EXPECT_START:
        if (id == GPTOSS_TOKEN_START) {
            p->state = HEADER;
            gptoss_chat_buf_free(&p->header);
        } else if (strict) {
            snprintf(detail, sizeof detail, "%d", (int)id);
            return fail(p, error, "unexpected token %s while expecting start token 200006", detail);
        } else if (is_stop(id) || id == GPTOSS_TOKEN_ENDOFTEXT) {
            if (id != GPTOSS_TOKEN_END) turn_end(p, reason_of(id));
        } else if (repair && (id == GPTOSS_TOKEN_CHANNEL || id == GPTOSS_TOKEN_MESSAGE)) {
            begin_header(p, true);
            return step(p, id, error);
        } else if (repair && id == GPTOSS_TOKEN_CONSTRAIN) {
            /* stray markup: dropped */
        } else if (repair && probe_extends(p, id)) {
            gptoss_chat_buf_free(&p->probe);
            append_token_bytes(p, &p->probe, id);
            p->state = PROBE;
        } else {
            begin_implicit(p);
            content_token(p, id);
        }
        break;
    case HEADER:
        if (id == GPTOSS_TOKEN_MESSAGE) {
            gptoss_status st = on_message_token(p, error);
            if (st) return st;
        } else if (!strict && (is_stop(id) || id == GPTOSS_TOKEN_ENDOFTEXT)) {
            recover_header(p, id, reason_of(id));
            if (id != GPTOSS_TOKEN_END) turn_end(p, reason_of(id));
        } else if (!strict && id == GPTOSS_TOKEN_START) {
            recover_header(p, -1, GPTOSS_CHAT_END_END);
            p->state = HEADER;
        } else {
            append_token_bytes(p, &p->header, id);
            if (!strict && p->header.len > GPTOSS_HARMONY_MAX_HEADER_BYTES) {
                if (repair) {
                    recover_long_header(p);
                } else {
                    /* A model that never writes <|message|>: surface what it wrote as text. */
                    gptoss_chat_buf raw = p->header;
                    memset(&p->header, 0, sizeof p->header);
                    begin_implicit(p);
                    feed_bytes(p, (const unsigned char *)raw.data, raw.len);
                    gptoss_chat_buf_free(&raw);
                }
            }
        }
        break;
    case CONTENT:
        if (is_stop(id) || (!strict && id == GPTOSS_TOKEN_ENDOFTEXT)) {
            close_message(p, id, reason_of(id));
            if (id != GPTOSS_TOKEN_END) turn_end(p, reason_of(id));
        } else if (!strict && id == GPTOSS_TOKEN_START) {
            close_message(p, -1, GPTOSS_CHAT_END_END);
            p->state = HEADER;
            gptoss_chat_buf_free(&p->header);
        } else if (repair && id == GPTOSS_TOKEN_CHANNEL) {
            /* the model began its next message without <|end|><|start|>assistant */
            close_message(p, -1, GPTOSS_CHAT_END_END);
            begin_header(p, true);
            return step(p, id, error);
        } else if (repair && (id == GPTOSS_TOKEN_MESSAGE || id == GPTOSS_TOKEN_CONSTRAIN)) {
            /* stray markup: dropped */
        } else {
            content_token(p, id);
        }
        break;
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_harmony_parser_push(gptoss_harmony_parser *p, int32_t id,
                                         gptoss_error *error) {
    if (p->failed) return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s", p->failure.message);
    begin_step(p);
    p->last_token = id;
    gptoss_status st = step(p, id, error);
    if (st) return st;
    if (p->n_events == 0) p->last_event_turn_end = false;
    return end_step(p, error);
}

gptoss_status gptoss_harmony_parser_finish(gptoss_harmony_parser *p, gptoss_error *error) {
    if (p->failed) return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s", p->failure.message);
    begin_step(p);
    if (p->state == PROBE) flush_probe(p);
    if (p->state == HEADER) {
        if (p->options.strict)
            return fail(p, error, "%s",
                        "unexpected end of input while waiting for message header to complete");
        recover_header(p, -1, GPTOSS_CHAT_END_LENGTH);
    } else if (p->state == CONTENT) {
        close_message(p, -1, GPTOSS_CHAT_END_LENGTH);
    }
    /* A turn end already reported by the last token is not repeated. */
    bool already_ended = p->n_events == 0 && p->last_event_turn_end;
    if (!already_ended)
        turn_end(p, p->n_events == 0 && p->last_token == GPTOSS_TOKEN_END ? GPTOSS_CHAT_END_END
                                                                          : GPTOSS_CHAT_END_LENGTH);
    return end_step(p, error);
}

const gptoss_chat_event *gptoss_harmony_parser_events(const gptoss_harmony_parser *p, size_t *n) {
    *n = p->n_events;
    return p->events;
}

size_t gptoss_harmony_parser_n_messages(const gptoss_harmony_parser *p) {
    return p->n_messages;
}

const gptoss_harmony_parsed_message *gptoss_harmony_parser_message(const gptoss_harmony_parser *p,
                                                                   size_t index) {
    return index < p->n_messages ? &p->messages[index] : NULL;
}

const char *gptoss_harmony_parser_current_content(const gptoss_harmony_parser *p, size_t *len) {
    if (p->state != CONTENT || !p->content.data) {
        *len = 0;
        return "";
    }
    *len = p->content.len;
    return p->content.data;
}

const char *gptoss_harmony_parser_last_delta(const gptoss_harmony_parser *p, size_t *len) {
    if (!p->has_delta) {
        *len = 0;
        return NULL;
    }
    *len = p->delta.len;
    return p->delta.data;
}
