#!/bin/sh
# Reruns the ablation of the transform codec on the quality suite: level 1 (t 0.03 keys / 0.003
# values) with every stage on, then with one stage switched off at a time, each variant calibrated
# on the tune split of facts.json (items 0, 2, 4, 6) and judged on its eval split (items 1, 3, 5, 7).
# Writes samples/suites/results/ablation_<variant>.json (one eval per variant) and prints the table.
#   sh samples/suites/ablation.sh [build/dev/app/cli/kvscope-cli]
# WORK=dir keeps the calibration captures and profiles (default /tmp/kvscope-iso, shared with
# iso_table.sh); SUITE_CACHE=dir uses another reference cache. ONLY="a b" reruns some variants.
set -eu
CLI=${1:-build/dev/app/cli/kvscope-cli}
SUITE=samples/suites/facts.json
OUT=samples/suites/results
WORK=${WORK:-/tmp/kvscope-iso}
CACHE=${SUITE_CACHE:+--suite-cache $SUITE_CACHE}
VARIANTS="full rope_kept basis_hadamard basis_identity per_head weighting_mse allocation_uniform entropy_fixed no_sinks"
ONLY=${ONLY-$VARIANTS uncalibrated}
mkdir -p "$OUT" "$WORK"

# 1. Calibration caches: the tune split's contexts, captured (as iso_table.sh does).
python3 - "$SUITE" "$WORK" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for i, it in enumerate(d["items"]):
    if i % 2 == 0:
        open(f"{sys.argv[2]}/tune{i}.txt", "w").write(it["context"])
PY
for i in 0 2 4 6; do
    [ -f "$WORK/tune$i.h5" ] || nice -n 10 "$CLI" capture --context "$WORK/tune$i.txt" --out "$WORK/tune$i.h5" --threads 1 --json > /dev/null
done
CAL="$WORK/tune0.h5 $WORK/tune2.h5 $WORK/tune4.h5 $WORK/tune6.h5"
TH="--thetas 0.03 --value-thetas 0.003"

# 2. One profile per variant: the default transform settings (every stage on) with one switch
#    changed, calibrated on the same four caches at the same water level.
[ -f "$WORK/abl_full.json" ] || nice -n 10 "$CLI" calibrate --codec transform $CAL --out "$WORK/abl_full.json" $TH --json > "$WORK/abl_full.cal.json"
python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
off = {
    "rope_kept": {"rope_undo": False},            # keys coded after RoPE
    "basis_hadamard": {"basis": "hadamard"},      # randomized Hadamard per head instead of PCA
    "basis_identity": {"basis": "none"},          # no transform: per-channel coding
    "per_head": {"across_heads": False},          # one PCA per KV head instead of across heads
    "weighting_mse": {"weighting": "mse"},        # water-filling on plain MSE, not attention
    "allocation_uniform": {"allocation": "uniform"},  # every component at the same rate
    "entropy_fixed": {"entropy": "fixed"},        # fixed-width symbols: no calibrated rANS tables
    "no_sinks": {"sink_tokens": 0},               # the first 4 tokens coded like the rest
}
for name, change in off.items():
    p = json.load(open(f"{w}/abl_full.json"))
    p["transform"].pop("model", None)
    p["transform"].update(change)
    json.dump(p, open(f"{w}/abl_{name}.base.json", "w"))
# Uncalibrated: the same settings, no model: the codec fits PCA and Laplace tables on each cache
# it codes, and the model travels in (and is counted in) every container.
p = json.load(open(f"{w}/abl_full.json"))
p["transform"].pop("model", None)
json.dump(p, open(f"{w}/abl_uncalibrated.json", "w"))
PY
for v in $VARIANTS; do
    [ "$v" = full ] || [ -f "$WORK/abl_$v.json" ] || nice -n 10 "$CLI" calibrate --codec transform $CAL \
        --profile "$WORK/abl_$v.base.json" --out "$WORK/abl_$v.json" $TH --json > "$WORK/abl_$v.cal.json"
done

# 3. One eval per variant on the held-out split (each process measures fp16 too: it is the bar).
for v in $ONLY; do
    nice -n 10 "$CLI" eval --suite "$SUITE" --split eval --threads 1 --json $CACHE \
        --codec transform --profile "$WORK/abl_$v.json" --baselines none --levels 1 > "$OUT/ablation_$v.json"
done

# 4. The table (markdown), from the JSON files.
python3 - "$OUT" $VARIANTS uncalibrated <<'PY'
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
print("| variant | bits/value | x int8 | accuracy [95% CI] | McNemar p | delta PPL % [95% CI] | KL per token [95% CI] | top-1 agree | iso |")
print("|---|---|---|---|---|---|---|---|---|")
for n in names:
    f = f"{out}/ablation_{n}.json"
    if not os.path.exists(f):
        continue
    j = json.load(open(f))
    r = [x for x in j["results"] if x["codec"] == "transform"][0]
    print(f"| {n} | {r['bits_per_value']:.3f} | {r['ratio_vs_int8']:.2f} | {r['accuracy']:.3f} "
          f"[{r['accuracy_ci'][0]:.3f}, {r['accuracy_ci'][1]:.3f}] | {r['mcnemar_p']:.3f} | "
          f"{r['delta_ppl_pct']:.3f} [{r['delta_ppl_pct_ci'][0]:.3f}, {r['delta_ppl_pct_ci'][1]:.3f}] | "
          f"{r['kl']:.5f} [{r['kl_ci'][0]:.5f}, {r['kl_ci'][1]:.5f}] | {r['token_agreement']:.3f} | "
          f"{'yes' if r['meets_iso_quality'] else 'no'} |")
PY
