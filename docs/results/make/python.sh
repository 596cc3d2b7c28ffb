#!/usr/bin/env bash
# Writes docs/results/python.md: kvscope from Python against kvscope-cli, in the same run.
#  1. transformers generating with kvscope.hf.KVScopeCache on the default model, next to
#     `kvscope-cli eval --context long_1k` on the same tokens, CacheGen's levels and the transform
#     codec's default ladder (samples/python/hf_quality.py);
#  2. what calling the codec from Python costs over the library call, on the 4K capture of the
#     codec pages (samples/python/bench_overhead.py: paired rounds in one process, median of the ratios).
#
#   docs/results/make/python.sh
#   PYTHON=path         the interpreter (default: installer/setup.sh's venv, which has transformers)
#   ROUNDS=7            bench_overhead.py --rounds
#   REUSE=1             keep the 4K capture already in WORK (see codec_speed.sh)
#   CLI=, WORK=         see common.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PYTHON="${PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/pyenv/bin/python}"
ROUNDS="${ROUNDS:-7}"
BUILD="$(dirname "$(dirname "$(dirname "$(readlink -f "$CLI")")")")"
[ -d "$BUILD/python/kvscope" ] || die "$BUILD/python/kvscope: not built (cmake --build --preset dev --target kvscope_python)"
start_on_long_4k
export PYTHONPATH="$BUILD/python" KVSCOPE_CLI="$CLI" KVSCOPE_SOURCE_DIR="$RESULTS_ROOT"
say "hf_quality.py --context long_1k"
"$PYTHON" samples/python/hf_quality.py --model "$MODEL" --context long_1k --json > "$WORK/hf_quality.json"
say "bench_overhead.py $KV --rounds $ROUNDS"
"$PYTHON" samples/python/bench_overhead.py "$KV" --rounds "$ROUNDS" --json > "$WORK/python_overhead.json"

{
  results_header "kvscope from Python: transformers next to kvscope-cli eval, and the cost of the call" \
      docs/results/make/python.sh
  "$PYTHON" - "$MODEL" "$WORK/hf_quality.json" "$WORK/python_overhead.json" "$ROUNDS" <<'PY'
import json, os, sys
model, hq, ov, rounds = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4]
import transformers, torch
print("## transformers with `KVScopeCache` next to `kvscope-cli eval`")
print()
print("`%s` in both runtimes: kvscope's, and transformers %s on torch %s reading the same GGUF file "
      "(`kvscope.hf.load_gguf_model`). Context `%s`: %d tokens (those `kvscope-cli capture` prefills), "
      "%d continuation tokens scored, the sample's question answered greedily (32 tokens). One row per row "
      "of `kvscope-cli eval --context %s --no-text --json` and of the same with `--codec transform "
      "--only-transform` (the default transform ladder, calibrated for the model); on the transformers side the "
      "context's full-precision states go through `KVScopeCache(codec, level, model=model)` (`kvscope.encode`, then "
      "`kvscope.decode`), scored as eval scores (the cache cut to n-1 tokens, the last context token "
      "run again, then the continuation). KL and delta PPL are against each runtime's own uncompressed "
      "run: eval's keeps the KV in fp16, transformers' in fp32." % (
          os.path.basename(model), transformers.__version__, torch.__version__.split("+")[0], hq["context"],
          hq["num_tokens"], hq["continuation_tokens"], hq["context"]))
print()
print("Bits per value count what a receiver of the level fetches, as eval counts them: the chunks, and for the "
      "transform codec the means re-estimated on the cache (`kvscope.encode(..., report=)`, the sizes of "
      "`kvscope-cli encode --json`).")
print()
print("```sh")
print("PYTHONPATH=build/dev/python KVSCOPE_CLI=build/dev/app/cli/kvscope-cli \\\n"
      "    ~/.cache/kvscope/pyenv/bin/python samples/python/hf_quality.py --context %s" % hq["context"])
print("```")
print()
o = hq["original"]
print("Uncompressed: perplexity of the continuation %.4f (transformers) and %.4f (kvscope), the answers "
      "%s; the context's KV of the two runtimes, each rounded to fp16: %.1f %% bit-identical, at most "
      "%.2f %% of a layer's absmax apart." % (
          o["hf_ppl"], o["cli_ppl"], "token for token equal" if o["hf_answer"] == o["cli_answer"] else "different",
          100 * hq["kv_agreement"]["identical"], 100 * hq["kv_agreement"]["max_rel_error"]))
print()
print("| codec | level | bits/value (transformers / eval) | KL transformers | KL eval | KL ratio | delta PPL % transformers | delta PPL % eval | token agreement transformers | token agreement eval |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in hq["rows"]:
    h, c = r["hf"], r["cli"]
    ratio = "%.3f" % (h["kl"] / c["kl"]) if c["kl"] else "-"
    print("| %s | %s | %.3f / %.3f | %.6f | %.6f | %s | %+.3f | %+.3f | %.3f | %.3f |" % (
        r["codec"], r["level"] if r["codec"] in ("cachegen", "transform") else "", h["bits_per_value"], c["bits_per_value"],
        h["kl"], c["kl"], ratio, h["delta_ppl_pct"], c["delta_ppl_pct"], h["token_agreement"], c["token_agreement"]))
print()
print("Time: %.0f s for kvscope-cli (capture, tokenize, generate, eval), %.0f s for the transformers side "
      "(model load included), one thread each; load average %.2f at the start, %.2f at the end." % (
          hq["seconds"]["cli"], hq["seconds"]["hf"], hq["load_start"][0], hq["load_end"][0]))
print()
print("## The cost of calling the codec from Python")
print()
print("`%s`, level %d (%d bytes at that level alone), one thread on both sides, one process. The library "
      "call is `benchCodec`, the function `kvscope-cli bench codec --threads 1 --level N` times (every chunk "
      "encoded, then decoded, in memory, no container), called in the same process "
      "(`kvscope._kvscope._bench_codec`). Each of %d rounds times it and the Python calls back to back (best "
      "of %d calls each, the calling thread's CPU time), the library first in even rounds; the figure is the "
      "median of the rounds' paired ratios, the range beside it. The last row pairs the whole container "
      "(every level) with `kvscope-cli encode`, a process of its own, wall clock." % (
          ov["kv"], ov["level"], ov["level_bytes"], ov["encode"]["rounds"], ov["repeats"]))
print()
print("```sh")
print("PYTHONPATH=build/dev/python KVSCOPE_CLI=build/dev/app/cli/kvscope-cli \\\n"
      "    /usr/bin/python3 samples/python/bench_overhead.py long_4k.h5 --rounds %s" % rounds)
print("```")
print()
print("| Python call | library call it is paired with | median ratio | range | best Python s | best library s |")
print("|---|---|---|---|---|---|")
rows = (("encode", "`kvscope.encode(kv, level=N)`", "`benchCodec` encode, CPU"),
        ("decode", "`kvscope.decode(data, level=N)` (a new KV)", "`benchCodec` decode, CPU"),
        ("decode_out", "`kvscope.decode(data, level=N, out=kv)`", "`benchCodec` decode, CPU"),
        ("encode_container", "`kvscope.encode(kv)` (every level), wall", "`kvscope-cli encode`'s `encode_s` (writeKvc, fsync), wall"))
for key, py, lib in rows:
    s = ov[key]
    print("| %s | %s | x%.3f (%+.1f %%) | x%.3f .. x%.3f | %.4f | %.4f |" % (
        py, lib, s["median"], 100 * (s["median"] - 1), s["min"], s["max"], s["python_s"], s["library_s"]))
print()
print("Load average %.2f at the start, %.2f at the end of this part." % (ov["load_start"][0], ov["load_end"][0]))
PY
} | results_write python.md
