#!/usr/bin/env bash
# Writes docs/results/codec_sizes.md: the size and the reconstruction error of the CacheGen codec
# in several configurations and of the baselines (`kvscope-cli encode --verify`), on a capture
# of the 4K sample context with the default model. Sizes only: what each configuration does to
# the model's answers is measured on quality suites (iso_quality.md).
#
#   docs/results/make/codec_sizes.sh
#   MODEL=file.gguf     the model to capture with (default: the default model)
#   REUSE=1             keep the capture already in WORK (codec_speed.sh makes the same one)
#   CLI=, WORK=, SOURCE=  see common.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

start_on_long_4k

# label|encode options (after `encode long_4k.h5 --out X.kvc --verify --json`)
ROWS=(
  "int8 (8-bit per token)|--codec int8"
  "KIVI-4|--codec kivi4"
  "KIVI-2|--codec kivi2"
  "zstd-3 (lossless)|--codec zstd"
  "CacheGen's public code: per-token, no delta, one table per channel in every chunk|--delta-group 0 --table-scope channel"
  "default profile (the same with delta groups of 10 and one table per KV head)|"
  "default, delta coding off|--delta-group 0"
  "default, keys quantized per channel|--key-quantizer channel"
  "default, tables shared (calibrated on the file, stored once)|--tables shared"
  "default, 1024-token chunks|--chunk-tokens 1024"
)
i=0
for row in "${ROWS[@]}"; do
  opts="${row#*|}"
  say "encode $opts"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$CLI" encode "$KV" --out "$WORK/sizes.kvc" --verify --json $opts > "$WORK/sizes_$i.json"
  i=$((i + 1))
done
rm -f "$WORK/sizes.kvc"

{
  results_header "Codec sizes: CacheGen configurations and baselines on a real capture" \
      docs/results/make/codec_sizes.sh
  python3 - "$MODEL" "$CONTEXT" "$WORK" "${ROWS[@]}" <<'PY'
import json, os, sys
model, context, work = sys.argv[1:4]
rows = [r.split("|", 1) for r in sys.argv[4:]]
cap = json.load(open(os.path.join(work, "capture.json")))
print("Input: `%s` captured with `%s` (%d tokens). Each row is one `encode --verify`, every level of "
      "the profile in the file; errors are after decoding, in KV units, over every value of the cache. "
      "`x int8` is the size of the 8-bit per-token baseline over the row's size." % (
          context, os.path.basename(model), cap["num_tokens"]))
print()
print("```sh")
print("kvscope-cli capture --model %s --context %s --out long_4k.h5 --threads 1 --json"
      % (os.path.basename(model), context))
for label, opts in rows:
    print(("kvscope-cli encode long_4k.h5 --out x.kvc --verify --json " + opts).rstrip())
print("```")
print()
print("| configuration | level | bits/value | x fp16 | x int8 | max abs error | RMS error |")
print("|---|---|---|---|---|---|---|")
for i, (label, opts) in enumerate(rows):
    r = json.load(open(os.path.join(work, "sizes_%d.json" % i)))
    for l in r["levels"]:
        print("| %s | %d | %.3f | %.2fx | %.2fx | %.4g | %.4g |" % (
            label, l["level"], l["bits_per_value"], l["ratio_vs_fp16"], l["ratio_vs_int8"],
            l["max_abs_error"], l["rms_error"]))
        label = ""
print()
print("At equal bins, delta coding and per-channel keys change both the size and the error: compare "
      "configurations at equal quality (the suites and the tuner do), not at equal bins.")
PY
} | results_write codec_sizes.md
