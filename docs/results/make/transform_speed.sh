#!/usr/bin/env bash
# Writes docs/results/transform_speed.md: the transform codec's encode and decode speed on one
# thread, with `rans` and `rans32`, against zstd-3 on the same fp16 bytes and htscodecs on the same
# symbols, timed in the same run (`kvscope-cli bench codec`), next to the CacheGen codec's default
# profile; on captures of the 4K sample context with the default model and Gemma 3 270M.
#
#   docs/results/make/transform_speed.sh
#   MODELS="a.gguf b.gguf"  the models, one capture and one set of rows each (default: SmolLM2-135M
#                       and Gemma 3 270M from the model cache, those that are there; MODEL= one)
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
#   REUSE=1, CLI=, WORK=   see common.sh and codec_speed.sh
#
# Each model's default profile keeps the coder its shipped ladder names (SmolLM2's `rans32`,
# Gemma's `rans`); its row with that stage is marked "shipped".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SIMD="${SIMD:-auto scalar}"
ENTROPY="${ENTROPY:-rans rans32}"
ROUNDS="${ROUNDS:-3}"
export LEVEL="${LEVEL:-}"
PROFILE="${PROFILE:-default}"
BEFORE="${BEFORE:-}"
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || die "BEFORE=$BEFORE: not an executable"
[ -z "${MODEL:-}" ] || MODELS="$MODEL"
default_models
for model in $MODELS; do [ -f "$model" ] || die "$model: no such model"; done
CONTEXT=samples/contexts/long_4k.txt
results_start
cd "$RESULTS_ROOT"
rm -f "$WORK/transform_speed_sources.txt"

# The calibrated default profile of MODEL: the one --codec transform takes without --profile.
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
# Per model: its capture ($WORK/long_4k_<model>.h5, the report in capture_<model>.json) and each
# profile of PROFILE in a copy per entropy stage, $WORK/transform_<model>_<profile>_<stage>.json;
# variants.txt lists model, capture, profile label, stage, copy and whether the stage is the
# profile's own.
variants="$WORK/transform_speed_profiles.txt"
: > "$variants"
for MODEL in $MODELS; do
  tag="$(basename "$MODEL" .gguf)"
  kv="$WORK/long_4k_$tag.h5"
  capture_kv "$MODEL" "$CONTEXT" "$kv" "$WORK/capture_$tag.json"
  for profile in $PROFILE; do
    if [ "$profile" = default ]; then src="$(default_profile)"; label=default
    else src="$profile"; label="$(basename "$profile" .json)"; fi
    [ -s "$src" ] || die "$src: no such profile"
    for entropy in $ENTROPY; do
      copy="$WORK/transform_${tag}_${label}_$entropy.json"
      own="$(python3 - "$src" "$entropy" "$copy" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
if "transform" not in p:
    sys.exit("%s: not a transform profile (no \"transform\" object)" % sys.argv[1])
own = p["transform"].get("entropy", "rans") == sys.argv[2]
p["transform"]["entropy"] = sys.argv[2]
json.dump(p, open(sys.argv[3], "w"))
print(int(own))
PY
)"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$kv" "$label" "$entropy" "$copy" "$own" >> "$variants"
    done
    printf '%s\t%s\t%s\n' "$tag" "$label" "$src" >> "$WORK/transform_speed_sources.txt"
  done
done
# One row: NAME BINARY SIMD MODEL KV PROFILE -> $WORK/transform_speed_<n>.json; rows.txt lists the
# row's name, that file, the --simd asked, the model and the profile ("" for CacheGen's default).
rows="$WORK/transform_speed_rows.txt"
: > "$rows"
n=0
bench_row() {
  local name="$1" bin="$2" simd="$3" tag="$4" kv="$5" profile="$6"
  local args=(--threads 1 --runs "$ROUNDS" --simd "$simd" --device cpu)
  [ -z "$profile" ] || args+=(--codec transform --profile "$profile")
  [ -z "$profile" ] || [ -z "$LEVEL" ] || args+=(--level "$LEVEL")
  n=$((n + 1))
  say "bench codec ($tag, $name, --simd $simd)"
  "$bin" bench codec "$kv" "${args[@]}" --json > "$WORK/transform_speed_$n.json"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$WORK/transform_speed_$n.json" "$simd" "$tag" "$profile" >> "$rows"
}
many=$(( $(wc -w <<< "$PROFILE") > 1 ))
for simd in $SIMD; do
  for MODEL in $MODELS; do
    tag="$(basename "$MODEL" .gguf)"
    while IFS=$'\t' read -r vtag kv label entropy file own; do
      [ "$vtag" = "$tag" ] || continue
      name="transform, $entropy"
      [ "$many" = 0 ] || name="transform $label, $entropy"
      [ "$own" = 0 ] || [ "$label" != default ] || name="$name (shipped)"
      bench_row "$name" "$CLI" "$simd" "$tag" "$kv" "$file"
      [ -z "$BEFORE" ] || bench_row "$name, before" "$BEFORE" "$simd" "$tag" "$kv" "$file"
    done < "$variants"
    kv="$WORK/long_4k_$tag.h5"
    bench_row "CacheGen default" "$CLI" "$simd" "$tag" "$kv" ""
    [ -z "$BEFORE" ] || bench_row "CacheGen default, before" "$BEFORE" "$simd" "$tag" "$kv" ""
  done
done

{
  results_header "Transform codec speed against zstd-3 and htscodecs, one thread" \
      docs/results/make/transform_speed.sh
  python3 - "$CONTEXT" "$ROUNDS" "$WORK" "$WORK/transform_speed_sources.txt" "$BEFORE" "$rows" <<'PY'
import json, os, sys
context, rounds, work, sources, before, rows = sys.argv[1:7]
home = os.path.expanduser("~")
sources = [l.rstrip("\n").split("\t") for l in open(sources)]
rows = [l.rstrip("\n").split("\t") for l in open(rows)]
runs = [(name, json.load(open(path)), simd, tag, prof) for name, path, simd, tag, prof in rows]
tags = list(dict.fromkeys(tag for _, _, _, tag, _ in runs))
caps = {tag: json.load(open(os.path.join(work, "capture_%s.json" % tag))) for tag in tags}
first = {tag: next(r for _, r, _, t, _ in runs if t == tag) for tag in tags}
cachegen = next((r for _, r, _, _, p in runs if not p), runs[0][1])


def profile_text(label, src):
    shown = src.replace(home, "~")
    if label != "default":
        return "`%s` (%s)" % (label, shown)
    coder = json.load(open(src))["transform"].get("entropy", "rans")
    return ("`default` (the calibrated default profile, what `--codec transform` without `--profile` "
            "uses: the shipped ladder fitted on its calibration contexts, cached in `%s`; it codes with "
            "`%s`, the coder its shipped ladder names)" % (shown, coder))


print("Inputs: `%s` captured with %s. Transform profiles: %s; each timed at %s with its `\"entropy\"` "
      "switched to the row's stage in a copy (`transform_<model>_<profile>_<stage>.json`: the same "
      "tables, so the same symbols); the row whose stage is the one the model's shipped ladder codes with "
      "is marked *shipped*. The CacheGen rows use its default profile, level %d. Every row is timed once "
      "per round, the rows of a run in turn (ours, entropy stage alone, int8, zstd), and keeps its "
      "fastest round (%s rounds of %d passes). MB/s are of fp16 KV; the entropy stage's rates are of "
      "quantised symbols, in millions per second; ratios are ours over the peer's, timed in the same "
      "run.%s"
      % (context,
         " and ".join("`%s.gguf` (%d tokens, %.1f MB of fp16 KV)" % (t, caps[t]["num_tokens"], first[t]["fp16_MB"])
                      for t in tags),
         "; ".join("%s: %s" % (tag, profile_text(label, src)) for tag, label, src in sources),
         "level %s" % os.environ["LEVEL"] if os.environ.get("LEVEL") else "its default level",
         cachegen["level"], rounds, runs[0][1]["repeats"],
         " Rows marked *before* are the build `%s`, run right after ours on the same config."
         % before if before else ""))
print()
print("```sh")
seen = []
for tag in tags:
    print("kvscope-cli capture --model %s.gguf --context %s --out long_4k_%s.h5 --threads 1 --json"
          % (tag, context, tag))
for name, r, simd, tag, prof in runs:
    line = "kvscope-cli bench codec long_4k_%s.h5 --threads 1 --runs %s --simd %s --device cpu%s --json" % (
        tag, rounds, simd, " --codec transform --profile %s" % os.path.basename(prof) if prof else "")
    if line not in seen:
        seen.append(line)
        print(line)
print("```")
print()
# The shipped coder's rows first, per model and SIMD path: what `--codec transform` runs.
shipped = [(name, r, tag) for name, r, _, tag, _ in runs if name.endswith("(shipped)")]
if shipped:
    print("What ships, per model and path (the rows marked *shipped* below):")
    print()
    print("| model | SIMD | coder | level | bits/value | decode vs zstd-3 | encode vs zstd-3 |")
    print("|---|---|---|---|---|---|---|")
    for name, r, tag in shipped:
        print("| %s | %s | `%s` | %d | %.3f | **%.2fx** | **%.2fx** |" % (
            tag, r["simd"], name.split(", ")[1].split(" ")[0], r["level"], r["bits_per_value"],
            r["decode_vs_zstd_decompress"], r["encode_vs_zstd_compress"]))
    print()
print("| model | codec | SIMD | level | bits/value | decode MB/s | zstd-3 decompress MB/s | decode vs zstd-3 "
      "| encode MB/s | zstd-3 compress MB/s | encode vs zstd-3 | entropy stage decode / encode, M symbols/s "
      "| htscodecs on the same symbols, decode / encode | entropy stage vs htscodecs, decode / encode |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, r, _, tag, _ in runs:
    print("| %s | %s | %s | %d | %.3f | %.0f | %.0f | **%.2fx** | %.0f | %.0f | **%.2fx** | %.0f / %.0f "
          "| %.0f / %.0f | %.2fx / %.2fx |" % (
              tag, name, r["simd"], r["level"], r["bits_per_value"], r["decode_MBps"],
              r["zstd_decompress_MBps"], r["decode_vs_zstd_decompress"], r["encode_MBps"],
              r["zstd_compress_MBps"], r["encode_vs_zstd_compress"], r["entropy_decode_MBps"],
              r["entropy_encode_MBps"], r["htscodecs_decode_MBps"], r["htscodecs_encode_MBps"],
              r["entropy_decode_vs_htscodecs"], r["entropy_encode_vs_htscodecs"]))
print()
sizes = {}
for n, r, _, tag, _ in runs:
    if not n.endswith("before"):
        sizes.setdefault((tag, n), (r["entropy_bytes"], r["htscodecs_bytes"], r["entropy_symbols"]))
print("Entropy-coded bytes, ours against htscodecs' order-0 rANS on the same symbols: %s." % "; ".join(
    "%s %s %d against %d (%d symbols)" % ((t, n) + v) for (t, n), v in sizes.items()))
print()
print("On a shared machine the ratios move with the load between runs; the load averages above say "
      "how busy it was. Compare rows of one page, not figures of two pages.")
PY
} | results_write transform_speed.md
