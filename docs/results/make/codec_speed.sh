#!/usr/bin/env bash
# Writes docs/results/codec_speed.md: the CacheGen codec's encode and decode speed on one thread,
# against zstd-3 on the same fp16 bytes and htscodecs' rANS 32x16 on the same quantised symbols,
# timed in the same run (`kvscope-cli bench codec`), on a capture of the 4K sample context with
# the default model and the default profile.
#
#   docs/results/make/codec_speed.sh
#   MODEL=file.gguf     the model to capture with (default: the default model)
#   SIMD="auto avx2"    decoder paths, one row each (default: auto, the path chosen for this CPU)
#   ROUNDS=3            bench codec --runs (each row timed once per round, its best kept)
#   REUSE=1             keep the capture already in WORK (a prefill of 4K tokens on one thread
#                       takes minutes; the page's timings do not depend on which build captured)
#   CLI=, WORK=         see common.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SIMD="${SIMD:-auto}"
ROUNDS="${ROUNDS:-3}"
start_on_long_4k
runs=()
for simd in $SIMD; do
  say "bench codec --simd $simd"
  "$CLI" bench codec "$KV" --threads 1 --runs "$ROUNDS" --simd "$simd" --json > "$WORK/bench_codec_$simd.json"
  runs+=("$WORK/bench_codec_$simd.json")
done

{
  results_header "Codec speed: CacheGen codec against zstd-3 and htscodecs, one thread" \
      docs/results/make/codec_speed.sh
  python3 - "$MODEL" "$CONTEXT" "$ROUNDS" "$WORK/capture.json" "$SIMD" "${runs[@]}" <<'PY'
import json, os, sys
model, context, rounds, capture, simd = sys.argv[1:6]
runs = [json.load(open(p)) for p in sys.argv[6:]]
asked = simd.split()
cap = json.load(open(capture))
first = runs[0]
print("Input: `%s` captured with `%s` (%d tokens, %.1f MB of fp16 KV). Codec: the default profile "
      "(CacheGen's settings with one probability table per KV head; `kvscope-cli profile` prints "
      "it), level %d. Every row of a run is timed once per round, "
      "the rows in turn, and keeps its fastest round (%s rounds of %d passes). MB/s are of fp16 KV "
      "(for the entropy stage, of quantised symbols); ratios are ours over the peer's, timed in "
      "the same run." % (context, os.path.basename(model), cap["num_tokens"], first["fp16_MB"],
                         first["level"], rounds, first["repeats"]))
print()
print("```sh")
print("kvscope-cli capture --model %s --context %s --out long_4k.h5 --threads 1 --json"
      % (os.path.basename(model), context))
for a in asked:
    print("kvscope-cli bench codec long_4k.h5 --threads 1 --runs %s --simd %s --json" % (rounds, a))
print("```")
print()
print("| `--simd` (path taken) | threads | bits/value (x smaller than int8) | decode MB/s | zstd-3 decompress MB/s | decode vs zstd-3 "
      "| encode MB/s | zstd-3 compress MB/s | encode vs zstd-3 | entropy decode vs htscodecs "
      "| entropy encode vs htscodecs |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for a, r in zip(asked, runs):
    ours = r["results"][0]
    print("| %s (%s) | %d | %.3f (%.2fx) | %.0f | %.0f | **%.2fx** | %.0f | %.0f | **%.2fx** | %.2fx (%.0f / %.0f) | %.2fx (%.0f / %.0f) |" % (
        a, r["simd"], r["threads"], r["bits_per_value"], ours["ratio_vs_int8"], r["decode_MBps"], r["zstd_decompress_MBps"],
        r["decode_vs_zstd_decompress"], r["encode_MBps"], r["zstd_compress_MBps"], r["encode_vs_zstd_compress"],
        r["entropy_decode_vs_htscodecs"], r["entropy_decode_MBps"], r["htscodecs_decode_MBps"],
        r["entropy_encode_vs_htscodecs"], r["entropy_encode_MBps"], r["htscodecs_encode_MBps"]))
print()
print("Every row of the first run (`results` in its JSON):")
print()
print("| codec | level | bits/value | encode MB/s | decode MB/s |")
print("|---|---|---|---|---|")
for x in first["results"]:
    print("| %s | %d | %.3f | %.0f | %.0f |" % (x["codec"], x["level"], x["bits_per_value"],
                                               x["encode_MBps"], x["decode_MBps"]))
print()
print("Size against zstd-3's lossless output: %.3f. Entropy stage sizes: ours %d bytes, htscodecs %d "
      "bytes for %d symbols. GPU: %s." % (
          first["size_vs_zstd"], first["entropy_bytes"], first["htscodecs_bytes"], first["entropy_symbols"],
          first["gpu"].replace("gpu: ", "") if isinstance(first["gpu"], str) else "see the run's JSON"))
print()
print("On a shared machine the ratios move with the load between runs; the load averages above say "
      "how busy it was. Rerun on a quiet machine before comparing builds.")
PY
} | results_write codec_speed.md
