#!/usr/bin/env bash
# Writes docs/results/transform_speed.md: the transform codec's encode and decode speed on one
# thread, with `rans` and `rans32`, against zstd-3 on the same fp16 bytes and htscodecs on the same
# symbols, timed in the same run (`kvscope-cli bench codec`), next to the CacheGen codec's default
# profile; on a capture of the 4K sample context with the default model.
#
#   docs/results/make/transform_speed.sh
#   BEFORE=path/to/kvscope-cli  also time another build (say, the commit before a change): its
#                       rows follow ours, each config run by both binaries back to back
#   PROFILE="default"   transform profiles, one set of rows each: "default" is the model's
#                       calibrated default profile (what `--codec transform` without `--profile`
#                       uses; made once here by `eval --codec transform` when the cache lacks
#                       it), anything else a profile file (say, one calibrated with --layer-group 5)
#   ENTROPY="rans rans32"   entropy stages, one row each ("entropy" switched in a copy)
#   SIMD="auto scalar"  decoder and encoder paths (bench codec --simd), one set of rows each
#   LEVEL=N             the level to time (default: the profile's default level)
#   ROUNDS=3            bench codec --runs (each row timed once per round, its best kept)
#   MODEL=, REUSE=1, CLI=, WORK=   see common.sh and codec_speed.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SIMD="${SIMD:-auto scalar}"
ENTROPY="${ENTROPY:-rans rans32}"
ROUNDS="${ROUNDS:-3}"
export LEVEL="${LEVEL:-}"
PROFILE="${PROFILE:-default}"
BEFORE="${BEFORE:-}"
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || die "BEFORE=$BEFORE: not an executable"
start_on_long_4k
rm -f "$WORK/transform_speed_sources.txt"

# The calibrated default profile: the one --codec transform takes without --profile.
default_profile() {
  local fingerprint path
  fingerprint="$("$CLI" info --model "$MODEL" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])')"
  path="${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/profiles/$fingerprint.transform.json"
  if [ ! -s "$path" ]; then
    say "calibrating the default transform profile once (eval --codec transform on story)"
    "$CLI" eval --model "$MODEL" --context story --codec transform --only-transform --no-text --threads 1 \
        --json > "$WORK/calibrate_eval.json"
  fi
  [ -s "$path" ] || die "$path: the calibration did not write it"
  echo "$path"
}
# Each profile of PROFILE in a copy per entropy stage: $WORK/transform_<profile>_<stage>.json.
variants="$WORK/transform_speed_profiles.txt"
: > "$variants"
for profile in $PROFILE; do
  if [ "$profile" = default ]; then src="$(default_profile)"; label=default
  else src="$profile"; label="$(basename "$profile" .json)"; fi
  [ -s "$src" ] || die "$src: no such profile"
  for entropy in $ENTROPY; do
    python3 - "$src" "$entropy" "$WORK/transform_${label}_$entropy.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
if "transform" not in p:
    sys.exit("%s: not a transform profile (no \"transform\" object)" % sys.argv[1])
p["transform"]["entropy"] = sys.argv[2]
json.dump(p, open(sys.argv[3], "w"))
PY
    printf '%s\t%s\t%s\n' "$label" "$entropy" "$WORK/transform_${label}_$entropy.json" >> "$variants"
  done
  printf '%s\t%s\n' "$label" "$src" >> "$WORK/transform_speed_sources.txt"
done
# One row: NAME BINARY SIMD PROFILE -> $WORK/transform_speed_<n>.json; rows.txt lists the row's
# name, that file, the --simd asked and the profile ("" for CacheGen's default).
rows="$WORK/transform_speed_rows.txt"
: > "$rows"
n=0
bench_row() {
  local name="$1" bin="$2" simd="$3" profile="$4"
  local args=(--threads 1 --runs "$ROUNDS" --simd "$simd" --device cpu)
  [ -z "$profile" ] || args+=(--codec transform --profile "$profile")
  [ -z "$profile" ] || [ -z "$LEVEL" ] || args+=(--level "$LEVEL")
  n=$((n + 1))
  say "bench codec ($name, --simd $simd)"
  "$bin" bench codec "$KV" "${args[@]}" --json > "$WORK/transform_speed_$n.json"
  printf '%s\t%s\t%s\t%s\n' "$name" "$WORK/transform_speed_$n.json" "$simd" "$profile" >> "$rows"
}
many=$(( $(wc -w <<< "$PROFILE") > 1 ))
for simd in $SIMD; do
  while IFS=$'\t' read -r label entropy file; do
    name="transform, $entropy"
    [ "$many" = 0 ] || name="transform $label, $entropy"
    bench_row "$name" "$CLI" "$simd" "$file"
    [ -z "$BEFORE" ] || bench_row "$name, before" "$BEFORE" "$simd" "$file"
  done < "$variants"
  bench_row "CacheGen default" "$CLI" "$simd" ""
  [ -z "$BEFORE" ] || bench_row "CacheGen default, before" "$BEFORE" "$simd" ""
done

{
  results_header "Transform codec speed against zstd-3 and htscodecs, one thread" \
      docs/results/make/transform_speed.sh
  python3 - "$MODEL" "$CONTEXT" "$ROUNDS" "$WORK/capture.json" "$WORK/transform_speed_sources.txt" "$BEFORE" "$rows" <<'PY'
import json, os, sys
model, context, rounds, capture, sources, before, rows = sys.argv[1:8]
sources = [l.rstrip("\n").split("\t") for l in open(sources)]
cap = json.load(open(capture))
rows = [l.rstrip("\n").split("\t") for l in open(rows)]
runs = [(name, json.load(open(path)), simd, prof) for name, path, simd, prof in rows]
first = runs[0][1]
cachegen = next((r for n, r, _, p in runs if not p), first)
home = os.path.expanduser("~")
print("Input: `%s` captured with `%s` (%d tokens, %.1f MB of fp16 KV). Transform profiles: %s; each "
      "timed at %s with its `\"entropy\"` switched to the row's stage in a copy "
      "(`transform_<profile>_<stage>.json`: the same tables, so the same symbols). The CacheGen rows use "
      "its default profile, level %d. Every row is timed once per round, the rows of a run in turn "
      "(ours, entropy stage alone, int8, zstd), and keeps its fastest round (%s rounds of %d passes). "
      "MB/s are of fp16 KV; the entropy stage's rates are of quantised symbols, in millions per "
      "second; ratios are ours over the peer's, timed in the same run.%s"
      % (context, os.path.basename(model), cap["num_tokens"], first["fp16_MB"],
         "; ".join("`%s` (%s)" % (label, "the calibrated default profile, what `--codec transform` "
                   "without `--profile` uses: the shipped ladder fitted on its calibration contexts, "
                   "cached in `%s`" % src.replace(home, "~") if label == "default" else src.replace(home, "~"))
                   for label, src in sources),
         "level %s" % os.environ["LEVEL"] if os.environ.get("LEVEL") else "its default level",
         cachegen["level"], rounds, first["repeats"],
         " Rows marked *before* are the build `%s`, run right after ours on the same config."
         % before if before else ""))
print()
print("```sh")
print("kvscope-cli capture --model %s --context %s --out long_4k.h5 --threads 1 --json"
      % (os.path.basename(model), context))
seen = []
for name, r, simd, prof in runs:
    line = "kvscope-cli bench codec long_4k.h5 --threads 1 --runs %s --simd %s --device cpu%s --json" % (
        rounds, simd, " --codec transform --profile %s" % os.path.basename(prof) if prof else "")
    if line not in seen:
        seen.append(line)
        print(line)
print("```")
print()
print("| codec | SIMD | level | bits/value | decode MB/s | zstd-3 decompress MB/s | decode vs zstd-3 | encode MB/s "
      "| zstd-3 compress MB/s | encode vs zstd-3 | entropy stage decode / encode, M symbols/s "
      "| htscodecs on the same symbols, decode / encode | entropy stage vs htscodecs, decode / encode |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, r, _, _ in runs:
    print("| %s | %s | %d | %.3f | %.0f | %.0f | **%.2fx** | %.0f | %.0f | **%.2fx** | %.0f / %.0f | %.0f / %.0f "
          "| %.2fx / %.2fx |" % (
              name, r["simd"], r["level"], r["bits_per_value"], r["decode_MBps"], r["zstd_decompress_MBps"],
              r["decode_vs_zstd_decompress"], r["encode_MBps"], r["zstd_compress_MBps"],
              r["encode_vs_zstd_compress"], r["entropy_decode_MBps"], r["entropy_encode_MBps"],
              r["htscodecs_decode_MBps"], r["htscodecs_encode_MBps"], r["entropy_decode_vs_htscodecs"],
              r["entropy_encode_vs_htscodecs"]))
print()
sizes = {}
for n, r, _, _ in runs:
    if not n.endswith("before"):
        sizes.setdefault(n, (r["entropy_bytes"], r["htscodecs_bytes"], r["entropy_symbols"]))
print("Entropy-coded bytes, ours against htscodecs' order-0 rANS on the same symbols: %s." % "; ".join(
    "%s %d against %d (%d symbols)" % ((n,) + v) for n, v in sizes.items()))
print()
print("On a shared machine the ratios move with the load between runs; the load averages above say "
      "how busy it was. Compare rows of one page, not figures of two pages.")
PY
} | results_write transform_speed.md
