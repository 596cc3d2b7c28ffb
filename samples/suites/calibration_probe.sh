#!/bin/sh
# How much the transform codec's calibration corpus matters on a genre it did not see: the same
# two-level ladder (keys t 0.1 and 0.05, values 10x finer, one water level per kind) calibrated
# three ways, then one held-out code context (code.json item feirkse-605) encoded with each:
#   generic  technical_note + long_4k (the shipped calibration)
#   nocode   generic + the first item of inventory, narrative and meetings (wider, still no code)
#   code     the first two items of code.json (in genre: what calibrating on the genre would buy)
#   generic+mean  generic with per-cache means ("adapt_mean": true, the means counted in the size)
# Prints bits/value and the reconstruction RMS of each level. A proxy (unweighted RMS, one
# context), not the iso-quality bar: it says where to look, the suites say what passes.
#
#   sh samples/suites/calibration_probe.sh [CLI] [WORK_DIR]
set -eu
CLI=${1:-build/dev/app/cli/kvscope-cli}
W=${2:-${TMPDIR:-/tmp}/kvscope-calibration-probe}
mkdir -p "$W"
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
# The items named below (the first of inventory, narrative and meetings; three of code).
picks = {"code": ["ganreind-601", "nithstund-602", "feirkse-605"], "inventory": ["wuthmere-501"],
         "narrative": ["hounford-701"], "meetings": ["semstead-401"]}
for genre, ids in picks.items():
    items = {x["id"]: x for x in json.load(open(f"samples/suites/{genre}.json"))["items"]}
    for i in ids:
        open(f"{w}/{i}.txt", "w").write(items[i]["context"])
p = json.load(open("samples/profiles/smollm2-135m-instruct.transform.json"))
p.pop("calibration", None)
p.pop("layer_shape", None)
p["transform"]["levels"] = [{"name": "t 0.1/0.01", "key_theta": 0.1, "value_theta": 0.01},
                            {"name": "t 0.05/0.005", "key_theta": 0.05, "value_theta": 0.005}]
p["transform"]["default_level"] = 1
p["transform"]["adapt_mean"] = False  # the shipped ladder's per-cache means: only the generic+mean row
json.dump(p, open(f"{w}/ladder.json", "w"), indent=1)
PY
kv() { [ -s "$W/$1.h5" ] || "$CLI" capture --context "$2" --out "$W/$1.h5" --threads 1 >/dev/null; echo "$W/$1.h5"; }
TN=$(kv technical_note technical_note); L4=$(kv long_4k long_4k)
C1=$(kv ganreind-601 "$W/ganreind-601.txt"); C2=$(kv nithstund-602 "$W/nithstund-602.txt")
I1=$(kv wuthmere-501 "$W/wuthmere-501.txt"); N1=$(kv hounford-701 "$W/hounford-701.txt"); M1=$(kv semstead-401 "$W/semstead-401.txt")
HELD=$(kv feirkse-605 "$W/feirkse-605.txt")
cal() { name=$1; shift; "$CLI" calibrate --codec transform "$@" --profile "$W/ladder.json" --out "$W/$name.json" >/dev/null; }
cal generic "$TN" "$L4"
cal nocode "$TN" "$L4" "$I1" "$N1" "$M1"
cal code "$C1" "$C2"
python3 -c "import json,sys; p=json.load(open(sys.argv[1])); p['transform']['adapt_mean']=True; json.dump(p,open(sys.argv[2],'w'))" \
    "$W/generic.json" "$W/generic+mean.json"
for name in generic nocode code generic+mean; do
    "$CLI" encode "$HELD" --codec transform --profile "$W/$name.json" --out "$W/$name.kvc" --verify --json |
        python3 -c "
import json, sys
j = json.load(sys.stdin)
for i, l in enumerate(j['levels']):
    print(f'$name level {i + 1}: {l[\"bits_per_value\"]:.3f} bits/value, RMS {l[\"rms_error\"]:.4f}')"
done
