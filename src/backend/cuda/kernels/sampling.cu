/*
 * sampling.cu - one token per logits row on the GPU, exactly as the rule of
 * backend/sampling_rule.h draws it on the host; only ids and logprobs cross to the host.
 *
 * Per row (fp32 logits l[0..V), read in place and never written):
 *
 *   processed m[j]   computed on the fly in every pass: NaN -> -inf, the allowed mask, and
 *                    the row's edits (bias, masked, repetition, frequency / presence) looked
 *                    up through a per-chunk slot table in shared memory;
 *   key(j)           (order bits of m) << 20 | (2^20 - 1 - j): larger key = earlier in the
 *                    order (m desc, id asc); keys are distinct; the row's largest key is the
 *                    greedy token and gives mx;
 *   W[j]             gptoss_sampling_weight((m - mx) * scale), integers <= 2^32;
 *   kept             min_p (per token), then top_k and top_p as thresholds on the key: keep
 *                    key >= thr_k (the top_k-th key among the min_p survivors), key >= thr_p
 *                    (the key at which the running weight of the survivors first reaches
 *                    top_p * Z1);
 *   draw             t = target(random, Z2); the first kept token in id order whose running
 *                    total exceeds t.
 *
 * Launches, every one of grid (chunks of SP_CHUNK tokens, rows) except the summary's; each
 * ends with "the last block of the row" (a ticket counter) doing the row's serial part:
 *
 *   [logits summary]  top-20 and log-sum-exp of the raw rows (logits_summary.cu), when some
 *                     row wants logprobs;
 *   max               each chunk's edit range (a 32-way search of the row's sorted edits)
 *                     and largest key; last block: the row's largest key, its phase;
 *   select x 5 / 10   5 when the batch uses top_k or top_p, 10 when it uses both: one
 *                     radix digit per launch over the 52-bit keys (digits of 11, 11, 10,
 *                     10, 10 bits), histograms of counts (top_k: the min_p survivors) or
 *                     weights (top_p: the top_k survivors) in shared memory, added into the
 *                     row's global histogram; last block:
 *                     the bin holding the boundary, and either the threshold (the bin is
 *                     taken whole, or holds one token) or the next digit. A row goes through
 *                     top_k's digits then top_p's and rests once both are settled (most
 *                     rows need 2-3 digits each, so later launches exit at once);
 *   draw              each chunk's kept total; last block: Z2, t, the chunk holding t (a
 *                     scan over the chunk totals) and the token (a scan over that chunk in id
 *                     order), then the outputs.
 *
 * Every kernel waits for its predecessor first thing (pdl_wait), so with programmatic
 * dependent launch on (cuda_kernels.h) the next launch's blocks are already resident when a
 * launch ends, which hides most of a launch's gap at batch 1.
 *
 * Every launch reads the row once (fp32: 0.8 MB at V = 201,088), so a step costs about
 * (2 + active select digits) passes over the logits plus the summary's two when logprobs are
 * asked for; the last blocks' serial work is a few microseconds. At one row a pass is a few
 * microseconds (the row stays in L2); at 256 rows it is 206 MB, about 70 us of HBM reads, and
 * the rule needs the row's maximum before any weight, hence two passes at least. Sums of
 * weights are integers (Z <= 2^32 * 2^20 = 2^52), so block, atomic and scan orders all give
 * the host's totals. A row with no finite maximum (every token -inf, or a +inf logit) has
 * every weight 0 and takes its greedy token.
 */
#include "backend/cuda/kernels/sampling.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/ptx.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <math.h>
#include <string.h>

#include "backend/sampling_rule.h"

/* ---- traits: every size of the kernels ---------------------------------------------------- */

#define SP_THREADS 256                                          /* threads per block */
#define SP_ITEMS 8                                              /* tokens per thread per chunk */
#define SP_CHUNK (SP_THREADS * SP_ITEMS)                        /* tokens per block */
#define SP_MAX_CHUNKS (GPTOSS_CUDA_SAMPLE_MAX_VOCAB / SP_CHUNK) /* 512 */
#define SP_ID_BITS 20                                           /* low key bits: 2^20 - 1 - id */
#define SP_ID_MASK ((1u << SP_ID_BITS) - 1u)
#define SP_DIGITS 5  /* radix digits of a 52-bit key: 11, 11, 10, 10, 10 */
#define SP_BINS 2048 /* bins of the widest digit */
#define SP_BINS_PER_THREAD (SP_BINS / SP_THREADS)
#define SP_TOP GPTOSS_MAX_SAMPLE_LOGPROBS /* top logprobs per row */
#define SP_ALIGN 256                      /* alignment of every buffer part */

static_assert(SP_CHUNK <= 32767, "edit slots are int16");
static_assert(SP_MAX_CHUNKS <= 2 * SP_THREADS, "the draw scans the chunk totals in two rounds");
static_assert(SP_BINS % SP_THREADS == 0, "bins split evenly over threads");

/* Bit position and width of radix digit d (most significant first). */
static __device__ __forceinline__ int sp_digit_shift(int d) {
    return d == 0 ? 41 : d == 1 ? 30 : 20 - 10 * (d - 2);
}
static __device__ __forceinline__ int sp_digit_width(int d) {
    return d < 2 ? 11 : 10;
}

/* Row phases (sp_row_state.phase). */
enum { SP_GREEDY = 0, SP_TOP_K = 1, SP_TOP_P = 2, SP_DRAW = 3 };

/* The packed input: this header, then rows, edits, masks at its offsets (16-byte aligned). */
typedef struct sp_header {
    int32_t n_rows, n_edits, n_allowed_rows, mask_words;
    uint32_t rows_offset, edits_offset, masks_offset, bytes;
} sp_header;

/* What the launches of a step know about a row, written by the last block of each. */
typedef struct sp_row_state {
    uint64_t best_key; /* largest key: greedy token and mx */
    uint64_t thr_k;    /* top_k: keep key >= thr_k (0: all) */
    uint64_t thr_p;    /* top_p: keep key >= thr_p (0: all) */
    uint64_t prefix;   /* radix: the digits settled so far */
    uint64_t above;    /* radix: survivors in bins above: count (top_k), weight (top_p) */
    uint64_t z1;       /* top_p: total weight of the top_k survivors */
    int32_t phase;     /* SP_GREEDY (token final), SP_TOP_K, SP_TOP_P, SP_DRAW */
    int32_t pass;      /* digit of the current phase */
    int32_t token;     /* greedy token, then the drawn one */
    int32_t pad;
} sp_row_state;

/* Device pointers of one step (scratch parts placed by scratch_rows, output parts by n_rows). */
typedef struct sp_bufs {
    const float *logits;
    int32_t vocab, n_chunks, n_rows;
    const sp_header *header;
    const gptoss_sample_row *rows; /* the header says where the edits and masks are */
    sp_row_state *state;           /* [rows] */
    unsigned *ticket;              /* [rows] zero between launches */
    unsigned long long *chunk_val; /* [rows, chunks] largest key (max), kept total (draw) */
    int2 *edit_range;              /* [rows, chunks] the chunk's edits [x, y) */
    unsigned *hist_count;          /* [rows, SP_BINS] zero between launches */
    unsigned long long *hist_sum;  /* [rows, SP_BINS] zero between launches */
    const int32_t *sum_ids;        /* summary: [rows, SP_TOP], or NULL (no logprobs) */
    const float *sum_vals;
    const float *sum_lse; /* [rows] */
    int32_t *out_ids;     /* [n_rows] */
    float *out_logprobs;  /* [n_rows] */
    int32_t *out_top_ids; /* [n_rows, SP_TOP] */
    float *out_top_logprobs;
} sp_bufs;

/* ---- keys --------------------------------------------------------------------------------- */

/* Order bits of a processed logit: larger value, larger bits (NaN as -inf, -0 as +0, which
 * the rule's comparisons treat as equal). */
static __device__ __forceinline__ uint32_t sp_order_bits(float x) {
    if (isnan(x)) x = -INFINITY;
    if (x == 0.0f) x = 0.0f;
    uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ uint64_t sp_key(float m, int32_t id) {
    return ((uint64_t)sp_order_bits(m) << SP_ID_BITS) | (uint64_t)(SP_ID_MASK - (uint32_t)id);
}
static __device__ __forceinline__ float sp_key_value(uint64_t key) {
    uint32_t b = (uint32_t)(key >> SP_ID_BITS);
    return __uint_as_float((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b);
}
static __device__ __forceinline__ int32_t sp_key_id(uint64_t key) {
    return (int32_t)(SP_ID_MASK - (uint32_t)(key & SP_ID_MASK));
}

/* ---- rows --------------------------------------------------------------------------------- */

/* Rule step 1 for one token: l raw, e its edit or NULL, allowed whether the mask lets it. */
static __device__ __forceinline__ float sp_processed(float l, const gptoss_sample_edit *e,
                                                     bool allowed, const gptoss_sample_row &p) {
    float m = isnan(l) ? -INFINITY : l;
    if (!e) return allowed ? m : -INFINITY;
    m = GPTOSS_SR_ADD(m, e->bias);
    if (e->masked || !allowed) m = -INFINITY;
    if (e->seen) m = gptoss_sampling_repetition(m, p.repetition_penalty);
    if (e->output_count > 0)
        m = gptoss_sampling_freq_presence(m, p.frequency_penalty, p.presence_penalty,
                                          e->output_count);
    return m;
}

/* Index of the first of edits[0..n) whose token is >= value (tokens sorted), found by one
 * warp probing 32 evenly spaced entries per round: log32(n) dependent loads. */
static __device__ int sp_lower_bound(const gptoss_sample_edit *edits, int n, int value) {
    const int lane = threadIdx.x & 31;
    int lo = 0, hi = n; /* entries before lo are < value; entry hi (if any) is >= value */
    while (hi > lo) {
        const int step = (hi - lo + 31) / 32;
        const int at = lo + lane * step;
        const bool less = at < hi && edits[at].token < value;
        const int c = __popc(__ballot_sync(0xffffffffu, less)); /* a prefix of the lanes */
        if (c == 0) return lo;
        const int next_hi = min(lo + c * step, hi);
        lo = lo + (c - 1) * step + 1;
        hi = next_hi;
    }
    return lo;
}

/* One row's view of the batch. */
struct sp_row {
    gptoss_sample_row p;
    const float *l; /* raw logits of the row */
    const gptoss_sample_edit
        *edits;              /* the batch's edits (the row's: [p.edit_start, + p.n_edits)) */
    const uint32_t *allowed; /* the row's allowed mask, or NULL */
};
static __device__ __forceinline__ sp_row sp_row_view(const sp_bufs &b, int row) {
    const char *in = (const char *)b.header;
    sp_row r;
    r.p = b.rows[row];
    r.l = b.logits + (size_t)row * b.vocab;
    r.edits = (const gptoss_sample_edit *)(in + b.header->edits_offset);
    r.allowed = r.p.allowed_row >= 0 ? (const uint32_t *)(in + b.header->masks_offset) +
                                           (size_t)r.p.allowed_row * b.header->mask_words
                                     : NULL;
    return r;
}

/* Processed logits of this thread's tokens of chunk [begin, begin + n): item i is token
 * begin + threadIdx.x + i * SP_THREADS (so item i of the block is SP_THREADS consecutive ids);
 * -inf past the end. The chunk's edits [er.x, er.y) go through slot (shared, SP_CHUNK). Every
 * thread of the block calls it (barriers when the chunk has edits). */
static __device__ void sp_load_chunk(const sp_row &r, int2 er, int begin, int n, short *slot,
                                     float m[SP_ITEMS]) {
    const int tid = threadIdx.x;
    const bool edited = er.y > er.x; /* uniform over the block */
    if (edited) {
        __syncthreads(); /* slot may still be read by an earlier call */
        for (int i = tid; i < SP_CHUNK; i += SP_THREADS)
            slot[i] = -1;
        __syncthreads();
        for (int e = er.x + tid; e < er.y; e += SP_THREADS)
            slot[r.edits[e].token - begin] = (short)(e - er.x);
        __syncthreads();
    }
    float raw[SP_ITEMS];
#pragma unroll
    for (int i = 0; i < SP_ITEMS; i++) {
        const int j = tid + i * SP_THREADS;
        raw[i] = j < n ? r.l[begin + j] : -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < SP_ITEMS; i++) {
        const int j = tid + i * SP_THREADS;
        if (j >= n) {
            m[i] = -INFINITY;
            continue;
        }
        const int id = begin + j;
        const bool allowed = !r.allowed || ((r.allowed[id >> 5] >> (id & 31)) & 1u);
        const gptoss_sample_edit *e = (edited && slot[j] >= 0) ? &r.edits[er.x + slot[j]] : NULL;
        m[i] = sp_processed(raw[i], e, allowed, r.p);
    }
}

/* Weight of a processed logit (rule step 3). */
static __device__ __forceinline__ uint64_t sp_weight(float m, float mx, float scale) {
    return gptoss_sampling_weight(gptoss_sampling_log2_weight(m, mx, scale));
}

/* Whether a token is drawn from (rule steps 4-5): weight, min_p, both thresholds. */
static __device__ __forceinline__ bool sp_kept(uint64_t w, uint64_t key, const sp_row_state &st,
                                               float min_p) {
    return w > 0 && gptoss_sampling_min_p_keeps(w, min_p) && key >= st.thr_k && key >= st.thr_p;
}

/* The block's ticket for row: whether it is the last block of the row to finish this launch
 * (then it sees every other block's writes, and resets the ticket for the next launch). */
static __device__ bool sp_last_block(unsigned *ticket, int n_blocks) {
    __shared__ bool last;
    __threadfence(); /* this block's results before its ticket */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(ticket, 1u) == (unsigned)n_blocks - 1u;
        if (last) *ticket = 0;
    }
    __syncthreads();
    if (last) __threadfence(); /* the other blocks' results after their tickets */
    return last;
}

typedef cub::BlockReduce<unsigned long long, SP_THREADS> sp_reduce;
typedef cub::BlockScan<unsigned long long, SP_THREADS> sp_scan;
union sp_block_tmp {
    typename sp_reduce::TempStorage reduce;
    typename sp_scan::TempStorage scan;
};

struct sp_max_op {
    __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
        return a > b ? a : b;
    }
};

/* The row's outputs, written by every thread of one block. */
static __device__ void sp_write_outputs(const sp_bufs &b, int row, const sp_row &r, int32_t token) {
    const int tid = threadIdx.x;
    if (tid == 0) {
        b.out_ids[row] = token;
        float lp = 0.0f;
        if (b.sum_lse && r.p.n_top_logprobs >= 0) lp = r.l[token] - b.sum_lse[row];
        b.out_logprobs[row] = lp;
    }
    if (b.sum_lse && tid < SP_TOP) {
        const size_t at = (size_t)row * SP_TOP + tid;
        b.out_top_ids[at] = b.sum_ids[at];
        b.out_top_logprobs[at] = b.sum_vals[at] - b.sum_lse[row];
    }
}

/* ---- launch 1: edit ranges, largest key, phase --------------------------------------------- */

__global__ void __launch_bounds__(SP_THREADS) sp_max_kernel(sp_bufs b) {
    __shared__ short slot[SP_CHUNK];
    __shared__ int2 er_shared;
    __shared__ typename sp_reduce::TempStorage reduce_tmp;
    const int row = blockIdx.y, chunk = blockIdx.x, tid = threadIdx.x;
    const int begin = chunk * SP_CHUNK, n = min(SP_CHUNK, b.vocab - begin);
    pdl_wait(); /* the logits, the input */
    const sp_row r = sp_row_view(b, row);
    if (tid < 32) {
        const gptoss_sample_edit *mine = r.edits + r.p.edit_start;
        const int lo = r.p.n_edits > 0 ? sp_lower_bound(mine, r.p.n_edits, begin) : 0;
        const int hi = r.p.n_edits > 0 ? sp_lower_bound(mine, r.p.n_edits, begin + n) : 0;
        if (tid == 0) {
            er_shared = make_int2(r.p.edit_start + lo, r.p.edit_start + hi);
            b.edit_range[(size_t)row * b.n_chunks + chunk] = er_shared;
        }
    }
    __syncthreads();
    float m[SP_ITEMS];
    sp_load_chunk(r, er_shared, begin, n, slot, m);
    unsigned long long best = 0; /* below every key (order bits of -inf are > 0) */
#pragma unroll
    for (int i = 0; i < SP_ITEMS; i++) {
        const int j = tid + i * SP_THREADS;
        if (j < n) best = max(best, (unsigned long long)sp_key(m[i], begin + j));
    }
    best = sp_reduce(reduce_tmp).Reduce(best, sp_max_op());
    if (tid == 0) b.chunk_val[(size_t)row * b.n_chunks + chunk] = best;
    if (!sp_last_block(&b.ticket[row], b.n_chunks)) return;

    __syncthreads();
    best = 0;
    for (int c = tid; c < b.n_chunks; c += SP_THREADS)
        best = max(best, __ldcg(&b.chunk_val[(size_t)row * b.n_chunks + c]));
    best = sp_reduce(reduce_tmp).Reduce(best, sp_max_op());
    if (tid == 0) {
        sp_row_state st;
        memset(&st, 0, sizeof st);
        st.best_key = best;
        st.token = sp_key_id(best);
        const float mx = sp_key_value(best);
        /* no finite maximum (every token -inf, or +inf logits): every weight is 0, so the row
         * takes its greedy token */
        if (!(r.p.temperature > 0.0f) || !isfinite(mx))
            st.phase = SP_GREEDY;
        else if (r.p.top_k > 0)
            st.phase = SP_TOP_K;
        else if (r.p.top_p < 1.0f)
            st.phase = SP_TOP_P;
        else
            st.phase = SP_DRAW;
        b.state[row] = st;
    }
}

/* ---- launches 2..11: one radix digit of top_k or top_p ----------------------------------- */

__global__ void __launch_bounds__(SP_THREADS) sp_select_kernel(sp_bufs b, int reverse) {
    __shared__ short slot[SP_CHUNK];
    __shared__ unsigned count[SP_BINS];
    __shared__ unsigned long long weight[SP_BINS];
    __shared__ typename sp_scan::TempStorage scan_tmp;
    __shared__ int found;
    const int row = reverse ? b.n_rows - 1 - (int)blockIdx.y : (int)blockIdx.y, chunk = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31;
    pdl_wait(); /* the state the last launch left */
    const sp_row_state st = b.state[row];
    if (st.phase != SP_TOP_K && st.phase != SP_TOP_P) return; /* uniform over the row's blocks */
    const bool top_k = st.phase == SP_TOP_K;
    const int shift = sp_digit_shift(st.pass), width = sp_digit_width(st.pass),
              high = shift + width;
    const int begin = chunk * SP_CHUNK, n = min(SP_CHUNK, b.vocab - begin);
    const sp_row r = sp_row_view(b, row);
    const float mx = sp_key_value(st.best_key), scale = gptoss_sampling_scale(r.p.temperature);

    for (int i = tid; i < SP_BINS; i += SP_THREADS)
        count[i] = 0, weight[i] = 0;
    __syncthreads();
    float m[SP_ITEMS];
    sp_load_chunk(r, b.edit_range[(size_t)row * b.n_chunks + chunk], begin, n, slot, m);
#pragma unroll
    for (int i = 0; i < SP_ITEMS; i++) {
        const int j = tid + i * SP_THREADS;
        const uint64_t key = sp_key(m[i], begin + j);
        const uint64_t w = sp_weight(m[i], mx, scale);
        /* top_k counts the min_p survivors; top_p weighs the top_k survivors (weight 0 adds
         * nothing, so only tokens with weight are counted: a bin of one such token is settled) */
        bool take = j < n && gptoss_sampling_min_p_keeps(w, r.p.min_p) &&
                    (key >> high) == (st.prefix >> high);
        if (!top_k) take = take && w > 0 && key >= st.thr_k;
        const unsigned bin = take ? (unsigned)(key >> shift) & ((1u << width) - 1u) : SP_BINS;
        const unsigned peers = __match_any_sync(0xffffffffu, bin); /* values crowd into few bins */
        if (take && lane == __ffs(peers) - 1) atomicAdd(&count[bin], (unsigned)__popc(peers));
        if (take && !top_k) atomicAdd(&weight[bin], (unsigned long long)w);
    }
    __syncthreads();
    unsigned *g_count = b.hist_count + (size_t)row * SP_BINS;
    unsigned long long *g_weight = b.hist_sum + (size_t)row * SP_BINS;
    for (int i = tid; i < SP_BINS; i += SP_THREADS) {
        if (count[i]) {
            atomicAdd(&g_count[i], count[i]);
            if (!top_k) atomicAdd(&g_weight[i], weight[i]);
        }
    }
    if (!sp_last_block(&b.ticket[row], b.n_chunks)) return;

    /* The row's histogram: thread t holds bins SP_BINS-1-8t down to SP_BINS-8-8t, so a scan
     * over threads runs from the largest keys down. Read, then cleared for the next launch. */
    unsigned c[SP_BINS_PER_THREAD];
    unsigned long long v[SP_BINS_PER_THREAD], mine = 0;
#pragma unroll
    for (int i = 0; i < SP_BINS_PER_THREAD; i++) {
        const int bin = SP_BINS - 1 - (tid * SP_BINS_PER_THREAD + i);
        c[i] = __ldcg(&g_count[bin]);
        const unsigned long long s = top_k ? 0ull : __ldcg(&g_weight[bin]);
        g_count[bin] = 0;
        if (!top_k) g_weight[bin] = 0;
        v[i] = top_k ? (unsigned long long)c[i] : s; /* what the boundary is measured in */
        mine += v[i];
    }
    if (tid == 0) found = 0;
    unsigned long long before, total;
    sp_scan(scan_tmp).ExclusiveSum(mine, before, total);
    const bool last_digit = st.pass == SP_DIGITS - 1;
    const uint64_t need = (uint64_t)(r.p.top_k > 0 ? r.p.top_k : 0);
    const uint64_t z1 = top_k ? 0 : (st.pass == 0 ? total : st.z1);
    unsigned long long run = st.above + before;
#pragma unroll
    for (int i = 0; i < SP_BINS_PER_THREAD; i++) {
        const unsigned long long next = run + v[i];
        const bool cross = top_k ? (run < need && next >= need)
                                 : (!gptoss_sampling_top_p_reached(run, z1, r.p.top_p) &&
                                    gptoss_sampling_top_p_reached(next, z1, r.p.top_p));
        if (cross) { /* exactly one bin of the row crosses */
            const int bin = SP_BINS - 1 - (tid * SP_BINS_PER_THREAD + i);
            sp_row_state out = st;
            out.prefix = st.prefix | ((uint64_t)bin << shift);
            out.above = run;
            out.z1 = z1;
            /* settled: the bin is taken whole (top_k) or holds the one crossing token (top_p) */
            const bool settled = last_digit || (top_k ? next == need : c[i] == 1);
            if (!settled) {
                out.pass = st.pass + 1;
            } else if (top_k) {
                out.thr_k = out.prefix;
                out.phase = r.p.top_p < 1.0f ? SP_TOP_P : SP_DRAW;
                out.pass = 0, out.prefix = 0, out.above = 0;
            } else {
                out.thr_p = out.prefix;
                out.phase = SP_DRAW;
            }
            b.state[row] = out;
            found = 1;
        }
        run = next;
    }
    __syncthreads();
    if (tid == 0 && !found) {
        /* top_k: at most top_k survivors, all kept. top_p: cannot happen (the best token is a
         * survivor with weight 2^32, so Z1 > 0), but a row must still end with a token. */
        sp_row_state out = st;
        if (top_k) {
            out.thr_k = 0;
            out.phase = r.p.top_p < 1.0f ? SP_TOP_P : SP_DRAW;
            out.pass = 0, out.prefix = 0, out.above = 0;
        } else {
            out.phase = SP_GREEDY;
        }
        b.state[row] = out;
    }
}

/* ---- launch 12: chunk totals, the draw, the outputs ---------------------------------------- */

__global__ void __launch_bounds__(SP_THREADS) sp_draw_kernel(sp_bufs b, int reverse) {
    __shared__ short slot[SP_CHUNK];
    __shared__ sp_block_tmp tmp;
    __shared__ int chosen_chunk, token;
    __shared__ unsigned long long target_in_chunk, z2_shared;
    const int row = reverse ? b.n_rows - 1 - (int)blockIdx.y : (int)blockIdx.y, chunk = blockIdx.x;
    const int tid = threadIdx.x;
    pdl_wait();
    const sp_row_state st = b.state[row];
    const sp_row r = sp_row_view(b, row);
    if (st.phase == SP_GREEDY) { /* uniform over the row's blocks */
        if (chunk == 0) sp_write_outputs(b, row, r, st.token);
        return;
    }
    const float mx = sp_key_value(st.best_key), scale = gptoss_sampling_scale(r.p.temperature);
    const int2 *ranges = b.edit_range + (size_t)row * b.n_chunks;
    unsigned long long *totals = b.chunk_val + (size_t)row * b.n_chunks;

    int begin = chunk * SP_CHUNK, n = min(SP_CHUNK, b.vocab - begin);
    float m[SP_ITEMS];
    sp_load_chunk(r, ranges[chunk], begin, n, slot, m);
    unsigned long long mine = 0;
#pragma unroll
    for (int i = 0; i < SP_ITEMS; i++) {
        const int j = tid + i * SP_THREADS;
        const uint64_t w = sp_weight(m[i], mx, scale);
        if (j < n && sp_kept(w, sp_key(m[i], begin + j), st, r.p.min_p)) mine += w;
    }
    mine = sp_reduce(tmp.reduce).Sum(mine);
    if (tid == 0) totals[chunk] = mine;
    if (!sp_last_block(&b.ticket[row], b.n_chunks)) return;

    /* Z2 and t, then the chunk whose running total first exceeds t (two rounds of
     * SP_THREADS chunks cover SP_MAX_CHUNKS). */
    unsigned long long part[2], z2 = 0;
    for (int k = 0; k < 2; k++) {
        const int c = tid + k * SP_THREADS;
        part[k] = c < b.n_chunks ? __ldcg(&totals[c]) : 0;
        z2 += part[k];
    }
    if (tid == 0) chosen_chunk = -1, token = -1;
    __syncthreads();
    z2 = sp_reduce(tmp.reduce).Sum(z2);
    if (tid == 0) z2_shared = z2;
    __syncthreads();
    z2 = z2_shared;
    if (z2 == 0) { /* cannot happen (the best token is kept with weight 2^32); greedy then */
        sp_write_outputs(b, row, r, st.token);
        return;
    }
    const unsigned long long t =
        gptoss_sampling_target(gptoss_sampling_random(r.p.seed, r.p.position, r.p.choice), z2);
    unsigned long long carry = 0;
    for (int k = 0; k < 2; k++) {
        unsigned long long incl, round_total;
        __syncthreads();
        sp_scan(tmp.scan).InclusiveSum(part[k], incl, round_total);
        incl += carry;
        const unsigned long long excl = incl - part[k];
        if (part[k] > 0 && excl <= t && t < incl) {
            chosen_chunk = tid + k * SP_THREADS;
            target_in_chunk = t - excl;
        }
        carry += round_total;
    }
    __syncthreads();
    const int c = chosen_chunk;
    if (c < 0) { /* cannot happen: t < Z2 */
        sp_write_outputs(b, row, r, st.token);
        return;
    }
    /* The token: the chunk again, in id order (item i of the block is SP_THREADS consecutive
     * ids), running totals by a scan per item. */
    begin = c * SP_CHUNK, n = min(SP_CHUNK, b.vocab - begin);
    sp_load_chunk(r, ranges[c], begin, n, slot, m);
    const unsigned long long tc = target_in_chunk;
    carry = 0;
#pragma unroll
    for (int i = 0; i < SP_ITEMS; i++) {
        const int j = tid + i * SP_THREADS;
        const uint64_t w0 = sp_weight(m[i], mx, scale);
        const unsigned long long w =
            (j < n && sp_kept(w0, sp_key(m[i], begin + j), st, r.p.min_p)) ? w0 : 0;
        unsigned long long incl, round_total;
        __syncthreads();
        sp_scan(tmp.scan).InclusiveSum(w, incl, round_total);
        incl += carry;
        if (w > 0 && incl - w <= tc && tc < incl) token = begin + j;
        carry += round_total;
    }
    __syncthreads();
    const int32_t drawn = token >= 0 ? token : st.token;
    if (tid == 0) b.state[row].token = drawn;
    sp_write_outputs(b, row, r, drawn);
}

/* ---- host side ----------------------------------------------------------------------------- */

static size_t sp_align(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

size_t gptoss_cuda_sample_input_bytes(int32_t n_rows, int32_t n_edits, int32_t n_allowed_rows,
                                      int32_t vocab) {
    size_t bytes = sp_align(sizeof(sp_header), 16);
    bytes += sp_align((size_t)n_rows * sizeof(gptoss_sample_row), 16);
    bytes += sp_align((size_t)n_edits * sizeof(gptoss_sample_edit), 16);
    bytes += sp_align((size_t)n_allowed_rows * (((size_t)vocab + 31) / 32) * sizeof(uint32_t), 16);
    return bytes;
}

size_t gptoss_cuda_sample_masks_offset(int32_t n_rows, int32_t n_edits) {
    return sp_align(sizeof(sp_header), 16) +
           sp_align((size_t)n_rows * sizeof(gptoss_sample_row), 16) +
           sp_align((size_t)(n_edits > 0 ? n_edits : 0) * sizeof(gptoss_sample_edit), 16);
}

size_t gptoss_cuda_sample_pack(void *host, const gptoss_sample_batch *batch, int32_t n_rows,
                               int32_t vocab, uint32_t *flags) {
    sp_header h;
    memset(&h, 0, sizeof h);
    h.n_rows = n_rows;
    h.n_edits = batch->n_edits > 0 ? batch->n_edits : 0;
    h.n_allowed_rows = (batch->allowed_masks || batch->fill_masks) && batch->n_allowed_rows > 0
                           ? batch->n_allowed_rows
                           : 0;
    h.mask_words = (vocab + 31) / 32;
    size_t at = sp_align(sizeof h, 16);
    h.rows_offset = (uint32_t)at;
    at += sp_align((size_t)n_rows * sizeof(gptoss_sample_row), 16);
    h.edits_offset = (uint32_t)at;
    at += sp_align((size_t)h.n_edits * sizeof(gptoss_sample_edit), 16);
    h.masks_offset = (uint32_t)at;
    const size_t mask_bytes = (size_t)h.n_allowed_rows * h.mask_words * sizeof(uint32_t);
    at += sp_align(mask_bytes, 16);
    h.bytes = (uint32_t)at;
    char *dst = (char *)host;
    memcpy(dst, &h, sizeof h);
    memcpy(dst + h.rows_offset, batch->rows, (size_t)n_rows * sizeof(gptoss_sample_row));
    if (h.n_edits)
        memcpy(dst + h.edits_offset, batch->edits, (size_t)h.n_edits * sizeof(gptoss_sample_edit));
    if (mask_bytes && batch->allowed_masks)
        memcpy(dst + h.masks_offset, batch->allowed_masks, mask_bytes);
    uint32_t f = 0;
    for (int32_t i = 0; i < n_rows; i++) {
        const gptoss_sample_row *p = &batch->rows[i];
        if (p->n_top_logprobs >= 0) f |= GPTOSS_CUDA_SAMPLE_LOGPROBS;
        if (p->temperature > 0.0f && p->top_k > 0) f |= GPTOSS_CUDA_SAMPLE_TOP_K;
        if (p->temperature > 0.0f && p->top_p < 1.0f) f |= GPTOSS_CUDA_SAMPLE_TOP_P;
    }
    *flags = f;
    return at;
}

/* Scratch parts, each SP_ALIGN-aligned, placed by scratch_rows (the zero-kept parts first). */
typedef struct sp_layout {
    size_t hist_count, hist_sum, ticket, state, chunk_val, edit_range, sum_ids, sum_vals, sum_lse,
        summary, bytes;
} sp_layout;

static sp_layout sp_layout_of(int32_t scratch_rows, int32_t vocab) {
    const size_t R = (size_t)scratch_rows, C = ((size_t)vocab + SP_CHUNK - 1) / SP_CHUNK;
    sp_layout L;
    size_t at = 0;
    L.hist_count = at, at = sp_align(at + R * SP_BINS * sizeof(unsigned), SP_ALIGN);
    L.hist_sum = at, at = sp_align(at + R * SP_BINS * sizeof(unsigned long long), SP_ALIGN);
    L.ticket = at, at = sp_align(at + R * sizeof(unsigned), SP_ALIGN);
    L.state = at, at = sp_align(at + R * sizeof(sp_row_state), SP_ALIGN);
    L.chunk_val = at, at = sp_align(at + R * C * sizeof(unsigned long long), SP_ALIGN);
    L.edit_range = at, at = sp_align(at + R * C * sizeof(int2), SP_ALIGN);
    L.sum_ids = at, at = sp_align(at + R * SP_TOP * sizeof(int32_t), SP_ALIGN);
    L.sum_vals = at, at = sp_align(at + R * SP_TOP * sizeof(float), SP_ALIGN);
    L.sum_lse = at, at = sp_align(at + R * sizeof(float), SP_ALIGN);
    L.summary = at,
    at = sp_align(at + gptoss_cuda_logits_summary_scratch(scratch_rows, vocab), SP_ALIGN);
    L.bytes = at;
    return L;
}

size_t gptoss_cuda_sample_scratch_bytes(int32_t scratch_rows, int32_t vocab) {
    return sp_layout_of(scratch_rows, vocab).bytes;
}

size_t gptoss_cuda_sample_output_bytes(int32_t n_rows) {
    return (size_t)n_rows * (2 + 2 * SP_TOP) * 4;
}

int gptoss_cuda_sample(const float *logits, int32_t n_rows, int32_t vocab, const void *input,
                       void *scratch, int32_t scratch_rows, void *output, uint32_t flags,
                       cudaStream_t stream) {
    if (n_rows <= 0) return 0;
    if (vocab < SP_TOP || vocab > GPTOSS_CUDA_SAMPLE_MAX_VOCAB || n_rows > 65535 ||
        scratch_rows < n_rows)
        return -1;
    const sp_layout L = sp_layout_of(scratch_rows, vocab);
    char *s = (char *)scratch;
    const char *in = (const char *)input;
    /* the input's parts are found on the device through its header; their offsets are fixed
     * by the packing order: header, rows (n_rows of them), edits, masks */
    sp_bufs b;
    memset(&b, 0, sizeof b);
    b.logits = logits;
    b.vocab = vocab;
    b.n_chunks = (vocab + SP_CHUNK - 1) / SP_CHUNK;
    b.n_rows = n_rows;
    b.header = (const sp_header *)in;
    b.rows = (const gptoss_sample_row *)(in + sp_align(sizeof(sp_header), 16));
    b.state = (sp_row_state *)(s + L.state);
    b.ticket = (unsigned *)(s + L.ticket);
    b.chunk_val = (unsigned long long *)(s + L.chunk_val);
    b.edit_range = (int2 *)(s + L.edit_range);
    b.hist_count = (unsigned *)(s + L.hist_count);
    b.hist_sum = (unsigned long long *)(s + L.hist_sum);
    char *out = (char *)output;
    b.out_ids = (int32_t *)out;
    b.out_logprobs = (float *)(out + (size_t)n_rows * 4);
    b.out_top_ids = (int32_t *)(out + (size_t)n_rows * 8);
    b.out_top_logprobs = (float *)(out + (size_t)n_rows * (8 + 4 * SP_TOP));
    if (flags & GPTOSS_CUDA_SAMPLE_LOGPROBS) {
        b.sum_ids = (const int32_t *)(s + L.sum_ids);
        b.sum_vals = (const float *)(s + L.sum_vals);
        b.sum_lse = (const float *)(s + L.sum_lse);
        if (gptoss_cuda_logits_summary(logits, n_rows, vocab, SP_TOP, s + L.summary,
                                       (int32_t *)(s + L.sum_ids), (float *)(s + L.sum_vals),
                                       (float *)(s + L.sum_lse), stream) != 0)
            return -1;
    }
    const dim3 grid(b.n_chunks, n_rows);
    launch_pdl(sp_max_kernel, grid, dim3(SP_THREADS), 0, stream, b);
    /* rows alternate direction between launches: the rows the last launch read last are the
     * ones still in L2 */
    int reverse = 1;
    /* a row settles top_k in at most SP_DIGITS launches, then top_p in as many */
    const int select_launches =
        SP_DIGITS * (!!(flags & GPTOSS_CUDA_SAMPLE_TOP_K) + !!(flags & GPTOSS_CUDA_SAMPLE_TOP_P));
    for (int i = 0; i < select_launches; i++, reverse ^= 1)
        launch_pdl(sp_select_kernel, grid, dim3(SP_THREADS), 0, stream, b, reverse);
    launch_pdl(sp_draw_kernel, grid, dim3(SP_THREADS), 0, stream, b, reverse);
    return 0;
}
