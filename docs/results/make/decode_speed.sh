#!/usr/bin/env bash
# Writes docs/results/decode_speed.md: prefill and decode speed of the runtime on one thread with
# the decode kernels (weight kernels on the GGUF's stored blocks, attention without BLAS) and
# without them (--decode-kernels off: every step as a prefill block, on the expanded fp32
# matrices), for each model in the cache, the two settings run in turn ROUNDS times in the same
# script so that both see the same machine; each row keeps its fastest round.
#
#   docs/results/make/decode_speed.sh
#   TOKENS=512,2048     prefill lengths (bench model --prefill-tokens)
#   DECODE=16           tokens decoded after each prefill
#   ROUNDS=2            rounds of (off, on) per model
#   MODELS="a.gguf b.gguf"  (default: SmolLM2-135M and Gemma 3 270M when in the cache)
#   CLI=, WORK=         see common.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TOKENS="${TOKENS:-512,2048}"
DECODE="${DECODE:-16}"
ROUNDS="${ROUNDS:-2}"
default_models
results_start
runs=()
for model in $MODELS; do
  for round in $(seq "$ROUNDS"); do
    for k in off on; do
      out="$WORK/bench_model_$(basename "$model" .gguf)_${k}_$round.json"
      say "$(basename "$model"): --decode-kernels $k, round $round"
      "$CLI" bench model --model "$model" --threads 1 --prefill-tokens "$TOKENS" --decode "$DECODE" \
          --decode-kernels "$k" --json > "$out"
      runs+=("$out")
    done
  done
done

{
  results_header "Decode and prefill speed: decode kernels on and off, one thread" docs/results/make/decode_speed.sh
  python3 - "$TOKENS" "$DECODE" "$ROUNDS" "${runs[@]}" <<'PY'
import json, sys
tokens, decode, rounds = sys.argv[1:4]
best = {}  # (model, kernels, prefill tokens) -> run with the fastest decode; prefill best separately
order = []
for path in sys.argv[4:]:
    j = json.load(open(path))
    for r in j["runs"]:
        key = (j["model"], j["decode_kernels"] != "off", r["prefill_tokens"])
        if key not in best:
            order.append(key)
            best[key] = {"decode": r["decode_ms_per_token"], "prefill": r["prefill_tokens_per_cpu_s"],
                         "rss": r["peak_rss_mb"], "runtime": j["runtime"], "mb": j["stored_weight_mb"]}
        else:
            b = best[key]
            b["decode"] = min(b["decode"], r["decode_ms_per_token"])
            b["prefill"] = max(b["prefill"], r["prefill_tokens_per_cpu_s"])
print("Each row: the fastest of %s rounds; off and on alternate within a round. Decode: ms per token "
      "for %s tokens after the prefill; prefill: tokens per CPU-second (what a shared machine can "
      "compare). `on` is the default." % (rounds, decode))
print()
print("```sh")
print("kvscope-cli bench model --model MODEL --threads 1 --prefill-tokens %s --decode %s --decode-kernels off|on --json"
      % (tokens, decode))
print("```")
print()
print("| model | context tokens | decode ms/token off | on | decode speed-up | prefill tok/CPU-s off | on | prefill on/off | peak RSS MB off / on |")
print("|---|---|---|---|---|---|---|---|---|")
for (model, on, n) in order:
    if on:
        continue
    off_, on_ = best[(model, False, n)], best.get((model, True, n))
    if on_ is None:
        continue
    print("| %s | %d | %.1f | %.1f | **%.2fx** | %.1f | %.1f | %.2f | %.0f / %.0f |" % (
        model, n, off_["decode"], on_["decode"], off_["decode"] / on_["decode"], off_["prefill"], on_["prefill"],
        on_["prefill"] / off_["prefill"], off_["rss"], on_["rss"]))
print()
for (model, on, n) in order:
    if on and n == order[0][2]:
        print("- %s, on: %s" % (model, best[(model, on, n)]["runtime"]))
PY
} | results_write decode_speed.md
