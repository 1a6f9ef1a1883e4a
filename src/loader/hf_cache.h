/*
 * hf_cache.h - what a model argument names: a folder, or a Hugging Face repo id
 * ("openai/gpt-oss-20b", "openai/gpt-oss-20b@REVISION") found in the local Hugging Face cache,
 * and the model id it is served under.
 *
 * Owns the cache layout (HUB/models--ORG--NAME/refs/REVISION holds a commit hash, whose files
 * are in HUB/models--ORG--NAME/snapshots/HASH/) and the order the cache folder is looked up
 * in. Never downloads: a repo that is not in the cache is an error that gives the command
 * which downloads it.
 */
#ifndef GPTOSS_LOADER_HF_CACHE_H
#define GPTOSS_LOADER_HF_CACHE_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct gptoss_model_location {
    char dir[4096]; /* the folder to load */
    char id[256];   /* the model id: ORG/NAME for a repo id or a cache snapshot folder, else the
                     * folder's last component */
} gptoss_model_location;

/* The Hugging Face hub cache folder: $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. */
void gptoss_hf_cache_dir(char *out, size_t size);

/* Whether text has the form of a repo id, ORG/NAME or ORG/NAME@REVISION: one slash, names of
 * letters, digits, '-', '_' and '.' that start with a letter or digit (no "..", no "--"). */
bool gptoss_hf_is_repo_id(const char *text);

/* Resolves a model argument: an existing path is used as it is (its id is ORG/NAME when it is a
 * cache snapshot folder, else its last component); otherwise a repo id is looked up in the
 * cache (REVISION defaults to main and may be a branch, a tag or a commit hash). IO error
 * when nothing is found: for a repo id, the message says where it looked and how to download
 * it. */
gptoss_status gptoss_model_locate(const char *arg, gptoss_model_location *out, gptoss_error *error);

#endif
