#!/usr/bin/env bash
# Writes docs/results/llama_peer.md: decode (and prefill) speed of kvscope next to llama.cpp on the
# same GGUF file, the same thread count and the same context lengths, in the same script, so that
# both see the same machine. Issue 37's goal: kvscope decodes at >= 50 % of llama.cpp's tokens/s.
#
# llama.cpp comes from llama-cpp-python built from source (PyPI sdist), outside CI, e.g.:
#   python3 -m venv /tmp/peer && pip download --no-deps --no-binary :all: llama-cpp-python
#   CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_OPENMP=OFF" /tmp/peer/bin/pip install llama_cpp_python-*.tar.gz
# Only its ctypes module and libllama are used (plus numpy), so the sdist's llama_cpp folder on
# PYTHONPATH with LLAMA_CPP_LIB_PATH naming a folder with libllama.so and libggml*.so does as well.
#
#   PEER_PYTHON=/tmp/peer/bin/python docs/results/make/llama_peer.sh
#   TOKENS=512,2048     context lengths (tokens prefilled before the decode steps)
#   DECODE=32           tokens decoded one at a time after each prefill
#   ROUNDS=2            rounds of (kvscope, llama.cpp) per model; each row keeps its fastest round
#   THREADS=1
#   PEER_EXTRA_BUFTS=0  1 lets llama.cpp use its extra buffer types (AMX, repacked weights); see peer()
#   MODELS="a.gguf b.gguf"  (default: SmolLM2-135M and Gemma 3 270M when in the cache)
#   CLI=, WORK=         see common.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TOKENS="${TOKENS:-512,2048}"
DECODE="${DECODE:-32}"
ROUNDS="${ROUNDS:-2}"
THREADS="${THREADS:-1}"
PEER_PYTHON="${PEER_PYTHON:-python3}"
PEER_EXTRA_BUFTS="${PEER_EXTRA_BUFTS:-0}"
default_models
"$PEER_PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llama_cpp') is None)" 2>/dev/null ||
  die "$PEER_PYTHON cannot import llama_cpp (set PEER_PYTHON to a venv with llama-cpp-python built from source)"
results_start
PEER_VERSION="$("$PEER_PYTHON" -c "import importlib.util, re; s = importlib.util.find_spec('llama_cpp'); print(re.search(r'__version__ = \"([^\"]+)', open(s.origin).read()).group(1))")"

# llama.cpp's side, through llama-cpp-python's ctypes layer on libllama (its low-level module
# alone: the high-level Llama class adds a sampler and Python bookkeeping per token): the same
# pseudo-random token ids as `bench model` (an LCG over the vocabulary), prefilled in n_batch
# pieces, then DECODE steps of one token each (the arg-max of the last logits), timed in wall and
# process CPU seconds. A fresh context per length.
peer() {
  "$PEER_PYTHON" - "$@" <<'PY'
import ctypes, importlib.util, json, sys, time, types
import numpy as np
# Import llama_cpp.llama_cpp without the package's __init__ (which pulls in the chat layer).
spec = importlib.util.find_spec("llama_cpp")
pkg = types.ModuleType("llama_cpp")
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["llama_cpp"] = pkg
import llama_cpp.llama_cpp as L
model_path, tokens, decode, threads = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
EXTRA_BUFTS = sys.argv[5] == "1"
L.llama_backend_init()
mp = L.llama_model_default_params()
# Extra buffer types (AMX tiles, repacked Q4_0/Q4_K/Q8_0 blocks) off: llama.cpp 0.3.36's AMX matmul
# crashes in the first prefill on this CPU (ggml_backend_amx_mul_mat, SIGSEGV). Decode on Q4_1
# (SmolLM2) takes llama.cpp's plain vec_dot path either way; Q4_K (Gemma 3) loses its repacked GEMV.
mp.use_extra_bufts = EXTRA_BUFTS
model = L.llama_model_load_from_file(model_path.encode(), mp)
vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
runs = []
for n in tokens:
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n + decode + 16, 512, 512
    cp.n_threads, cp.n_threads_batch = threads, threads
    ctx = L.llama_init_from_model(model, cp)
    x, ids = 12345, []
    for _ in range(n):
        x = (x * 1664525 + 1013904223) % 2**32
        ids.append(x % vocab)
    def run(toks):
        arr = (L.llama_token * len(toks))(*toks)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks))) != 0:
            raise SystemExit("llama_decode failed")
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, n, 512):
        run(ids[i:i + 512])
    prefill, prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(decode):
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(vocab,))
        run([int(np.argmax(logits))])
    dec, dec_cpu = time.perf_counter() - t0, time.process_time() - c0
    L.llama_free(ctx)
    runs.append({"prefill_tokens": n, "prefill_tokens_per_cpu_s": n / prefill_cpu, "prefill_tokens_per_s": n / prefill,
                 "decode_ms_per_token": 1e3 * dec / decode, "decode_cpu_ms_per_token": 1e3 * dec_cpu / decode})
print(json.dumps({"model": model_path, "runs": runs}))
PY
}

runs=()
for model in $MODELS; do
  name="$(basename "$model" .gguf)"
  for round in $(seq "$ROUNDS"); do
    out="$WORK/peer_kvscope_${name}_$round.json"
    say "$name: kvscope, round $round"
    "$CLI" bench model --model "$model" --threads "$THREADS" --prefill-tokens "$TOKENS" --decode "$DECODE" --json > "$out"
    runs+=("kvscope|$name|$out")
    out="$WORK/peer_llamacpp_${name}_$round.json"
    say "$name: llama.cpp, round $round"
    peer "$model" "$TOKENS" "$DECODE" "$THREADS" "$PEER_EXTRA_BUFTS" > "$out" 2> "$out.log"
    runs+=("llama.cpp|$name|$out")
  done
done

{
  results_header "Decode speed against llama.cpp, same GGUF, $THREADS thread(s)" docs/results/make/llama_peer.sh
  python3 - "$DECODE" "$ROUNDS" "$THREADS" "$PEER_VERSION" "$PEER_EXTRA_BUFTS" "${runs[@]}" <<'PY'
import json, sys
decode, rounds, threads, version, extra = sys.argv[1:6]
best, order = {}, []
for arg in sys.argv[6:]:
    engine, model, path = arg.split("|", 2)
    j = json.load(open(path))
    for r in j["runs"]:
        key = (engine, r["prefill_tokens"])
        m = best.setdefault(model, {})
        if model not in order:
            order.append(model)
        cpu = r.get("decode_cpu_ms_per_token", r["decode_ms_per_token"])
        b = m.get(key)
        if b is None:
            m[key] = {"wall": r["decode_ms_per_token"], "cpu": cpu, "prefill": r["prefill_tokens_per_cpu_s"]}
        else:
            b["wall"] = min(b["wall"], r["decode_ms_per_token"])
            b["cpu"] = min(b["cpu"], cpu)
            b["prefill"] = max(b["prefill"], r["prefill_tokens_per_cpu_s"])
print("llama.cpp: llama-cpp-python %s built from source on this machine (CPU, native ISA, no BLAS, no OpenMP), "
      "libllama through its ctypes layer, n_threads %s, n_batch 512, default KV type (f16), extra buffer types %s. Each row: the fastest of %s rounds; kvscope "
      "and llama.cpp alternate within a round. Decode: ms per token over %s one-token steps after the prefill, "
      "in CPU time (what a shared machine can compare) and wall time; prefill: tokens per CPU-second."
      % (version, threads, "on" if extra == "1" else "off (AMX and repacked weights: see the script)", rounds, decode))
print()
print("```sh")
print("kvscope-cli bench model --model MODEL --threads %s --prefill-tokens N --decode %s --json" % (threads, decode))
print("```")
print()
print("| model | context | kvscope decode ms/token (CPU, wall) | llama.cpp decode ms/token (CPU, wall) | kvscope / llama.cpp tokens/s (CPU) | prefill tok/CPU-s kvscope, llama.cpp |")
print("|---|---|---|---|---|---|")
for model in order:
    m = best[model]
    for (engine, n) in sorted(k for k in m if k[0] == "kvscope"):
        k, p = m[("kvscope", n)], m.get(("llama.cpp", n))
        if p is None:
            continue
        print("| %s | %d | %.1f, %.1f | %.1f, %.1f | %.0f %% | %.0f, %.0f |"
              % (model, n, k["cpu"], k["wall"], p["cpu"], p["wall"], 100 * p["cpu"] / k["cpu"], k["prefill"], p["prefill"]))
PY
} | results_write llama_peer.md
