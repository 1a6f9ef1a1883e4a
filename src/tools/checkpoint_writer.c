/*
 * checkpoint_writer.c - see checkpoint_writer.h.
 *
 * Tensor values come from model/random_init (a pure function of seed, name and index), so
 * the bytes do not depend on thread count, chunking or machine.
 */
#include "tools/checkpoint_writer.h"
#include "format/safetensors_writer.h"
#include "model/config.h"
#include "model/random_init.h"
#include "model/special_tokens.h"
#include "util/error.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DEFAULT_MAX_SHARD_BYTES 4600000000ull

typedef struct fill_context {
    const gptoss_init_tensor *tensors; /* the shard's tensors */
    uint64_t seed;
    uint64_t done_before; /* bytes written in earlier shards */
    uint64_t total;       /* bytes of all shards */
    const gptoss_checkpoint_options *options;
} fill_context;

static void fill(void *user, size_t index, uint64_t offset, uint8_t *out, size_t len) {
    const fill_context *ctx = user;
    const gptoss_init_tensor *t = &ctx->tensors[index];
    /* Split the chunk into 64 KiB pieces (multiples of 8 bytes) generated in parallel. */
    const size_t piece = 65536;
    long n_pieces = (long)((len + piece - 1) / piece);
#pragma omp parallel for schedule(static)
    for (long p = 0; p < n_pieces; p++) {
        size_t start = (size_t)p * piece;
        size_t n = len - start < piece ? len - start : piece;
        gptoss_init_fill(t, ctx->seed, offset + start, out + start, n);
    }
}

static void written(void *user, uint64_t bytes) {
    const fill_context *ctx = user;
    if (ctx->options->progress)
        ctx->options->progress(ctx->options->progress_user, "writing weights",
                               (double)(ctx->done_before + bytes) / (double)ctx->total);
}

static gptoss_status write_text(const char *dir, const char *name, const char *text,
                                gptoss_error *error) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot create: %s", path,
                                strerror(errno));
    size_t len = strlen(text);
    bool ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
    if (fclose(f) != 0) ok = false;
    if (!ok)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: write failed: %s", path,
                                strerror(errno));
    return GPTOSS_OK;
}

static gptoss_status write_json(const char *dir, const char *name, json_t *value,
                                gptoss_error *error) {
    char *text = json_dumps(value, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    gptoss_status st = write_text(dir, name, text, error);
    free(text);
    return st;
}

static gptoss_status copy_file(const char *from, const char *to, gptoss_error *error) {
    FILE *in = fopen(from, "rb");
    if (!in)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    if (ferror(in)) ok = false;
    fclose(in);
    if (fclose(out) != 0) ok = false;
    if (!ok) return gptoss_set_error(error, GPTOSS_ERR_IO, "copying %s to %s failed", from, to);
    return GPTOSS_OK;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static gptoss_status write_generation_config(const gptoss_config *c, const char *dir,
                                             gptoss_error *error) {
    json_t *g = json_object();
    if (c->vocab_size > GPTOSS_TOKEN_STARTOFTEXT)
        json_object_set_new(g, "bos_token_id", json_integer(GPTOSS_TOKEN_STARTOFTEXT));
    json_object_set_new(g, "do_sample", json_true());
    json_t *eos = json_array();
    json_array_append_new(eos, json_integer(c->eos_token_id));
    /* The published file also stops on <|endoftext|> and <|call|> when they exist. */
    if (c->eos_token_id == GPTOSS_TOKEN_RETURN && c->vocab_size > GPTOSS_TOKEN_CALL) {
        json_array_append_new(eos, json_integer(GPTOSS_TOKEN_ENDOFTEXT));
        json_array_append_new(eos, json_integer(GPTOSS_TOKEN_CALL));
    }
    json_object_set_new(g, "eos_token_id", eos);
    if (c->pad_token_id >= 0) json_object_set_new(g, "pad_token_id", json_integer(c->pad_token_id));
    json_object_set_new(g, "transformers_version", json_string("4.55.0.dev0"));
    gptoss_status st = write_json(dir, "generation_config.json", g, error);
    json_decref(g);
    return st;
}

static gptoss_status make_dir(const char *dir, gptoss_error *error) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot create folder: %s", path,
                                    strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot create folder: %s", path,
                                strerror(errno));
    return GPTOSS_OK;
}

gptoss_status gptoss_checkpoint_write_random(const gptoss_config *c, const char *dir,
                                             const gptoss_checkpoint_options *options,
                                             gptoss_error *error) {
    gptoss_status st = gptoss_config_validate(c, error);
    if (st != GPTOSS_OK) return st;
    if ((st = make_dir(dir, error)) != GPTOSS_OK) return st;

    gptoss_init_tensor *tensors = NULL;
    size_t n = 0;
    if ((st = gptoss_init_tensors(c, &tensors, &n, error)) != GPTOSS_OK) return st;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += gptoss_init_tensor_bytes(&tensors[i]);

    /* Sharding in checkpoint order. With an explicit limit: greedy packing under it. By
     * default, the published layout: n = max(3, ceil(total / 4.6 GB)) shards (3 for 20b, 15
     * for 120b), each tensor placed by where its first byte falls, empty shards dropped. */
    size_t *shard_of = calloc(n, sizeof *shard_of);
    gptoss_st_write_tensor *views = calloc(n, sizeof *views);
    const char **names = calloc(n, sizeof *names);
    json_t *weight_map = json_object();
    if (!shard_of || !views || !names) {
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    uint64_t n_target = (total + DEFAULT_MAX_SHARD_BYTES - 1) / DEFAULT_MAX_SHARD_BYTES;
    if (n_target < 3) n_target = 3;
    size_t n_shards = 1;
    uint64_t in_shard = 0, offset = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = gptoss_init_tensor_bytes(&tensors[i]);
        if (options->single_file)
            shard_of[i] = 0;
        else if (options->max_shard_bytes) {
            if (in_shard > 0 && in_shard + bytes > options->max_shard_bytes) {
                n_shards++;
                in_shard = 0;
            }
            shard_of[i] = n_shards - 1;
            in_shard += bytes;
        } else {
            shard_of[i] = (size_t)((double)offset / (double)total * (double)n_target);
            if (i > 0 && shard_of[i] > shard_of[i - 1])
                shard_of[i] = shard_of[i - 1] + 1; /* compact */
        }
        offset += bytes;
        views[i].name = tensors[i].name;
        views[i].dtype = tensors[i].dtype;
        views[i].n_dims = tensors[i].n_dims;
        views[i].shape = tensors[i].shape;
        names[i] = tensors[i].name;
    }
    if (!options->single_file && !options->max_shard_bytes) n_shards = shard_of[n - 1] + 1;
    uint64_t done_before = 0;
    for (size_t s = 0, first = 0; s < n_shards; s++) {
        size_t last = first;
        while (last < n && shard_of[last] == s)
            last++;
        char file[128], path[4096];
        if (options->single_file)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s, n_shards - 1);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        fill_context ctx = {&tensors[first], options->seed, done_before, total, options};
        st = gptoss_st_write(path, &views[first], last - first, fill, written, &ctx, error);
        if (st != GPTOSS_OK) goto done;
        for (size_t i = first; i < last; i++) {
            json_object_set_new(weight_map, tensors[i].name, json_string(file));
            done_before += gptoss_init_tensor_bytes(&tensors[i]);
        }
        first = last;
    }
    if (!options->single_file) {
        qsort(names, n, sizeof *names, compare_names);
        json_t *sorted = json_object();
        for (size_t i = 0; i < n; i++)
            json_object_set(sorted, names[i], json_object_get(weight_map, names[i]));
        json_t *index = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total,
                                  "weight_map", sorted);
        st = write_json(dir, "model.safetensors.index.json", index, error);
        json_decref(index);
        if (st != GPTOSS_OK) goto done;
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        remove(path); /* a stale index would point at shards we did not write */
    }
    char *config_text = gptoss_config_to_json(c);
    st = config_text ? write_text(dir, "config.json", config_text, error)
                     : gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    free(config_text);
    if (st != GPTOSS_OK) goto done;
    if ((st = write_generation_config(c, dir, error)) != GPTOSS_OK) goto done;
    if (options->tokenizer_dir) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            char from[4096], to[4096];
            snprintf(from, sizeof from, "%s/%s", options->tokenizer_dir, files[i]);
            snprintf(to, sizeof to, "%s/%s", dir, files[i]);
            if ((st = copy_file(from, to, error)) != GPTOSS_OK) goto done;
        }
        json_t *special = json_pack("{s:s,s:s,s:s}", "bos_token", "<|startoftext|>", "eos_token",
                                    "<|return|>", "pad_token", "<|endoftext|>");
        st = write_json(dir, "special_tokens_map.json", special, error);
        json_decref(special);
    }
done:
    json_decref(weight_map);
    free(names);
    free(views);
    free(shard_of);
    free(tensors);
    return st;
}
