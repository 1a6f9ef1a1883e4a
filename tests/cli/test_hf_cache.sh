#!/usr/bin/env bash
# test_hf_cache.sh - -m ORG/NAME finds a model in the local Hugging Face cache, laid out as
# huggingface_hub writes it (HUB/models--ORG--NAME/refs/main holds a commit hash; the files of
# snapshots/HASH/ are links into blobs/), with the cache folder from HF_HUB_CACHE, else
# HF_HOME/hub, else ~/.cache/huggingface/hub; ORG/NAME@REVISION takes a branch or a commit.
# The model is served as "ORG/NAME", also when the snapshot folder is given as a path. A repo
# that is not there is an error that gives the download command and where it looked; an
# existing folder of the same name wins over the cache.
. "$(dirname "$0")/cli_lib.sh"
"$bin" make-model --preset tiny -o "$work/tiny" >/dev/null 2>&1 || { fail "make-model"; finish; }

# cache_snapshot HUB REPO_DIR HASH: the tiny model as a snapshot, its files links into blobs/.
cache_snapshot() {
    local repo="$1/$2" hash=$3
    mkdir -p "$repo/blobs" "$repo/snapshots/$hash" "$repo/refs"
    for f in "$work/tiny"/*; do
        local blob
        blob=$(sha256sum "$f" | cut -c1-64)
        [ -f "$repo/blobs/$blob" ] || cp "$f" "$repo/blobs/$blob"
        ln -s "../../blobs/$blob" "$repo/snapshots/$hash/$(basename "$f")"
    done
}
main=0123456789abcdef0123456789abcdef01234567
dev=89abcdef0123456789abcdef0123456789abcdef
hub="$work/hf/hub"
cache_snapshot "$hub" models--openai--gpt-oss-20b $main
cache_snapshot "$hub" models--openai--gpt-oss-20b $dev
printf '%s' $main >"$hub/models--openai--gpt-oss-20b/refs/main"
printf '%s\n' $dev >"$hub/models--openai--gpt-oss-20b/refs/dev"
snap_main="$hub/models--openai--gpt-oss-20b/snapshots/$main"
snap_dev="$hub/models--openai--gpt-oss-20b/snapshots/$dev"
cd "$work" || exit 1
unset HF_HUB_CACHE HF_HOME XDG_CACHE_HOME

# info_dir ARGS...: the folder `gptoss info ARGS` loaded ("model: DIR"), or its error.
info_dir() { "$bin" info "$@" 2>&1 | sed -n 's/^model: \(.*\) (Hugging Face folder)$/\1/p;s/^model: \(.*\) (GGUF file)$/\1/p;s/^gptoss: error: //p' | head -1; }
[ "$(HF_HOME="$work/hf" info_dir -m openai/gpt-oss-20b)" = "$snap_main" ] ||
    fail "HF_HOME: $(HF_HOME="$work/hf" "$bin" info -m openai/gpt-oss-20b 2>&1 | head -3)"
[ "$(HF_HUB_CACHE="$hub" HF_HOME="$work/elsewhere" info_dir -m openai/gpt-oss-20b)" = "$snap_main" ] ||
    fail "HF_HUB_CACHE does not win over HF_HOME"
mkdir -p "$work/home/.cache/huggingface"
ln -s "$hub" "$work/home/.cache/huggingface/hub"
[ "$(HOME="$work/home" info_dir -m openai/gpt-oss-20b)" = "$work/home/.cache/huggingface/hub/models--openai--gpt-oss-20b/snapshots/$main" ] ||
    fail "~/.cache/huggingface/hub: $(HOME="$work/home" info_dir -m openai/gpt-oss-20b)"
[ "$(HF_HOME="$work/hf" info_dir -m openai/gpt-oss-20b@dev)" = "$snap_dev" ] || fail "@dev (a branch)"
[ "$(HF_HOME="$work/hf" info_dir -m openai/gpt-oss-20b@$dev)" = "$snap_dev" ] || fail "@HASH (a commit)"

# Not in the cache: the download command and the place it looked.
HF_HOME="$work/empty" "$bin" info -m openai/gpt-oss-120b >"$work/out" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "a repo not in the cache: exit $rc, want 1"
for want in "hf download openai/gpt-oss-120b" "huggingface-cli download openai/gpt-oss-120b" \
    "$work/empty/hub/models--openai--gpt-oss-120b/refs/main" "HF_HUB_CACHE"; do
    grep -qF -- "$want" "$work/out" || fail "the not-found error lacks '$want': $(cat "$work/out")"
done
HF_HOME="$work/hf" "$bin" info -m openai/gpt-oss-20b@v9 >"$work/out" 2>&1
grep -qF -- "hf download openai/gpt-oss-20b --revision v9" "$work/out" ||
    fail "a missing revision: $(cat "$work/out")"
# Not a repo id and not a folder: the loader's error, no download advice.
"$bin" info -m "$work/no/such/dir" >"$work/out" 2>&1
grep -q "hf download" "$work/out" && fail "a missing path got download advice: $(cat "$work/out")"
# A folder of the same name in the working folder wins over the cache.
mkdir -p "$work/openai"
cp -r "$work/tiny" "$work/openai/gpt-oss-20b"
[ "$(HF_HOME="$work/hf" info_dir -m openai/gpt-oss-20b)" = "openai/gpt-oss-20b" ] ||
    fail "an existing folder named openai/gpt-oss-20b does not win"
rm -rf "$work/openai"

# Served under the repo id: given as a repo id, and given the snapshot folder as a path.
if HF_HOME="$work/hf" start_serve "$work/serve1.log" "$bin" -m openai/gpt-oss-20b; then
    models | grep -q '"id":"openai/gpt-oss-20b"' || fail "repo id: /v1/models $(models)"
    grep -q "ready in .* model 'openai/gpt-oss-20b'" "$work/serve1.log" || fail "ready line: $(cat "$work/serve1.log")"
    code=$(curl -s -m 60 -o "$work/c.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
        -H 'Content-Type: application/json' -d '{"model":"openai/gpt-oss-20b","prompt":"Hi","max_tokens":2}')
    [ "$code" = 200 ] || fail "a completion for model openai/gpt-oss-20b: $code $(cat "$work/c.json")"
    stop_serve
else
    fail "serve -m openai/gpt-oss-20b did not start"
fi
if start_serve "$work/serve2.log" "$bin" -m "$snap_dev/"; then
    models | grep -q '"id":"openai/gpt-oss-20b"' || fail "snapshot path: /v1/models $(models)"
    stop_serve
else
    fail "serve -m SNAPSHOT did not start"
fi
finish
