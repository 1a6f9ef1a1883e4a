/*
 * test_harmony_constraint.c - harmony framing of structured output (harmony_constraint.c),
 * driven by a random sampler that draws uniformly among the allowed tokens (the worst case of
 * a model: it never chooses to stop on its own), with small body constraints written here.
 *
 * References: every generated sequence is parsed back by the chat layer (chat.h, the parser
 * the server uses) and must give the body the test constraint accepts, in the channel or tool
 * call the frame asked for, ended by the right stop token, within max_tokens.
 */
#include "model_fixture.h"
#include "test_support.h"

#include "chat/chat.h"
#include "model/special_tokens.h"
#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gptoss_tokenizer *tok;
static int32_t vocab;

static int setup(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", tm_tokenizer_dir());
    gptoss_error err = {0};
    if (gptoss_tokenizer_load(path, &tok, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    vocab = gptoss_tokenizer_n_vocab(tok) + 64; /* a model's padded vocabulary */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_tokenizer_free(tok);
    return 0;
}

static int32_t one_token(const char *text) {
    gptoss_tokens t = {0};
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_encode(tok, text, strlen(text), true, &t, &err), GPTOSS_OK);
    assert_int_equal(t.n, 1);
    int32_t id = t.ids[0];
    gptoss_tokens_free(&t);
    return id;
}

/* ---- a list constraint: "[" ("1" ("," "1")*)? "]", closing within its budget ------------- */

typedef struct list_constraint {
    gptoss_token_constraint base;
    int state;      /* 0: expect "[", 1: after "[", 2: after "1", 3: after ",", 4: done */
    int32_t budget; /* tokens it may still take, the next one included */
    int32_t open, one, comma, close;
} list_constraint;

/* Tokens needed to finish after moving to state s. */
static int32_t list_needs(int s) {
    static const int32_t needs[] = {2, 1, 1, 2, 0};
    return needs[s];
}

static int list_next_state(const list_constraint *l, int32_t token) {
    if (l->state == 0 && token == l->open) return 1;
    if ((l->state == 1 || l->state == 3) && token == l->one) return 2;
    if ((l->state == 1 || l->state == 2) && token == l->close) return 4;
    if (l->state == 2 && token == l->comma) return 3;
    return -1;
}

static void list_allow(gptoss_token_constraint *self, uint32_t *mask, int32_t v) {
    list_constraint *l = (list_constraint *)self;
    const int32_t candidates[] = {l->open, l->one, l->comma, l->close};
    for (int i = 0; i < 4; i++) {
        int s = list_next_state(l, candidates[i]);
        if (s >= 0 && 1 + list_needs(s) <= l->budget && candidates[i] < v)
            mask[candidates[i] / 32] |= 1u << (candidates[i] % 32);
    }
}

static bool list_advance(gptoss_token_constraint *self, int32_t token) {
    list_constraint *l = (list_constraint *)self;
    int s = list_next_state(l, token);
    if (s < 0) return false;
    l->state = s;
    return true;
}

static bool list_complete(const gptoss_token_constraint *self) {
    return ((const list_constraint *)self)->state == 4;
}

static void list_free(gptoss_token_constraint *self) {
    free(self);
}

static const gptoss_token_constraint_ops list_ops = {list_allow, list_advance, list_complete,
                                                     list_free};

static int n_list_created;

static gptoss_status list_create(void *user, gptoss_token_constraint **out, gptoss_error *error) {
    (void)user;
    (void)error;
    list_constraint *l = calloc(1, sizeof *l);
    l->base.ops = &list_ops;
    l->budget = INT32_MAX;
    l->open = one_token("[");
    l->one = one_token("1");
    l->comma = one_token(",");
    l->close = one_token("]");
    n_list_created++;
    *out = &l->base;
    return GPTOSS_OK;
}

static void list_set_budget(gptoss_token_constraint *self, int32_t tokens_left) {
    ((list_constraint *)self)->budget = tokens_left;
}

static bool is_list(const char *s) {
    if (*s++ != '[') return false;
    if (*s == ']') return s[1] == '\0';
    for (;;) {
        if (*s++ != '1') return false;
        if (*s == ']') return s[1] == '\0';
        if (*s++ != ',') return false;
    }
}

/* ---- a random sampler over the allowed tokens ------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Draws uniformly among the allowed tokens, except that with probability `p_special` / 1000 it
 * takes the allowed special token (a structural choice) when there is one. */
static int32_t draw(const uint32_t *mask, int p_special) {
    const size_t words = ((size_t)vocab + 31) / 32;
    int32_t n = 0, special = -1;
    for (size_t w = 0; w < words; w++)
        n += __builtin_popcount(mask[w]);
    assert_true(n > 0);
    for (int32_t t = GPTOSS_TOKEN_STARTOFTEXT; t < vocab; t++)
        if (mask[t / 32] >> (t % 32) & 1u) special = t;
    if (special >= 0 && (int)(rng() % 1000) < p_special) return special;
    int32_t k = (int32_t)(rng() % (uint64_t)n);
    for (size_t w = 0; w < words; w++) {
        int32_t c = __builtin_popcount(mask[w]);
        if (k < c) {
            uint32_t bits = mask[w];
            for (;;) {
                int b = __builtin_ctz(bits);
                if (k-- == 0) return (int32_t)(w * 32) + b;
                bits &= bits - 1;
            }
        }
        k -= c;
    }
    fail_msg("unreachable");
    return -1;
}

typedef struct outcome {
    char content[4096];
    char reasoning_tail[64];
    char tool[128];
    char args[4096];
    int n_calls;
    const char *finish;
    int32_t n_tokens;
} outcome;

static void cat(char *dst, size_t cap, const char *text, size_t len) {
    size_t have = strlen(dst);
    if (have + len >= cap) len = cap - have - 1;
    memcpy(dst + have, text, len);
    dst[have + len] = '\0';
}

/* Generates one choice under the frame, the way the engine does (stop ids end it), and parses
 * the tokens back with the chat layer. */
static outcome generate(const gptoss_harmony_frame *frame, int32_t max_tokens, int p_special) {
    outcome o;
    memset(&o, 0, sizeof o);
    gptoss_harmony_constraint *c = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_harmony_constraint_create(frame, &c, &err), GPTOSS_OK);
    int32_t *generated = calloc((size_t)max_tokens, sizeof *generated);
    const size_t words = ((size_t)vocab + 31) / 32;
    uint32_t *mask = calloc(words, sizeof *mask);
    gptoss_chat_stream *stream = NULL;
    assert_int_equal(gptoss_chat_stream_create(tok, NULL, &stream, &err), GPTOSS_OK);
    int32_t n = 0;
    while (n < max_tokens) {
        memset(mask, 0, words * sizeof *mask);
        assert_true(gptoss_harmony_constraint_next(c, generated, n, mask, vocab));
        int32_t t = draw(mask, p_special);
        generated[n++] = t;
        assert_int_equal(gptoss_chat_stream_push(stream, t, &err), GPTOSS_OK);
        size_t np = 0;
        const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(stream, &np);
        for (size_t i = 0; i < np; i++) {
            const gptoss_chat_piece *p = &pieces[i];
            if (p->kind == GPTOSS_CHAT_PIECE_CONTENT)
                cat(o.content, sizeof o.content, p->text, p->len);
            if (p->kind == GPTOSS_CHAT_PIECE_TOOL_CALL) {
                o.n_calls++;
                snprintf(o.tool, sizeof o.tool, "%s", p->name);
            }
            if (p->kind == GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS)
                cat(o.args, sizeof o.args, p->text, p->len);
        }
        if (t == GPTOSS_TOKEN_RETURN || t == GPTOSS_TOKEN_CALL) break;
    }
    assert_int_equal(gptoss_chat_stream_finish(stream, &err), GPTOSS_OK);
    size_t np = 0;
    const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(stream, &np);
    for (size_t i = 0; i < np; i++)
        if (pieces[i].kind == GPTOSS_CHAT_PIECE_FINISH) o.finish = pieces[i].finish_reason;
    o.n_tokens = n;
    gptoss_chat_stream_free(stream);
    gptoss_harmony_constraint_free(c);
    free(generated);
    free(mask);
    return o;
}

static const gptoss_harmony_target analysis = {.header = "<|channel|>analysis<|message|>",
                                               .kind = GPTOSS_HARMONY_BODY_REASONING};

static gptoss_harmony_target list_target(const char *header, int32_t end) {
    gptoss_harmony_target t = {.header = header,
                               .kind = GPTOSS_HARMONY_BODY_CONSTRAINED,
                               .end_token = end,
                               .budgeted = true,
                               .body = {list_create, list_set_budget, NULL}};
    return t;
}

/* response_format: reasoning free, then a final answer the constraint accepts, for every
 * budget from the smallest that fits the frame up: the reasoning is cut in time. */
static void test_final_body_always_fits(void **state) {
    (void)state;
    gptoss_harmony_target targets[] = {
        analysis, list_target("<|channel|>final<|message|>", GPTOSS_TOKEN_RETURN)};
    const int32_t reserve = 8;
    int n_reasoned = 0;
    for (int32_t max_tokens = 12; max_tokens <= 200; max_tokens += 7) {
        gptoss_harmony_frame *frame = NULL;
        gptoss_error err = {0};
        assert_int_equal(
            gptoss_harmony_frame_create(tok, targets, 2, max_tokens, reserve, &frame, &err),
            GPTOSS_OK);
        for (int seed = 1; seed <= 6; seed++) {
            rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + max_tokens);
            outcome o = generate(frame, max_tokens, seed * 40);
            if (!is_list(o.content) || strcmp(o.finish, "stop") != 0 || o.n_calls)
                fail_msg("max_tokens %d seed %d: content '%s' finish %s", max_tokens, seed,
                         o.content, o.finish);
            assert_true(o.n_tokens <= max_tokens);
            if (o.n_tokens > 20) n_reasoned++;
        }
        gptoss_harmony_frame_free(frame);
    }
    assert_true(n_reasoned > 10); /* reasoning did run, and was cut */
}

/* tool_choice required with two tools: the call goes to one of them with accepted arguments
 * and ends in <|call|>; a preamble or final answer is impossible. */
static void test_required_tool_call(void **state) {
    (void)state;
    gptoss_harmony_target targets[] = {
        analysis,
        list_target("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                    GPTOSS_TOKEN_CALL),
        list_target("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>",
                    GPTOSS_TOKEN_CALL)};
    gptoss_harmony_frame *frame = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_harmony_frame_create(tok, targets, 3, 120, 8, &frame, &err), GPTOSS_OK);
    int seen_weather = 0, seen_time = 0;
    for (int seed = 1; seed <= 40; seed++) {
        rng_state = 0x51ed2701ull * (uint64_t)seed + 1;
        outcome o = generate(frame, 120, 300);
        assert_int_equal(o.n_calls, 1);
        assert_string_equal(o.finish, "tool_calls");
        assert_string_equal(o.content, "");
        if (!is_list(o.args)) fail_msg("seed %d: arguments '%s'", seed, o.args);
        seen_weather += strcmp(o.tool, "get_weather") == 0;
        seen_time += strcmp(o.tool, "get_time") == 0;
    }
    assert_int_equal(seen_weather + seen_time, 40);
    assert_true(seen_weather > 0 && seen_time > 0);
    gptoss_harmony_frame_free(frame);
}

/* tool_choice none with a text answer: free text in the final channel, never a tool call. */
static void test_text_answer_no_tool_call(void **state) {
    (void)state;
    gptoss_harmony_target targets[] = {analysis,
                                       {.header = "<|channel|>final<|message|>",
                                        .kind = GPTOSS_HARMONY_BODY_TEXT,
                                        .end_token = GPTOSS_TOKEN_RETURN}};
    gptoss_harmony_frame *frame = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_harmony_frame_create(tok, targets, 2, 0, 0, &frame, &err), GPTOSS_OK);
    int answered = 0;
    for (int seed = 1; seed <= 20; seed++) {
        rng_state = 77 * (uint64_t)seed + 3;
        outcome o = generate(frame, 60, 200);
        assert_int_equal(o.n_calls, 0);
        answered += o.content[0] != '\0';
    }
    assert_true(answered > 0);
    gptoss_harmony_frame_free(frame);
}

/* Tokens are taken incrementally; a token outside the frame breaks it for good; a header
 * that is not one of the targets cannot be started. */
static void test_rejects_off_frame_tokens(void **state) {
    (void)state;
    gptoss_harmony_target targets[] = {
        analysis, list_target("<|channel|>final<|message|>", GPTOSS_TOKEN_RETURN)};
    gptoss_harmony_frame *frame = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_harmony_frame_create(tok, targets, 2, 0, 0, &frame, &err), GPTOSS_OK);
    const size_t words = ((size_t)vocab + 31) / 32;
    uint32_t *mask = calloc(words, sizeof *mask);
    gptoss_harmony_constraint *c = NULL;
    assert_int_equal(gptoss_harmony_constraint_create(frame, &c, &err), GPTOSS_OK);
    /* The first token must be <|channel|>, and only it. */
    assert_true(gptoss_harmony_constraint_next(c, NULL, 0, mask, vocab));
    int32_t n_allowed = 0;
    for (size_t w = 0; w < words; w++)
        n_allowed += __builtin_popcount(mask[w]);
    assert_int_equal(n_allowed, 1);
    assert_true(mask[GPTOSS_TOKEN_CHANNEL / 32] >> (GPTOSS_TOKEN_CHANNEL % 32) & 1u);
    gptoss_tokens t = {0};
    const char *text = "<|channel|>final<|message|>[1,1]<|return|>";
    assert_int_equal(gptoss_tokenizer_encode(tok, text, strlen(text), true, &t, &err), GPTOSS_OK);
    for (size_t i = 1; i <= t.n; i++) {
        memset(mask, 0, words * sizeof *mask);
        assert_true(gptoss_harmony_constraint_next(c, t.ids, (int32_t)i, mask, vocab));
    }
    assert_true(gptoss_harmony_constraint_done(c));
    gptoss_harmony_constraint_free(c);
    /* "]" before "[": the body refuses it, and the state stays broken. */
    assert_int_equal(gptoss_harmony_constraint_create(frame, &c, &err), GPTOSS_OK);
    int32_t bad[] = {t.ids[0], t.ids[1], t.ids[2], one_token("]")};
    assert_false(gptoss_harmony_constraint_next(c, bad, 4, mask, vocab));
    assert_false(gptoss_harmony_constraint_next(c, bad, 3, mask, vocab));
    gptoss_harmony_constraint_free(c);
    /* <|return|> inside reasoning is not allowed. */
    assert_int_equal(gptoss_harmony_constraint_create(frame, &c, &err), GPTOSS_OK);
    gptoss_tokens r = {0};
    const char *reasoning = "<|channel|>analysis<|message|>hm<|return|>";
    assert_int_equal(gptoss_tokenizer_encode(tok, reasoning, strlen(reasoning), true, &r, &err),
                     GPTOSS_OK);
    assert_true(gptoss_harmony_constraint_next(c, r.ids, (int32_t)r.n - 1, mask, vocab));
    assert_false(mask[GPTOSS_TOKEN_RETURN / 32] >> (GPTOSS_TOKEN_RETURN % 32) & 1u);
    assert_false(gptoss_harmony_constraint_next(c, r.ids, (int32_t)r.n, mask, vocab));
    gptoss_harmony_constraint_free(c);
    gptoss_tokens_free(&t);
    gptoss_tokens_free(&r);
    free(mask);
    gptoss_harmony_frame_free(frame);
}

/* Headers that cannot frame anything are refused when the frame is built. */
static void test_bad_frames(void **state) {
    (void)state;
    gptoss_harmony_frame *frame = NULL;
    gptoss_error err = {0};
    gptoss_harmony_target no_message[] = {{.header = "<|channel|>final",
                                           .kind = GPTOSS_HARMONY_BODY_TEXT,
                                           .end_token = GPTOSS_TOKEN_RETURN}};
    assert_int_equal(gptoss_harmony_frame_create(tok, no_message, 1, 0, 0, &frame, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "<|message|>"));
    gptoss_harmony_target twice[] = {analysis, analysis};
    assert_int_equal(gptoss_harmony_frame_create(tok, twice, 2, 0, 0, &frame, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_null(frame);
}

/* ---- with the JSON Schema matcher --------------------------------------------------------- */

static gptoss_status matcher_create(void *user, gptoss_token_constraint **out,
                                    gptoss_error *error) {
    return gptoss_json_matcher_create(user, out, error);
}

/* The matcher under the frame's budget: every answer, from the smallest max_tokens that fits
 * up, parses as JSON and has the schema's shape (checked here by hand: an object with exactly
 * an integer "a" and a string "b" of at most 5 characters), whether the draw reasons first or
 * not. */
static void test_json_matcher_always_closes(void **state) {
    (void)state;
    gptoss_json_vocab *jv = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_json_vocab_create(tok, &jv, &err), GPTOSS_OK);
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                                "\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":5}},"
                                "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
                                0, NULL);
    gptoss_json_schema *compiled = NULL;
    assert_int_equal(gptoss_json_schema_compile(schema, jv, &compiled, &err), GPTOSS_OK);
    gptoss_harmony_target targets[] = {
        analysis,
        {.header = "<|channel|>final<|message|>",
         .kind = GPTOSS_HARMONY_BODY_CONSTRAINED,
         .end_token = GPTOSS_TOKEN_RETURN,
         .budgeted = true,
         .body = {matcher_create, gptoss_json_matcher_set_budget, compiled}}};
    int n_reasoned = 0;
    for (int32_t max_tokens = 40; max_tokens <= 160; max_tokens += 8) {
        gptoss_harmony_frame *frame = NULL;
        assert_int_equal(gptoss_harmony_frame_create(tok, targets, 2, max_tokens, 30, &frame, &err),
                         GPTOSS_OK);
        for (int seed = 1; seed <= 3; seed++) {
            rng_state = 0xabcdef12345ull * (uint64_t)(seed + 7 * max_tokens);
            outcome o = generate(frame, max_tokens, seed == 1 ? 0 : 30);
            json_error_t jerr;
            json_t *v = json_loads(o.content, 0, &jerr);
            const json_t *a = json_object_get(v, "a"), *b = json_object_get(v, "b");
            const bool shaped = json_is_object(v) && json_object_size(v) == 2 &&
                                json_is_integer(a) && json_is_string(b) &&
                                json_string_length(b) <= 15; /* <= 5 characters of UTF-8 */
            if (!shaped || strcmp(o.finish, "stop") != 0 || o.n_tokens > max_tokens)
                fail_msg("max_tokens %d seed %d: '%s' finish %s after %d tokens", max_tokens, seed,
                         o.content, o.finish, o.n_tokens);
            n_reasoned += o.n_tokens > 40;
            json_decref(v);
        }
        gptoss_harmony_frame_free(frame);
    }
    assert_true(n_reasoned > 0);
    gptoss_json_schema_free(compiled);
    json_decref(schema);
    gptoss_json_vocab_free(jv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_final_body_always_fits),
        cmocka_unit_test(test_required_tool_call),
        cmocka_unit_test(test_text_answer_no_tool_call),
        cmocka_unit_test(test_rejects_off_frame_tokens),
        cmocka_unit_test(test_bad_frames),
        cmocka_unit_test(test_json_matcher_always_closes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
