/*
 * utf8.h - the UTF-8 helpers now live in util/utf8.h; this forwards to them for includers
 * outside the tokenizer that still name this path.
 */
#ifndef GPTOSS_TOKENIZER_UTF8_H
#define GPTOSS_TOKENIZER_UTF8_H

#include "util/utf8.h"

#endif
