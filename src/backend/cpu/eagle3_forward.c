/*
 * eagle3_forward.c - the EAGLE3 head on the CPU (see eagle3_forward.h).
 *
 * Every matrix product is batched over the rows (each weight row widened once and used for
 * every token, OpenMP over output rows), reductions in a fixed order per row.
 * Owns: grow-only scratch buffers sized for the largest batch seen.
 */
#include "backend/cpu/eagle3_forward.h"
#include "backend/cpu/cpu_math.h"
#include "util/error.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct gptoss_eagle3_cpu {
    const gptoss_eagle3_config *c;
    const gptoss_eagle3_weights *w;
    float *inv_freq; /* [D/2] */
    int32_t capacity;
    float *hidden; /* [n, H] the hidden input of each row */
    float *x2;     /* [n, 2H] normalized [embed, hidden] */
    float *q;      /* [n, NH*D] */
    float *k;      /* [n, NKV*D] */
    float *v;      /* [n, NKV*D] */
    float *attn;   /* [n, NH*D] */
    float *h;      /* [n, H] after attention + residual */
    float *t;      /* [n, max(H, 3H)] normalized input of the MLP / gathered aux / final norm */
    float *gate;   /* [n, I] */
    float *up;     /* [n, I] */
    float *out;    /* [n, max(H, DV)] MLP output, then logits */
    int32_t *pick; /* [n] rows selected for fc / logits */
};

/* Rotate-half RoPE of one head vector at position pos. */
static void rope(float *v, int32_t head_dim, int32_t pos, const float *inv_freq) {
    int32_t half = head_dim / 2;
    for (int32_t j = 0; j < half; j++) {
        float angle = (float)pos * inv_freq[j];
        float c = cosf(angle), s = sinf(angle);
        float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

gptoss_status gptoss_eagle3_cpu_create(const gptoss_eagle3_head *head, gptoss_eagle3_cpu **out,
                                       gptoss_error *error) {
    *out = NULL;
    gptoss_eagle3_cpu *f = calloc(1, sizeof *f);
    if (!f) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    f->c = gptoss_eagle3_head_config(head);
    f->w = gptoss_eagle3_head_weights(head);
    int32_t half = f->c->head_dim / 2;
    f->inv_freq = malloc((size_t)half * sizeof *f->inv_freq);
    if (!f->inv_freq) {
        free(f);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int32_t j = 0; j < half; j++)
        f->inv_freq[j] = (float)(1.0 / pow(f->c->rope_theta, (2.0 * j) / f->c->head_dim));
    *out = f;
    return GPTOSS_OK;
}

void gptoss_eagle3_cpu_free(gptoss_eagle3_cpu *f) {
    if (!f) return;
    free(f->inv_freq), free(f->hidden), free(f->x2), free(f->q), free(f->k), free(f->v);
    free(f->attn), free(f->h), free(f->t), free(f->gate), free(f->up), free(f->out);
    free(f->pick);
    free(f);
}

bool gptoss_eagle3_kv_reserve(gptoss_eagle3_kv *kv, int32_t n_positions, int32_t kv_dim) {
    if (n_positions <= kv->cap) return true;
    int32_t cap = kv->cap ? kv->cap : 64;
    while (cap < n_positions)
        cap *= 2;
    float *k = realloc(kv->k, (size_t)cap * kv_dim * sizeof *k);
    if (!k) return false;
    kv->k = k;
    float *v = realloc(kv->v, (size_t)cap * kv_dim * sizeof *v);
    if (!v) return false;
    kv->v = v;
    kv->cap = cap;
    return true;
}

static bool grow(gptoss_eagle3_cpu *f, int32_t n) {
    if (n <= f->capacity) return true;
    const gptoss_eagle3_config *c = f->c;
    size_t N = (size_t)n, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size,
           q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim,
           DV = (size_t)c->draft_vocab_size;
#define GROW(field, count)                                                                         \
    do {                                                                                           \
        void *p = realloc(f->field, (count) * sizeof *f->field);                                   \
        if (!p) return false;                                                                      \
        f->field = p;                                                                              \
    } while (0)
    GROW(hidden, N * H);
    GROW(x2, N * 2 * H);
    GROW(q, N * q);
    GROW(k, N * kv);
    GROW(v, N * kv);
    GROW(attn, N * q);
    GROW(h, N * H);
    GROW(t, N * 3 * H);
    GROW(gate, N * I);
    GROW(up, N * I);
    GROW(out, N * (DV > H ? DV : H));
    GROW(pick, N);
#undef GROW
    f->capacity = n;
    return true;
}

/* Causal attention of row r (query q_r at position p) over its cache [start, p]. */
static void attend(const gptoss_eagle3_cpu *f, const gptoss_eagle3_row *row, const float *q_r,
                   float *out, float *scores) {
    const gptoss_eagle3_config *c = f->c;
    const int32_t D = c->head_dim, kv_dim = c->n_kv_heads * D;
    const int32_t group = c->n_heads / c->n_kv_heads;
    const int32_t n_ctx = row->position - row->kv->start + 1;
    const float scale = 1.0f / sqrtf((float)D);
    for (int32_t h = 0; h < c->n_heads; h++) {
        const int32_t g = h / group;
        const float *qh = q_r + (size_t)h * D;
        float max = -INFINITY;
        for (int32_t j = 0; j < n_ctx; j++) {
            scores[j] =
                gptoss_cpu_dot(qh, row->kv->k + (size_t)j * kv_dim + (size_t)g * D, D) * scale;
            if (scores[j] > max) max = scores[j];
        }
        float sum = 0.0f;
        for (int32_t j = 0; j < n_ctx; j++) {
            scores[j] = expf(scores[j] - max);
            sum += scores[j];
        }
        float *oh = out + (size_t)h * D;
        for (int32_t d = 0; d < D; d++)
            oh[d] = 0.0f;
        for (int32_t j = 0; j < n_ctx; j++) {
            const float *vj = row->kv->v + (size_t)j * kv_dim + (size_t)g * D;
            const float p = scores[j] / sum;
            for (int32_t d = 0; d < D; d++)
                oh[d] += p * vj[d];
        }
    }
}

gptoss_status gptoss_eagle3_cpu_forward(gptoss_eagle3_cpu *f, gptoss_eagle3_row *rows, int32_t n,
                                        gptoss_error *error) {
    if (n <= 0) return GPTOSS_OK;
    const gptoss_eagle3_config *c = f->c;
    const gptoss_eagle3_weights *w = f->w;
    const int32_t H = c->hidden_size, I = c->intermediate_size, D = c->head_dim,
                  DV = c->draft_vocab_size;
    const int32_t q_dim = c->n_heads * D, kv_dim = c->n_kv_heads * D;
    if (!grow(f, n)) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");

    /* Positions continue each cache; reserve room for every row first. */
    for (int32_t r = 0; r < n; r++) {
        gptoss_eagle3_kv *kv = rows[r].kv;
        int32_t ahead = 0;
        for (int32_t s = 0; s < r; s++)
            ahead += rows[s].kv == kv;
        if (rows[r].position != kv->start + kv->n + ahead || (!rows[r].aux && !rows[r].hidden) ||
            !rows[r].embed || !rows[r].prenorm)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "EAGLE3 forward: row %d at position %d does not continue its "
                                    "cache [%d, %d) or lacks an input",
                                    r, rows[r].position, kv->start, kv->start + kv->n + ahead);
        if (!gptoss_eagle3_kv_reserve(kv, kv->n + ahead + 1, kv_dim))
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (head KV)");
    }

    /* hidden = fc(aux) for target rows, the given prenorm for chained rows. */
    int32_t n_aux = 0;
    for (int32_t r = 0; r < n; r++) {
        if (rows[r].aux) {
            memcpy(f->t + (size_t)n_aux * 3 * H, rows[r].aux, (size_t)3 * H * sizeof(float));
            f->pick[n_aux++] = r;
        } else {
            memcpy(f->hidden + (size_t)r * H, rows[r].hidden, (size_t)H * sizeof(float));
        }
    }
    if (n_aux > 0) {
        gptoss_cpu_matmul_bf16(f->out, f->t, n_aux, &w->fc, NULL);
        for (int32_t i = 0; i < n_aux; i++)
            memcpy(f->hidden + (size_t)f->pick[i] * H, f->out + (size_t)i * H,
                   (size_t)H * sizeof(float));
    }

    /* x = [input_norm(embed), hidden_norm(hidden)]; q, k, v; RoPE; append K and V. */
    for (int32_t r = 0; r < n; r++) {
        float *x = f->x2 + (size_t)r * 2 * H;
        gptoss_cpu_rmsnorm(x, rows[r].embed, w->input_norm_f32, H, c->rms_norm_eps);
        gptoss_cpu_rmsnorm(x + H, f->hidden + (size_t)r * H, w->hidden_norm_f32, H,
                           c->rms_norm_eps);
    }
    gptoss_cpu_matmul_bf16(f->q, f->x2, n, &w->q, NULL);
    gptoss_cpu_matmul_bf16(f->k, f->x2, n, &w->k, NULL);
    gptoss_cpu_matmul_bf16(f->v, f->x2, n, &w->v, NULL);
    for (int32_t r = 0; r < n; r++) {
        const int32_t pos = rows[r].position;
        for (int32_t h = 0; h < c->n_heads; h++)
            rope(f->q + (size_t)r * q_dim + (size_t)h * D, D, pos, f->inv_freq);
        for (int32_t g = 0; g < c->n_kv_heads; g++)
            rope(f->k + (size_t)r * kv_dim + (size_t)g * D, D, pos, f->inv_freq);
        gptoss_eagle3_kv *kv = rows[r].kv;
        memcpy(kv->k + (size_t)kv->n * kv_dim, f->k + (size_t)r * kv_dim,
               (size_t)kv_dim * sizeof(float));
        memcpy(kv->v + (size_t)kv->n * kv_dim, f->v + (size_t)r * kv_dim,
               (size_t)kv_dim * sizeof(float));
        kv->n++;
    }

    /* Attention, per row over its own cache. */
    bool ok = true;
#pragma omp parallel
    {
        int32_t longest = 1;
        for (int32_t r = 0; r < n; r++)
            if (rows[r].position - rows[r].kv->start + 1 > longest)
                longest = rows[r].position - rows[r].kv->start + 1;
        float *scores = malloc((size_t)longest * sizeof *scores);
        if (!scores) {
#pragma omp atomic write
            ok = false;
        }
#pragma omp for schedule(dynamic)
        for (int32_t r = 0; r < n; r++)
            if (scores)
                attend(f, &rows[r], f->q + (size_t)r * q_dim, f->attn + (size_t)r * q_dim, scores);
        free(scores);
    }
    if (!ok) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");

    /* h = o_proj(attn) + hidden; prenorm = h + mlp(post_norm(h)). */
    gptoss_cpu_matmul_bf16(f->h, f->attn, n, &w->o, NULL);
    for (size_t i = 0; i < (size_t)n * H; i++)
        f->h[i] += f->hidden[i];
    for (int32_t r = 0; r < n; r++)
        gptoss_cpu_rmsnorm(f->t + (size_t)r * H, f->h + (size_t)r * H, w->post_norm_f32, H,
                           c->rms_norm_eps);
    gptoss_cpu_matmul_bf16(f->gate, f->t, n, &w->gate, NULL);
    gptoss_cpu_matmul_bf16(f->up, f->t, n, &w->up, NULL);
    for (size_t i = 0; i < (size_t)n * I; i++) {
        float g = f->gate[i];
        f->gate[i] = g / (1.0f + expf(-g)) * f->up[i];
    }
    gptoss_cpu_matmul_bf16(f->out, f->gate, n, &w->down, NULL);
    for (int32_t r = 0; r < n; r++)
        for (int32_t i = 0; i < H; i++)
            rows[r].prenorm[i] = f->h[(size_t)r * H + i] + f->out[(size_t)r * H + i];

    /* logits = lm_head(norm(prenorm)) for the rows that want them. */
    int32_t n_logits = 0;
    for (int32_t r = 0; r < n; r++)
        if (rows[r].want_token || rows[r].logits) {
            gptoss_cpu_rmsnorm(f->t + (size_t)n_logits * H, rows[r].prenorm, w->final_norm_f32, H,
                               c->rms_norm_eps);
            f->pick[n_logits++] = r;
        }
    if (n_logits == 0) return GPTOSS_OK;
    gptoss_cpu_matmul_bf16(f->out, f->t, n_logits, &w->lm_head, NULL);
    for (int32_t i = 0; i < n_logits; i++) {
        gptoss_eagle3_row *row = &rows[f->pick[i]];
        const float *logits = f->out + (size_t)i * DV;
        if (row->logits) memcpy(row->logits, logits, (size_t)DV * sizeof(float));
        int32_t best = 0;
        for (int32_t d = 1; d < DV; d++)
            if (logits[d] > logits[best]) best = d;
        row->draft_token = best;
    }
    return GPTOSS_OK;
}

/* ---- the executor ---------------------------------------------------------------------- */

static gptoss_status exec_forward(void *state, gptoss_eagle3_row *rows, int32_t n,
                                  gptoss_error *error) {
    return gptoss_eagle3_cpu_forward(state, rows, n, error);
}

static void exec_kv_release(void *state, gptoss_eagle3_kv *kv) {
    (void)state;
    free(kv->k), free(kv->v);
    kv->k = kv->v = NULL;
    kv->cap = 0;
}

static void exec_destroy(void *state) {
    gptoss_eagle3_cpu_free(state);
}

gptoss_status gptoss_eagle3_cpu_exec(const gptoss_eagle3_head *head, gptoss_eagle3_exec *out,
                                     gptoss_error *error) {
    memset(out, 0, sizeof *out);
    gptoss_eagle3_cpu *f = NULL;
    gptoss_status st = gptoss_eagle3_cpu_create(head, &f, error);
    if (st) return st;
    *out = (gptoss_eagle3_exec){.state = f,
                                .wants_embed = true,
                                .forward = exec_forward,
                                .kv_release = exec_kv_release,
                                .destroy = exec_destroy};
    return GPTOSS_OK;
}
