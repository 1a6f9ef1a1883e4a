/*
 * load_hf.c - gptoss_model_load for a Hugging Face gpt-oss folder: config.json, the presence of
 * tokenizer.json, and the safetensors weights (one model.safetensors, or shards listed by
 * model.safetensors.index.json). A path to a GGUF file is handed to load_gguf.c.
 *
 * Owns: finding and opening the files and checking that the index and the shard headers
 * agree. Each mapped shard is handed to the model as storage, and every tensor as a view, so
 * the model itself stays free of file formats (model/model.h).
 */
#include "format/safetensors.h"
#include "format/tensor.h"
#include "loader/gguf_model.h"
#include "model/config.h"
#include "model/model.h"
#include "util/error.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The shards opened so far; the model owns them, this list only finds them again. */
typedef struct hf_shards {
    const char *dir;
    gptoss_model *model;
    gptoss_st_file **files; /* [n] borrowed */
    size_t n;
} hf_shards;

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static void close_shard(void *handle) {
    gptoss_st_close(handle);
}

static gptoss_status add_shard(hf_shards *s, const char *path, gptoss_error *error) {
    gptoss_st_file **grown = realloc(s->files, (s->n + 1) * sizeof *grown);
    if (!grown) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    s->files = grown;
    gptoss_st_file *file = NULL;
    gptoss_status st = gptoss_st_open(path, &file, error);
    if (st != GPTOSS_OK) return st;
    if ((st = gptoss_model_add_storage(s->model, file, close_shard, error)) != GPTOSS_OK) return st;
    s->files[s->n++] = file;
    return GPTOSS_OK;
}

static const gptoss_st_file *find_shard(const hf_shards *s, const char *path) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->files[i]->path, path) == 0) return s->files[i];
    return NULL;
}

/* Opens the shards named by model.safetensors.index.json and checks that the weight map and
 * the shard headers agree. */
static gptoss_status open_sharded(hf_shards *s, const char *index_path, gptoss_error *error) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "%s: not valid JSON: %s (line %d, column %d)", index_path,
                                jerr.text, jerr.line, jerr.column);
    gptoss_status st = GPTOSS_OK;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                              "%s: \"weight_map\" is missing, empty or not an object", index_path);
        goto done;
    }
    const char *name;
    json_t *value;
    json_object_foreach(map, name, value) {
        const char *shard = json_string_value(value);
        if (!shard || !*shard || strchr(shard, '/') || strcmp(shard, "..") == 0 ||
            strlen(shard) > 255) {
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                  "%s: weight_map[\"%s\"] is not a plain file name", index_path,
                                  name);
            goto done;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", s->dir, shard);
        if (!find_shard(s, path)) {
            if (!file_exists(path)) {
                st = gptoss_set_error(error, GPTOSS_ERR_IO,
                                      "%s: shard %s (holding %s) does not exist", index_path, shard,
                                      name);
                goto done;
            }
            if ((st = add_shard(s, path, error)) != GPTOSS_OK) goto done;
        }
        if (!gptoss_st_find(find_shard(s, path), name)) {
            st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                  "%s: weight_map puts %s in %s, but that shard has no such tensor",
                                  index_path, name, shard);
            goto done;
        }
    }
    /* Every tensor in a shard must be in the weight map. */
    for (size_t i = 0; i < s->n; i++) {
        for (size_t t = 0; t < s->files[i]->n_tensors; t++) {
            const char *tname = s->files[i]->tensors[t].name;
            json_t *listed = json_object_get(map, tname);
            const char *base = strrchr(s->files[i]->path, '/');
            base = base ? base + 1 : s->files[i]->path;
            if (!listed || strcmp(json_string_value(listed), base) != 0) {
                st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                      "%s: tensor %s is not in the weight_map of %s",
                                      s->files[i]->path, tname, index_path);
                goto done;
            }
        }
    }
done:
    json_decref(root);
    return st;
}

/* Hands every tensor of every shard to the model as a view. */
static gptoss_status bind_shards(const hf_shards *s, gptoss_error *error) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->files[i]->n_tensors;
    gptoss_tensor *views = calloc(n ? n : 1, sizeof *views);
    const char **origins = calloc(n ? n : 1, sizeof *origins);
    if (!views || !origins) {
        free(views);
        free(origins);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        for (size_t t = 0; t < s->files[i]->n_tensors; t++, k++) {
            const gptoss_st_tensor *src = &s->files[i]->tensors[t];
            views[k].name = src->name;
            views[k].data = src->data;
            views[k].dtype = src->dtype;
            views[k].n_dims = src->n_dims;
            memcpy(views[k].shape, src->shape, sizeof views[k].shape);
            views[k].n_bytes = (size_t)(src->end - src->begin);
            origins[k] = s->files[i]->path;
        }
    gptoss_status st = gptoss_model_bind(s->model, views, origins, n, error);
    free(views);
    free(origins);
    return st;
}

/* OpenAI's own checkpoint format (config.json, dtypes.json and one model.safetensors with
 * other tensor names) ships in the repo's original/ folder, and a download of only that folder
 * holds nothing else: say what it is and what to point at instead of failing on its config. */
static gptoss_status check_not_original(const char *dir, gptoss_error *error) {
    char path[4096];
    snprintf(path, sizeof path, "%s/dtypes.json", dir);
    if (file_exists(path))
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "%s is OpenAI's original checkpoint layout (config.json, dtypes.json, "
            "model.safetensors), which gptoss does not read; give -m the Hugging Face folder "
            "instead: the one above original/, with config.json, tokenizer.json and "
            "model-*.safetensors at its top",
            dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (file_exists(path)) return GPTOSS_OK;
    snprintf(path, sizeof path, "%s/original/dtypes.json", dir);
    char config[4096];
    snprintf(config, sizeof config, "%s/original/config.json", dir);
    if (file_exists(path) || file_exists(config))
        return gptoss_set_error(
            error, GPTOSS_ERR_IO,
            "%s holds only original/ (OpenAI's original checkpoint layout, which gptoss does not "
            "read) and not the Hugging Face files gptoss loads: config.json, tokenizer.json and "
            "model-*.safetensors with their index at the top of the folder. Download those "
            "(hf download openai/gpt-oss-20b --exclude 'original/*' --exclude 'metal/*', or "
            "120b) and give -m that folder",
            dir);
    return GPTOSS_OK;
}

gptoss_status gptoss_model_load(const char *dir, gptoss_model **out, gptoss_error *error) {
    *out = NULL;
    if (!dir || !*dir)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "no model folder given");
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: %s", dir, strerror(errno));
    if (S_ISREG(sb.st_mode) && gptoss_gguf_sniff(dir))
        return gptoss_gguf_model_load(dir, out, error);
    if (!S_ISDIR(sb.st_mode))
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "%s: neither a model folder (holding config.json) nor a GGUF file",
                                dir);
    gptoss_status st = check_not_original(dir, error);
    if (st != GPTOSS_OK) return st;
    gptoss_config config;
    st = gptoss_config_load(dir, &config, error);
    if (st != GPTOSS_OK) return st;

    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!file_exists(path))
        return gptoss_set_error(
            error, GPTOSS_ERR_IO,
            "%s: tokenizer.json is missing (a gpt-oss folder ships it beside config.json)", dir);

    hf_shards shards = {.dir = dir};
    if ((st = gptoss_model_create(dir, &config, &shards.model, error)) != GPTOSS_OK) return st;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) {
        st = open_sharded(&shards, path, error);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (file_exists(path))
            st = add_shard(&shards, path, error);
        else
            st = gptoss_set_error(
                error, GPTOSS_ERR_IO,
                "%s: no weights: neither model.safetensors.index.json nor model.safetensors exists",
                dir);
    }
    if (st == GPTOSS_OK) {
        st = bind_shards(&shards, error);
        if (st != GPTOSS_OK) gptoss_error_prefix(error, "%s: ", dir);
    }
    free(shards.files);
    if (st != GPTOSS_OK) {
        gptoss_model_free(shards.model);
        return st;
    }
    *out = shards.model;
    return GPTOSS_OK;
}
