/*
 * traits.h - tile sizes of the CUDA kernels (kernels/ and kernels/moe/), in one place.
 */
#ifndef GPTOSS_CUDA_TRAITS_H
#define GPTOSS_CUDA_TRAITS_H

#define WG_BN 128 /* path 6's route tile height; a tile multiplies only its rows rounded up to 32 */
#define GEMV_MAX_GROUPS_PER_LANE 4 /* k_in <= 4096 */

#endif
