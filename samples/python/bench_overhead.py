"""What calling the codec from Python costs over the library call, in the same run.

    PYTHONPATH=build/dev/python KVSCOPE_CLI=build/dev/app/cli/kvscope-cli \
        /usr/bin/python3 samples/python/bench_overhead.py [KV.h5] [--level N] [--rounds R]

`kvscope-cli bench codec KV --threads 1` times the library's encode and decode of every chunk at
one level (thread CPU time, best of its repeats and runs); this script times `kvscope.encode(kv,
level=N)` (a whole .kvc container: chunks, index, CRCs, metadata, in memory) and
`kvscope.decode(data, level=N)` (container parsed, CRCs checked, a new cache allocated) on the
same cache, also as the calling thread's CPU time, best of R rounds interleaved with the CLI's, and
prints the ratio. It also sets `kvscope.encode(kv)` (every level) beside the library call that
`kvscope-cli encode --json` times (`encode_s`: writeKvc to the file, wall clock, fsync included),
and `kvscope.decode` beside `kvscope-cli decode --json` (`decode_s`: KvcReader::decodeAll, a new
cache allocated, CRCs checked, as in Python), and `kvscope.decode(..., out=kv)`, which decodes
into an existing cache as the library benchmark does. Without a KV file it synthesises a 4096-token cache of SmolLM2-135M's shape
(30 layers, 3 KV heads of 64). Single-threaded on both sides (OMP_NUM_THREADS=1).
"""

import os

os.environ["OMP_NUM_THREADS"] = "1"  # before kvscope loads OpenMP: one thread, as --threads 1

import argparse
import json
import subprocess
import tempfile
import time

import kvscope


def best_cpu(f, repeats):
    """(best thread CPU seconds, best wall seconds, last result) over `repeats` calls."""
    cpu = wall = float("inf")
    out = None
    for _ in range(repeats):
        c0, w0 = time.thread_time(), time.perf_counter()
        out = f()
        cpu = min(cpu, time.thread_time() - c0)
        wall = min(wall, time.perf_counter() - w0)
    return cpu, wall, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kv", nargs="?", help="HDF5 KV file (default: a synthetic 4096-token SmolLM2-shaped cache)")
    ap.add_argument("--level", type=int, default=None, help="level to time (default: the profile's default)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each timing the CLI then Python (best kept)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per round and side")
    ap.add_argument("--cli", default=os.environ.get("KVSCOPE_CLI", "kvscope-cli"))
    a = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="kvscope-bench-")
    path = a.kv
    if path is None:
        path = os.path.join(tmp.name, "kv4k.h5")
        kvscope.synthetic(layers=30, kv_heads=3, head_dim=64, tokens=4096, seed=5).write(path)
    kv = kvscope.read_kv(path)
    level = a.level or kvscope.Container(kvscope.encode(kv)).default_level
    data = kvscope.encode(kv)  # every level; decode reads level `level` of it

    lib_enc = lib_dec = py_enc = py_dec = py_enc_wall = py_dec_wall = float("inf")
    file_enc = py_all = file_dec = py_into = float("inf")
    kvc = os.path.join(tmp.name, "all.kvc")
    with open(kvc, "wb") as f:
        f.write(data)
    for _ in range(a.rounds):
        for _ in range(a.repeats):
            r = subprocess.run([a.cli, "encode", path, "--out", os.path.join(tmp.name, "x.kvc"), "--json"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"kvscope-cli encode failed: {r.stderr.strip()}")
            file_enc = min(file_enc, json.loads(r.stdout)["encode_s"])
            r = subprocess.run([a.cli, "decode", kvc, "--out", os.path.join(tmp.name, "x.h5"), "--level", str(level),
                                "--json"], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"kvscope-cli decode failed: {r.stderr.strip()}")
            file_dec = min(file_dec, json.loads(r.stdout)["decode_s"])
        py_all = min(py_all, best_cpu(lambda: kvscope.encode(kv), a.repeats)[1])
        r = subprocess.run([a.cli, "bench", "codec", path, "--threads", "1", "--runs", "1", "--repeats", str(a.repeats),
                            "--level", str(level), "--device", "cpu", "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"kvscope-cli bench codec failed: {r.stderr.strip()}")
        j = json.loads(r.stdout)
        lib_enc = min(lib_enc, j["fp16_MB"] / j["encode_MBps"])
        lib_dec = min(lib_dec, j["fp16_MB"] / j["decode_MBps"])
        c, w, one = best_cpu(lambda: kvscope.encode(kv, level=level), a.repeats)
        py_enc, py_enc_wall = min(py_enc, c), min(py_enc_wall, w)
        c, w, _ = best_cpu(lambda: kvscope.decode(data, level=level), a.repeats)
        py_dec, py_dec_wall = min(py_dec, c), min(py_dec_wall, w)
        out = kvscope.decode(data, level=level)
        py_into = min(py_into, best_cpu(lambda: kvscope.decode(data, level=level, out=out), a.repeats)[0])

    print(f"{path}: {kv}, level {level}, {len(one)} bytes at that level alone")
    print(f"encode: library {lib_enc:.3f} s, kvscope.encode {py_enc:.3f} s CPU ({py_enc_wall:.3f} s wall): "
          f"x{py_enc / lib_enc:.3f} ({100 * (py_enc / lib_enc - 1):+.1f} %)")
    print(f"encode, every level: kvscope-cli encode's writeKvc {file_enc:.3f} s wall, kvscope.encode {py_all:.3f} s wall: "
          f"x{py_all / file_enc:.3f} ({100 * (py_all / file_enc - 1):+.1f} %)")
    print(f"decode: library {lib_dec:.3f} s, kvscope.decode {py_dec:.3f} s CPU ({py_dec_wall:.3f} s wall): "
          f"x{py_dec / lib_dec:.3f} ({100 * (py_dec / lib_dec - 1):+.1f} %)")
    print(f"decode into an existing KV (out=): kvscope.decode {py_into:.3f} s CPU: x{py_into / lib_dec:.3f} "
          f"({100 * (py_into / lib_dec - 1):+.1f} %)")
    print(f"decode, level {level} of the container: kvscope-cli decode's decodeAll {file_dec:.3f} s wall, kvscope.decode "
          f"{py_dec_wall:.3f} s wall: x{py_dec_wall / file_dec:.3f} ({100 * (py_dec_wall / file_dec - 1):+.1f} %)")


if __name__ == "__main__":
    main()
