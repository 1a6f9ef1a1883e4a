/*
 * cuda_sample_ops.cu - the CUDA backend's forward_sample: the step's forward pass exactly as
 * forward_summary runs it (logits left on the device), then the sampling kernels
 * (sampling.cu) on the same stream; only token ids and the logprobs asked for come back.
 *
 * Per call: the batch packed into pinned memory and copied on a side stream while the forward
 * runs (the main stream waits for it before sampling), the kernels, one copy of the outputs.
 * A batch with fill_masks has its allowed-token masks written straight into the pinned input
 * once the forward is launched (the host builds them while the GPU computes), then uploaded
 * on the side stream; the sampling kernels wait for that copy.
 * Owns the sampler (gptoss_cuda_sampler): device scratch, input and output buffers and their
 * pinned host twins, grown to the largest batch seen, freed with the state. Must not: touch
 * the logits (they stay as the forward left them) or leave a copy in flight on return.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/sampling.h"

#include <stdlib.h>
#include <string.h>

struct gptoss_cuda_sampler {
    void *scratch; /* device: gptoss_cuda_sample_scratch_bytes(scratch_rows, V), zeroed */
    int32_t scratch_rows;
    void *input;        /* device copy of the packed batch */
    void *input_host;   /* pinned staging of the same */
    size_t input_bytes; /* of both */
    void *output;       /* device: gptoss_cuda_sample_output_bytes(output_rows) */
    void *output_host;  /* pinned: the part that comes back */
    int32_t output_rows;
    cudaStream_t upload; /* the input's copy, beside the forward */
    cudaEvent_t uploaded;
};

void gptoss_cuda_sampler_free(struct gptoss_cuda_sampler *sp) {
    if (!sp) return;
    if (sp->upload) cudaStreamSynchronize(sp->upload);
    cudaFree(sp->scratch);
    cudaFree(sp->input);
    cudaFreeHost(sp->input_host);
    cudaFree(sp->output);
    cudaFreeHost(sp->output_host);
    if (sp->uploaded) cudaEventDestroy(sp->uploaded);
    if (sp->upload) cudaStreamDestroy(sp->upload);
    free(sp);
}

#define SAMPLE_TRY(call, what)                                                                     \
    do {                                                                                           \
        cudaError_t sample_try_code_ = (call);                                                     \
        if (sample_try_code_ != cudaSuccess)                                                       \
            return gptoss_cuda_error(error, sample_try_code_, what);                               \
    } while (0)

/* Grows the sampler's buffers for a batch of n_rows rows and input_bytes of packed input.
 * The main stream is idle here (every call ends synchronized), and the last upload is waited
 * for, so buffers may be freed and the pinned input rewritten. */
static gptoss_status sampler_reserve(gptoss_cuda_state *s, int32_t n_rows, size_t input_bytes,
                                     gptoss_error *error) {
    if (!s->sampler) {
        s->sampler = (struct gptoss_cuda_sampler *)calloc(1, sizeof *s->sampler);
        if (!s->sampler)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (sampler)");
        SAMPLE_TRY(cudaStreamCreateWithFlags(&s->sampler->upload, cudaStreamNonBlocking),
                   "cudaStreamCreate");
        SAMPLE_TRY(cudaEventCreateWithFlags(&s->sampler->uploaded, cudaEventDisableTiming),
                   "cudaEventCreate");
    }
    struct gptoss_cuda_sampler *sp = s->sampler;
    SAMPLE_TRY(cudaEventSynchronize(sp->uploaded), "sampling input upload");
    const int32_t V = s->config.vocab_size;
    int32_t rows = n_rows > s->ws.cap_logits ? n_rows : s->ws.cap_logits;
    if (rows > sp->scratch_rows) {
        const size_t bytes = gptoss_cuda_sample_scratch_bytes(rows, V);
        cudaFree(sp->scratch);
        sp->scratch = NULL;
        sp->scratch_rows = 0;
        SAMPLE_TRY(cudaMalloc(&sp->scratch, bytes), "sampling scratch");
        SAMPLE_TRY(cudaMemset(sp->scratch, 0, bytes),
                   "sampling scratch"); /* the kernels keep it so */
        sp->scratch_rows = rows;
    }
    if (rows > sp->output_rows) {
        const size_t bytes = gptoss_cuda_sample_output_bytes(rows);
        cudaFree(sp->output);
        cudaFreeHost(sp->output_host);
        sp->output = sp->output_host = NULL;
        sp->output_rows = 0;
        SAMPLE_TRY(cudaMalloc(&sp->output, bytes), "sampling output");
        SAMPLE_TRY(cudaHostAlloc(&sp->output_host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
        sp->output_rows = rows;
    }
    if (input_bytes > sp->input_bytes) {
        const size_t bytes =
            input_bytes + input_bytes / 2; /* room for the next few batches' edits */
        cudaFree(sp->input);
        cudaFreeHost(sp->input_host);
        sp->input = sp->input_host = NULL;
        sp->input_bytes = 0;
        SAMPLE_TRY(cudaMalloc(&sp->input, bytes), "sampling input");
        SAMPLE_TRY(cudaHostAlloc(&sp->input_host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
        sp->input_bytes = bytes;
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_forward_sample(void *state, const gptoss_batch_plan *plan,
                                         const gptoss_sample_batch *batch, gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    const int32_t NL = plan->n_logits, V = s->config.vocab_size;
    if (NL <= 0) {
        gptoss_status st = gptoss_cuda_forward_device(s, plan, error);
        if (st) return st;
        SAMPLE_TRY(cudaStreamSynchronize(s->stream), "forward pass");
        return GPTOSS_OK;
    }
    if (V < GPTOSS_MAX_SAMPLE_LOGPROBS || V > GPTOSS_CUDA_SAMPLE_MAX_VOCAB || NL > 65535)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA: sampling on the GPU supports vocabularies of %d to %d tokens and up to 65535 "
            "rows (vocabulary %d, %d rows)",
            GPTOSS_MAX_SAMPLE_LOGPROBS, GPTOSS_CUDA_SAMPLE_MAX_VOCAB, (int)V, (int)NL);
    gptoss_status bind_st = gptoss_cuda_device_bind(&s->dev, error);
    if (bind_st) return bind_st;
    const size_t input_bytes =
        gptoss_cuda_sample_input_bytes(NL, batch->n_edits, batch->n_allowed_rows, V);
    gptoss_status st = sampler_reserve(s, NL, input_bytes, error);
    if (st) return st;
    struct gptoss_cuda_sampler *sp = s->sampler;
    uint32_t flags = 0;
    const size_t packed = gptoss_cuda_sample_pack(sp->input_host, batch, NL, V, &flags);
    /* Masks from fill_masks are the packed input's last part, written while the forward runs:
     * what comes before them goes up now. */
    const size_t masks_at =
        batch->fill_masks ? gptoss_cuda_sample_masks_offset(NL, batch->n_edits) : packed;
    SAMPLE_TRY(
        cudaMemcpyAsync(sp->input, sp->input_host, masks_at, cudaMemcpyHostToDevice, sp->upload),
        "sampling input upload");
    SAMPLE_TRY(cudaEventRecord(sp->uploaded, sp->upload), "cudaEventRecord");

    st = gptoss_cuda_forward_device(s, plan, error);
    if (st) return st;
    if (batch->fill_masks) {
        st = batch->fill_masks(batch->fill_masks_user,
                               (uint32_t *)((char *)sp->input_host + masks_at), error);
        if (st) {
            /* nothing may stay in flight: the forward and the first upload end here */
            cudaStreamSynchronize(s->stream);
            cudaEventSynchronize(sp->uploaded);
            return st;
        }
        if (packed > masks_at) {
            SAMPLE_TRY(cudaMemcpyAsync((char *)sp->input + masks_at,
                                       (const char *)sp->input_host + masks_at, packed - masks_at,
                                       cudaMemcpyHostToDevice, sp->upload),
                       "allowed-token masks upload");
            SAMPLE_TRY(cudaEventRecord(sp->uploaded, sp->upload), "cudaEventRecord");
        }
    }
    SAMPLE_TRY(cudaStreamWaitEvent(s->stream, sp->uploaded, 0), "cudaStreamWaitEvent");
    if (gptoss_cuda_sample(s->ws.logits, NL, V, sp->input, sp->scratch, sp->scratch_rows,
                           sp->output, flags, s->stream) != 0)
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND,
                                "CUDA: the sampling kernels refused %d rows", (int)NL);
    SAMPLE_TRY(cudaGetLastError(), "sampling kernels");
    bool want_top = false;
    for (int32_t i = 0; i < NL; i++)
        want_top = want_top || batch->rows[i].n_top_logprobs > 0;
    const size_t back = want_top ? gptoss_cuda_sample_output_bytes(NL) : (size_t)NL * 8;
    SAMPLE_TRY(
        cudaMemcpyAsync(sp->output_host, sp->output, back, cudaMemcpyDeviceToHost, s->stream),
        "sampling output download");
    if (batch->while_running) batch->while_running(batch->while_running_user);
    SAMPLE_TRY(cudaStreamSynchronize(s->stream), "forward pass and sampling");

    const int32_t *ids = (const int32_t *)sp->output_host;
    const float *logprobs = (const float *)(ids + NL);
    const int32_t *top_ids = (const int32_t *)(logprobs + NL);
    const float *top_logprobs = (const float *)(top_ids + (size_t)NL * GPTOSS_MAX_SAMPLE_LOGPROBS);
    memcpy(batch->token_ids, ids, (size_t)NL * sizeof(int32_t));
    for (int32_t i = 0; i < NL; i++) {
        const int32_t n_top = batch->rows[i].n_top_logprobs;
        if (n_top >= 0 && batch->logprobs) batch->logprobs[i] = logprobs[i];
        if (n_top > 0 && batch->top_ids && batch->top_logprobs) {
            const size_t at = (size_t)i * GPTOSS_MAX_SAMPLE_LOGPROBS;
            memcpy(batch->top_ids + at, top_ids + at, GPTOSS_MAX_SAMPLE_LOGPROBS * sizeof(int32_t));
            memcpy(batch->top_logprobs + at, top_logprobs + at,
                   GPTOSS_MAX_SAMPLE_LOGPROBS * sizeof(float));
        }
    }
    return GPTOSS_OK;
}
