/*
 * special_tokens.h - the special token ids of the o200k_harmony vocabulary (spec section 5.5).
 *
 * Facts of the models' vocabulary, needed below the tokenizer too (the config's defaults, the
 * checkpoint writer's generation_config.json), so they live in the model layer; the tokenizer
 * and the chat layer include them from here.
 */
#ifndef GPTOSS_MODEL_SPECIAL_TOKENS_H
#define GPTOSS_MODEL_SPECIAL_TOKENS_H

enum {
    GPTOSS_TOKEN_STARTOFTEXT = 199998,
    GPTOSS_TOKEN_ENDOFTEXT = 199999,
    GPTOSS_TOKEN_RETURN = 200002,
    GPTOSS_TOKEN_CONSTRAIN = 200003,
    GPTOSS_TOKEN_CHANNEL = 200005,
    GPTOSS_TOKEN_START = 200006,
    GPTOSS_TOKEN_END = 200007,
    GPTOSS_TOKEN_MESSAGE = 200008,
    GPTOSS_TOKEN_CALL = 200012,
};

#endif
