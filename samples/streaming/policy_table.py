#!/usr/bin/env python3
"""Print the per-policy table of one `kvscope-cli stream --json` output, as docs/streaming.md shows it.

    kvscope-cli stream ... --json > run.json && python3 samples/streaming/policy_table.py run.json

Columns: SLO hit, mean KL, the per-run oracle's mean KL (null without the oracle), mean KL over
the oracle's (the goal is <= 1.1), regret, median TTFT, backlogged utilisation (the goal figure),
and the levels the policy sent, counted over every run's chunks ("text" = recomputed from the tokens).
"""
import collections
import json
import sys


def fmt(x, d=4):
    return "-" if not isinstance(x, (int, float)) else f"{x:.{d}f}"


def main():
    j = json.load(open(sys.argv[1]))
    print(f"codec {j.get('codec')} ({j.get('levels')} levels; {j.get('codec_reason')}); planner {json.dumps(j.get('planner'))}; "
          f"distortion {j.get('level_distortion_source')}\n")
    print("| policy | SLO hit | mean KL | oracle KL | KL / oracle | regret KL | TTFT median | utilisation | levels sent |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in j["policies"]:
        runs = p["runs"]
        util = [r["link"].get("backlogged_utilisation") for r in runs]
        util = [u for u in util if isinstance(u, (int, float))]
        sent = collections.Counter(c["level"] for r in runs for c in r["chunks"])
        o = p.get("oracle_kl")
        regret = f"{p['regret_kl']:+.4f}" if isinstance(p.get("regret_kl"), (int, float)) else "-"
        ratio = p["mean_kl"] / o if isinstance(o, (int, float)) and o > 0 and isinstance(p.get("mean_kl"), (int, float)) else None
        print(f"| {p['policy']} | {p['slo_hit_rate']:.2f} | {fmt(p.get('mean_kl'))} | {fmt(o)} | {fmt(ratio, 2)} | "
              f"{regret} | "
              f"{p['ttft_median_s']:.3f} s | {fmt(sum(util) / len(util) if util else None, 3)} | "
              f"{' '.join(f'{k}:{v}' for k, v in sorted(sent.items(), key=lambda kv: str(kv[0])))} |")


if __name__ == "__main__":
    main()
