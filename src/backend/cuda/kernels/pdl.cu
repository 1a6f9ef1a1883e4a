/*
 * pdl.cu - the process-wide programmatic-dependent-launch setting that launch_pdl (ptx.cuh)
 * reads.
 */
#include "backend/cuda/cuda_kernels.h"

static bool pdl_on = false; /* see cuda_kernels.h; one setting per process */
void gptoss_cuda_set_pdl(bool on) { pdl_on = on; }
bool gptoss_cuda_pdl_enabled(void) { return pdl_on; }
