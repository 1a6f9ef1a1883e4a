/*
 * output_constraint.c - structured output for a request (see output_constraint.h): the
 * request's response_format, tools, tool_choice and parallel_tool_calls checked and turned
 * into a harmony frame (structured/harmony_constraint.h) whose bodies are JSON Schema
 * matchers (structured/json_schema.h).
 *
 * The frame per request:
 *   - always: analysis messages (reasoning, free);
 *   - response_format text: a final answer in free text; json_object / json_schema: a final
 *     answer whose body the matcher constrains (budgeted: reasoning is cut to keep it whole);
 *   - tool_choice auto: a commentary preamble (text answers only) and a call to any tool;
 *     the arguments of a strict tool are constrained by its parameters, others are free;
 *   - tool_choice required / a named function: only tool calls (to any tool / that one), with
 *     arguments constrained (strict: the parameters schema; otherwise any JSON object), and
 *     no final answer; tool_choice none: no tool calls.
 * Requests that nothing constrains (text, no tools or only non-strict tools under auto) get
 * no constraint at all.
 *
 * Owns: the frame and one state per choice; a process-wide cache of compiled schemas (the
 * last 64 distinct ones, reference counted: a request keeps its schemas until the engine frees
 * it), so that a schema asked for again reuses its compiled automaton and cached masks; and the
 * per-tokenizer JSON vocabulary (built once, on first use, under a lock; kept for the life of
 * the process, as the tokenizer it is keyed by is).
 */
#include "server/output_constraint.h"
#include "util/json_type.h"

#include "chat/chat.h"
#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"
#include "util/clock.h"
#include "util/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOOLS 128
#define SHORTEST_BODY_MAX 65536 /* a schema whose shortest value needs more is refused */
#define SCHEMA_CACHE_SLOTS 64
#define SCHEMA_CACHE_MAX_KEY 65536 /* larger schemas are compiled per request, not kept */
#define TOOL_NAME_MAX 64

/* A compiled schema, shared by the requests that ask for the same one: its matcher caches
 * (masks of automaton states) then serve them all. */
typedef struct schema_entry {
    char *key; /* the schema as compact JSON ("" for json_object) */
    const gptoss_json_vocab *vocab;
    gptoss_json_schema *schema;
    int32_t shortest;   /* the fewest body tokens a value takes (the matcher's budget unit) */
    int32_t refs;       /* bodies using it, plus one while the cache holds it */
    uint64_t last_used; /* cache clock */
} schema_entry;

/* A message body of the frame: the schema its matcher is made from. */
typedef struct body {
    schema_entry *entry;
} body;

struct output_constraint {
    gptoss_harmony_frame *frame;
    gptoss_harmony_constraint **choices; /* [n_choices] */
    int32_t n_choices;
    body *bodies; /* [n_bodies] referenced by the frame's targets */
    int32_t n_bodies;
    int32_t max_tokens;    /* the request's, 0 until known */
    int32_t shortest_body; /* the most tokens any constrained body needs at least */
};

/* ---- the JSON vocabulary, once per tokenizer ------------------------------------------------ */

static pthread_mutex_t vocab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const gptoss_tokenizer *tokenizer;
    gptoss_json_vocab *vocab;
} vocabs[4];

static const gptoss_json_vocab *vocab_for(const gptoss_tokenizer *tokenizer, gptoss_error *error) {
    pthread_mutex_lock(&vocab_lock);
    const gptoss_json_vocab *found = NULL;
    size_t i = 0;
    for (; i < sizeof vocabs / sizeof vocabs[0] && vocabs[i].tokenizer; i++)
        if (vocabs[i].tokenizer == tokenizer) found = vocabs[i].vocab;
    if (!found) {
        gptoss_json_vocab *made = NULL;
        const double t0 = gptoss_now_seconds();
        if (gptoss_json_vocab_create(tokenizer, &made, error) == GPTOSS_OK) {
            GPTOSS_LOG_I("structured", "JSON vocabulary built in %.0f ms",
                         (gptoss_now_seconds() - t0) * 1e3);
            if (i == sizeof vocabs / sizeof vocabs[0]) {
                /* schemas compiled against the others may still be in use: none is freed */
                gptoss_json_vocab_free(made);
                gptoss_set_error(error, GPTOSS_ERR_CAPACITY, "too many tokenizers in one process");
            } else {
                vocabs[i].tokenizer = tokenizer;
                vocabs[i].vocab = made;
                found = made;
            }
        }
    }
    pthread_mutex_unlock(&vocab_lock);
    return found;
}

static gptoss_status body_create(void *user, gptoss_token_constraint **out, gptoss_error *error) {
    return gptoss_json_matcher_create(((body *)user)->entry->schema, out, error);
}

static void body_set_budget(gptoss_token_constraint *matcher, int32_t tokens_left) {
    gptoss_json_matcher_set_budget(matcher, tokens_left);
}

/* Whether a fresh matcher allows any first token within `budget` body tokens. */
static bool starts_within(gptoss_token_constraint *m, int32_t budget, uint32_t *mask, size_t words,
                          int32_t vocab) {
    memset(mask, 0, words * sizeof *mask);
    gptoss_json_matcher_set_budget(m, budget);
    gptoss_constraint_allow(m, mask, vocab);
    for (size_t w = 0; w < words; w++)
        if (mask[w]) return true;
    return false;
}

/* The fewest body tokens the matcher promises to finish in (its budget unit), found by
 * search; -1 when even a generous budget allows nothing. */
static int32_t shortest_body(gptoss_json_schema *schema, const gptoss_tokenizer *tokenizer) {
    gptoss_token_constraint *m = NULL;
    gptoss_error err = {0};
    if (gptoss_json_matcher_create(schema, &m, &err) != GPTOSS_OK) return -1;
    const int32_t vocab = gptoss_tokenizer_n_vocab(tokenizer);
    const size_t words = ((size_t)vocab + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask);
    int32_t lo = 0, hi = 16, found = -1; /* lo: too few */
    while (mask && hi <= SHORTEST_BODY_MAX && !starts_within(m, hi, mask, words, vocab)) {
        lo = hi;
        hi *= 2;
    }
    if (mask && hi <= SHORTEST_BODY_MAX) {
        while (hi - lo > 1) {
            int32_t mid = lo + (hi - lo) / 2;
            if (starts_within(m, mid, mask, words, vocab))
                hi = mid;
            else
                lo = mid;
        }
        found = hi;
    }
    free(mask);
    gptoss_constraint_free(m);
    return found;
}

/* ---- compiled schemas, shared -----------------------------------------------------------------
 */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static schema_entry *cache[SCHEMA_CACHE_SLOTS];
static uint64_t cache_clock;

static void entry_free(schema_entry *entry) {
    gptoss_json_schema_free(entry->schema);
    free(entry->key);
    free(entry);
}

static void entry_release(schema_entry *entry) {
    if (!entry) return;
    pthread_mutex_lock(&cache_lock);
    const bool last = --entry->refs == 0;
    pthread_mutex_unlock(&cache_lock);
    if (last) entry_free(entry);
}

/* The compiled `schema` (NULL: json_object), from the cache or compiled now (outside the
 * lock) and cached. NULL with *error set when the schema is refused. */
static schema_entry *entry_acquire(const json_t *schema, const gptoss_tokenizer *tokenizer,
                                   gptoss_error *error) {
    const gptoss_json_vocab *vocab = vocab_for(tokenizer, error);
    if (!vocab) return NULL;
    char *key = schema ? json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup("");
    if (!key) {
        gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    pthread_mutex_lock(&cache_lock);
    for (size_t i = 0; i < SCHEMA_CACHE_SLOTS; i++)
        if (cache[i] && cache[i]->vocab == vocab && strcmp(cache[i]->key, key) == 0) {
            schema_entry *hit = cache[i];
            hit->refs++;
            hit->last_used = ++cache_clock;
            pthread_mutex_unlock(&cache_lock);
            free(key);
            return hit;
        }
    pthread_mutex_unlock(&cache_lock);
    schema_entry *entry = calloc(1, sizeof *entry);
    if (!entry) {
        free(key);
        gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    entry->key = key;
    entry->vocab = vocab;
    entry->refs = 1;
    if (gptoss_json_schema_compile(schema, vocab, &entry->schema, error) != GPTOSS_OK) {
        entry_free(entry);
        return NULL;
    }
    entry->shortest = shortest_body(entry->schema, tokenizer);
    if (entry->shortest < 0) {
        gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                         "no value of this schema can be written within %d tokens",
                         SHORTEST_BODY_MAX);
        entry_free(entry);
        return NULL;
    }
    if (strlen(key) > SCHEMA_CACHE_MAX_KEY) return entry;
    schema_entry *evicted = NULL;
    pthread_mutex_lock(&cache_lock);
    size_t slot = 0;
    for (size_t i = 0; i < SCHEMA_CACHE_SLOTS; i++) {
        if (!cache[i]) {
            slot = i;
            break;
        }
        if (cache[i]->last_used < cache[slot]->last_used) slot = i;
    }
    if (cache[slot] && --cache[slot]->refs == 0) evicted = cache[slot];
    cache[slot] = entry;
    entry->refs++;
    entry->last_used = ++cache_clock;
    pthread_mutex_unlock(&cache_lock);
    if (evicted) entry_free(evicted);
    return entry;
}

/* ---- request checks ------------------------------------------------------------------------- */

/* OpenAI's name alphabet (plus '.' for tools, as the prompt accepts): a name ends up in a
 * harmony header, where whitespace or '<' would change how it parses. */
static bool valid_name(const char *name, bool dot) {
    size_t n = strlen(name);
    if (n == 0 || n > TOOL_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || (dot && c == '.')))
            return false;
    }
    return true;
}

typedef enum format_kind { FORMAT_TEXT, FORMAT_JSON } format_kind;
typedef enum choice_kind { CHOICE_AUTO, CHOICE_NONE, CHOICE_REQUIRED, CHOICE_NAMED } choice_kind;

typedef struct tool_info {
    const char *name;
    const json_t *parameters; /* or NULL */
    bool strict;
} tool_info;

typedef struct parsed {
    format_kind format;
    const json_t *schema; /* FORMAT_JSON: the schema, or NULL (json_object) */
    tool_info tools[MAX_TOOLS];
    int n_tools;
    choice_kind choice;
    const char *named; /* CHOICE_NAMED */
} parsed;

static bool read_format(const json_t *request, parsed *p, field_error *e) {
    p->format = FORMAT_TEXT;
    const json_t *format = json_member(request, "response_format");
    if (!format) return true;
    if (!json_is_object(format))
        return field_fail(e, "response_format",
                          "response_format: expected an object with a string 'type', got %s",
                          gptoss_json_type_name(format));
    const json_t *type = json_object_get(format, "type");
    if (!json_is_string(type))
        return field_fail(e, "response_format.type",
                          "response_format.type: expected \"text\", \"json_object\" or "
                          "\"json_schema\"");
    const char *t = json_string_value(type);
    if (strcmp(t, "text") == 0) return true;
    if (strcmp(t, "json_object") == 0) {
        p->format = FORMAT_JSON;
        return true;
    }
    if (strcmp(t, "json_schema") != 0)
        return field_fail(e, "response_format.type",
                          "response_format.type '%.100s' is not supported: use \"text\", "
                          "\"json_object\" or \"json_schema\"",
                          t);
    const json_t *js = json_object_get(format, "json_schema");
    if (!json_is_object(js))
        return field_fail(e, "response_format.json_schema",
                          "response_format.json_schema: expected an object with 'name' and "
                          "'schema'");
    const json_t *name = json_object_get(js, "name");
    if (!json_is_string(name) || !valid_name(json_string_value(name), false))
        return field_fail(e, "response_format.json_schema.name",
                          "response_format.json_schema.name: expected a string of 1 to 64 "
                          "letters, digits, '_' or '-'");
    const json_t *description = json_member(js, "description");
    if (description && !json_is_string(description))
        return field_fail(e, "response_format.json_schema.description",
                          "response_format.json_schema.description: expected a string");
    const json_t *strict = json_member(js, "strict");
    if (strict && !json_is_boolean(strict))
        return field_fail(e, "response_format.json_schema.strict",
                          "response_format.json_schema.strict: expected a boolean");
    const json_t *schema = json_member(js, "schema");
    if (schema && !json_is_object(schema) && !json_is_true(schema))
        return field_fail(e, "response_format.json_schema.schema",
                          "response_format.json_schema.schema: expected a JSON Schema object, "
                          "got %s",
                          gptoss_json_type_name(schema));
    p->format = FORMAT_JSON;
    p->schema = json_is_object(schema) ? schema : NULL;
    return true;
}

static bool read_tools(const json_t *request, parsed *p, field_error *e) {
    const json_t *tools = json_member(request, "tools");
    if (!tools) return true;
    if (!json_is_array(tools))
        return field_fail(e, "tools", "tools: expected an array, got %s",
                          gptoss_json_type_name(tools));
    if (json_array_size(tools) > MAX_TOOLS)
        return field_fail(e, "tools", "tools: at most %d tools are supported", MAX_TOOLS);
    size_t i;
    const json_t *tool;
    char field[96];
    json_array_foreach(tools, i, tool) {
        const json_t *fn = json_is_object(tool) ? json_object_get(tool, "function") : NULL;
        const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name)) {
            snprintf(field, sizeof field, "tools[%zu].function.name", i);
            return field_fail(e, field,
                              "%s: expected a string (tools are {\"type\": "
                              "\"function\", \"function\": {\"name\": ...}})",
                              field);
        }
        if (!valid_name(json_string_value(name), true)) {
            snprintf(field, sizeof field, "tools[%zu].function.name", i);
            return field_fail(e, field,
                              "%s: '%.80s' is not 1 to 64 letters, digits, '_', '-' or '.'", field,
                              json_string_value(name));
        }
        for (int k = 0; k < p->n_tools; k++)
            if (strcmp(p->tools[k].name, json_string_value(name)) == 0) {
                snprintf(field, sizeof field, "tools[%zu].function.name", i);
                return field_fail(e, field, "%s: '%s' names two tools", field,
                                  json_string_value(name));
            }
        const json_t *strict = json_member(fn, "strict");
        if (strict && !json_is_boolean(strict)) {
            snprintf(field, sizeof field, "tools[%zu].function.strict", i);
            return field_fail(e, field, "%s: expected a boolean", field);
        }
        const json_t *parameters = json_member(fn, "parameters");
        if (parameters && !json_is_object(parameters)) {
            snprintf(field, sizeof field, "tools[%zu].function.parameters", i);
            return field_fail(e, field, "%s: expected a JSON Schema object", field);
        }
        tool_info *t = &p->tools[p->n_tools++];
        t->name = json_string_value(name);
        t->parameters = parameters;
        t->strict = json_is_true(strict);
    }
    return true;
}

static bool read_tool_choice(const json_t *request, parsed *p, field_error *e) {
    p->choice = CHOICE_AUTO;
    const json_t *choice = json_member(request, "tool_choice");
    const json_t *parallel = json_member(request, "parallel_tool_calls");
    if (parallel && !json_is_boolean(parallel))
        return field_fail(e, "parallel_tool_calls", "parallel_tool_calls: expected a boolean");
    if (!choice) return true;
    if (json_is_string(choice)) {
        const char *s = json_string_value(choice);
        if (strcmp(s, "auto") == 0)
            p->choice = CHOICE_AUTO;
        else if (strcmp(s, "none") == 0)
            p->choice = CHOICE_NONE;
        else if (strcmp(s, "required") == 0)
            p->choice = CHOICE_REQUIRED;
        else
            return field_fail(e, "tool_choice",
                              "tool_choice: '%.80s' is not \"none\", \"auto\", \"required\" or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                              s);
    } else if (json_is_object(choice)) {
        const json_t *type = json_object_get(choice, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return field_fail(e, "tool_choice.type",
                              "tool_choice.type: expected \"function\" (tool_choice is \"none\", "
                              "\"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                              "{\"name\": ...}})");
        const json_t *fn = json_object_get(choice, "function");
        const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name))
            return field_fail(e, "tool_choice.function.name",
                              "tool_choice.function.name: expected a string");
        p->choice = CHOICE_NAMED;
        p->named = json_string_value(name);
    } else {
        return field_fail(e, "tool_choice", "tool_choice: expected a string or an object, got %s",
                          gptoss_json_type_name(choice));
    }
    if ((p->choice == CHOICE_REQUIRED || p->choice == CHOICE_NAMED) && p->n_tools == 0)
        return field_fail(e, "tool_choice",
                          "tool_choice: '%s' needs tools, and the request has none",
                          p->choice == CHOICE_REQUIRED ? "required" : p->named);
    if (p->choice == CHOICE_NAMED) {
        for (int i = 0; i < p->n_tools; i++)
            if (strcmp(p->tools[i].name, p->named) == 0) return true;
        return field_fail(e, "tool_choice.function.name",
                          "tool_choice.function.name: '%.80s' is not one of the request's tools",
                          p->named);
    }
    return true;
}

/* ---- building the constraint ---------------------------------------------------------------- */

void output_constraint_free(output_constraint *c) {
    if (!c) return;
    for (int32_t i = 0; c->choices && i < c->n_choices; i++)
        gptoss_harmony_constraint_free(c->choices[i]);
    free(c->choices);
    gptoss_harmony_frame_free(c->frame);
    for (int32_t i = 0; c->bodies && i < c->n_bodies; i++)
        entry_release(c->bodies[i].entry);
    free(c->bodies);
    free(c);
}

/* The body reserve: what a constrained answer is guaranteed when reasoning runs long: half
 * the budget within [32, 1024], and never less than the shortest body needs. */
static int32_t body_reserve(int32_t max_tokens, int32_t shortest_body) {
    int32_t r = max_tokens / 2;
    if (r > 1024) r = 1024;
    if (r < 32) r = 32;
    return r > shortest_body ? r : shortest_body;
}

/* Compiles `schema` (NULL: any JSON object) into body k, the next one (c->n_bodies becomes
 * k + 1); `field` names it in errors. */
static bool compile_body(output_constraint *c, int32_t k, const json_t *schema,
                         const gptoss_tokenizer *tokenizer, const char *field, field_error *e) {
    gptoss_error err = {0};
    schema_entry *entry = entry_acquire(schema, tokenizer, &err);
    if (!entry) return field_fail(e, field, "%s: %s", field, err.message);
    c->bodies[k].entry = entry;
    c->n_bodies = k + 1; /* released with c from here on */
    if (entry->shortest > c->shortest_body) c->shortest_body = entry->shortest;
    return true;
}

static gptoss_harmony_target body_target(output_constraint *c, int32_t k, const char *header,
                                         int32_t end, bool budgeted) {
    gptoss_harmony_target t = {.header = header,
                               .kind = GPTOSS_HARMONY_BODY_CONSTRAINED,
                               .end_token = end,
                               .budgeted = budgeted};
    t.body = (gptoss_harmony_body_source){body_create, body_set_budget, &c->bodies[k]};
    return t;
}

bool output_constraint_create(const json_t *request, const gptoss_tokenizer *tokenizer,
                              int32_t n_choices, int32_t max_tokens, output_constraint **out,
                              field_error *e) {
    *out = NULL;
    parsed *p = calloc(1, sizeof *p);
    if (!p) return field_fail(e, "", "out of memory");
    if (!read_format(request, p, e) || !read_tools(request, p, e) ||
        !read_tool_choice(request, p, e)) {
        free(p);
        return false;
    }
    const bool calls_allowed = p->n_tools > 0 && p->choice != CHOICE_NONE;
    bool any_strict = false;
    for (int i = 0; i < p->n_tools; i++)
        any_strict = any_strict || p->tools[i].strict;
    if (p->format == FORMAT_TEXT &&
        (p->n_tools == 0 || (p->choice == CHOICE_AUTO && !any_strict))) {
        free(p);
        return true; /* nothing to constrain */
    }
    const json_t *min_tokens = json_member(request, "min_tokens");
    if (json_is_integer(min_tokens) && json_integer_value(min_tokens) > 0) {
        free(p);
        return field_fail(e, "min_tokens",
                          "min_tokens: cannot be combined with response_format or tool_choice, "
                          "which end the answer as soon as it is complete");
    }

    output_constraint *c = calloc(1, sizeof *c);
    gptoss_harmony_target *targets = calloc((size_t)p->n_tools + 4, sizeof *targets);
    char(*headers)[160] = calloc((size_t)p->n_tools + 1, sizeof *headers);
    c->bodies = calloc((size_t)p->n_tools + 1, sizeof *c->bodies);
    c->choices = calloc((size_t)(n_choices > 0 ? n_choices : 1), sizeof *c->choices);
    bool ok = c && targets && headers && c->bodies && c->choices;
    if (!ok) field_fail(e, "", "out of memory");
    size_t n = 0;
    if (ok) {
        c->n_choices = n_choices;
        c->max_tokens = max_tokens;
        targets[n++] = (gptoss_harmony_target){.header = "<|channel|>analysis<|message|>",
                                               .kind = GPTOSS_HARMONY_BODY_REASONING};
    }
    const bool answers = p->choice == CHOICE_AUTO || p->choice == CHOICE_NONE || !calls_allowed;
    if (ok && answers) {
        static const char final_header[] = "<|channel|>final<|message|>";
        if (p->format == FORMAT_JSON) {
            ok = compile_body(c, c->n_bodies, p->schema, tokenizer,
                              p->schema ? "response_format.json_schema.schema" : "response_format",
                              e);
            if (ok)
                targets[n++] =
                    body_target(c, c->n_bodies - 1, final_header, GPTOSS_TOKEN_RETURN, true);
        } else {
            targets[n++] = (gptoss_harmony_target){.header = final_header,
                                                   .kind = GPTOSS_HARMONY_BODY_TEXT,
                                                   .end_token = GPTOSS_TOKEN_RETURN,
                                                   .budgeted = true};
            if (calls_allowed)
                targets[n++] = (gptoss_harmony_target){.header = "<|channel|>commentary<|message|>",
                                                       .kind = GPTOSS_HARMONY_BODY_TEXT,
                                                       .end_token = GPTOSS_TOKEN_END};
        }
    }
    for (int i = 0; ok && calls_allowed && i < p->n_tools; i++) {
        const tool_info *t = &p->tools[i];
        if (p->choice == CHOICE_NAMED && strcmp(t->name, p->named) != 0) continue;
        snprintf(headers[i], sizeof headers[i],
                 "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", t->name);
        const bool forced = p->choice == CHOICE_REQUIRED || p->choice == CHOICE_NAMED;
        if (!t->strict && !forced) {
            targets[n++] = (gptoss_harmony_target){.header = headers[i],
                                                   .kind = GPTOSS_HARMONY_BODY_TEXT,
                                                   .end_token = GPTOSS_TOKEN_CALL};
            continue;
        }
        char field[96];
        snprintf(field, sizeof field, "tools[%d].function.parameters", i);
        ok = compile_body(c, c->n_bodies, t->strict ? t->parameters : NULL, tokenizer, field, e);
        if (ok)
            targets[n++] = body_target(c, c->n_bodies - 1, headers[i], GPTOSS_TOKEN_CALL, forced);
    }
    if (ok) {
        gptoss_error err = {0};
        int32_t budget = max_tokens > 0 ? max_tokens : 0;
        if (gptoss_harmony_frame_create(tokenizer, targets, n, budget,
                                        body_reserve(budget, c->shortest_body), &c->frame,
                                        &err) != GPTOSS_OK)
            ok = field_fail(e, "", "structured output: %s", err.message);
        /* The header, the shortest body and the end token must fit. */
        const int32_t reserve = body_reserve(budget, c->shortest_body);
        const int32_t need =
            ok ? gptoss_harmony_frame_reserve(c->frame) - reserve + c->shortest_body : 0;
        if (ok && budget > 0 && c->n_bodies > 0 && need > budget)
            ok = field_fail(e, "max_tokens",
                            "max_tokens: %d is too few for the requested structured output, "
                            "whose shortest answer takes %d tokens",
                            budget, need);
        for (int32_t i = 0; ok && i < n_choices; i++)
            if (gptoss_harmony_constraint_create(c->frame, &c->choices[i], &err) != GPTOSS_OK)
                ok = field_fail(e, "", "structured output: %s", err.message);
    }
    free(targets);
    free(headers);
    free(p);
    if (!ok) {
        output_constraint_free(c);
        return false;
    }
    *out = c;
    return true;
}

void output_constraint_set_default_max_tokens(output_constraint *c, int32_t max_tokens) {
    if (c->max_tokens > 0 || max_tokens <= 0) return;
    c->max_tokens = max_tokens;
    gptoss_harmony_frame_set_budget(c->frame, max_tokens,
                                    body_reserve(max_tokens, c->shortest_body));
}

static bool allowed_tokens(void *user, int32_t choice, const int32_t *generated,
                           int32_t n_generated, uint32_t *mask, int32_t vocab_size) {
    output_constraint *c = user;
    if (choice < 0 || choice >= c->n_choices) return false;
    return gptoss_harmony_constraint_next(c->choices[choice], generated, n_generated, mask,
                                          vocab_size);
}

static void free_user(void *user) {
    output_constraint_free(user);
}

void output_constraint_bind(output_constraint *c, gptoss_request_options *options) {
    options->allowed_tokens = allowed_tokens;
    options->allowed_tokens_user = c;
    options->allowed_tokens_free = free_user;
}
