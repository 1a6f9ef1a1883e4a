#!/usr/bin/env bash
# test_layering.sh - the include graph of src/ follows the layers of DESIGN.md.
#
# Every `#include "layer/..."` in src/<layer>/ must name the layer itself or one it may use,
# per the table below. The table is ordered bottom-up and a layer may only use layers listed
# before it, so an include graph that passes has no cycle between layers. An entry with a
# slash allows one header only: model/ may see the tensor view of format/, never a reader;
# tokenizer/ may use the GGUF reader, to take a vocabulary from a GGUF file's metadata.
# The public headers of include/ (gptoss.h, gptoss_engine.h) may be included anywhere; they may
# include each other and nothing of src/.
#
# Usage: test_layering.sh [SRC_ROOT]   (default: $GPTOSS_SOURCE_DIR or the checkout).
# Without an argument it also checks itself: an upward include planted in a copy of src/
# must be refused.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="${1:-${GPTOSS_SOURCE_DIR:-$here/../..}}"

# layer: what it may include besides itself
LAYERS='
util:
format: util
model: util format/tensor.h
loader: util format model
tools: util format model
backend: util model
engine: util model backend
tokenizer: util model/special_tokens.h format/gguf.h
structured: util tokenizer model/special_tokens.h
chat: util tokenizer
server: util tokenizer structured chat engine
cli: util format model loader tools backend engine tokenizer structured chat server
'

# check SRC_DIR INCLUDE_DIR: prints each violation; exit 1 if any.
check() {
    local src="$1" inc="$2"
    printf '%s\n' "$LAYERS" | awk -v src="$src" -v inc="$inc" '
        function fail(msg) { print "layering: " msg; bad = 1 }
        NF == 0 { next }
        {
            layer = $1; sub(/:$/, "", layer)
            rank[layer] = ++n; order[n] = layer
            for (i = 2; i <= NF; i++) {
                dep = $i; dep_layer = dep; sub(/\/.*/, "", dep_layer)
                if (!(dep_layer in rank)) fail("table: " layer " uses " dep ", which is not listed before it")
                allowed[layer, dep] = 1
            }
        }
        END {
            cmd = "cd \"" src "\" && find . -type f \\( -name \"*.c\" -o -name \"*.h\" -o -name \"*.cu\" -o -name \"*.cuh\" \\) | sort"
            while ((cmd | getline file) > 0) {
                sub(/^\.\//, "", file)
                layer = file; sub(/\/.*/, "", layer)
                if (!(layer in rank)) { fail(file ": folder " layer " is in no layer of the table"); continue }
                lineno = 0
                while ((getline line < (src "/" file)) > 0) {
                    lineno++
                    if (line !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
                    target = line; sub(/^[^"]*"/, "", target); sub(/".*$/, "", target)
                    if (target !~ /\//) continue  # beside the file, or a public header
                    to = target; sub(/\/.*/, "", to)
                    if (to == layer || allowed[layer, to] || allowed[layer, target]) {
                        if (to != layer) edges[layer " -> " to] = 1
                        continue
                    }
                    fail(file ":" lineno ": " layer "/ may not include \"" target "\"")
                }
                close(src "/" file)
            }
            close(cmd)
            # Public headers: a quoted include must name another public header, never src/.
            cmd = "cd \"" inc "\" && find . -maxdepth 1 -type f -name \"*.h\" | sort"
            while ((cmd | getline file) > 0) { sub(/^\.\//, "", file); public[file] = 1 }
            close(cmd)
            for (file in public) {
                lineno = 0
                while ((getline line < (inc "/" file)) > 0) {
                    lineno++
                    if (line !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
                    target = line; sub(/^[^"]*"/, "", target); sub(/".*$/, "", target)
                    if (!(target in public))
                        fail("include/" file ":" lineno ": a public header may not include \"" target "\"")
                }
                close(inc "/" file)
            }
            if (!bad) for (e in edges) print "edge " e
            exit bad
        }'
}

edges="$(check "$root/src" "$root/include")" || { printf '%s\n' "$edges"; echo "FAIL: upward includes in $root/src"; exit 1; }
echo "layer edges in use:"
printf '%s\n' "$edges" | sort | sed 's/^edge /  /'

if [ $# -eq 0 ]; then
    # The rule must bite: plant upward includes in a copy and expect each to be refused.
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    for plant in 'format/safetensors.c:model/config.h' 'model/model.c:format/safetensors.h' \
                 'util/log.c:tokenizer/tokenizer.h' 'engine/engine.c:server/server.h'; do
        rm -rf "$tmp/src"
        cp -r "$root/src" "$tmp/src"
        file="${plant%%:*}" header="${plant#*:}"
        printf '#include "%s"\n' "$header" >>"$tmp/src/$file"
        if out="$(check "$tmp/src" "$root/include")"; then
            echo "FAIL: an include of $header in src/$file was not refused"
            exit 1
        fi
        grep -qF "$file:" <<<"$out" || { echo "FAIL: the refusal does not name $file: $out"; exit 1; }
    done
    echo "planted upward includes refused: ok"

    # A public header must not reach into src/ (engine types stay self-contained).
    rm -rf "$tmp/include"
    cp -r "$root/include" "$tmp/include"
    printf '#include "%s"\n' engine/scheduler.h >>"$tmp/include/gptoss_engine.h"
    if out="$(check "$root/src" "$tmp/include")"; then
        echo "FAIL: an include of engine/scheduler.h in include/gptoss_engine.h was not refused"
        exit 1
    fi
    grep -qF "include/gptoss_engine.h:" <<<"$out" || { echo "FAIL: the refusal does not name include/gptoss_engine.h: $out"; exit 1; }
    echo "planted src/ include in a public header refused: ok"
fi
echo "PASS"
