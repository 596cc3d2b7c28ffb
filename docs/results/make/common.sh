# Shared by the page generators in this folder (sourced, not run). A generator calls
# results_start first (it notes the date and the load average before anything runs), runs its
# commands, then writes its page with results_header at the top. Pages are written to a temporary
# and renamed, so a failed run leaves the previous page in place.
#
#   CLI=path/to/kvscope-cli   the binary to measure (default: build/dev/app/cli/kvscope-cli)
#   WORK=dir                  captures and raw JSON (default: build/results)
#   SOURCE=dir                the checkout the binary was built from, for the commit on the page
#                             (default: the one its build folder's CMakeCache.txt names)
#   COMMIT=text               what to print as the commit, for a binary copied out of a checkout
#                             that has moved on since it was built

RESULTS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CLI="${CLI:-$RESULTS_ROOT/build/dev/app/cli/kvscope-cli}"
WORK="${WORK:-$RESULTS_ROOT/build/results}"

say() { echo "$(basename "$0"): $*" >&2; }
die() { say "error: $*"; exit 1; }

# The source tree the binary was built from: its build folder's CMakeCache.txt names it, so a
# page measured with another checkout's binary names that checkout's commit.
binary_source_dir() {
  local d
  d="$(dirname "$(readlink -f "$CLI")")"
  while [ "$d" != / ]; do
    if [ -f "$d/CMakeCache.txt" ]; then
      sed -n 's/^kvscope_SOURCE_DIR:STATIC=//p' "$d/CMakeCache.txt"
      return
    fi
    d="$(dirname "$d")"
  done
}

results_start() {
  [ -x "$CLI" ] || die "$CLI: not built (cmake --build --preset dev --target kvscope-cli, or set CLI=)"
  mkdir -p "$WORK"
  RESULTS_DATE="$(date -u '+%Y-%m-%d %H:%M UTC')"
  RESULTS_LOAD="$(cut -d' ' -f1-3 /proc/loadavg)"
  local src dirty
  src="${SOURCE:-$(binary_source_dir)}"
  [ -n "$src" ] || src="$RESULTS_ROOT"
  RESULTS_COMMIT="$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  dirty="$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)"
  [ -z "$dirty" ] || RESULTS_COMMIT="$RESULTS_COMMIT with uncommitted changes"
  RESULTS_COMMIT="${COMMIT:-$RESULTS_COMMIT}"
  RESULTS_CPU="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  local family model
  family="$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  model="$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  [ -z "$family" ] || RESULTS_CPU="$RESULTS_CPU (family $family, model $model)"
  if grep -qw avx512f /proc/cpuinfo; then RESULTS_ISA="AVX-512 and AVX2"
  elif grep -qw avx2 /proc/cpuinfo; then RESULTS_ISA="AVX2, no AVX-512"
  else RESULTS_ISA="no AVX2"; fi
  RESULTS_CORES="$(nproc)"
  say "measuring with $CLI (commit $RESULTS_COMMIT), load average $RESULTS_LOAD"
}

# results_header TITLE SCRIPT: the lines every page starts with.
results_header() {
  cat <<EOF
# $1

Written by \`$2\`, which reruns the commands below. Do not edit this page by hand:
rerun the script (\`CLI=path/to/kvscope-cli\` measures another build).

| | |
|---|---|
| date | $RESULTS_DATE |
| commit | \`$RESULTS_COMMIT\` |
| CPU | $RESULTS_CPU; $RESULTS_ISA |
| cores | $RESULTS_CORES |
| load average at the start (1, 5, 15 min) | $RESULTS_LOAD |
| load average at the end | $(cut -d' ' -f1-3 /proc/loadavg) |

EOF
}

# results_write PAGE: stdin becomes docs/results/PAGE, atomically.
results_write() {
  local page="$RESULTS_ROOT/docs/results/$1"
  cat > "$page.tmp" && mv "$page.tmp" "$page"
  say "wrote docs/results/$1"
}

# default_models: MODELS, or else the SmolLM2-135M and Gemma 3 270M files of the model cache that
# are there; dies when there is none.
default_models() {
  local cache="$HOME/.cache/kvscope/models"
  MODELS="${MODELS:-$(ls "$cache"/SmolLM2-135M-Instruct.Q4_1.gguf "$cache"/gemma-3-270m-q4_k_m.gguf 2>/dev/null || true)}"
  [ -n "$MODELS" ] || die "no model in $cache (installer/fetch_model.sh fetches them)"
}

# The start the codec pages share: results_start, then the 4K sample context captured with $MODEL
# (default: the default model) into $KV.
start_on_long_4k() {
  MODEL="${MODEL:-$HOME/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
  CONTEXT=samples/contexts/long_4k.txt
  [ -f "$MODEL" ] || die "$MODEL: no such model (installer/fetch_model.sh fetches the default one)"
  results_start
  cd "$RESULTS_ROOT"
  KV="$WORK/long_4k.h5"
  capture_kv "$MODEL" "$CONTEXT" "$KV"
}

# capture_kv MODEL CONTEXT KV [JSON]: prefill CONTEXT with MODEL into KV (its --json report in
# JSON, default $WORK/capture.json), or keep both when REUSE=1 and they are there.
capture_kv() {
  local json="${4:-$WORK/capture.json}"
  if [ "${REUSE:-0}" = 1 ] && [ -s "$3" ] && [ -s "$json" ]; then
    say "reusing $3"
  else
    say "capture of $2"
    "$CLI" capture --model "$1" --context "$2" --out "$3" --threads 1 --json > "$json"
  fi
}
