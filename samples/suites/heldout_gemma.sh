#!/bin/sh
# The held-out protocol of heldout.sh on Gemma 3 270M: the rows of docs/results/iso_quality_gemma.md.
# The same suites, bar and verdicts; only the first three contexts of each suite (80 questions
# per genre), because a Gemma row costs about twice a SmolLM2 row (a 262K-token vocabulary) on the
# shared 2-core machine. One eval at a time.
#
#   sh samples/suites/heldout_gemma.sh [CLI] [GENRES]
#     CLI     default build/dev/app/cli/kvscope-cli
#     GENRES  default "code narrative inventory meetings"
#   MODEL=gguf   default ~/.cache/kvscope/models/gemma-3-270m-q4_k_m.gguf (kvscope-cli fetch-model gemma3-270m)
#   OUT=dir      default samples/suites/results/heldout_gemma
#   ROWS=list    baselines cachegen transform generic (default all four)
#   BASELINES    the baselines row's codecs (default int8; int8,kivi2,kivi4 as heldout.sh, 3x the time)
#   TRANSFORM_LEVELS  levels of Gemma's own ladder (samples/profiles/gemma-3-270m.transform.json,
#                `--codec transform` with no --profile: calibrated on first use), default all;
#                ROWS=transform_hi measures TRANSFORM_HI_LEVELS (default 6,7) of it into <genre>.transform_hi.json
#   GENERIC_LEVELS    levels of the generic ladder (samples/profiles/generic.transform.json, one
#                water level per kind: what any model without a ladder of its own gets), default 4,5,6;
#                calibrated once by its first use on Gemma (the same two sample contexts) into
#                $OUT/generic.profile.json (not committed: it holds the transform model)
set -eu
CLI=${1:-build/dev/app/cli/kvscope-cli}
GENRES=${2:-"code narrative inventory meetings"}
MODEL=${MODEL:-$HOME/.cache/kvscope/models/gemma-3-270m-q4_k_m.gguf}
OUT=${OUT:-samples/suites/results/heldout_gemma}
ROWS=${ROWS:-"baselines cachegen transform generic"}
THREADS=${THREADS:-1}
[ -s "$MODEL" ] || { echo "heldout_gemma: $MODEL is missing (kvscope-cli fetch-model gemma3-270m)" >&2; exit 2; }
mkdir -p "$OUT"
# The machine and the code the rows are measured with (heldout_table.py prints it in the page).
python3 samples/suites/machine_json.py "$OUT/machine.json" "$CLI"
items() {
    case $1 in
    code) echo ganreind-601,nithstund-602,faendban-603 ;;
    narrative) echo hounford-701,distead-702,braervale-703 ;;
    inventory) echo wuthmere-501,staerby-502,fithmere-503 ;;
    meetings) echo semstead-401,semthorpe-402,graewick-403 ;;
    *) echo "heldout_gemma: no items chosen for genre '$1'" >&2; exit 2 ;;
    esac
}
generic="$OUT/generic.profile.json"
case " $ROWS " in *" generic "*)
    if [ ! -s "$generic" ]; then
        # The first use of the generic ladder, as a model without a ladder of its own gets it: a
        # samples folder that holds only that ladder, a profile cache of its own, one short eval.
        tmp=$(mktemp -d)
        mkdir -p "$tmp/samples/profiles"
        ln -s "$PWD/samples/contexts" "$tmp/samples/contexts"
        cp samples/profiles/generic.transform.json "$tmp/samples/profiles/"
        KVSCOPE_SAMPLES="$tmp/samples" XDG_CACHE_HOME="$tmp/cache" "$CLI" eval --model "$MODEL" --context technical_note \
            --holdout-tokens 32 --codec transform --levels 1 --only-transform --no-text --threads "$THREADS" --json > /dev/null
        cp "$tmp"/cache/kvscope/profiles/*.transform.json "$generic"
        rm -rf "$tmp"
    fi ;;
esac
printf '%s\n' "the generic ladder (samples/profiles/generic.transform.json: one water level per kind, keys t = 0.1 ... 0.0015, values 10x finer, no per-cache means) calibrated on Gemma on the same two sample contexts; what a model without a ladder of its own gets" > "$OUT/variant-generic.txt"
for g in $GENRES; do
    E="eval --model $MODEL --suite samples/suites/$g.json --items $(items "$g") --threads $THREADS --json"
    for r in $ROWS; do
        fam=$r
        [ "$r" = generic ] && fam=variant-generic
        f="$OUT/$g.$fam.json"
        [ -s "$f" ] && { echo "heldout_gemma: $f exists, kept (delete it to rerun)" >&2; continue; }
        echo "heldout_gemma: $g $r" >&2
        case $r in
        baselines) "$CLI" $E --baselines "${BASELINES:-int8}" --levels none > "$f.tmp" ;;
        cachegen) "$CLI" $E --codec cachegen --baselines none --levels all > "$f.tmp" ;;
        transform) "$CLI" $E --codec transform --baselines none --levels "${TRANSFORM_LEVELS:-all}" > "$f.tmp" ;;
        transform_hi) "$CLI" $E --codec transform --baselines none --levels "${TRANSFORM_HI_LEVELS:-6,7}" > "$f.tmp" ;;
        generic) "$CLI" $E --codec transform --profile "$generic" --baselines none --levels "${GENERIC_LEVELS:-4,5,6}" > "$f.tmp" ;;
        *) echo "heldout_gemma: unknown row family '$r'" >&2; exit 2 ;;
        esac
        mv "$f.tmp" "$f"
    done
done
python3 samples/suites/heldout_table.py "$OUT" $GENRES --page docs/results/iso_quality_gemma.md \
    --profile samples/profiles/gemma-3-270m.transform.json --script samples/suites/heldout_gemma.sh
