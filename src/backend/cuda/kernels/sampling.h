/*
 * sampling.h - drawing one token per logits row on the GPU (sampling.cu), by the rule of
 * backend/sampling_rule.h, so the token is exactly the host reference's.
 *
 * Owns nothing: the caller allocates the buffers below (sizes from the functions here) and
 * keeps them; nothing here allocates, synchronizes or checks for errors (the caller checks
 * cudaGetLastError once per step). A step is:
 *
 *   1. gptoss_cuda_sample_pack: the batch's rows, edits and allowed masks into one pinned host
 *      buffer (a header with counts and offsets first), which the caller copies to the device
 *      input buffer in one cudaMemcpyAsync;
 *   2. gptoss_cuda_sample: the kernels on the stream, reading the logits in place;
 *   3. one copy of the output buffer back: token ids and logprobs, then the top logprobs.
 *
 * Kernel arguments depend only on n_rows, the vocabulary, the buffers and three flags (whether
 * any row wants logprobs, uses top_k, uses top_p), so a step can be captured in
 * a CUDA graph keyed by those.
 */
#ifndef GPTOSS_CUDA_SAMPLING_H
#define GPTOSS_CUDA_SAMPLING_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "gptoss.h"

/* Vocabularies up to this many tokens (token ids fit the 20 low bits of a selection key). */
#define GPTOSS_CUDA_SAMPLE_MAX_VOCAB (1 << 20)

/* gptoss_cuda_sample flags. */
enum {
    GPTOSS_CUDA_SAMPLE_LOGPROBS = 1u << 0, /* some row has n_top_logprobs >= 0: run the summary */
    GPTOSS_CUDA_SAMPLE_TOP_K = 1u << 1,    /* some sampled row has top_k > 0 */
    GPTOSS_CUDA_SAMPLE_TOP_P = 1u << 2,    /* some sampled row has top_p < 1 */
};

/* Bytes of the packed input of a batch (header, rows, edits, masks; 16-byte aligned parts). */
size_t gptoss_cuda_sample_input_bytes(int32_t n_rows, int32_t n_edits, int32_t n_allowed_rows,
                                      int32_t vocab);

/* Packs rows [n_rows], the edits and the allowed masks of batch into host (at least
 * gptoss_cuda_sample_input_bytes bytes, 16-byte aligned). Returns the bytes written (the size of
 * the one copy to the device) and the flags the batch needs in *flags. A batch with fill_masks
 * gets room for its masks, unwritten, at gptoss_cuda_sample_masks_offset: the last part. */
size_t gptoss_cuda_sample_pack(void *host, const gptoss_sample_batch *batch, int32_t n_rows,
                               int32_t vocab, uint32_t *flags);

/* Byte offset of the masks in the packed input of a batch of n_rows rows and n_edits edits. */
size_t gptoss_cuda_sample_masks_offset(int32_t n_rows, int32_t n_edits);

/* Device scratch for up to scratch_rows rows (grown with the row count; zeroed once when
 * allocated: the kernels leave their counters and histograms at zero when they finish, and
 * their places depend only on scratch_rows). */
size_t gptoss_cuda_sample_scratch_bytes(int32_t scratch_rows, int32_t vocab);

/* Output buffer of n_rows rows, in this order (offsets depend only on n_rows):
 *   token ids int32 [n_rows] | logprobs f32 [n_rows] |
 *   top ids int32 [n_rows, GPTOSS_MAX_SAMPLE_LOGPROBS] | top logprobs f32 [same]
 * The first two parts (2 * n_rows words) are all a batch without top logprobs needs back. */
size_t gptoss_cuda_sample_output_bytes(int32_t n_rows);

/*
 * Draws one token per row of logits [n_rows, vocab] (f32, device, left unchanged). input: the
 * device copy of a packed batch of n_rows rows; scratch: gptoss_cuda_sample_scratch_bytes
 * (scratch_rows >= n_rows) of device memory, 256-byte aligned, zeroed when allocated and
 * since used only by these kernels with the same scratch_rows; output: device buffer as
 * above. Rows with n_top_logprobs < 0 get a logprob of 0 and no top logprobs (the parts are
 * written only with GPTOSS_CUDA_SAMPLE_LOGPROBS). Returns -1 (nothing enqueued) for a
 * vocabulary outside [GPTOSS_MAX_SAMPLE_LOGPROBS, GPTOSS_CUDA_SAMPLE_MAX_VOCAB], more than
 * 65535 rows or scratch_rows < n_rows.
 */
int gptoss_cuda_sample(const float *logits, int32_t n_rows, int32_t vocab, const void *input,
                       void *scratch, int32_t scratch_rows, void *output, uint32_t flags,
                       cudaStream_t stream);

#endif
