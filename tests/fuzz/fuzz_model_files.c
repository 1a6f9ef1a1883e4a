/*
 * fuzz_model_files.c - libFuzzer target: the text a checkpoint folder brings besides its tensor
 * bytes. The bytes up to the first 0 byte are a config.json, read as a model's (an accepted
 * config must validate again and write itself back as text that parses to the same config) and
 * as an EAGLE3 head's (the same round trip; its target boundaries in range), those after it a
 * safetensors header against a
 * data buffer whose size the first 8 of them give (gptoss_st_parse_header: every accepted
 * tensor's byte range must lie in the buffer, hold exactly its shape times its dtype size, and
 * overlap no other unless empty). Every refusal must say why.
 */
#include "format/safetensors.h"
#include "model/config.h"
#include "model/eagle3.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_header(const uint8_t *p, size_t n) {
    uint64_t data_size = 0;
    if (n >= 8) {
        memcpy(&data_size, p, 8);
        data_size %= (uint64_t)1 << 40;
        p += 8, n -= 8;
    }
    gptoss_st_tensor *tensors = NULL;
    size_t n_tensors = 0;
    gptoss_error err = {0};
    if (gptoss_st_parse_header((const char *)p, n, data_size, &tensors, &n_tensors, &err) !=
        GPTOSS_OK) {
        if (err.message[0] == '\0') abort();
        return;
    }
    for (size_t i = 0; i < n_tensors; i++) {
        const gptoss_st_tensor *t = &tensors[i];
        if (!t->name || t->begin > t->end || t->end > data_size) abort();
        if (t->n_dims < 0 || t->n_dims > GPTOSS_MAX_DIMS) abort();
        unsigned __int128 bytes = gptoss_dtype_size(t->dtype);
        for (int32_t d = 0; d < t->n_dims; d++) {
            if (t->shape[d] < 0) abort();
            bytes *= (uint64_t)t->shape[d];
        }
        if (bytes != t->end - t->begin) abort();
        for (size_t j = 0; j < i; j++) {
            const gptoss_st_tensor *u = &tensors[j];
            const bool empty = t->begin == t->end || u->begin == u->end;
            if (!empty && t->begin < u->end && u->begin < t->end) abort(); /* overlap */
        }
    }
    gptoss_st_free_tensors(tensors, n_tensors);
}

/* The text as a model's config.json: accepted, it validates again and writes itself back as
 * text that parses to the same config. */
static void check_config(const char *text, size_t n) {
    gptoss_config config, again;
    memset(&config, 0, sizeof config);
    memset(&again, 0, sizeof again);
    gptoss_error err = {0};
    if (gptoss_config_parse(text, n, &config, &err) != GPTOSS_OK) {
        if (err.message[0] == '\0') abort();
        return;
    }
    if (gptoss_config_validate(&config, &err) != GPTOSS_OK) abort();
    char *json = gptoss_config_to_json(&config);
    if (!json) return; /* out of memory */
    if (gptoss_config_parse(json, strlen(json), &again, &err) != GPTOSS_OK ||
        memcmp(&config, &again, sizeof config) != 0)
        abort();
    free(json);
}

/* The same text as an EAGLE3 head's config.json: accepted, it round-trips the same way, and
 * its boundaries for a 36-layer target are refused with a reason or lie in [0, 36]. */
static void check_eagle3_config(const char *text, size_t n) {
    gptoss_eagle3_config config, again;
    memset(&config, 0, sizeof config);
    memset(&again, 0, sizeof again);
    gptoss_error err = {0};
    if (gptoss_eagle3_config_parse(text, n, &config, &err) != GPTOSS_OK) {
        if (err.message[0] == '\0') abort();
        return;
    }
    char *json = gptoss_eagle3_config_to_json(&config);
    if (!json) return;
    if (gptoss_eagle3_config_parse(json, strlen(json), &again, &err) != GPTOSS_OK ||
        memcmp(&config, &again, sizeof config) != 0)
        abort();
    free(json);
    int32_t b[GPTOSS_EAGLE3_N_AUX];
    gptoss_error berr = {0};
    if (gptoss_eagle3_boundaries(&config, 36, b, &berr) == GPTOSS_OK) {
        for (int i = 0; i < GPTOSS_EAGLE3_N_AUX; i++)
            if (b[i] < 0 || b[i] > 36) abort();
    } else if (berr.message[0] == '\0') {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *zero = memchr(data, 0, size);
    const size_t n_config = zero ? (size_t)(zero - data) : size;
    check_config((const char *)data, n_config);
    check_eagle3_config((const char *)data, n_config);
    if (zero) check_header(zero + 1, size - n_config - 1);
    return 0;
}
