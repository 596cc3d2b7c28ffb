#!/usr/bin/env bash
# Writes docs/results/serve_attack.md: legitimate clients of `kvscope-cli serve` while 200 slowloris
# peers and a connect flood run (tests/serve_attack.py, issue 32), in three attack shapes.
#
#   docs/results/make/serve_attack.sh
#   BEFORE=path/to/kvscope-cli  also run the first shape against another build's server
#   SECONDS_PER_RUN=20          how long the clients fetch in each shape
#   CLI=, WORK=                 see common.sh
# Needs no model: the KV is synthetic (synth, 8 fp16 chunks of 128 KiB).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

BEFORE="${BEFORE:-}"
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || die "BEFORE=$BEFORE: not an executable"
RUN_S="${SECONDS_PER_RUN:-20}"
results_start
cd "$RESULTS_ROOT"
rows="$WORK/serve_attack_rows.txt"
: > "$rows"
n=0
attack() {  # NAME SHAPE BINARY ARGS...
  local name="$1" shape="$2" bin="$3"
  shift 3
  n=$((n + 1))
  say "serve_attack.py ($name, $shape)"
  python3 tests/serve_attack.py "$bin" --seconds "$RUN_S" "$@" > "$WORK/serve_attack_$n.json"
  printf '%s\t%s\t%s\t%s\n' "$name" "$shape" "$WORK/serve_attack_$n.json" "$*" >> "$rows"
}
[ -z "$BEFORE" ] || attack before "400 held, a new one every 2 ms" "$BEFORE"
attack this "400 held, a new one every 2 ms" "$CLI"
attack this "400 held, a new one every 10 ms" "$CLI" --flood-every 10
attack this "connect and close at once" "$CLI" --flood 0

{
  results_header "Chunk server under attack: slowloris peers and a connect flood" docs/results/make/serve_attack.sh
  python3 - "$rows" "$BEFORE" "$RUN_S" <<'PY'
import json, sys
rows, before, seconds = sys.argv[1], sys.argv[2], sys.argv[3]
runs = []
for line in open(rows):
    name, shape, path, args = line.rstrip("\n").split("\t")
    runs.append((name, shape, json.load(open(path)), args))
j = runs[-1][2]
print("`tests/serve_attack.py` makes a synthetic KV (`synth`), encodes it with fp16 chunks of 16 tokens "
      "(%d chunks), starts `serve --store` on it with default options at %s, and fetches every chunk once "
      "calmly (the reference bytes). Then, for %s s: %d slowloris peers each send 3 bytes of a frame header "
      "and wait (reconnecting when dropped), a flood keeps up to 400 plain connections open (a new one "
      "every few ms, closing its oldest), and %d clients fetch the whole context over and over, each run "
      "on a new connection. A run hits when every chunk arrives byte-exact within %.0f s of its start; "
      "the worst client is the lowest hit rate of one client.%s"
      % (j["chunks"], j["bandwidth"], seconds, j["slowloris"], j["clients"], j["deadline_s"],
         " *before* is the server of `%s`, with the same script." % before if before else ""))
print()
print("```sh")
for name, shape, _, args in runs:
    if name != "before":
        print(("python3 tests/serve_attack.py build/dev/app/cli/kvscope-cli --seconds %s %s" % (seconds, args)).rstrip())
print("```")
print()
print("| server | flood | runs | hit rate | worst client | run median / max | connects (slowloris, flood) "
      "| evicted | frame timeouts | refused |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, shape, r, _ in runs:
    s = r.get("server") or {}
    med = "%.3f / %.3f s" % (r["run_s_median"], r["run_s_max"]) if r["run_s_median"] is not None else "-"
    print("| %s | %s | %d | **%.2f** | %.2f | %s | %d, %d | %s | %s | %s |" % (
        name, shape, r["runs"], r["hit_rate"], r["worst_client_hit_rate"], med,
        r["attackers"]["slowloris_connects"], r["attackers"]["flood_connects"], s.get("evicted", "-"),
        s.get("frame_timeouts", "-"), s.get("refused", "-")))
failures = [f for _, _, r, _ in runs for f in r["first_failures"]]
if failures:
    print()
    print("First failures: " + "; ".join("`%s`" % f for f in failures[:5]) + ".")
PY
} | results_write serve_attack.md
