/*
 * draft_options.h - the speculative-decoding options that run, chat, serve and bench share:
 * --draft, --draft-model, --num-speculative-tokens, --draft-max-batch (docs/speculative.md).
 */
#ifndef GPTOSS_CLI_DRAFT_OPTIONS_H
#define GPTOSS_CLI_DRAFT_OPTIONS_H

#include "options.h"
#include "gptoss_engine.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct cli_draft_options {
    int kind;              /* index into the choices: none, ngram, [replay,] eagle3 */
    bool with_replay;      /* the choices include replay (set by cli_draft_option_table) */
    const char *model_dir; /* --draft-model: an EAGLE3 head folder */
    int64_t k;             /* --num-speculative-tokens */
    int64_t max_batch;     /* --draft-max-batch */
} cli_draft_options;

enum { CLI_DRAFT_N_OPTIONS = 4 };

cli_draft_options cli_draft_options_default(void);

/* Fills `table` bound to *d. with_replay: also accept --draft replay (bench, which brings the
 * recorded continuations replay drafts from). */
void cli_draft_option_table(cli_draft_options *d, bool with_replay,
                            cli_option table[CLI_DRAFT_N_OPTIONS]);

/* Sets eo->draft from the parsed options. */
void cli_draft_options_apply(const cli_draft_options *d, gptoss_engine_options *eo);

#endif
