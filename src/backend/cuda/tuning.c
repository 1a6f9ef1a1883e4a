/*
 * tuning.c - the CUDA backend's knobs: one table (key, variable, kind, range), the defaults,
 * and the two parsers over it (the options string and the environment). See tuning.h for
 * the meaning of each knob. Owns nothing beyond the struct it fills.
 */
#include "backend/cuda/tuning.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KIND_BOOL, KIND_INT, KIND_NAMED } knob_kind;

typedef struct knob {
    const char *key;
    const char *env;
    knob_kind kind;
    size_t offset;     /* of the bool or int field */
    int lo, hi;        /* KIND_INT: the accepted range */
    const char *names; /* KIND_NAMED: "name=value" pairs separated by spaces */
} knob;

#define FIELD(f) offsetof(gptoss_cuda_tuning, f)

static const knob knobs[] = {
    {"graphs", "GPTOSS_CUDA_GRAPHS", KIND_BOOL, FIELD(graphs), 0, 0, NULL},
    {"pdl", "GPTOSS_CUDA_PDL", KIND_BOOL, FIELD(pdl), 0, 0, NULL},
    {"gemv", "GPTOSS_CUDA_GEMV", KIND_NAMED, FIELD(gemv), 0, 0, "0=0 1=1 all=2"},
    {"gemv_kernel", "GPTOSS_CUDA_GEMV_KERNEL", KIND_NAMED, FIELD(gemv_kernel), 0, 0,
     "auto=0 ld=1 tma=2"},
    {"attn_tc", "GPTOSS_CUDA_ATTN_TC", KIND_BOOL, FIELD(attn_tc), 0, 0, NULL},
    {"attn_decode", "GPTOSS_CUDA_ATTN_DECODE", KIND_BOOL, FIELD(attn_decode), 0, 0, NULL},
    {"adc_warps", "GPTOSS_CUDA_ADC_WARPS", KIND_NAMED, FIELD(adc_warps), 0, 0, "0=0 4=4 8=8"},
    {"norm_router", "GPTOSS_CUDA_NORM_ROUTER", KIND_BOOL, FIELD(norm_router), 0, 0, NULL},
    {"qkv_rope", "GPTOSS_CUDA_QKV_ROPE", KIND_BOOL, FIELD(qkv_rope), 0, 0, NULL},
    {"router_fused_max", "GPTOSS_CUDA_ROUTER_FUSED_MAX", KIND_INT, FIELD(router_fused_max), 0, 64,
     NULL},
    {"moe_path", "GPTOSS_CUDA_MOE_PATH", KIND_NAMED, FIELD(moe_path), 0, 0,
     "auto=0 route_gemv=1 wmma_gemm=2 pair_gemv=3 mma_gemm=4 pair_mma=5 wgmma_gemm=6 0=0 1=1 2=2 "
     "3=3 4=4 5=5 6=6"},
    {"moe_pair_kernel", "GPTOSS_CUDA_MOE_PAIR_KERNEL", KIND_NAMED, FIELD(moe_pair_kernel), 0, 0,
     "auto=0 wide=1 tma=2 fp8=3 dense=4"},
    {"moe_pair_tokens", "GPTOSS_CUDA_MOE_PAIR_TOKENS", KIND_INT, FIELD(moe_pair_tokens), 0, 1 << 20,
     NULL},
    {"moe_inflight", "GPTOSS_CUDA_MOE_INFLIGHT", KIND_INT, FIELD(moe_inflight), 0, 1 << 20, NULL},
    {"moe_wg_min", "GPTOSS_CUDA_MOE_WG_MIN", KIND_INT, FIELD(moe_wg_min), 1, 1 << 20, NULL},
    {"moe_max_tile", "GPTOSS_CUDA_MOE_MAX_TILE", KIND_INT, FIELD(moe_max_tile), 8, 128, NULL},
    {"moe_tile_pct", "GPTOSS_CUDA_MOE_TILE_PCT", KIND_INT, FIELD(moe_tile_pct), 50, 800, NULL},
    {"moe_mma_stage_kb", "GPTOSS_CUDA_MOE_MMA_STAGE_KB", KIND_INT, FIELD(moe_mma_stage_kb), 0, 3,
     NULL},
    {"moe_mma_slab", "GPTOSS_CUDA_MOE_MMA_SLAB", KIND_BOOL, FIELD(moe_mma_slab), 0, 0, NULL},
    {"bi_dense_max", "GPTOSS_CUDA_BI_DENSE_MAX", KIND_INT, FIELD(bi_dense_max), 0, 65536, NULL},
    {"bi_dense_wide", "GPTOSS_CUDA_BI_DENSE_WIDE", KIND_BOOL, FIELD(bi_dense_wide), 0, 0, NULL},
    {"bi_dense_split", "GPTOSS_CUDA_BI_DENSE_SPLIT", KIND_INT, FIELD(bi_dense_split), 0, 8, NULL},
    {"bi_dense_large", "GPTOSS_CUDA_BI_DENSE_LARGE", KIND_NAMED, FIELD(bi_dense_large), 0, 0,
     "off=0 auto=1 128=2 64=3 64x64=4 0=0 1=1 2=2 3=3 4=4"},
    {"bi_moe_max", "GPTOSS_CUDA_BI_MOE_MAX", KIND_INT, FIELD(bi_moe_max), 0, 65536, NULL},
    {"bi_moe_pairs", "GPTOSS_CUDA_BI_MOE_PAIRS", KIND_INT, FIELD(bi_moe_pairs), 0, 64, NULL},
    {"bi_moe_wide", "GPTOSS_CUDA_BI_MOE_WIDE", KIND_BOOL, FIELD(bi_moe_wide), 0, 0, NULL},
    {"bi_moe_pair", "GPTOSS_CUDA_BI_MOE_PAIR", KIND_BOOL, FIELD(bi_moe_pair), 0, 0, NULL},
    {"bi_moe_mma", "GPTOSS_CUDA_BI_MOE_MMA", KIND_BOOL, FIELD(bi_moe_mma), 0, 0, NULL},
    {"bi_moe_tile", "GPTOSS_CUDA_BI_MOE_TILE", KIND_INT, FIELD(bi_moe_tile), 8, 128, NULL},
    {"bi_moe_pair_tokens", "GPTOSS_CUDA_BI_MOE_PAIR_TOKENS", KIND_INT, FIELD(bi_moe_pair_tokens), 0,
     64, NULL},
    {"profile", "GPTOSS_CUDA_PROFILE", KIND_BOOL, FIELD(profile), 0, 0, NULL},
    {"step_timing", "GPTOSS_STEP_TIMING", KIND_BOOL, FIELD(step_timing), 0, 0, NULL},
    {"ablate", "GPTOSS_CUDA_ABLATE", KIND_INT, FIELD(ablate), 0, 255, NULL},
    {"device_profile", "GPTOSS_CUDA_DEVICE_PROFILE", KIND_NAMED, FIELD(device_profile), 0, 0,
     "auto=0 ampere=1 ada=2 hopper=3"},
    {"host_weights", "GPTOSS_CUDA_HOST_WEIGHTS", KIND_BOOL, FIELD(host_weights), 0, 0, NULL},
    {"draft_fp8", "GPTOSS_CUDA_DRAFT_FP8", KIND_BOOL, FIELD(draft_fp8), 0, 0, NULL},
};

#undef FIELD

void gptoss_cuda_tuning_default(gptoss_cuda_tuning *t) {
    memset(t, 0, sizeof *t);
    t->graphs = true;
    t->pdl = true;
    t->draft_fp8 = true;
    t->gemv = GPTOSS_CUDA_GEMV_ON;
    t->gemv_kernel = GPTOSS_CUDA_GEMV_KERNEL_AUTO;
    t->attn_tc = true;
    t->attn_decode = true;
    t->adc_warps = 0;
    t->norm_router = true;
    t->qkv_rope = true;
    /* Measured on an H100 (120b, bench -b at depth 512): with the fused router up to 64 tokens,
     * norms/rope/router took 3.2, 3.6 and 4.4 ms of steps of 16, 32 and 64 tokens; with 8, 2.2,
     * 2.2 and 2.3 ms (+7% tokens/s). The fused kernel's last block selects for every token
     * alone, and each block re-reads the router matrix per 8 tokens. */
    t->router_fused_max = 8;
    t->moe_path = 0;
    t->moe_pair_kernel = GPTOSS_CUDA_PAIR_KERNEL_AUTO;
    t->moe_pair_tokens = 0;
    t->moe_inflight = 3;
    t->moe_wg_min = 24;
    t->moe_max_tile = 64;
    t->moe_tile_pct = 125;
    t->moe_mma_stage_kb = 0;
    t->moe_mma_slab = false;
    t->device_profile = -1;
    /* the skinny GEMM up to 16 rows, the large one beyond: 120b batch-invariant decode (H100,
     * tg32) at 24 / 48 / 128 sequences 1,167 / 1,739 / 3,613 tok/s against 1,141 / 1,692 /
     * 3,388 with the skinny one up to 128 */
    t->bi_dense_max = 16;
    t->bi_moe_max = 64;
    t->bi_moe_wide = true;
    t->bi_moe_pairs = 1; /* distinct experts for one token; more pairs may share one */
    t->bi_dense_wide = true;
    t->bi_dense_split = 8;
    t->bi_dense_large = 1;
    t->bi_moe_pair = true;
    t->bi_moe_mma = true;
    t->bi_moe_pair_tokens = 8;
    /* 64-row tiles spill a few registers but read each expert's weights half as often as 32:
     * 120b pp2048 (H100) 89.0 ms of experts against 97.6 */
    t->bi_moe_tile = 64;
}

/* What a knob accepts, for error messages. */
static void describe(const knob *k, char *buf, size_t cap) {
    if (k->kind == KIND_BOOL) {
        snprintf(buf, cap, "0 or 1");
    } else if (k->kind == KIND_INT) {
        snprintf(buf, cap, "an integer in [%d, %d]", k->lo, k->hi);
    } else {
        size_t n = 0;
        buf[0] = 0;
        for (const char *p = k->names; *p && n + 1 < cap;) {
            const char *eq = strchr(p, '='), *end = strchr(p, ' ');
            if (!end) end = p + strlen(p);
            n += (size_t)snprintf(buf + n, cap - n, "%s%.*s", n ? ", " : "one of ", (int)(eq - p),
                                  p);
            p = *end ? end + 1 : end;
        }
    }
}

static gptoss_status bad_value(const knob *k, const char *origin, const char *value, size_t len,
                               gptoss_error *error) {
    char what[256];
    describe(k, what, sizeof what);
    return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                            "CUDA tuning: %s=%.*s is invalid (expected %s)", origin, (int)len,
                            value, what);
}

static bool token_is(const char *s, size_t len, const char *word) {
    return strlen(word) == len && !memcmp(s, word, len);
}

/* Sets knob k from value[0, len); origin names the key or variable in errors. */
static gptoss_status set_knob(gptoss_cuda_tuning *t, const knob *k, const char *origin,
                              const char *value, size_t len, gptoss_error *error) {
    char *field = (char *)t + k->offset;
    int v = 0;
    if (k->kind == KIND_BOOL) {
        if (token_is(value, len, "1") || token_is(value, len, "on") ||
            token_is(value, len, "true") || token_is(value, len, "yes"))
            v = 1;
        else if (token_is(value, len, "0") || token_is(value, len, "off") ||
                 token_is(value, len, "false") || token_is(value, len, "no"))
            v = 0;
        else
            return bad_value(k, origin, value, len, error);
        *(bool *)field = v != 0;
        return GPTOSS_OK;
    }
    if (k->kind == KIND_INT) {
        char buf[32];
        if (len == 0 || len >= sizeof buf) return bad_value(k, origin, value, len, error);
        memcpy(buf, value, len);
        buf[len] = 0;
        char *end = NULL;
        errno = 0;
        long n = strtol(buf, &end, 10);
        if (errno || *end || n < k->lo || n > k->hi) return bad_value(k, origin, value, len, error);
        v = (int)n;
    } else {
        bool found = false;
        for (const char *p = k->names; *p && !found;) {
            const char *eq = strchr(p, '='), *end = strchr(p, ' ');
            if (!end) end = p + strlen(p);
            if ((size_t)(eq - p) == len && !memcmp(p, value, len)) {
                v = atoi(eq + 1);
                found = true;
            }
            p = *end ? end + 1 : end;
        }
        if (!found) return bad_value(k, origin, value, len, error);
    }
    if (k->offset == offsetof(gptoss_cuda_tuning, moe_inflight)) t->moe_inflight_report = v > 0;
#ifndef GPTOSS_DIAGNOSTICS
    if (k->offset == offsetof(gptoss_cuda_tuning, ablate) && v != 0)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA tuning: %s needs a diagnostics build (cmake -DGPTOSS_DIAGNOSTICS=ON); it "
            "leaves components out and makes the logits wrong",
            origin);
#endif
    *(int *)field = v;
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_tuning_parse(gptoss_cuda_tuning *t, const char *spec,
                                       gptoss_error *error) {
    const char *p = spec ? spec : "";
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a < b) {
            const char *eq = memchr(a, '=', (size_t)(b - a));
            if (!eq)
                return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                        "CUDA tuning: '%.*s' is not key=value", (int)(b - a), a);
            const char *ke = eq;
            while (ke > a && (ke[-1] == ' ' || ke[-1] == '\t'))
                ke--;
            const char *v = eq + 1;
            while (v < b && (*v == ' ' || *v == '\t'))
                v++;
            const knob *k = NULL;
            for (size_t i = 0; i < sizeof knobs / sizeof knobs[0] && !k; i++)
                if (token_is(a, (size_t)(ke - a), knobs[i].key)) k = &knobs[i];
            if (!k) {
                char keys[512];
                size_t n = 0;
                for (size_t i = 0; i < sizeof knobs / sizeof knobs[0] && n + 1 < sizeof keys; i++)
                    n += (size_t)snprintf(keys + n, sizeof keys - n, "%s%s", i ? ", " : "",
                                          knobs[i].key);
                return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                        "CUDA tuning: unknown key '%.*s' (keys: %s)", (int)(ke - a),
                                        a, keys);
            }
            gptoss_status st = set_knob(t, k, k->key, v, (size_t)(b - v), error);
            if (st) return st;
        }
        p = *end ? end + 1 : end;
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_tuning_from_env(gptoss_cuda_tuning *t, gptoss_error *error) {
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        const char *v = getenv(knobs[i].env);
        if (!v) continue;
        gptoss_status st = set_knob(t, &knobs[i], knobs[i].env, v, strlen(v), error);
        if (st) return st;
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_tuning_init(gptoss_cuda_tuning *t, const char *spec,
                                      gptoss_error *error) {
    gptoss_cuda_tuning_default(t);
    gptoss_status st = gptoss_cuda_tuning_parse(t, spec, error);
    return st ? st : gptoss_cuda_tuning_from_env(t, error);
}
