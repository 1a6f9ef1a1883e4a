/*
 * profile.c - device capabilities and the profiles that limit them (see profile.h): the
 * numbers of the three reference GPUs, the name table, and the one function that narrows a
 * device to a profile. Owns nothing.
 */
#include "backend/cuda/profile.h"

#include <stdio.h>
#include <string.h>

static const char *const profile_names[] = {"auto", "ampere", "ada", "hopper"};

gptoss_cuda_caps gptoss_cuda_caps_of(int major, int minor, size_t smem_per_block,
                                     size_t smem_per_sm, bool integrated) {
    gptoss_cuda_caps c;
    memset(&c, 0, sizeof c);
    c.sm = 10 * major + minor;
    c.smem_per_block = smem_per_block;
    c.smem_per_sm = smem_per_sm;
    c.pdl = major >= 9;
    c.tma = major >= 9;
    c.wgmma = major == 9 && minor == 0;
    c.fp8 = c.sm >= 89;
    c.integrated = integrated;
    return c;
}

/* The shared-memory limits the drivers report: A100 163 KB per block of 164 KB per SM,
 * RTX 4090 99 of 100 KB, H100 227 of 228 KB. */
gptoss_cuda_caps gptoss_cuda_profile_caps(gptoss_cuda_profile profile) {
    switch (profile) {
    case GPTOSS_CUDA_PROFILE_AMPERE:
        return gptoss_cuda_caps_of(8, 0, 163 * 1024, 164 * 1024, false);
    case GPTOSS_CUDA_PROFILE_ADA:
        return gptoss_cuda_caps_of(8, 9, 99 * 1024, 100 * 1024, false);
    case GPTOSS_CUDA_PROFILE_HOPPER:
        return gptoss_cuda_caps_of(9, 0, 227 * 1024, 228 * 1024, false);
    default: {
        gptoss_cuda_caps none;
        memset(&none, 0, sizeof none);
        return none;
    }
    }
}

const char *gptoss_cuda_profile_name(gptoss_cuda_profile profile) {
    return profile >= GPTOSS_CUDA_PROFILE_AUTO && profile <= GPTOSS_CUDA_PROFILE_HOPPER
               ? profile_names[profile]
               : "?";
}

bool gptoss_cuda_profile_parse(const char *name, gptoss_cuda_profile *profile) {
    for (int i = 0; name && i <= GPTOSS_CUDA_PROFILE_HOPPER; i++)
        if (!strcmp(name, profile_names[i])) {
            *profile = (gptoss_cuda_profile)i;
            return true;
        }
    return false;
}

gptoss_status gptoss_cuda_profile_resolve(gptoss_cuda_profile option, int tuning_profile,
                                          gptoss_cuda_profile *out, gptoss_error *error) {
    if (option < GPTOSS_CUDA_PROFILE_AUTO || option > GPTOSS_CUDA_PROFILE_HOPPER)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "CUDA: cuda_profile %d is not a profile (auto, ampere, ada, "
                                "hopper)",
                                (int)option);
    *out =
        tuning_profile >= GPTOSS_CUDA_PROFILE_AUTO && tuning_profile <= GPTOSS_CUDA_PROFILE_HOPPER
            ? (gptoss_cuda_profile)tuning_profile
            : option;
    return GPTOSS_OK;
}

static size_t min_size(size_t a, size_t b) {
    return a < b ? a : b;
}

gptoss_status gptoss_cuda_caps_limit(const gptoss_cuda_caps *device, gptoss_cuda_profile profile,
                                     const char *device_name, gptoss_cuda_caps *out,
                                     gptoss_error *error) {
    *out = *device;
    if (profile == GPTOSS_CUDA_PROFILE_AUTO) return GPTOSS_OK;
    const gptoss_cuda_caps p = gptoss_cuda_profile_caps(profile);
    const char *lack = NULL;
    if (device->sm < p.sm)
        lack = "an older compute capability";
    else if (p.fp8 && !device->fp8)
        lack = "no FP8 conversion";
    else if (p.wgmma && !device->wgmma)
        lack = "no wgmma (compute capability 9.0 only)";
    else if (p.tma && !device->tma)
        lack = "no bulk copies (TMA)";
    else if (p.pdl && !device->pdl)
        lack = "no programmatic dependent launch";
    if (lack)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA: profile %s (sm_%d) is above what %s (sm_%d) runs: it has "
                                "%s; use --cuda-profile auto or a lower profile",
                                gptoss_cuda_profile_name(profile), p.sm,
                                device_name ? device_name : "this GPU", device->sm, lack);
    /* shared memory: the smaller of the two (an RTX 3090 under the ampere profile keeps its
     * 99 KB), never a refusal */
    out->sm = p.sm;
    out->smem_per_block = min_size(device->smem_per_block, p.smem_per_block);
    out->smem_per_sm = min_size(device->smem_per_sm, p.smem_per_sm);
    out->pdl = device->pdl && p.pdl;
    out->tma = device->tma && p.tma;
    out->wgmma = device->wgmma && p.wgmma;
    out->fp8 = device->fp8 && p.fp8;
    return GPTOSS_OK;
}

void gptoss_cuda_caps_describe(const gptoss_cuda_caps *c, char *buf, size_t size) {
    snprintf(buf, size, "sm_%d, %zu KB smem/block, %sPDL, %sTMA, %swgmma, %sFP8%s", c->sm,
             c->smem_per_block / 1024, c->pdl ? "" : "no ", c->tma ? "" : "no ",
             c->wgmma ? "" : "no ", c->fp8 ? "" : "no ", c->integrated ? ", integrated" : "");
}
