"""What calling the codec from Python costs over the library call, in the same process.

    PYTHONPATH=build/dev/python KVSCOPE_CLI=build/dev/app/cli/kvscope-cli \
        /usr/bin/python3 samples/python/bench_overhead.py [KV.h5] [--level N] [--rounds R] [--json]

The library call is `benchCodec`, the function `kvscope-cli bench codec KV --threads 1 --level N`
times (every chunk encoded, then decoded, in memory, no container; the thread's CPU time, best of
its repeats), called in this process through `kvscope._kvscope._bench_codec`. Beside it, on the
same cache: `kvscope.encode(kv, level=N)` (a whole .kvc container: chunks, index, CRCs,
metadata, written into the bytes object), `kvscope.decode(data, level=N)` (container parsed, CRCs
checked, a new cache allocated) and `kvscope.decode(data, level=N, out=kv)` (into an existing
cache, as the library benchmark decodes), as the calling thread's CPU time, best of the same
number of calls.

Made to be read on a loaded, shared machine: both sides run in one process and one thread (the
same allocator, the same caches), each round times both back to back (the library first in even
rounds, Python first in odd ones, so that a drift in the load favours neither), and the figure
is the median over rounds of the paired ratio Python / library, with the smallest and largest
beside it. CPU time, not wall time: time spent waiting for a core does not count; what is left of
the load is a slower core (shared caches), which the pairing cancels to the extent it lasts
longer than a round. It also sets `kvscope.encode(kv)` (every level, wall) beside `kvscope-cli
encode --json`'s `encode_s` (writeKvc to a file, wall, fsync included; a process of its own),
paired the same way. Without a KV file it synthesises a 4096-token cache of SmolLM2-135M's shape
(30 layers, 3 KV heads of 64). Single-threaded on both sides (OMP_NUM_THREADS=1).
"""

import os

os.environ["OMP_NUM_THREADS"] = "1"  # before kvscope loads OpenMP: one thread, as --threads 1

import argparse
import json
import statistics
import sys
import tempfile
import time

import kvscope
from cli_run import cli_json


def best(f, repeats, clock=time.thread_time):
    """(best seconds of `clock` over `repeats` calls, last result). Each call's result is let go
    before the next call, as a loop that uses and drops it would."""
    t = float("inf")
    out = None
    for _ in range(repeats):
        out = None
        t0 = clock()
        out = f()
        t = min(t, clock() - t0)
    return t, out


def summary(pairs):
    """Median, min and max of the paired ratios, and the ratio of each side's best."""
    ratios = [p / l for l, p in pairs]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "of_bests": min(p for _, p in pairs) / min(l for l, _ in pairs),
            "library_s": min(l for l, _ in pairs), "python_s": min(p for _, p in pairs), "rounds": len(pairs)}


def measure(path, level, rounds, repeats, cli, log=print):
    kv = kvscope.read_kv(path)
    data = kvscope.encode(kv)  # every level; decode reads level `level` of it
    level = level or kvscope.Container(data).default_level
    out = kvscope.decode(data, level=level)
    tmp = tempfile.TemporaryDirectory(prefix="kvscope-bench-")
    pairs = {"encode": [], "decode": [], "decode_out": [], "encode_container": []}
    level_bytes = 0
    load = [os.getloadavg()]
    for r in range(rounds):
        def library():
            enc, dec = kvscope._kvscope._bench_codec(kv, level, repeats=repeats)
            enc_s = min(cli_json(cli, "encode", path, "--out", os.path.join(tmp.name, "x.kvc"))["encode_s"]
                        for _ in range(repeats))
            return enc, dec, enc_s

        def python():
            nonlocal level_bytes
            # In benchCodec's order: the decode that compares with its decode right after the encode
            # (a decode into a new cache first would leave 93 MB of fresh pages in the caches).
            enc, one = best(lambda: kvscope.encode(kv, level=level), repeats)
            level_bytes = len(one)
            del one
            into, _ = best(lambda: kvscope.decode(data, level=level, out=out), repeats)
            dec, _ = best(lambda: kvscope.decode(data, level=level), repeats)
            every, _ = best(lambda: kvscope.encode(kv), repeats, time.perf_counter)
            return enc, dec, into, every

        if r % 2 == 0:
            lib, py = library(), python()
        else:
            py, lib = python(), library()
        pairs["encode"].append((lib[0], py[0]))
        pairs["decode"].append((lib[1], py[1]))
        pairs["decode_out"].append((lib[1], py[2]))
        pairs["encode_container"].append((lib[2], py[3]))
        log(f"round {r + 1}/{rounds}: encode x{py[0] / lib[0]:.3f}, decode x{py[1] / lib[1]:.3f}, "
            f"decode out= x{py[2] / lib[1]:.3f}, container encode x{py[3] / lib[2]:.3f}")
    load.append(os.getloadavg())
    return {"file": path, "kv": repr(kv), "level": level, "level_bytes": level_bytes, "repeats": repeats,
            "load_start": load[0], "load_end": load[1], **{k: summary(v) for k, v in pairs.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kv", nargs="?", help="HDF5 KV file (default: a synthetic 4096-token SmolLM2-shaped cache)")
    ap.add_argument("--level", type=int, default=None, help="level to time (default: the profile's default)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds, each timing both sides back to back")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per round and side (best kept)")
    ap.add_argument("--cli", default=os.environ.get("KVSCOPE_CLI", "kvscope-cli"))
    ap.add_argument("--json", action="store_true", help="print one JSON object (progress to stderr)")
    a = ap.parse_args()
    log = (lambda s: print(s, file=sys.stderr)) if a.json else print

    tmp = tempfile.TemporaryDirectory(prefix="kvscope-bench-")
    path = a.kv
    if path is None:
        path = os.path.join(tmp.name, "kv4k.h5")
        kvscope.synthetic(layers=30, kv_heads=3, head_dim=64, tokens=4096, seed=5).write(path)
    m = measure(path, a.level, a.rounds, a.repeats, a.cli, log)
    if a.json:
        print(json.dumps(m))
        return
    print(f"{m['file']}: {m['kv']}, level {m['level']}, {m['level_bytes']} bytes at that level alone; "
          f"load average {m['load_start'][0]:.2f} -> {m['load_end'][0]:.2f}")
    for key, what in (("encode", "kvscope.encode(level) / benchCodec encode (CPU)"),
                      ("decode", "kvscope.decode(level) / benchCodec decode (CPU)"),
                      ("decode_out", "kvscope.decode(level, out=) / benchCodec decode (CPU)"),
                      ("encode_container", "kvscope.encode() / kvscope-cli encode's encode_s (wall)")):
        s = m[key]
        print(f"{what}: median x{s['median']:.3f} ({100 * (s['median'] - 1):+.1f} %), range x{s['min']:.3f}..x{s['max']:.3f} "
              f"over {s['rounds']} rounds; bests {s['python_s']:.4f} s / {s['library_s']:.4f} s = x{s['of_bests']:.3f}")


if __name__ == "__main__":
    main()
