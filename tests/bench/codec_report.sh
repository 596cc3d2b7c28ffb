#!/usr/bin/env bash
# Prints the codec figures quoted in the README: sizes and errors per configuration, and the
# speed benchmark, on one KV file (default: a synthetic cache shaped like SmolLM2-135M's,
# 30 layers x 3 KV heads x 64 dims, 4096 tokens).
#   tests/bench/codec_report.sh BUILD_DIR [KV.h5]
set -euo pipefail
build=${1:?usage: codec_report.sh BUILD_DIR [KV.h5]}
cli="$build/app/cli/kvscope-cli"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kv=${2:-}
if [ -z "$kv" ]; then
  kv="$work/synthetic.h5"
  "$cli" synth --out "$kv" --layers 30 --kv-heads 3 --head-dim 64 --tokens 4096 --seed 7 >/dev/null
fi

row() {  # label, then encode options
  local label=$1; shift
  "$cli" encode "$kv" --out "$work/x.kvc" --verify --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)
for l in r["levels"]:
    print("| %s | %d | %d | %.3f | %.2fx | %.2fx | %.4g | %.4g |" % (sys.argv[1], l["level"], l["bytes"],
          l["bits_per_value"], l["ratio_vs_fp16"], l["ratio_vs_int8"], l["max_abs_error"], l["rms_error"]))
' "$label"
}

echo "KV: $kv"
echo
echo "| configuration | level | bytes | bits/value | vs fp16 | vs int8 | max abs err | RMS err |"
echo "|---|---|---|---|---|---|---|---|"
for c in int8 kivi4 kivi2 zstd; do row "$c" --codec "$c"; done
row "cachegen (CacheGen's code: per-token, no delta, per-channel in-band tables, 256)" --delta-group 0 --table-scope channel
row "cachegen, per-head tables (default scope)" --delta-group 0
row "cachegen + delta 10" --delta-group 10
row "cachegen + channel keys" --delta-group 0 --key-quantizer channel
row "cachegen + channel keys + delta 10" --delta-group 10 --key-quantizer channel
for n in 64 256 1024; do
  for scope in channel head; do
    row "chunk $n, in-band tables per $scope" --delta-group 0 --chunk-tokens $n --tables inband --table-scope $scope
    row "chunk $n, shared tables per $scope" --delta-group 0 --chunk-tokens $n --tables shared --table-scope $scope
  done
done
echo
echo "Per-layer error of the default profile at its default level:"
"$cli" encode "$kv" --out "$work/d.kvc" --json >/dev/null
"$cli" decode "$work/d.kvc" --out "$work/d.h5" --source "$kv" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("| layer | K max | K RMS | V max | V RMS |")
print("|---|---|---|---|---|")
for l in r["layers"]:
    print("| %d | %.4g | %.4g | %.4g | %.4g |" % (l["layer"], l["key_max_abs"], l["key_rms"], l["value_max_abs"], l["value_rms"]))
'
echo
echo "Speed (MB of fp16 KV per second, same input, same run):"
"$cli" bench codec "$kv" --repeats 5
