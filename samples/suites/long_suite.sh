#!/bin/sh
# Reruns the long-context rows: fp16 (the reference, built once and cached), int8 and the transform
# codec at level 1 on facts_long.json (4 contexts of about 4K, 5K, 6K and 7.5K tokens, 120
# questions). The transform profile is calibrated on the tune split of facts.json (ablation.sh's
# abl_full.json: every stage on, t 0.03 keys / 0.003 values), so every long item is held out.
#   sh samples/suites/long_suite.sh [build/dev/app/cli/kvscope-cli]
# WORK=dir as in ablation.sh (default /tmp/kvscope-iso); SUITE_CACHE=dir uses another reference cache.
set -eu
CLI=${1:-build/dev/app/cli/kvscope-cli}
SUITE=samples/suites/facts_long.json
OUT=samples/suites/results
WORK=${WORK:-/tmp/kvscope-iso}
CACHE=${SUITE_CACHE:+--suite-cache $SUITE_CACHE}
[ -f "$WORK/abl_full.json" ] || ONLY="" WORK="$WORK" sh samples/suites/ablation.sh "$CLI" > /dev/null
E="eval --suite $SUITE --threads 1 --json $CACHE"
# The first run builds the fp16 reference (prefill and reference pass of every item; its wall time
# is timings.prepare_s); the others read it from the cache.
nice -n 10 "$CLI" $E --baselines int8 --levels none > "$OUT/long_int8.json"
nice -n 10 "$CLI" $E --codec transform --profile "$WORK/abl_full.json" --baselines none --levels 1 > "$OUT/long_transform_l1.json"
