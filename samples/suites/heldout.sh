#!/bin/sh
# The held-out protocol: every codec row judged on quality suites of genres that neither the
# transform's calibration (samples/contexts: technical_note, long_4k) nor the choice of its ladder
# (facts.json) ever saw. One `eval --suite` per (genre, codec family); each process measures fp16
# too (it is the bar). Then heldout_table.py pools them and writes docs/results/iso_quality.md.
#
#   sh samples/suites/heldout.sh [CLI] [GENRES]
#     CLI     default build/dev/app/cli/kvscope-cli
#     GENRES  default "meetings inventory code narrative" (samples/suites/<genre>.json)
#   OUT=dir     where the per-run JSON goes (default samples/suites/results/heldout)
#   ROWS=list   which families to run: transform cachegen tuned baselines (default all four)
#   THREADS=n   --threads for every run (default 1: the machine is shared; see README)
#   TRANSFORM_LEVELS, CACHEGEN_LEVELS, TUNED_LEVELS  levels of the transform ladder and of the
#               CacheGen default and tuned profiles (default all); ROWS=transform_hi measures
#               TRANSFORM_HI_LEVELS (default 4,5) of the ladder into <genre>.transform_hi.json
#               (heldout_table.py merges them with the transform rows); ROWS=transform_nomean
#               measures TRANSFORM_NOMEAN_LEVELS (default 4,5) of the calibrated ladder with its
#               per-cache means off ("adapt_mean": false, how the ladder shipped before);
#               ROWS=transform_grouped measures TRANSFORM_GROUPED_LEVELS (default 2,3,4,5) of the
#               calibrated profile TRANSFORM_GROUPED_PROFILE (the ladder with "layer_group" set,
#               calibrated by `kvscope-cli calibrate --codec transform`, see docs/transform.md)
#               ROWS=variant measures VARIANT_LEVELS (default 3,4) of any calibrated transform profile
#               VARIANT_PROFILE into <genre>.variant-<VARIANT>.json, shown as "transform, <VARIANT>"
#               (underscores as spaces); VARIANT_NOTE, when set, is written to variant-<VARIANT>.txt and
#               the page quotes it (what the variant is and how it was made)
# Runs can go side by side (two shells, different ROWS or GENRES): a row being measured is
# locked (<row>.json.lock) and the other shell skips it.
#
# The transform rows use the shipped ladder with no --profile: the first run calibrates it on the
# user's checkpoint once (eval/transform_default.h) and caches it.
set -eu
CLI=${1:-build/dev/app/cli/kvscope-cli}
GENRES=${2:-"meetings inventory code narrative"}
OUT=${OUT:-samples/suites/results/heldout}
ROWS=${ROWS:-"transform cachegen tuned baselines"}
THREADS=${THREADS:-1}
mkdir -p "$OUT"
# The machine and the code the rows are measured with (heldout_table.py prints it in the page).
python3 samples/suites/machine_json.py "$OUT/machine.json" "$CLI"
for g in $GENRES; do
    S=samples/suites/$g.json
    [ -f "$S" ] || { echo "heldout: $S is missing (python3 samples/suites/make_genre_suites.py writes it)" >&2; exit 2; }
    E="eval --suite $S --threads $THREADS --json"
    for r in $ROWS; do
        fam=$r
        if [ "$r" = variant ]; then
            [ -n "${VARIANT:-}" ] && [ -s "${VARIANT_PROFILE:-}" ] ||
                { echo "heldout: ROWS=variant needs VARIANT=name and VARIANT_PROFILE=a calibrated profile" >&2; exit 2; }
            fam="variant-$VARIANT"
            [ -z "${VARIANT_NOTE:-}" ] || printf '%s\n' "$VARIANT_NOTE" > "$OUT/$fam.txt"
        fi
        f="$OUT/$g.$fam.json"
        [ -s "$f" ] && { echo "heldout: $f exists, kept (delete it to rerun)" >&2; continue; }
        mkdir "$f.lock" 2>/dev/null || { echo "heldout: $f is being measured by another run, skipped" >&2; continue; }
        # On an early exit the row's lock goes too; a row that finished removed its own (|| true: the
        # trap's status would become the script's).
        trap 'rmdir "$f.lock" 2>/dev/null || true' EXIT
        echo "heldout: $g $r" >&2
        case $r in
        transform) "$CLI" $E --codec transform --baselines none --levels "${TRANSFORM_LEVELS:-all}" > "$f.tmp" ;;
        transform_hi) "$CLI" $E --codec transform --baselines none --levels "${TRANSFORM_HI_LEVELS:-4,5}" > "$f.tmp" ;;
        transform_nomean)
            # The calibrated ladder (made by the transform rows' first run) with adapt_mean off.
            fp=$(python3 -c "import json; print(json.load(open('samples/profiles/smollm2-135m-instruct.transform.json'))['model_fingerprint'])")
            cached="${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/profiles/$fp.transform.json"
            [ -s "$cached" ] || { echo "heldout: run ROWS=transform first (it calibrates the ladder)" >&2; exit 2; }
            python3 -c "import json,sys; p=json.load(open(sys.argv[1])); p['transform']['adapt_mean']=False; json.dump(p,open(sys.argv[2],'w'))" \
                "$cached" "$f.profile"
            "$CLI" $E --codec transform --profile "$f.profile" --baselines none \
                --levels "${TRANSFORM_NOMEAN_LEVELS:-4,5}" > "$f.tmp"
            rm -f "$f.profile" ;;
        transform_grouped)
            [ -s "${TRANSFORM_GROUPED_PROFILE:-}" ] || { echo "heldout: set TRANSFORM_GROUPED_PROFILE to a calibrated profile" >&2; exit 2; }
            "$CLI" $E --codec transform --profile "$TRANSFORM_GROUPED_PROFILE" --baselines none \
                --levels "${TRANSFORM_GROUPED_LEVELS:-2,3,4,5}" > "$f.tmp" ;;
        variant)
            "$CLI" $E --codec transform --profile "$VARIANT_PROFILE" --baselines none \
                --levels "${VARIANT_LEVELS:-3,4}" > "$f.tmp" ;;
        cachegen)  "$CLI" $E --codec cachegen --baselines none --levels "${CACHEGEN_LEVELS:-all}" > "$f.tmp" ;;
        tuned)     "$CLI" $E --codec cachegen --profile samples/profiles/smollm2-135m-instruct.json --baselines none \
                       --levels "${TUNED_LEVELS:-all}" > "$f.tmp" ;;
        baselines) "$CLI" $E --baselines int8,kivi2,kivi4 --levels none > "$f.tmp" ;;
        *) echo "heldout: unknown row family '$r'" >&2; exit 2 ;;
        esac
        mv "$f.tmp" "$f"
        rmdir "$f.lock"
    done
done
# The page is made from the repository's results only; rows measured elsewhere are copied in first.
if [ "$OUT" = samples/suites/results/heldout ]; then
    python3 samples/suites/heldout_table.py "$OUT" $GENRES
else
    echo "heldout: rows are in $OUT; copy them to samples/suites/results/heldout and run heldout_table.py there" >&2
fi
