/*
 * draft_options.c - the shared speculative-decoding options (see draft_options.h).
 */
#include "draft_options.h"
#include "engine/draft.h"

static const char *const draft_names[] = {"none", "ngram", "eagle3", NULL};
static const char *const draft_names_replay[] = {"none", "ngram", "replay", "eagle3", NULL};

cli_draft_options cli_draft_options_default(void) {
    gptoss_draft_options o = gptoss_engine_options_default().draft;
    return (cli_draft_options){.kind = 0, .k = o.num_speculative_tokens, .max_batch = o.max_batch};
}

void cli_draft_option_table(cli_draft_options *d, bool with_replay,
                            cli_option table[CLI_DRAFT_N_OPTIONS]) {
    d->with_replay = with_replay;
    table[0] = (cli_option){
        .name = "draft",
        .kind = CLI_ENUM,
        .target = &d->kind,
        .choices = with_replay ? draft_names_replay : draft_names,
        .help = with_replay ? "speculative decoding: draft tokens by prompt lookup (ngram),\n"
                              "from each request's recorded output (replay) or with an\n"
                              "EAGLE3 head (eagle3, --draft-model); outputs are unchanged\n"
                              "(default none)"
                            : "speculative decoding: draft tokens by prompt lookup (ngram)\n"
                              "or with an EAGLE3 head (eagle3, --draft-model, CPU backend);\n"
                              "outputs are unchanged, decoding may be faster (default none)",
        .error = with_replay ? "--draft must be none, ngram, replay or eagle3"
                             : "--draft must be none, ngram or eagle3"};
    table[1] = (cli_option){.name = "num-speculative-tokens",
                            .kind = CLI_INT,
                            .target = &d->k,
                            .value = "K",
                            .lo = 1,
                            .hi = GPTOSS_MAX_SPECULATIVE_TOKENS,
                            .help = "draft tokens per sequence and step, 1..7 (default 3)",
                            .error = "--num-speculative-tokens needs a count in 1..7"};
    table[2] =
        (cli_option){.name = "draft-max-batch",
                     .kind = CLI_INT,
                     .target = &d->max_batch,
                     .value = "N",
                     .lo = 0,
                     .hi = 1 << 20,
                     .help = "no drafting while more sequences decode\n(default 16; 0 = no limit)",
                     .error = "--draft-max-batch needs a count >= 0"};
    table[3] = (cli_option){.name = "draft-model",
                            .kind = CLI_STRING,
                            .target = &d->model_dir,
                            .value = "DIR",
                            .help = "the EAGLE3 head folder of --draft eagle3 (config.json and\n"
                                    "*.safetensors in the Hugging Face layout)"};
}

void cli_draft_options_apply(const cli_draft_options *d, gptoss_engine_options *eo) {
    const char *name = (d->with_replay ? draft_names_replay : draft_names)[d->kind];
    if (!gptoss_draft_kind_parse(name, &eo->draft.kind)) eo->draft.kind = GPTOSS_DRAFT_NONE;
    eo->draft.model_dir = d->model_dir;
    eo->draft.num_speculative_tokens = (int32_t)d->k;
    eo->draft.max_batch = (int32_t)d->max_batch;
}
