/*
 * harmony_schema.c - JSON Schema to the TypeScript-like parameter types harmony shows the
 * model in a tools section (spec 6.3), e.g. `{\nlocation: string,\nunit?: "c" | "f",\n}`.
 *
 * Owns: nothing beyond its output buffer. Must not reorder properties: they render in the
 * order given (jansson keeps insertion order), because that is what the model was shown.
 * Follows harmony's rendering quirks on purpose (the oneOf layout, bare enum defaults, a
 * variant's " | null"), since byte-identical prompts are the goal.
 */
#include "chat/chat_buf.h"
#include "chat/harmony.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_enum(const json_t *schema) {
    const json_t *values = json_object_get(schema, "enum");
    return json_is_array(values) && json_array_size(values) > 0;
}

/* Compact JSON for a default value: integers as written, reals in their shortest form that
 * reads back to the same double (20.5, not 20.499999999999999), with ".0" kept for whole
 * reals, as harmony's serializer prints them. */
static bool append_json_value(gptoss_chat_buf *out, const json_t *value) {
    if (json_is_real(value)) {
        double v = json_real_value(value);
        char text[64];
        for (int precision = 1; precision <= 17; precision++) {
            snprintf(text, sizeof text, "%.*g", precision, v);
            if (strtod(text, NULL) == v) break;
        }
        if (!strpbrk(text, ".eEn")) strcat(text, ".0");
        return gptoss_chat_buf_puts(out, text);
    }
    char *dumped = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    if (!dumped) return false;
    bool ok = gptoss_chat_buf_puts(out, dumped);
    free(dumped);
    return ok;
}

/* "default: X" where X is quoted for a plain string, bare for an enum's string, else JSON. */
static bool append_default(gptoss_chat_buf *out, const json_t *owner, const json_t *value) {
    if (json_is_string(value) && !is_enum(owner))
        return gptoss_chat_buf_printf(out, "default: \"%s\"", json_string_value(value));
    if (json_is_string(value))
        return gptoss_chat_buf_printf(out, "default: %s", json_string_value(value));
    return gptoss_chat_buf_puts(out, "default: ") && append_json_value(out, value);
}

static bool nullable(const json_t *schema) {
    return json_is_true(json_object_get(schema, "nullable"));
}

/* Renders schema's type, adding " | null" for a nullable schema unless "null" already shows. */
static bool type_with_null(const json_t *schema, const char *indent, gptoss_chat_buf *out) {
    gptoss_chat_buf type = {0};
    bool ok = gptoss_harmony_schema_to_typescript(schema, indent, &type) &&
              gptoss_chat_buf_terminate(&type);
    if (ok) {
        ok = gptoss_chat_buf_append(out, type.data, type.len);
        if (ok && nullable(schema) && !strstr(type.data, "null"))
            ok = gptoss_chat_buf_puts(out, " | null");
    }
    gptoss_chat_buf_free(&type);
    return ok;
}

static char *indent_plus(const char *indent, const char *extra) {
    size_t a = strlen(indent), b = strlen(extra);
    char *s = malloc(a + b + 1);
    if (!s) return NULL;
    memcpy(s, indent, a);
    memcpy(s + a, extra, b + 1);
    return s;
}

/* A schema whose own top level is a oneOf: one "\n | VARIANT // comments" line each. */
static bool one_of_top(const json_t *variants, const char *indent, gptoss_chat_buf *out) {
    char *inner = indent_plus(indent, "   ");
    if (!inner) return false;
    bool ok = true;
    size_t i;
    const json_t *variant;
    json_array_foreach(variants, i, variant) {
        ok = ok && gptoss_chat_buf_printf(out, "\n%s | ", indent) &&
             type_with_null(variant, inner, out);
        const json_t *desc = json_object_get(variant, "description");
        const json_t *def = json_object_get(variant, "default");
        bool has_desc = json_is_string(desc);
        if (ok && (has_desc || def)) {
            ok = gptoss_chat_buf_puts(out, " // ");
            if (ok && has_desc) ok = gptoss_chat_buf_puts(out, json_string_value(desc));
            if (ok && has_desc && def) ok = gptoss_chat_buf_puts(out, " ");
            if (ok && def) ok = append_default(out, variant, def);
        }
    }
    free(inner);
    return ok;
}

static bool is_required(const json_t *schema, const char *key) {
    const json_t *required = json_object_get(schema, "required");
    size_t i;
    const json_t *name;
    json_array_foreach(required, i, name) {
        if (json_is_string(name) && strcmp(json_string_value(name), key) == 0) return true;
    }
    return false;
}

/* A property given as a oneOf: comments above, "name?:", one " | VARIANT" line each, ",". */
static bool one_of_property(const json_t *schema, const char *key, const json_t *prop,
                            const json_t *variants, const char *indent, gptoss_chat_buf *out) {
    const json_t *desc = json_object_get(prop, "description");
    const char *prop_desc = json_is_string(desc) ? json_string_value(desc) : NULL;
    const json_t *first = json_array_get(variants, 0);
    const json_t *first_desc = first ? json_object_get(first, "description") : NULL;
    bool skip = prop_desc && json_is_string(first_desc) &&
                strcmp(prop_desc, json_string_value(first_desc)) == 0;
    bool desc_above = false;
    bool ok = true;
    if (!skip && prop_desc) {
        ok = gptoss_chat_buf_printf(out, "%s// %s\n", indent, prop_desc);
        desc_above = true;
    }
    const json_t *def = json_object_get(prop, "default");
    if (ok && def)
        ok = gptoss_chat_buf_printf(out, "%s// ", indent) && append_default(out, prop, def) &&
             gptoss_chat_buf_puts(out, "\n");
    ok = ok &&
         gptoss_chat_buf_printf(out, "%s%s%s:\n", indent, key, is_required(schema, key) ? "" : "?");
    char *inner = indent_plus(indent, "   ");
    if (!inner) return false;
    size_t i;
    const json_t *variant;
    json_array_foreach(variants, i, variant) {
        if (!ok) break;
        ok = gptoss_chat_buf_printf(out, "%s | ", indent) && type_with_null(variant, inner, out);
        const json_t *vdesc = json_object_get(variant, "description");
        const json_t *vdef = json_object_get(variant, "default");
        bool show_desc = !(i == 0 && desc_above) && json_is_string(vdesc) &&
                         !(prop_desc && strcmp(prop_desc, json_string_value(vdesc)) == 0);
        if (ok && (show_desc || vdef)) {
            ok = gptoss_chat_buf_puts(out, " // ");
            if (ok && show_desc) ok = gptoss_chat_buf_puts(out, json_string_value(vdesc));
            if (ok && show_desc && vdef) ok = gptoss_chat_buf_puts(out, " ");
            if (ok && vdef) ok = append_default(out, variant, vdef);
        }
        ok = ok && gptoss_chat_buf_puts(out, "\n");
    }
    free(inner);
    return ok && gptoss_chat_buf_printf(out, "%s,\n", indent);
}

static bool object_type(const json_t *schema, const char *indent, gptoss_chat_buf *out) {
    bool ok = true;
    const json_t *desc = json_object_get(schema, "description");
    if (json_is_string(desc))
        ok = gptoss_chat_buf_printf(out, "%s// %s\n", indent, json_string_value(desc));
    ok = ok && gptoss_chat_buf_puts(out, "{\n");
    const json_t *props = json_object_get(schema, "properties");
    char *inner = indent_plus(indent, "    ");
    if (!inner) return false;
    const char *key;
    const json_t *prop;
    json_object_foreach((json_t *)props, key, prop) {
        if (!ok) break;
        const json_t *title = json_object_get(prop, "title");
        const json_t *one_of = json_object_get(prop, "oneOf");
        const json_t *pdesc = json_object_get(prop, "description");
        const json_t *examples = json_object_get(prop, "examples");
        if (json_is_string(title))
            ok = gptoss_chat_buf_printf(out, "%s// %s\n%s//\n", indent, json_string_value(title),
                                        indent);
        if (ok && !one_of && json_is_string(pdesc))
            ok = gptoss_chat_buf_printf(out, "%s// %s\n", indent, json_string_value(pdesc));
        if (ok && json_is_array(examples) && json_array_size(examples) > 0) {
            ok = gptoss_chat_buf_printf(out, "%s// Examples:\n", indent);
            size_t i;
            const json_t *ex;
            json_array_foreach(examples, i, ex) {
                if (ok && json_is_string(ex))
                    ok = gptoss_chat_buf_printf(out, "%s// - \"%s\"\n", indent,
                                                json_string_value(ex));
            }
        }
        if (!ok) break;
        if (json_is_array(one_of)) {
            ok = one_of_property(schema, key, prop, one_of, indent, out);
            continue;
        }
        ok = gptoss_chat_buf_printf(out, "%s%s%s: ", indent, key,
                                    is_required(schema, key) ? "" : "?") &&
             type_with_null(prop, inner, out) && gptoss_chat_buf_puts(out, ",");
        const json_t *def = json_object_get(prop, "default");
        if (ok && !one_of && def)
            ok = gptoss_chat_buf_puts(out, " // ") && append_default(out, prop, def);
        ok = ok && gptoss_chat_buf_puts(out, "\n");
    }
    free(inner);
    return ok && gptoss_chat_buf_printf(out, "%s}", indent);
}

bool gptoss_harmony_schema_to_typescript(const json_t *schema, const char *indent,
                                         gptoss_chat_buf *out) {
    const json_t *one_of = json_object_get(schema, "oneOf");
    if (json_is_array(one_of)) return one_of_top(one_of, indent, out);

    const json_t *type = json_object_get(schema, "type");
    if (json_is_array(type)) {
        bool any = false;
        size_t i;
        const json_t *t;
        json_array_foreach(type, i, t) {
            if (!json_is_string(t)) continue;
            const char *name = json_string_value(t);
            if (strcmp(name, "integer") == 0) name = "number";
            if (!gptoss_chat_buf_printf(out, "%s%s", any ? " | " : "", name)) return false;
            any = true;
        }
        if (any) return true;
    }
    if (!json_is_string(type)) return gptoss_chat_buf_puts(out, "any");
    const char *name = json_string_value(type);
    if (strcmp(name, "object") == 0) return object_type(schema, indent, out);
    if (strcmp(name, "string") == 0) {
        const json_t *values = json_object_get(schema, "enum");
        bool any = false;
        size_t i;
        const json_t *v;
        json_array_foreach(values, i, v) {
            if (!json_is_string(v)) continue;
            if (!gptoss_chat_buf_printf(out, "%s\"%s\"", any ? " | " : "", json_string_value(v)))
                return false;
            any = true;
        }
        return any ? true : gptoss_chat_buf_puts(out, "string");
    }
    if (strcmp(name, "number") == 0 || strcmp(name, "integer") == 0)
        return gptoss_chat_buf_puts(out, "number");
    if (strcmp(name, "boolean") == 0) return gptoss_chat_buf_puts(out, "boolean");
    if (strcmp(name, "array") == 0) {
        const json_t *items = json_object_get(schema, "items");
        if (!items) return gptoss_chat_buf_puts(out, "Array<any>");
        return gptoss_harmony_schema_to_typescript(items, indent, out) &&
               gptoss_chat_buf_puts(out, "[]");
    }
    return gptoss_chat_buf_puts(out, "any");
}
