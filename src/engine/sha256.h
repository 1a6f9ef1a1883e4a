/*
 * sha256.h - the engine keys prefix-cache blocks with SHA-256; the implementation is the
 * shared one in util/.
 */
#ifndef GPTOSS_ENGINE_SHA256_H
#define GPTOSS_ENGINE_SHA256_H

#include "util/sha256.h"

#endif
