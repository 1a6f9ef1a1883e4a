/*
 * fuzz_gguf.c - libFuzzer target: arbitrary bytes as a GGUF file. The reader must refuse or
 * accept without reading outside the input; for an accepted file every metadata value is read
 * through each typed getter (the wrong ones must refuse), every tensor's bytes are touched,
 * and the gpt-oss metadata mapping (gptoss_gguf_read_config) runs on it.
 */
#include "format/gguf.h"
#include "loader/gguf_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gptoss_gguf_file *f = NULL;
    gptoss_error err = {0};
    if (gptoss_gguf_parse(data, size, &f, &err) != GPTOSS_OK) {
        if (err.message[0] == '\0') abort(); /* every refusal says why */
        return 0;
    }
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gptoss_gguf_tensor *t = &f->tensors[i];
        if (t->data < data || t->data + t->n_bytes > data + size) abort();
        for (uint64_t b = 0; b < t->n_bytes; b += 61)
            sink ^= t->data[b];
    }
    for (uint64_t i = 0; i < f->n_kvs; i++) {
        const gptoss_gguf_kv *kv = &f->kvs[i];
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len > 200 ? 200 : kv->key.len),
                 kv->key.ptr);
        if (memchr(kv->key.ptr, 0, kv->key.len) || kv->key.len > 200) continue;
        int64_t iv;
        double dv;
        bool bv;
        gptoss_gguf_str sv;
        const gptoss_gguf_kv *av;
        gptoss_gguf_get_int(f, key, true, INT64_MIN, INT64_MAX, &iv, &err);
        gptoss_gguf_get_float(f, key, true, &dv, &err);
        gptoss_gguf_get_bool(f, key, true, &bv, &err);
        if (gptoss_gguf_get_string(f, key, true, &sv, &err) == GPTOSS_OK && sv.len)
            sink ^= (uint8_t)sv.ptr[sv.len - 1];
        for (uint32_t type = 0; type < GPTOSS_GGUF_N_VTYPES; type++)
            if (gptoss_gguf_get_array(f, key, type, &av, &err) == GPTOSS_OK) {
                if (av->count && type == GPTOSS_GGUF_STRING && av->strings[av->count - 1].len)
                    sink ^= (uint8_t)av->strings[av->count - 1].ptr[0];
                else if (av->count && type != GPTOSS_GGUF_STRING && type != GPTOSS_GGUF_F32 &&
                         type != GPTOSS_GGUF_F64 && type != GPTOSS_GGUF_BOOL)
                    sink ^= (uint8_t)gptoss_gguf_array_int(av, av->count - 1);
            }
    }
    gptoss_config config;
    gptoss_gguf_read_config(f, &config, &err);
    (void)sink;
    gptoss_gguf_close(f);
    return 0;
}
