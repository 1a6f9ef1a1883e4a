/*
 * harmony_render_tokens.c - the token-id form of a harmony rendering.
 *
 * Owns: nothing. Each text fragment from the renderer is encoded with special tokens NOT
 * recognised (so user text containing "<|start|>" cannot forge a message boundary, spec 7
 * gotcha 13); special tokens go in as single ids. Kept apart from harmony_render.c so text
 * rendering links without a tokenizer.
 */
#include "chat/harmony.h"

typedef struct token_sink {
    const gptoss_tokenizer *tokenizer; /* encodes text fragments */
    gptoss_tokens *out;                /* ids appended here */
} token_sink;

static gptoss_status sink_text(void *user, const char *bytes, size_t len, gptoss_error *error) {
    token_sink *s = user;
    if (len == 0) return GPTOSS_OK;
    return gptoss_tokenizer_encode(s->tokenizer, bytes, len, false, s->out, error);
}

static gptoss_status sink_special(void *user, int32_t id, gptoss_error *error) {
    token_sink *s = user;
    return gptoss_tokens_push(s->out, id, error);
}

gptoss_status gptoss_harmony_render_tokens(const gptoss_harmony_conversation *conversation,
                                           const gptoss_harmony_render_options *options,
                                           const gptoss_tokenizer *tokenizer, gptoss_tokens *out,
                                           gptoss_error *error) {
    token_sink s = {tokenizer, out};
    gptoss_harmony_sink sink = {sink_text, sink_special, &s};
    return gptoss_harmony_render_to_sink(conversation, options, &sink, error);
}
