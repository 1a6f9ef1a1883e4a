/*
 * json_type.h - the name of a JSON value's type as error messages say it ("an object",
 * "a number", ...), for every layer that checks jansson values (chat rendering, request fields,
 * structured-output fields).
 */
#ifndef GPTOSS_UTIL_JSON_TYPE_H
#define GPTOSS_UTIL_JSON_TYPE_H

#include <jansson.h>

static inline const char *gptoss_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

#endif
