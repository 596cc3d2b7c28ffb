#!/usr/bin/env python3
"""Write the project's synthetic bandwidth traces in the Mahimahi (mm-link) format.

Exact command (from the repository root; plain Python 3, no packages):

    python3 samples/traces/make_traces.py            # writes samples/traces/*.trace
    python3 samples/traces/make_traces.py --check    # only recomputes and prints the mean rates

Format: one integer per line, a millisecond timestamp (non-decreasing, starting at 1) at which
one packet of 1500 bytes may cross the link; a timestamp written k times means k packets in that
millisecond. The trace loops, and its period is the last timestamp. 1500 bytes a packet means
12 kbit a packet, so a rate of R Mbit/s is R/12 packets a millisecond.

Each trace is a list of segments (rate in Mbit/s, duration in ms). Packets are placed by
carrying the fractional credit from one millisecond to the next, so within a segment they are
spread as evenly as whole packets allow. Every segment holds a whole number of packets, so the
last millisecond of the trace carries a packet and the period equals the intended duration.
"""
import argparse
import os
from fractions import Fraction

PACKET_BITS = 1500 * 8

TRACES = {
    # name: [(Mbit/s, ms), ...]
    "constant_10mbit": [(10, 6000)],
    "constant_50mbit": [(50, 6000)],
    "steps_50_10_30mbit": [(50, 3000), (10, 3000), (30, 3000)],
    "drop_recovery": [(40, 3000), (2, 3000), (40, 3000)],
}


def timestamps(segments):
    out = []
    t = 0
    for mbit, ms in segments:
        per_ms = Fraction(mbit * 1_000_000, PACKET_BITS * 1000)
        if (per_ms * ms).denominator != 1:
            raise ValueError(f"{mbit} Mbit/s over {ms} ms is not a whole number of packets")
        credit = Fraction(0)
        for _ in range(ms):
            t += 1
            credit += per_ms
            n = int(credit)
            credit -= n
            out.extend([t] * n)
    if out[-1] != t:
        raise AssertionError("the last millisecond carries no packet")
    return out


def mean_mbit(ts):
    """Mean capacity of a trace as mm-link loops it: packets * 1500 B over the period."""
    return len(ts) * PACKET_BITS / (ts[-1] / 1000) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--check", action="store_true", help="read the files, print their means")
    args = ap.parse_args()
    for name, segments in TRACES.items():
        path = os.path.join(args.out, name + ".trace")
        if args.check:
            with open(path) as f:
                ts = [int(line) for line in f if line.strip()]
        else:
            ts = timestamps(segments)
            with open(path, "w", newline="\n") as f:
                f.write("".join(f"{x}\n" for x in ts))
        print(f"{name}.trace: {len(ts)} packets, period {ts[-1] / 1000:g} s, "
              f"mean {mean_mbit(ts):.2f} Mbit/s, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
