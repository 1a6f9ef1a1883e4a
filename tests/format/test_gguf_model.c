/*
 * test_gguf_model.c - gpt-oss GGUF files end to end on the CPU backend:
 *   - `convert` of every test checkpoint shape (the golden configs, the CUDA test configs, the
 *     tiny preset) gives a file whose logits are bit-identical to the folder's (the CPU
 *     backend reading the experts in ggml's layout), whose config equals config.json's, and
 *     whose experts, once unpacked into the Hugging Face layout, are the folder's bytes;
 *   - the tokenizer read from the file equals tokenizer.json's: every id's bytes and kind, and
 *     every id of the >= 2 MB tokenizer corpus (tests/tokenizer/corpus.mjs) in both modes;
 *   - the load-time conversions of other ggml types: F16 and Q8_0 matrices match an
 *     independent dequantization here; types that cannot hold these weights are refused
 *     naming the tensor and the type;
 *   - a file split in three as llama.cpp's gguf-split does loads from its first part with the
 *     same logits; a later or missing part is refused by name.
 */
#include "model_fixture.h"
#include "test_support.h"

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/tensor.h"
#include "loader/gguf_model.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *convert(const char *dir) {
    char *path = ts_path(dir, "model.gguf");
    gptoss_error err = {0};
    if (gptoss_gguf_convert(dir, path, &err) != GPTOSS_OK) fail_msg("convert: %s", err.message);
    return path;
}

static gptoss_model *load(const char *path) {
    gptoss_model *model = NULL;
    gptoss_error err = {0};
    if (gptoss_model_load(path, &model, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    return model;
}

/* The tiny preset and its conversion, made once for the tests below. */
static char *tiny_dir, *tiny_gguf;

/* ---- logits ------------------------------------------------------------------------------- */

/* A GGUF model's experts stay in the file's layout until gptoss_model_unpack_experts, which
 * must give exactly the folder's blocks and scales (gate and up rows interleaved again), once. */
static void check_unpacked_experts(gptoss_model *folder, gptoss_model *gguf) {
    const gptoss_weights *wa = gptoss_model_weights(folder), *wb = gptoss_model_weights(gguf);
    assert_null(wa->ggml_experts);
    assert_non_null(wb->ggml_experts);
    assert_null(wb->layers[0].gate_up_blocks.data);
    gptoss_error err = {0};
    if (gptoss_model_unpack_experts(folder, &err) != GPTOSS_OK ||
        gptoss_model_unpack_experts(gguf, &err) != GPTOSS_OK)
        fail_msg("unpack: %s", err.message);
    const void *first = wb->layers[0].gate_up_blocks.data;
    for (int32_t l = 0; l < wa->n_layers; l++) {
        const gptoss_layer_weights *la = &wa->layers[l], *lb = &wb->layers[l];
        const gptoss_tensor *ta[] = {&la->gate_up_blocks, &la->gate_up_scales, &la->down_blocks,
                                     &la->down_scales};
        const gptoss_tensor *tb[] = {&lb->gate_up_blocks, &lb->gate_up_scales, &lb->down_blocks,
                                     &lb->down_scales};
        for (int i = 0; i < 4; i++) {
            assert_non_null(tb[i]->data);
            assert_int_equal(ta[i]->n_bytes, tb[i]->n_bytes);
            if (memcmp(ta[i]->data, tb[i]->data, ta[i]->n_bytes) != 0)
                fail_msg("layer %d: unpacked %s differs from the folder's", l, ta[i]->name);
        }
    }
    if (gptoss_model_unpack_experts(gguf, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    assert_ptr_equal(first, wb->layers[0].gate_up_blocks.data);
}

/* dir and gguf, when given, are an existing checkpoint and its conversion (kept). */
static void check_same_logits(const char *config, const char *given_dir, const char *given_gguf) {
    char *dir = given_dir ? strdup(given_dir) : tm_make_model(NULL, config, 7);
    char *gguf = given_gguf ? strdup(given_gguf) : convert(dir);
    const char *preset = given_dir ? "tiny" : NULL;
    gptoss_model *a = load(dir), *b = load(gguf);
    const gptoss_config *ca = gptoss_model_config(a), *cb = gptoss_model_config(b);
    if (memcmp(ca, cb, sizeof *ca) != 0)
        fail_msg("%s: the configs differ", preset ? preset : config);
    /* 40 tokens in chunks of 7: crosses the sliding windows and mixes prefill and steps. */
    int32_t ids[40];
    for (int32_t i = 0; i < 40; i++)
        ids[i] = (int32_t)((i * 7919u + 13) % (uint32_t)ca->vocab_size);
    tm_sequence seq = {ids, 40};
    float *la = tm_run_all_logits(a, GPTOSS_BACKEND_CPU, &seq, 1, 7, 16);
    float *lb = tm_run_all_logits(b, GPTOSS_BACKEND_CPU, &seq, 1, 7, 16);
    size_t n = (size_t)40 * (size_t)ca->vocab_size;
    if (memcmp(la, lb, n * sizeof *la) != 0) {
        size_t i = 0;
        while (la[i] == lb[i])
            i++;
        fail_msg("%s: logits differ at %zu: %.9g vs %.9g", preset ? preset : config, i, la[i],
                 lb[i]);
    }
    free(la);
    free(lb);
    check_unpacked_experts(a, b);
    gptoss_model_free(a);
    gptoss_model_free(b);
    if (!given_dir) ts_rmtree(dir);
    free(dir);
    free(gguf);
}

static void test_logits_identical(void **state) {
    (void)state;
    const char *configs[] = {
        "tests/golden/configs/moe.json",           "tests/golden/configs/swa.json",
        "tests/golden/configs/yarn.json",          "tests/cuda/configs/mid.json",
        "tests/cuda/configs/mid_all_experts.json", "tests/cuda/configs/swa_all_experts.json"};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        char *path = ts_path(ts_env("GPTOSS_SOURCE_DIR"), configs[i]);
        check_same_logits(path, NULL, NULL);
        free(path);
    }
    check_same_logits(NULL, tiny_dir, tiny_gguf);
}

/* ---- tokenizer ---------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    tiny_dir = tm_make_model("tiny", NULL, 1);
    tiny_gguf = convert(tiny_dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ts_rmtree(tiny_dir);
    free(tiny_dir);
    free(tiny_gguf);
    return 0;
}

static uint32_t rd32(const unsigned char **p) {
    uint32_t v = (uint32_t)(*p)[0] | (uint32_t)(*p)[1] << 8 | (uint32_t)(*p)[2] << 16 |
                 (uint32_t)(*p)[3] << 24;
    *p += 4;
    return v;
}

static void test_tokenizer_identical(void **state) {
    (void)state;
    gptoss_tokenizer *json = NULL, *gguf = NULL;
    gptoss_error err = {0};
    char *json_path = ts_path(tm_tokenizer_dir(), "tokenizer.json");
    if (gptoss_tokenizer_load(json_path, &json, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    if (gptoss_tokenizer_load(tiny_gguf, &gguf, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    assert_int_equal(gptoss_tokenizer_n_vocab(json), gptoss_tokenizer_n_vocab(gguf));
    assert_int_equal(gptoss_tokenizer_n_ordinary(json), gptoss_tokenizer_n_ordinary(gguf));
    for (int32_t id = 0; id < gptoss_tokenizer_n_vocab(json); id++) {
        size_t la = 0, lb = 0;
        const char *a = gptoss_tokenizer_token_bytes(json, id, &la);
        const char *b = gptoss_tokenizer_token_bytes(gguf, id, &lb);
        if (!a != !b || la != lb || (a && memcmp(a, b, la) != 0)) fail_msg("token %d differs", id);
        assert_int_equal(gptoss_tokenizer_is_special(json, id),
                         gptoss_tokenizer_is_special(gguf, id));
    }

    /* The tokenizer corpus (its texts; the peer ids in the file are test_peer's business). */
    char *dir = ts_mkdtemp();
    char *peer = ts_path(dir, "peer.bin");
    char *out = NULL;
    int rc = ts_run(&out, "cd '%s' && node tests/tokenizer/peer_encode.mjs '%s'",
                    ts_env("GPTOSS_SOURCE_DIR"), peer);
    if (rc != 0) fail_msg("peer_encode.mjs failed (%d): %s", rc, out);
    free(out);
    size_t size = 0;
    unsigned char *data = (unsigned char *)ts_read_file(peer, &size);
    const unsigned char *p = data + 4, *end = data + size;
    uint32_t n_docs = rd32(&p);
    size_t total = 0, ids = 0;
    for (uint32_t d = 0; d < n_docs; d++) {
        assert_true(end - p >= 4);
        p += rd32(&p); /* name */
        uint32_t len = rd32(&p);
        const char *text = (const char *)p;
        p += len;
        for (int mode = 0; mode < 2; mode++) {
            p += (size_t)rd32(&p) * 4; /* peer ids */
            gptoss_tokens ta = {0}, tb = {0};
            assert_int_equal(gptoss_tokenizer_encode(json, text, len, mode, &ta, &err), GPTOSS_OK);
            assert_int_equal(gptoss_tokenizer_encode(gguf, text, len, mode, &tb, &err), GPTOSS_OK);
            if (ta.n != tb.n || memcmp(ta.ids, tb.ids, ta.n * sizeof *ta.ids) != 0)
                fail_msg("document %u (mode %d): the GGUF tokenizer differs", d, mode);
            ids += ta.n;
            gptoss_tokens_free(&ta);
            gptoss_tokens_free(&tb);
        }
        total += len;
    }
    assert_true(total >= 2000000);
    fprintf(stderr, "corpus: %u documents, %zu bytes, %zu ids identical\n", n_docs, total, ids);
    free(data);
    ts_rmtree(dir);
    free(dir);
    free(peer);
    free(json_path);
    gptoss_tokenizer_free(json);
    gptoss_tokenizer_free(gguf);
}

/* ---- other ggml types --------------------------------------------------------------------- */

/* The file offset of a tensor's type field, found from its name in the header. */
static size_t type_field(const uint8_t *buf, size_t size, const char *name) {
    gptoss_gguf_file *f = NULL;
    gptoss_error err = {0};
    if (gptoss_gguf_parse(buf, size, &f, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    const gptoss_gguf_tensor *t = gptoss_gguf_find_tensor(f, name);
    assert_non_null(t);
    size_t at = (size_t)((const uint8_t *)t->name.ptr - buf) + t->name.len + 4 + 8 * t->n_dims;
    gptoss_gguf_close(f);
    return at;
}

static char *patched_copy(const char *dir, const char *tensor, uint32_t type) {
    size_t size = 0;
    uint8_t *buf = (uint8_t *)ts_read_file(tiny_gguf, &size);
    size_t at = type_field(buf, size, tensor);
    for (int i = 0; i < 4; i++)
        buf[at + i] = (uint8_t)(type >> (8 * i));
    char *path = ts_path(dir, "patched.gguf");
    ts_write_file(path, buf, size);
    free(buf);
    return path;
}

static float half_to_float(uint16_t h) {
    int exp = (h >> 10) & 31, mant = h & 1023;
    float v = exp == 0    ? ldexpf((float)mant, -24)
              : exp == 31 ? (mant ? NAN : INFINITY)
                          : ldexpf((float)(mant | 1024), exp - 25);
    return (h & 0x8000) ? -v : v;
}

static uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void test_f16_matrix(void **state) {
    (void)state;
    /* The same bytes read as F16 instead of BF16: the loader must give bf16(f16 value). */
    char *dir = ts_mkdtemp();
    char *path = patched_copy(dir, "blk.1.attn_q.weight", 1);
    gptoss_model *orig = load(tiny_gguf), *model = load(path);
    const gptoss_tensor *a = &gptoss_model_weights(orig)->layers[1].q_weight;
    const gptoss_tensor *b = &gptoss_model_weights(model)->layers[1].q_weight;
    assert_int_equal(b->dtype, GPTOSS_DTYPE_BF16);
    size_t n = a->n_bytes / 2;
    for (size_t i = 0; i < n; i++) {
        uint16_t raw, got;
        memcpy(&raw, (const uint8_t *)a->data + 2 * i, 2);
        memcpy(&got, (const uint8_t *)b->data + 2 * i, 2);
        float want = half_to_float(raw);
        if (isnan(want)) continue;
        if (got != bf16_rne(want)) fail_msg("element %zu: 0x%04x from f16 0x%04x", i, got, raw);
    }
    gptoss_model_free(orig);
    gptoss_model_free(model);
    ts_rmtree(dir);
    free(dir);
    free(path);
}

static void test_unsupported_types_refused(void **state) {
    (void)state;
    const struct {
        const char *tensor;
        uint32_t type;
        const char *fragment;
    } cases[] = {
        {"blk.0.attn_k.weight", 25, "tensor blk.0.attn_k.weight: ggml type I16 is not supported"},
        {"blk.2.attn_norm.weight", 26, "tensor blk.2.attn_norm.weight: ggml type I32 is not"},
        {"output_norm.weight", 26, "tensor output_norm.weight: ggml type I32"},
    };
    char *dir = ts_mkdtemp();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *path = patched_copy(dir, cases[i].tensor, cases[i].type);
        gptoss_model *model = NULL;
        gptoss_error err = {0};
        assert_int_equal(gptoss_model_load(path, &model, &err), GPTOSS_ERR_UNSUPPORTED);
        if (!strstr(err.message, cases[i].fragment))
            fail_msg("'%s' lacks '%s'", err.message, cases[i].fragment);
        free(path);
    }
    ts_rmtree(dir);
    free(dir);
}

/* Rewrites tiny.gguf with its BF16 matrices as Q8_0 (quantized here: per 32 values d =
 * max|x| / 127 as f16, q = round(x / d)) to test the loader's Q8_0 path, as published files
 * use it for attention, embedding and output. */
typedef struct requant {
    gptoss_gguf_file *src;
} requant;

static uint16_t float_to_half(float f) {
    /* Values here are normal halves well inside range: round mantissa to nearest even. */
    if (f == 0) return 0;
    int e;
    float m = frexpf(fabsf(f), &e); /* f = m * 2^e, m in [0.5, 1) */
    int exp = e - 1 + 15;
    float scaled = ldexpf(m * 2.0f - 1.0f, 10);
    uint32_t mant = (uint32_t)lrintf(scaled);
    if (mant == 1024) mant = 0, exp++;
    return (uint16_t)((f < 0 ? 0x8000 : 0) | (uint32_t)exp << 10 | mant);
}

static gptoss_status requant_fill(void *user, size_t index, uint8_t *out, size_t n_bytes,
                                  gptoss_error *error) {
    (void)error;
    const gptoss_gguf_tensor *t = &((requant *)user)->src->tensors[index];
    if (t->type != GPTOSS_GGML_BF16) {
        memcpy(out, t->data, n_bytes);
        return GPTOSS_OK;
    }
    size_t n = t->n_bytes / 2;
    for (size_t b = 0; b < n / 32; b++) {
        float x[32], amax = 0;
        for (int j = 0; j < 32; j++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * (b * 32 + (size_t)j), 2);
            x[j] = gptoss_bf16_to_f32(h);
            amax = fmaxf(amax, fabsf(x[j]));
        }
        uint16_t d = float_to_half(amax / 127.0f);
        float dv = half_to_float(d);
        uint8_t *o = out + b * 34;
        memcpy(o, &d, 2);
        for (int j = 0; j < 32; j++)
            o[2 + j] = (uint8_t)(int8_t)(dv ? lrintf(x[j] / dv) : 0);
    }
    return GPTOSS_OK;
}

/* Copies the metadata of a file written by convert (the value types it uses). */
static void copy_metadata(gptoss_gguf_writer *w, const gptoss_gguf_file *src) {
    for (uint64_t i = 0; i < src->n_kvs; i++) {
        const gptoss_gguf_kv *kv = &src->kvs[i];
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        uint32_t u = 0;
        if (kv->type == GPTOSS_GGUF_U32 || kv->type == GPTOSS_GGUF_F32)
            u = (uint32_t)kv->data[0] | (uint32_t)kv->data[1] << 8 | (uint32_t)kv->data[2] << 16 |
                (uint32_t)kv->data[3] << 24;
        if (kv->type == GPTOSS_GGUF_STRING) {
            gptoss_gguf_add_string(w, key, kv->str.ptr, kv->str.len);
        } else if (kv->type == GPTOSS_GGUF_U32) {
            gptoss_gguf_add_u32(w, key, u);
        } else if (kv->type == GPTOSS_GGUF_F32) {
            float f;
            memcpy(&f, &u, 4);
            gptoss_gguf_add_f32(w, key, f);
        } else if (kv->type == GPTOSS_GGUF_ARRAY && kv->elem_type == GPTOSS_GGUF_STRING) {
            const char **texts = malloc(kv->count * sizeof *texts);
            size_t *lens = malloc(kv->count * sizeof *lens);
            for (uint64_t j = 0; j < kv->count; j++)
                texts[j] = kv->strings[j].ptr, lens[j] = (size_t)kv->strings[j].len;
            gptoss_gguf_add_array_strings(w, key, kv->count, texts, lens);
            free(texts);
            free(lens);
        } else if (kv->type == GPTOSS_GGUF_ARRAY && kv->elem_type == GPTOSS_GGUF_I32) {
            int32_t *v = malloc(kv->count * sizeof *v);
            for (uint64_t j = 0; j < kv->count; j++)
                v[j] = (int32_t)gptoss_gguf_array_int(kv, j);
            gptoss_gguf_add_array_i32(w, key, kv->count, v);
            free(v);
        } else {
            fail_msg("copy_metadata: %s has an unexpected type", key);
        }
    }
}

static void test_q8_0_matrices(void **state) {
    (void)state;
    gptoss_error err = {0};
    requant rq = {0};
    if (gptoss_gguf_open(tiny_gguf, &rq.src, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    gptoss_gguf_writer *w = gptoss_gguf_writer_new();
    copy_metadata(w, rq.src);
    for (uint64_t i = 0; i < rq.src->n_tensors; i++) {
        const gptoss_gguf_tensor *t = &rq.src->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        gptoss_gguf_add_tensor(w, name, t->n_dims, t->ne,
                               t->type == GPTOSS_GGML_BF16 ? GPTOSS_GGML_Q8_0 : t->type);
    }
    char *dir = ts_mkdtemp();
    char *path = ts_path(dir, "q8.gguf");
    if (gptoss_gguf_writer_write(w, path, requant_fill, &rq, &err) != GPTOSS_OK)
        fail_msg("%s", err.message);
    gptoss_gguf_writer_free(w);

    gptoss_model *model = load(path), *orig = load(tiny_gguf);
    const gptoss_tensor *q = &gptoss_model_weights(model)->layers[0].q_weight;
    const gptoss_tensor *o = &gptoss_model_weights(orig)->layers[0].q_weight;
    const gptoss_gguf_tensor *src = gptoss_gguf_find_tensor(rq.src, "blk.0.attn_q.weight");
    uint8_t *q8 = malloc(src->n_bytes / 2 / 32 * 34);
    requant_fill(&rq, (size_t)(src - rq.src->tensors), q8, 0, &err);
    double worst = 0;
    for (size_t i = 0; i < q->n_bytes / 2; i++) {
        uint16_t got, ref;
        memcpy(&got, (const uint8_t *)q->data + 2 * i, 2);
        memcpy(&ref, (const uint8_t *)o->data + 2 * i, 2);
        const uint8_t *blk = q8 + (i / 32) * 34;
        uint16_t d;
        memcpy(&d, blk, 2);
        float want = half_to_float(d) * (float)(int8_t)blk[2 + i % 32];
        if (got != bf16_rne(want)) fail_msg("element %zu: 0x%04x, expected bf16(%g)", i, got, want);
        double err_rel = fabs(gptoss_bf16_to_f32(got) - gptoss_bf16_to_f32(ref));
        if (err_rel > worst) worst = err_rel;
    }
    /* A Q8_0 model still computes: same top-1 on most positions as the BF16 one. */
    int32_t ids[24];
    for (int32_t i = 0; i < 24; i++)
        ids[i] = 1000 + 37 * i;
    tm_sequence seq = {ids, 24};
    const int32_t V = gptoss_model_config(orig)->vocab_size;
    float *la = tm_run_all_logits(orig, GPTOSS_BACKEND_CPU, &seq, 1, 0, 16);
    float *lb = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, &seq, 1, 0, 16);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)24 * (size_t)V; i++) {
        num += (la[i] - lb[i]) * (double)(la[i] - lb[i]);
        den += (double)la[i] * la[i];
    }
    fprintf(stderr, "q8_0: worst weight change %.3g, logits relative L2 change %.3g\n", worst,
            sqrt(num / den));
    assert_true(sqrt(num / den) < 0.2); /* random weights amplify; a wrong decode gives ~1 */
    assert_true(sqrt(num / den) > 0);   /* the Q8_0 path was taken */
    free(la);
    free(lb);
    free(q8);
    gptoss_model_free(model);
    gptoss_model_free(orig);
    gptoss_gguf_close(rq.src);
    ts_rmtree(dir);
    free(dir);
    free(path);
}

static gptoss_status zero_fill(void *user, size_t index, uint8_t *out, size_t n_bytes,
                               gptoss_error *error) {
    (void)user, (void)index, (void)error;
    memset(out, 0, n_bytes);
    return GPTOSS_OK;
}

static void test_bad_split_and_foreign_files_refused(void **state) {
    (void)state;
    char *dir = ts_mkdtemp();
    const struct {
        const char *arch;
        uint32_t split_count;
        gptoss_status status;
        const char *fragment;
    } cases[] = {
        {"gpt-oss", 3, GPTOSS_ERR_MODEL, "metadata key split.no is missing"},
        {"llama", 0, GPTOSS_ERR_UNSUPPORTED, "general.architecture is \"llama\""},
        {"gpt-oss", 0, GPTOSS_ERR_MODEL, "metadata key gpt-oss.block_count is missing"},
    };
    char *path = ts_path(dir, "x.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gptoss_gguf_writer *w = gptoss_gguf_writer_new();
        gptoss_gguf_add_string(w, "general.architecture", cases[i].arch, strlen(cases[i].arch));
        if (cases[i].split_count) gptoss_gguf_add_u32(w, "split.count", cases[i].split_count);
        int64_t ne[2] = {32, 4};
        gptoss_gguf_add_tensor(w, "token_embd.weight", 2, ne, GPTOSS_GGML_BF16);
        gptoss_error err = {0};
        assert_int_equal(gptoss_gguf_writer_write(w, path, zero_fill, NULL, &err), GPTOSS_OK);
        gptoss_gguf_writer_free(w);
        gptoss_model *model = NULL;
        assert_int_equal(gptoss_model_load(path, &model, &err), cases[i].status);
        if (!strstr(err.message, cases[i].fragment))
            fail_msg("'%s' lacks '%s'", err.message, cases[i].fragment);
    }
    free(path);
    ts_rmtree(dir);
    free(dir);
}

/* Tensors of one part of a split: the source tensors i with i % n_parts == part. */
typedef struct split_part {
    const gptoss_gguf_file *src;
    int part, n_parts;
} split_part;

static gptoss_status part_fill(void *user, size_t index, uint8_t *out, size_t n_bytes,
                               gptoss_error *error) {
    (void)error;
    const split_part *p = user;
    memcpy(out, p->src->tensors[index * (size_t)p->n_parts + (size_t)p->part].data, n_bytes);
    return GPTOSS_OK;
}

/* Writes tiny.gguf as n_parts files the way llama.cpp's gguf-split names and marks them. */
static void write_split(const char *prefix, int n_parts) {
    gptoss_gguf_file *src = NULL;
    gptoss_error err = {0};
    if (gptoss_gguf_open(tiny_gguf, &src, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    for (int part = 0; part < n_parts; part++) {
        gptoss_gguf_writer *w = gptoss_gguf_writer_new();
        if (part == 0) copy_metadata(w, src);
        gptoss_gguf_add_u16(w, "split.no", (uint16_t)part);
        gptoss_gguf_add_u16(w, "split.count", (uint16_t)n_parts);
        gptoss_gguf_add_i32(w, "split.tensors.count", (int32_t)src->n_tensors);
        for (uint64_t i = (uint64_t)part; i < src->n_tensors; i += (uint64_t)n_parts) {
            const gptoss_gguf_tensor *t = &src->tensors[i];
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            gptoss_gguf_add_tensor(w, name, t->n_dims, t->ne, t->type);
        }
        char path[4200];
        snprintf(path, sizeof path, "%s-%05d-of-%05d.gguf", prefix, part + 1, n_parts);
        split_part p = {src, part, n_parts};
        if (gptoss_gguf_writer_write(w, path, part_fill, &p, &err) != GPTOSS_OK)
            fail_msg("%s", err.message);
        gptoss_gguf_writer_free(w);
    }
    gptoss_gguf_close(src);
}

static void test_split_files(void **state) {
    (void)state;
    char *dir = ts_mkdtemp();
    char *prefix = ts_path(dir, "tiny");
    write_split(prefix, 3);
    char first[4200], second[4200], third[4200];
    snprintf(first, sizeof first, "%s-00001-of-00003.gguf", prefix);
    snprintf(second, sizeof second, "%s-00002-of-00003.gguf", prefix);
    snprintf(third, sizeof third, "%s-00003-of-00003.gguf", prefix);
    /* The same logits and tokenizer as the single file. */
    gptoss_model *whole = load(tiny_gguf), *split = load(first);
    int32_t ids[20];
    for (int32_t i = 0; i < 20; i++)
        ids[i] = 500 + 101 * i;
    tm_sequence seq = {ids, 20};
    size_t n = (size_t)20 * (size_t)gptoss_model_config(whole)->vocab_size;
    float *la = tm_run_all_logits(whole, GPTOSS_BACKEND_CPU, &seq, 1, 0, 16);
    float *lb = tm_run_all_logits(split, GPTOSS_BACKEND_CPU, &seq, 1, 0, 16);
    assert_memory_equal(la, lb, n * sizeof *la);
    free(la);
    free(lb);
    gptoss_model_free(whole);
    gptoss_model_free(split);
    gptoss_tokenizer *tok = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_load(first, &tok, &err), GPTOSS_OK);
    assert_int_equal(gptoss_tokenizer_n_vocab(tok), 200019);
    gptoss_tokenizer_free(tok);
    /* A later part is refused with the name to give; a missing part is named. */
    gptoss_model *model = NULL;
    assert_int_equal(gptoss_model_load(second, &model, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "part 2 of a GGUF split into 3 files: give the first"));
    assert_int_equal(remove(third), 0);
    assert_int_equal(gptoss_model_load(first, &model, &err), GPTOSS_ERR_IO);
    assert_non_null(strstr(err.message, third));
    ts_rmtree(dir);
    free(dir);
    free(prefix);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_identical),
        cmocka_unit_test(test_tokenizer_identical),
        cmocka_unit_test(test_f16_matrix),
        cmocka_unit_test(test_unsupported_types_refused),
        cmocka_unit_test(test_q8_0_matrices),
        cmocka_unit_test(test_bad_split_and_foreign_files_refused),
        cmocka_unit_test(test_split_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
