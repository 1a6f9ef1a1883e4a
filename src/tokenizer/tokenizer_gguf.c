/*
 * tokenizer_gguf.c - the o200k_harmony tokenizer from a GGUF file's tokenizer.ggml.* metadata,
 * so that a lone .gguf needs no tokenizer.json.
 *
 * Owns: mapping llama.cpp's "gpt2" vocabulary onto gptoss_tok_build: tokenizer.ggml.tokens[id]
 * is the token (GPT-2 byte-level alphabet for normal tokens), tokenizer.ggml.token_type[id]
 * says which: 1 normal (an ordinary BPE token, rank = id), 3 control and 4 user-defined (the
 * special tokens, text taken verbatim), 5 unused (the "[PAD<id>]" fillers of ids the model's
 * tokenizer does not define: left undefined, as tokenizer.json leaves them). Merges are not
 * needed: as in tiktoken, merge priority is the rank of the merged token.
 */
#include "format/gguf.h"
#include "tokenizer/tokenizer_internal.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4, TOKEN_UNUSED = 5 };

static gptoss_status build(const char *path, const gptoss_gguf_file *file, gptoss_tokenizer **out,
                           gptoss_error *error) {
    gptoss_gguf_str model = {0}, pre = {0};
    gptoss_status st = gptoss_gguf_get_string(file, "tokenizer.ggml.model", true, &model, error);
    if (st) return st;
    if (!gptoss_gguf_str_is(model, "gpt2"))
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "tokenizer.ggml.model is \"%.*s\"; only byte-level BPE (\"gpt2\", "
                                "o200k_harmony) is supported",
                                (int)(model.len > 32 ? 32 : model.len), model.ptr);
    if ((st = gptoss_gguf_get_string(file, "tokenizer.ggml.pre", false, &pre, error))) return st;
    if (pre.ptr && !gptoss_gguf_str_is(pre, "gpt-4o"))
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "tokenizer.ggml.pre is \"%.*s\"; only the o200k pre-tokenizer "
                                "(\"gpt-4o\") is supported",
                                (int)(pre.len > 32 ? 32 : pre.len), pre.ptr);
    const gptoss_gguf_kv *tokens, *types;
    if ((st = gptoss_gguf_get_array(file, "tokenizer.ggml.tokens", GPTOSS_GGUF_STRING, &tokens,
                                    error)) ||
        (st = gptoss_gguf_get_array(file, "tokenizer.ggml.token_type", GPTOSS_GGUF_I32, &types,
                                    error)))
        return st;
    if (types->count != tokens->count)
        return gptoss_set_error(
            error, GPTOSS_ERR_FORMAT, "tokenizer.ggml.token_type has %llu entries for %llu tokens",
            (unsigned long long)types->count, (unsigned long long)tokens->count);
    if (tokens->count > (1u << 23))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries",
                                (unsigned long long)tokens->count);
    gptoss_tok_source *list = malloc((tokens->count ? tokens->count : 1) * sizeof *list);
    if (!list) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = 0;
    for (uint64_t id = 0; id < tokens->count; id++) {
        int64_t type = gptoss_gguf_array_int(types, id);
        if (type == TOKEN_UNUSED) continue;
        if (type != TOKEN_NORMAL && type != TOKEN_CONTROL && type != TOKEN_USER_DEFINED) {
            free(list);
            return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                    "token %llu has token_type %lld; a gpt2 vocabulary has only "
                                    "normal (1), control (3), user-defined (4) and unused (5)",
                                    (unsigned long long)id, (long long)type);
        }
        list[n++] = (gptoss_tok_source){(int32_t)id, tokens->strings[id].ptr,
                                        (size_t)tokens->strings[id].len, type != TOKEN_NORMAL};
    }
    st = gptoss_tok_build(path, list, n, out, error);
    free(list);
    return st;
}

gptoss_status gptoss_tokenizer_load_gguf(const char *path, gptoss_tokenizer **out,
                                         gptoss_error *error) {
    *out = NULL;
    gptoss_gguf_file *file = NULL;
    gptoss_status st = gptoss_gguf_open(path, &file, error);
    if (st) return st;
    st = build(path, file, out, error);
    gptoss_gguf_close(file);
    if (st && strncmp(error ? error->message : "", path, strlen(path)) != 0)
        gptoss_error_prefix(error, "%s: ", path);
    return st;
}

bool gptoss_tokenizer_path_for_model(const char *model_path, char *out, size_t size) {
    struct stat sb;
    int n;
    if (stat(model_path, &sb) == 0 && S_ISREG(sb.st_mode))
        n = snprintf(out, size, "%s", model_path);
    else
        n = snprintf(out, size, "%s/tokenizer.json", model_path);
    return n >= 0 && (size_t)n < size;
}
