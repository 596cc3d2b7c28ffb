#!/usr/bin/env bash
# GPU checks of the CUDA decoder on a fresh machine with an NVIDIA GPU and this repository:
#   1. builds only what the checks need (GUI off), with -j16;
#   2. runs the tests labelled gpu (bit-exact parity with the CPU decoder, corrupt input; the
#      transform codec included) and the host emulation tst_cuda_core;
#   3. cachegen: decodes (format 2.x streams: one warp per stream) a Llama-2-7B 8K-sized KV (32 layers, 32 KV heads x 128, 8192 tokens: 4 GiB fp16,
#      synthetic) and prints GB/s, ms and the share of copies vs kernels, for in-band and shared
#      tables, each with one table per KV head (format 2.2, the default) and one per channel;
#   4. transform: parity on the device over its stage switches, then the decode of a 4 GiB fp16
#      cache shaped like SmolLM2 (30 layers, 3 KV heads x 64, 186368 tokens; a Llama-7B-shaped
#      transform cache cannot be encoded in minutes: the fit inverts a 4096 x 4096 matrix per
#      block), through cuda/standalone's driver (--only transform), split into copies, the
#      symbol kernel (rANS, escapes) and the GEMM kernels.
# When the full configure fails (no Qt, HDF5 or libtorch on the GPU machine) it says what is
# missing and falls back to cuda/standalone: the CUDA library plus a driver that needs only nvcc,
# zstd, zlib and nlohmann-json, and runs the same parity cases and the same benchmark.
# Results go to $OUT (when set) or build/gpu-check/out. Usage: cuda/gpu_check.sh [jobs]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${1:-16}"
RESULTS="${OUT:-$ROOT/build/gpu-check/out}"
mkdir -p "$RESULTS"
LOG="$RESULTS/gpu_check.log"
: > "$LOG"
say() { echo "gpu_check: $*" | tee -a "$LOG" >&2; }
t_start=$(date +%s)

# --- what the machine has --------------------------------------------------------------------
missing=()
for tool in nvcc cmake g++ nvidia-smi; do
  command -v "$tool" >/dev/null 2>&1 || { [ "$tool" = nvcc ] && [ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH || missing+=("$tool"); }
done
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
if ((${#missing[@]})); then say "missing tools: ${missing[*]}"; fi
command -v nvcc >/dev/null 2>&1 || { say "FAIL: no nvcc: install the CUDA toolkit"; exit 2; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$RESULTS/gpu.txt" | sed 's/^/gpu_check: device: /' >&2
nvcc --version | tail -1 | sed 's/^/gpu_check: /' >&2
# Build for this GPU only (fast); the default build covers sm_80/89/90.
CC_ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')"
ARCH_ARGS=()
[ -n "$CC_ARCH" ] && ARCH_ARGS=(-DCMAKE_CUDA_ARCHITECTURES="$CC_ARCH")

# --- full build: tst_cuda, tst_cuda_core, kvscope-cli --------------------------------------------
FULL="$ROOT/build/gpu-check/full"
mode=full
if cmake -S "$ROOT" -B "$FULL" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DKVSCOPE_GUI=OFF -DKVSCOPE_CUDA=ON \
     "${ARCH_ARGS[@]}" >"$RESULTS/configure_full.log" 2>&1; then
  say "full configure ok"
  if ! cmake --build "$FULL" -j "$JOBS" --target tst_cuda tst_cuda_core kvscope-cli kvs_gpu_check >"$RESULTS/build_full.log" 2>&1; then
    say "full build failed (tail of $RESULTS/build_full.log follows); falling back to the standalone build"
    tail -20 "$RESULTS/build_full.log" >&2
    mode=standalone
  fi
else
  say "full configure failed; missing (from CMake):"
  grep -E "Could NOT find|not found|No package|Could not find|REQUIRED" "$RESULTS/configure_full.log" | sort -u | head -20 | sed 's/^/gpu_check:   /' >&2
  say "(Debian: qt6-base-dev libhdf5-dev libtorch-dev libzstd-dev libhiredis-dev libsentencepiece-dev libpcre2-dev libicu-dev nlohmann-json3-dev libcli11-dev zlib1g-dev)"
  mode=standalone
fi

# The standalone build (cuda/standalone): needs only nvcc, zstd, zlib and nlohmann-json. Its
# arguments go to kvs_gpu_check (--only transform: transform parity and the transform benchmark).
run_standalone() {
  SA="$ROOT/build/gpu-check/standalone"
  if ! cmake -S "$ROOT/cuda/standalone" -B "$SA" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${ARCH_ARGS[@]}" \
       >"$RESULTS/configure_standalone.log" 2>&1; then
    say "FAIL: standalone configure failed; missing:"
    grep -E "Could NOT find|not found|Could not find|REQUIRED" "$RESULTS/configure_standalone.log" | sort -u | head -20 | sed 's/^/gpu_check:   /' >&2
    say "(the standalone build needs nvcc, g++ with OpenMP, zlib1g-dev, libzstd-dev, nlohmann-json3-dev)"
    status=2
    return
  fi
  cmake --build "$SA" -j "$JOBS" >"$RESULTS/build_standalone.log" 2>&1 || { say "FAIL: standalone build"; tail -30 "$RESULTS/build_standalone.log" >&2; status=2; return; }
  run_driver "$SA/kvs_gpu_check" "$@"
}

# Runs kvs_gpu_check (path, then its arguments) and prints its figures.
run_driver() {
  local exe="$1"
  shift
  say "kvs_gpu_check $* (parity cases + benchmarks)"
  "$exe" --repeats 3 "$@" >"$RESULTS/standalone.json" 2> >(tee -a "$LOG" >&2) || status=1
  python3 - "$RESULTS/standalone.json" <<'PY' >&2 || cat "$RESULTS/standalone.json" >&2
import json, sys
r = json.load(open(sys.argv[1]))
bad = [p["case"] for p in r.get("parity", []) if not p["ok"]]
print(f"gpu_check: standalone parity: {len(r.get('parity', [])) - len(bad)} cases bit-exact" + (f", FAILED: {bad}" if bad else ""))
for b in r.get("bench") or []:
    if b.get("codec") == "transform":
        print(f"gpu_check: transform {b['shape']} level {b['level']} ({b['bits_per_value']:.2f} bits/value): {b['decode_GBps']:.1f} GB/s, "
              f"{b['wall_ms']:.1f} ms for {b['output_GB']:.2f} GB; copies {b['h2d_ms']:.1f} ms, symbol kernel {b['entropy_kernel_ms']:.1f} ms, "
              f"GEMM kernels {b['gemm_kernels_ms']:.1f} ms, {b['batches']} batches")
    else:
        print(f"gpu_check: cachegen ({b['tables']} tables, per {b.get('table_scope', 'channel')}) level {b['level']}: {b['decode_GBps']:.1f} GB/s, {b['wall_ms']:.1f} ms for "
              f"{b['output_GB']:.2f} GB; copies {b['h2d_ms']:.1f} ms, kernels {b['table_kernels_ms'] + b['decode_kernels_ms']:.1f} ms; goal < 50 ms")
PY
}

status=0
if [ "$mode" = full ]; then
  say "ctest -L gpu (plus the host emulation tst_cuda_core)"
  (cd "$FULL" && ctest -L gpu --output-on-failure -j1) 2>&1 | tee "$RESULTS/ctest_gpu.log" >&2 || status=1
  (cd "$FULL" && ctest -R tst_cuda_core --output-on-failure) 2>&1 | tee "$RESULTS/ctest_cuda_core.log" >&2 || status=1
  KV="$ROOT/build/gpu-check/llama2-7b-8k.h5"
  CLI="$FULL/app/cli/kvscope-cli"
  if [ ! -s "$KV" ]; then
    say "writing a synthetic Llama-2-7B 8K KV (4 GiB fp16)"
    "$CLI" synth --out "$KV" --layers 32 --kv-heads 32 --head-dim 128 --tokens 8192 --json >"$RESULTS/synth.json" 2>>"$LOG" || status=1
  fi
  for tables in inband shared; do
    for scope in head channel; do
      say "bench codec --gpu-only, $tables tables, one table per $scope"
      extra=(--table-scope "$scope")
      [ "$tables" = shared ] && extra+=(--tables shared)
      json="$RESULTS/bench_gpu_${tables}_${scope}.json"
      "$CLI" bench codec "$KV" --gpu-only --repeats 3 "${extra[@]}" --json >"$json" 2>>"$LOG" || status=1
      python3 - "$json" "$tables" "$scope" <<'PY' >&2 || cat "$json" >&2
import json, sys
g = json.load(open(sys.argv[1]))["gpu"]
if isinstance(g, str): print("gpu_check:", g); sys.exit(0)
print(f"gpu_check: {g['device']} ({sys.argv[2]} tables, per {sys.argv[3]}): {g['decode_GBps']:.1f} GB/s, {g['wall_ms']:.1f} ms for "
      f"{g['output_bytes']/2**30:.2f} GiB; copies {g['h2d_ms']:.1f} ms ({100*g['copy_share']:.0f}%), kernels "
      f"{g['table_kernels_ms']+g['decode_kernels_ms']:.1f} ms ({100*g['kernel_share']:.0f}%), {g['batches']} batches; goal < 50 ms")
PY
    done
  done
  run_driver "$FULL/tests/kvs_gpu_check" --only transform
else
  run_standalone
fi
say "mode $mode, status $status, $(( $(date +%s) - t_start )) s; results in $RESULTS"
exit $status
