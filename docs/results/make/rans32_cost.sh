#!/usr/bin/env bash
# Writes docs/results/rans32_cost.md: what the transform codec's 32-state entropy stage
# (`"entropy": "rans32"`) costs in bytes against the 4-state one (`"rans"`) on the same symbols,
# level by level, and where those bytes sit in each block stream (FORMAT.md "Chunk payloads
# (transform)"): the initial decoder states, how much information they carry beyond their floor
# (2^16 or 2^23), and the renormalisation words or bytes after them.
#
#   docs/results/make/rans32_cost.sh
#   PROFILE=default     the transform profile ("default": the model's calibrated default profile,
#                       as transform_speed.sh finds or makes it), its "entropy" switched in copies
#   GENRES="code inventory meetings narrative"   held-out genre suites (samples/suites/<genre>.json):
#                       the first item's context of each is captured and encoded both ways, and
#                       the page lists its bits per value at every level (what switching the
#                       shipped ladder would add to the held-out tables' bits columns)
#   MODEL=, REUSE=1, CLI=, WORK=   see common.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PROFILE="${PROFILE:-default}"
GENRES="${GENRES-code inventory meetings narrative}"
start_on_long_4k

if [ "$PROFILE" = default ]; then
  fingerprint="$("$CLI" info --model "$MODEL" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])')"
  PROFILE="${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/profiles/$fingerprint.transform.json"
  [ -s "$PROFILE" ] || die "$PROFILE: no calibrated default profile (docs/results/make/transform_speed.sh makes it)"
fi
for entropy in rans rans32; do
  python3 - "$PROFILE" "$entropy" "$WORK/rans32_cost_$entropy.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
if "transform" not in p:
    sys.exit("%s: not a transform profile (no \"transform\" object)" % sys.argv[1])
p["transform"]["entropy"] = sys.argv[2]
json.dump(p, open(sys.argv[3], "w"))
PY
  say "encode with $entropy"
  "$CLI" encode "$KV" --codec transform --profile "$WORK/rans32_cost_$entropy.json" \
      --out "$WORK/rans32_cost_$entropy.kvc" --json > "$WORK/rans32_cost_encode_$entropy.json"
done

for genre in $GENRES; do
  suite="samples/suites/$genre.json"
  [ -s "$suite" ] || die "$suite: no such suite"
  python3 -c 'import json, sys; sys.stdout.write(json.load(open(sys.argv[1]))["items"][0]["context"])' "$suite" \
      > "$WORK/rans32_cost_$genre.txt"
  if [ "${REUSE:-0}" = 1 ] && [ -s "$WORK/rans32_cost_$genre.h5" ]; then say "reusing the $genre capture"
  else
    say "capture of $genre item 0"
    "$CLI" capture --model "$MODEL" --context "$WORK/rans32_cost_$genre.txt" --out "$WORK/rans32_cost_$genre.h5" \
        --threads 1 --json > "$WORK/rans32_cost_capture_$genre.json"
  fi
  for entropy in rans rans32; do
    "$CLI" encode "$WORK/rans32_cost_$genre.h5" --codec transform --profile "$WORK/rans32_cost_$entropy.json" \
        --out "$WORK/rans32_cost_${genre}_$entropy.kvc" --json > "$WORK/rans32_cost_encode_${genre}_$entropy.json"
  done
done

{
  results_header "What the 32-state entropy stage costs the transform codec in bytes" docs/results/make/rans32_cost.sh
  python3 - "$CONTEXT" "$PROFILE" "$WORK/rans32_cost_rans.kvc" "$WORK/rans32_cost_rans32.kvc" "$WORK" $GENRES <<'PY'
import json, math, os, struct, sys
context, profile, path_a, path_b, work = sys.argv[1:6]
genres = sys.argv[6:]

def streams(path):
    """Every block stream of every chunk payload, per level (FORMAT.md: header, chunk index,
    u32 escape_size[B], u32 stream_size[B], raw values, then per block escapes and stream)."""
    d = open(path, "rb").read()
    L, H, D, T, N, chunks, levels = struct.unpack_from("<7I", d, 24)
    index = struct.unpack_from("<Q", d, 120)[0]
    out = {}
    for c in range(chunks):
        for lv in range(levels):
            off, size, _ = struct.unpack_from("<QII", d, index + 16 * (c * levels + lv))
            p = d[off:off + size]
            B = 2 * L
            esc = struct.unpack_from("<%dI" % B, p, 0)
            sts = struct.unpack_from("<%dI" % B, p, 4 * B)
            q = size - sum(esc) - sum(sts)  # the block data starts after the sizes and raw values
            for u in range(B):
                q += esc[u]
                out.setdefault(lv + 1, []).append(p[q:q + sts[u]])
                q += sts[u]
    return out

a, b = streams(path_a), streams(path_b)
home = os.path.expanduser("~")
print("Input: `%s` captured with the default model; profile `%s` with `\"entropy\"` set to `rans` and "
      "to `rans32` in two copies (the same tables, so the same symbols), each encoded at every level "
      "by `kvscope-cli encode`. Bytes are those of the block streams (one per block and chunk; escapes "
      "and raw tokens are the same bytes in both files). *Information* is sum(log2(x) - log2(floor)) / 8 "
      "over a stream's initial decoder states x (floor 2^23 for `rans`, 2^16 for `rans32`): what the "
      "states carry of the symbols; the rest of their bytes is overhead."
      % (context, profile.replace(home, "~")))
print()
print("```sh")
print("kvscope-cli encode long_4k.h5 --codec transform --profile rans32_cost_rans.json --out rans32_cost_rans.kvc --json")
print("kvscope-cli encode long_4k.h5 --codec transform --profile rans32_cost_rans32.json --out rans32_cost_rans32.kvc --json")
print("```")
print()
print("| level | streams | `rans` bytes | `rans32` bytes | `rans32` more | per stream | state bytes per stream, `rans` / `rans32` | of which information | words or bytes after the states, `rans32` less per stream |")
print("|---|---|---|---|---|---|---|---|---|")
for lv in sorted(a):
    sa = [s for s in a[lv] if s]
    sb = [s for s in b[lv] if s]
    n = len(sb)
    ta, tb = sum(map(len, sa)), sum(map(len, sb))
    ia = sum(sum(math.log2(x) - 23 for x in struct.unpack_from("<4I", s)) for s in sa) / 8 / len(sa)
    ib = sum(sum(math.log2(x) - 16 for x in struct.unpack_from("<32I", s)) for s in sb) / 8 / n
    body = ((ta - 16 * len(sa)) - (tb - 128 * n)) / n
    print("| %d | %d | %d | %d | %+.2f%% | %+.1f B | 16 / 128 | %.1f / %.1f B | %.1f B |"
          % (lv, n, ta, tb, 100.0 * (tb - ta) / ta, (tb - ta) / n, ia, ib, body))
if genres:
    print()
    print("## Held-out genres")
    print()
    print("The first item's context of each held-out genre suite (`samples/suites/<genre>.json`), captured "
          "with the default model and encoded with both copies of the profile at every level: bits per "
          "value as `kvscope-cli encode` reports them (chunk payloads), `rans` -> `rans32`.")
    print()
    print("| genre | tokens | " + " | ".join("level %d" % lv for lv in sorted(a)) + " |")
    print("|---|---|" + "---|" * len(a))
    for g in genres:
        cap = json.load(open(os.path.join(work, "rans32_cost_capture_%s.json" % g)))
        ea = json.load(open(os.path.join(work, "rans32_cost_encode_%s_rans.json" % g)))
        eb = json.load(open(os.path.join(work, "rans32_cost_encode_%s_rans32.json" % g)))
        la = {l["level"]: l["bits_per_value"] for l in ea["levels"]}
        lb = {l["level"]: l["bits_per_value"] for l in eb["levels"]}
        print("| %s | %d | %s |" % (g, cap["num_tokens"], " | ".join(
            "%.4f -> %.4f (%+.2f%%)" % (la[lv], lb[lv], 100.0 * (lb[lv] - la[lv]) / la[lv]) for lv in sorted(la))))
PY
} | results_write rans32_cost.md
