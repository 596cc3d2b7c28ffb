"""kvscope's Python module against kvscope-cli on the same files (issue 33).

Run by CTest (tests/CMakeLists.txt: py_kvscope) with PYTHONPATH=<build>/python and KVSCOPE_CLI set;
by hand: PYTHONPATH=build/dev/python KVSCOPE_CLI=build/dev/app/cli/kvscope-cli python3 -m unittest
tests/python/test_kvscope.py. Exits 77 (CTest's skip) when numpy is missing.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
except ImportError:
    print("skip: numpy is not installed for", sys.executable)
    sys.exit(77)

import kvscope

CLI = os.environ.get("KVSCOPE_CLI", "kvscope-cli")
SOURCE_DIR = os.environ.get("KVSCOPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SMOLLM2_PROFILE = os.path.join(SOURCE_DIR, "samples", "profiles", "smollm2-135m-instruct.json")


def cli(*args, ok=True):
    """Runs kvscope-cli; returns (returncode, stdout, stderr)."""
    r = subprocess.run([CLI, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise AssertionError(f"kvscope-cli {' '.join(args)} failed: {r.stderr}")
    return r.returncode, r.stdout, r.stderr


def cli_error(*args):
    """The one-line message kvscope-cli prints after 'error: '."""
    code, _, err = cli(*args, ok=False)
    assert code != 0, f"kvscope-cli {' '.join(args)} succeeded"
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: "), line
    return line[len("error: "):]


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Files:
    """Synthetic KV files of three dtypes, written once by `kvscope-cli synth`."""

    dir = None

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir.name, name)

    @classmethod
    def setup(cls):
        if cls.dir:
            return
        cls.dir = tempfile.TemporaryDirectory(prefix="kvscope-pytest-")
        shape = ["--layers", "4", "--kv-heads", "2", "--head-dim", "32", "--tokens", "600"]
        for dtype in ("float16", "bfloat16", "float32"):
            cli("synth", "--out", cls.path(f"{dtype}.h5"), *shape, "--dtype", dtype, "--seed", "7")
        # SmolLM2's shape (30 layers, 3 KV heads of 64) for the shipped profile's calibrated tables.
        cli("synth", "--out", cls.path("smol.h5"), "--layers", "30", "--kv-heads", "3", "--head-dim", "64",
            "--tokens", "300", "--seed", "3")


def setUpModule():
    Files.setup()


class EncodeMatchesCli(unittest.TestCase):
    def check(self, kv_name, cli_opts, **py_opts):
        path = Files.path(kv_name)
        out = Files.path("cli.kvc")
        cli("encode", path, "--out", out, *cli_opts)
        ours = kvscope.encode(kvscope.read_kv(path), **py_opts)
        theirs = read(out)
        self.assertEqual(len(ours), len(theirs))
        self.assertTrue(ours == theirs, "kvscope.encode bytes differ from kvscope-cli encode")

    def test_default_cachegen_every_dtype(self):
        for dtype in ("float16", "bfloat16", "float32"):
            with self.subTest(dtype=dtype):
                self.check(f"{dtype}.h5", [])

    def test_baselines(self):
        for codec in ("fp16", "int8", "kivi2", "kivi4", "zstd"):
            with self.subTest(codec=codec):
                self.check("float16.h5", ["--codec", codec], codec=codec)

    def test_overrides(self):
        self.check("float16.h5", ["--chunk-tokens", "128", "--delta-group", "0", "--tables", "shared",
                                  "--key-quantizer", "channel"],
                   chunk_tokens=128, delta_group=0, tables="shared", key_quantizer="channel")

    def test_profile_with_calibrated_tables(self):
        # The shipped SmolLM2 profile: shared tables from the profile (not from the cache).
        self.check("smol.h5", ["--profile", SMOLLM2_PROFILE, "--force-profile"],
                   profile=SMOLLM2_PROFILE, force_profile=True)
        self.check("smol.h5", ["--profile", SMOLLM2_PROFILE, "--force-profile"],
                   profile=kvscope.Profile.load(SMOLLM2_PROFILE), force_profile=True)


    def test_tiny_and_incompressible(self):
        # A tiny cache's container outgrows the bytes object kvscope.encode writes into (its in-band
        # tables outweigh the values); fp16 and zstd come close to it.
        path = Files.path("tiny.h5")
        cli("synth", "--out", path, "--layers", "1", "--kv-heads", "1", "--head-dim", "16", "--tokens", "40")
        for codec in ("cachegen", "fp16", "zstd"):
            with self.subTest(codec=codec):
                self.check("tiny.h5", ["--codec", codec], codec=codec)
        kv = kvscope.read_kv(path)
        self.assertGreater(len(kvscope.encode(kv)), kv.nbytes * 9 // 8 + 256)

    def test_one_level(self):
        kv = kvscope.read_kv(Files.path("float16.h5"))
        whole = kvscope.encode(kv)
        one = kvscope.encode(kv, level=3)
        c = kvscope.Container(one)
        self.assertEqual(c.num_levels, 1)
        self.assertLess(len(one), len(whole))
        self.assertTrue(kvscope.decode(one).same_bytes(kvscope.decode(whole, level=3)))


class DecodeMatchesCli(unittest.TestCase):
    def test_into_an_existing_cache(self):
        kv = kvscope.read_kv(Files.path("float16.h5"))
        data = kvscope.encode(kv)
        out = kvscope.decode(data, level=1)
        again = kvscope.decode(data, level=3, out=out)
        self.assertIs(again, out)
        self.assertTrue(out.same_bytes(kvscope.decode(data, level=3)))
        self.assertIs(kvscope.Container(data).decode(2, out=out), out)
        self.assertTrue(out.same_bytes(kvscope.decode(data, level=2)))
        small = kvscope.read_kv(Files.path("float32.h5"))
        with self.assertRaisesRegex(kvscope.Error, r"^<bytes>: output: the cache to decode into is not of the file's shape and dtype$"):
            kvscope.decode(data, out=small)

    def test_levels(self):
        for dtype in ("float16", "bfloat16"):
            src = Files.path(f"{dtype}.h5")
            kvc = Files.path(f"{dtype}.kvc")
            cli("encode", src, "--out", kvc)
            chunks = kvscope.Container(kvc).num_chunks
            self.assertEqual(chunks, 3)
            for cli_level, py_level in (("1", 1), ("3", 3), ("", None), ("2,1,3", [2, 1, 3])):
                with self.subTest(dtype=dtype, level=cli_level):
                    out = Files.path("decoded.h5")
                    cli("decode", kvc, "--out", out, *(["--level", cli_level] if cli_level else []))
                    theirs = kvscope.read_kv(out)
                    ours = kvscope.decode(read(kvc), level=py_level)
                    self.assertTrue(ours.same_bytes(theirs))
                    self.assertEqual(ours.dtype, dtype)
                    self.assertTrue(kvscope.decode(kvc, level=py_level).same_bytes(theirs))

    def test_error_against_source(self):
        src = Files.path("float16.h5")
        kvc = Files.path("err.kvc")
        cli("encode", src, "--out", kvc)
        _, out, _ = cli("decode", kvc, "--out", Files.path("d.h5"), "--level", "1", "--source", src, "--json")
        theirs = json.loads(out)
        ours = kvscope.compare(kvscope.read_kv(src), kvscope.decode(kvc, level=1))
        self.assertEqual(ours["max_abs_error"], theirs["max_abs_error"])
        self.assertEqual(ours["rms_error"], theirs["rms_error"])
        self.assertEqual(ours["layers"], theirs["layers"])
        self.assertGreater(ours["max_abs_error"], 0)


class ContainerMatchesCli(unittest.TestCase):
    def test_chunks_and_levels(self):
        src = Files.path("float16.h5")
        kvc = Files.path("c.kvc")
        _, out, _ = cli("encode", src, "--out", kvc, "--json")
        report = json.loads(out)
        c = kvscope.Container(read(kvc))
        self.assertEqual(c.codec, "cachegen")
        self.assertEqual(c.num_chunks, report["num_chunks"])
        self.assertEqual(c.num_levels, len(report["levels"]))
        self.assertEqual(c.default_level, report["default_level"])
        self.assertEqual(c.file_bytes, report["file_bytes"])
        self.assertEqual(c.shape, (4, 2, 600, 32))
        for lev in report["levels"]:
            self.assertEqual(c.level_bytes(lev["level"]), lev["chunk_bytes"])
            self.assertEqual(sum(ch["levels"][lev["level"] - 1]["bytes"] for ch in c.chunks), lev["chunk_bytes"])
        self.assertEqual([ch["tokens"] for ch in c.chunks], [256, 256, 88])
        self.assertEqual(c.chunk_range(2), (512, 88))
        self.assertEqual(len(c.read_chunk(1, 2)), c.chunk_bytes(1, 2))


class Stats(unittest.TestCase):
    def test_matches_cli(self):
        src = Files.path("float16.h5")
        _, out, _ = cli("stats", src, "--json")
        theirs = json.loads(out)
        theirs.pop("file")
        ours = kvscope.stats(kvscope.read_kv(src))
        self.assertEqual(ours, theirs)


class Arrays(unittest.TestCase):
    def test_zero_copy_views(self):
        kv = kvscope.read_kv(Files.path("float16.h5"))
        k = kv.keys(1)
        self.assertEqual(k.shape, (2, 600, 32))
        self.assertEqual(k.dtype, np.float16)
        self.assertIs(k.base, kv)  # a view of the cache's storage, which it keeps alive
        self.assertTrue(np.shares_memory(k, kv.keys(1)))
        k[0, 0, 0] = 1.5
        self.assertEqual(kv.keys(1)[0, 0, 0], 1.5)  # writes go to the cache
        v = kv.values(3)
        del kv, k
        self.assertEqual(v.shape, (2, 600, 32))
        self.assertTrue(np.isfinite(v.astype(np.float32)).all())

    def test_values_match_h5py(self):
        try:
            import h5py
        except ImportError:
            self.skipTest("h5py is not installed")
        for dtype, npdtype in (("float16", np.float16), ("float32", np.float32)):
            kv = kvscope.read_kv(Files.path(f"{dtype}.h5"))
            with h5py.File(Files.path(f"{dtype}.h5"), "r") as f:
                np.testing.assert_array_equal(kv.keys(2), f["layers/02/key"][...])
                np.testing.assert_array_equal(kv.values(0), f["layers/00/value"][...])
            self.assertEqual(kv.keys(0).dtype, npdtype)

    def test_bfloat16(self):
        kv = kvscope.read_kv(Files.path("bfloat16.h5"))
        raw = kv.keys(0, raw=True)
        self.assertEqual(raw.dtype, np.uint16)
        self.assertIs(raw.base, kv)
        as_float = kv.keys(0)
        self.assertEqual(as_float.dtype, np.float32)
        np.testing.assert_array_equal(as_float, (raw.astype(np.uint32) << 16).view(np.float32))

    def test_from_arrays_round_trip(self):
        for dtype in ("float16", "bfloat16", "float32"):
            with self.subTest(dtype=dtype):
                kv = kvscope.read_kv(Files.path(f"{dtype}.h5"))
                raw = dtype == "bfloat16"  # numpy has no bfloat16: its bit patterns
                keys = [kv.keys(l, raw=raw) for l in range(kv.num_layers)]
                values = np.stack([kv.values(l, raw=raw) for l in range(kv.num_layers)])
                back = kvscope.KV.from_arrays(keys, values, dtype=dtype, model_name=kv.model_name,
                                              model_fingerprint=kv.model_fingerprint, tokens=kv.tokens,
                                              context=kv.context)
                self.assertTrue(back.same_bytes(kv))
                path = Files.path("roundtrip.h5")
                back.write(path)
                self.assertTrue(kvscope.read_kv(path).same_bytes(kv))
                self.assertEqual(kvscope.encode(back), kvscope.encode(kv))

    def test_from_arrays_rope(self):
        # The RoPE the keys carry (what the transform codec undoes) set from Python, kept by the file.
        kv = kvscope.read_kv(Files.path("float16.h5"))
        freq = 10000.0 ** (-np.arange(kv.head_dim // 2, dtype=np.float32) / (kv.head_dim // 2))
        keys = [kv.keys(l) for l in range(kv.num_layers)]
        values = [kv.values(l) for l in range(kv.num_layers)]
        back = kvscope.KV.from_arrays(keys, values, rope_inv_freq=freq, rope_position0=7)
        np.testing.assert_array_equal(back.rope_inv_freq, freq)
        self.assertEqual(back.rope_position0, 7)
        path = Files.path("rope.h5")
        back.write(path)
        again = kvscope.read_kv(path)
        np.testing.assert_array_equal(again.rope_inv_freq, freq)
        self.assertEqual(again.rope_position0, 7)
        self.assertIsNone(kvscope.KV.from_arrays(keys, values).rope_inv_freq)
        back.rope_inv_freq = None
        self.assertIsNone(back.rope_inv_freq)
        back.rope_inv_freq = list(freq)
        back.rope_position0 = 3
        self.assertEqual(back.rope_position0, 3)
        with self.assertRaisesRegex(kvscope.Error, r"^rope_inv_freq: expected head_dim / 2 = %d frequencies, got shape \(%d\)$" % (
                kv.head_dim // 2, kv.head_dim // 2 - 1)):
            kvscope.KV.from_arrays(keys, values, rope_inv_freq=freq[1:])
        with self.assertRaisesRegex(kvscope.Error, r"^rope_inv_freq\[2\]: -1\.0+ is not a positive frequency$"):
            kvscope.KV.from_arrays(keys, values, rope_inv_freq=np.where(np.arange(freq.size) == 2, -1, freq))
        with self.assertRaisesRegex(kvscope.Error, r"^rope_position0: -1 is negative$"):
            kvscope.KV.from_arrays(keys, values, rope_inv_freq=freq, rope_position0=-1)

    def test_from_arrays_rounds_other_floats(self):
        x = np.linspace(-2, 2, 2 * 3 * 8 * 16, dtype=np.float64).reshape(2, 3, 8, 16)
        kv = kvscope.KV.from_arrays(x, -x, dtype="float16")
        self.assertEqual(kv.shape, (2, 3, 8, 16))
        np.testing.assert_array_equal(kv.keys(1), x[1].astype(np.float16))
        np.testing.assert_array_equal(kv.values(0), (-x[0]).astype(np.float16))


class Errors(unittest.TestCase):
    def test_corrupt_container_has_the_cli_message(self):
        src = Files.path("float16.h5")
        kvc = Files.path("bad.kvc")
        cli("encode", src, "--out", kvc)
        data = bytearray(read(kvc))
        data[200] ^= 0xFF  # inside chunk 0's payload: its CRC no longer matches
        with open(kvc, "wb") as f:
            f.write(data)
        expected = cli_error("decode", kvc, "--out", Files.path("x.h5"), "--level", "1")
        self.assertIn("CRC", expected)
        with self.assertRaises(kvscope.Error) as e:
            kvscope.decode(kvc, level=1)
        self.assertEqual(str(e.exception), expected)
        with self.assertRaises(kvscope.Error) as e:
            kvscope.decode(bytes(data), level=1, name=kvc)
        self.assertEqual(str(e.exception), expected)
        self.assertIsInstance(e.exception, RuntimeError)
        self.assertIsInstance(e.exception, ValueError)

    def test_truncated_header(self):
        whole = Files.path("whole.kvc")
        cli("encode", Files.path("float16.h5"), "--out", whole)
        kvc = Files.path("short.kvc")
        with open(kvc, "wb") as f:
            f.write(read(whole)[:100])  # the header alone is 160 bytes
        expected = cli_error("decode", kvc, "--out", Files.path("x.h5"))
        with self.assertRaises(kvscope.Error) as e:
            kvscope.Container(kvc)
        self.assertEqual(str(e.exception), expected)

    def test_truncated_kv_file(self):
        bad = Files.path("truncated.h5")
        with open(bad, "wb") as f:
            f.write(read(Files.path("float16.h5"))[:5000])
        expected = cli_error("stats", bad)
        with self.assertRaises(kvscope.Error) as e:
            kvscope.read_kv(bad)
        self.assertEqual(str(e.exception), expected)

    def test_level_out_of_range(self):
        kvc = Files.path("lv.kvc")
        cli("encode", Files.path("float16.h5"), "--out", kvc)
        expected = cli_error("decode", kvc, "--out", Files.path("x.h5"), "--level", "9")
        with self.assertRaises(kvscope.Error) as e:
            kvscope.decode(kvc, level=9)
        self.assertEqual(str(e.exception), expected)

    def test_profile_of_another_model(self):
        expected = cli_error("encode", Files.path("smol.h5"), "--out", Files.path("x.kvc"), "--profile", SMOLLM2_PROFILE)
        with self.assertRaises(kvscope.Error) as e:
            kvscope.encode(kvscope.read_kv(Files.path("smol.h5")), profile=SMOLLM2_PROFILE)
        self.assertEqual(str(e.exception), expected)

    def test_transform_on_a_cache_without_rope(self):
        # Synthetic caches carry no RoPE parameters, which the default transform undoes: whatever
        # the CLI does with them (refuse, or fit without), Python does the same.
        path = Files.path("float32.h5")
        out = Files.path("t.kvc")
        code, _, err = cli("encode", path, "--out", out, "--codec", "transform", ok=False)
        kv = kvscope.read_kv(path)
        if code == 0:
            self.assertTrue(kvscope.encode(kv, codec="transform") == read(out))
            return
        with self.assertRaises(kvscope.Error) as e:
            kvscope.encode(kv, codec="transform")
        self.assertEqual("error: " + str(e.exception), err.strip().splitlines()[-1])

    def test_unknown_codec(self):
        expected = cli_error("encode", Files.path("float16.h5"), "--out", Files.path("x.kvc"), "--codec", "lz4")
        with self.assertRaises(kvscope.Error) as e:
            kvscope.encode(kvscope.read_kv(Files.path("float16.h5")), codec="lz4")
        self.assertEqual(str(e.exception), expected)

    def test_layer_out_of_range_and_wrong_dtype(self):
        kv = kvscope.read_kv(Files.path("float16.h5"))
        with self.assertRaisesRegex(kvscope.Error, r"^layer 4 out of range \(the cache has 4 layers\)$"):
            kv.keys(4)
        with self.assertRaisesRegex(kvscope.Error, "layer -1 out of range"):
            kv.values(-1)
        with self.assertRaisesRegex(kvscope.Error, r"^keys\[0\]: dtype int32 is not float16 or float32"):
            kvscope.KV.from_arrays(np.zeros((1, 2, 3, 4), np.int32), np.zeros((1, 2, 3, 4), np.int32))
        with self.assertRaisesRegex(kvscope.Error, r"^values\[0\]: shape differs"):
            kvscope.KV.from_arrays(np.zeros((1, 2, 3, 4), np.float16), np.zeros((1, 2, 3, 5), np.float16))
        c = kvscope.Container(kvscope.encode(kv))
        with self.assertRaisesRegex(kvscope.Error, r"chunk 3 does not exist \(the file has 3\)"):
            c.read_chunk(3, 1)


class DefaultTransform(unittest.TestCase):
    """encode(kv, codec="transform") without a profile: the CLI's default ladder, same bytes."""

    FINGERPRINT = "2b5d3154c5afb0c8"  # the SmolLM2 ladder's (samples/profiles/smollm2-135m-instruct.transform.json)

    def kv_with_rope(self):
        try:
            import h5py
        except ImportError:
            self.skipTest("h5py is not installed")
        path = Files.path("smol-rope.h5")
        if not os.path.exists(path):
            kv = kvscope.read_kv(Files.path("smol.h5"))
            kv.model_fingerprint = self.FINGERPRINT
            kv.write(path)
            with h5py.File(path, "r+") as f:  # RoPE parameters, as a capture of the model writes them
                f.create_dataset("rope_inv_freq", data=100000.0 ** (-np.arange(32, dtype=np.float32) / 32))
        return path

    def encode_both(self, path, cache_home):
        old = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = cache_home  # read by the CLI and by the module
        try:
            out = Files.path("dt.kvc")
            _, stdout, err = cli("encode", path, "--out", out, "--codec", "transform", "--json")
            report = {}
            ours = kvscope.encode(kvscope.read_kv(path), codec="transform", report=report)
        finally:
            if old is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = old
        theirs = read(out)
        self.assertTrue(ours == theirs, "kvscope.encode(codec='transform') differs from kvscope-cli encode --codec transform")
        j = json.loads(stdout)
        self.assertEqual(report["file_bytes"], j["file_bytes"])
        self.assertEqual(report["model_from"], j["model_from"])
        for mine, its in zip(report["levels"], j["levels"], strict=True):
            for k in ("level", "chunk_bytes", "table_bytes", "side_bytes", "bytes"):
                self.assertEqual(mine[k], its[k], k)
            self.assertAlmostEqual(mine["bits_per_value"], its["bits_per_value"], places=12)
        self.reports = getattr(self, "reports", []) + [report]
        return ours, "no calibrated transform profile" not in err

    def test_from_arrays_with_rope_codes_as_the_file(self):
        # A cache assembled from arrays (a transformers cache, say) with the model's RoPE and
        # fingerprint gives the container of the same cache read from a capture file.
        path = self.kv_with_rope()
        kv = kvscope.read_kv(path)
        layers = range(kv.num_layers)
        mine = kvscope.KV.from_arrays([kv.keys(l) for l in layers], [kv.values(l) for l in layers],
                                      model_fingerprint=kv.model_fingerprint, rope_inv_freq=kv.rope_inv_freq,
                                      model_name=kv.model_name, tokens=kv.tokens, context=kv.context)
        self.assertEqual(kvscope.encode(mine, codec="transform"), kvscope.encode(kv, codec="transform"))

    def test_uncalibrated_and_calibrated_ladder(self):
        path = self.kv_with_rope()
        with tempfile.TemporaryDirectory(prefix="kvscope-xdg-") as empty:
            fitted, calibrated = self.encode_both(path, empty)
            self.assertFalse(calibrated)
        # The user's calibrated copy of the ladder (written once by eval/stream with the model).
        home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        cached = os.path.join(home, "kvscope", "profiles", self.FINGERPRINT + ".transform.json")
        if not os.path.exists(cached):
            self.skipTest(f"no calibrated default ladder in {cached} (kvscope-cli eval --codec transform makes it)")
        with tempfile.TemporaryDirectory(prefix="kvscope-xdg-") as home2:
            os.makedirs(os.path.join(home2, "kvscope", "profiles"))
            with open(cached, "rb") as src, open(os.path.join(home2, "kvscope", "profiles", self.FINGERPRINT + ".transform.json"), "wb") as dst:
                dst.write(src.read())
            ladder, calibrated = self.encode_both(path, home2)
        if not calibrated:
            self.skipTest(f"{cached} is a fit of an older ladder (the CLI refits it with the model)")
        self.assertNotEqual(ladder, fitted)  # the calibrated model, not a fit on this cache
        # encode(report=) gives the sizes of `encode --json`: what travels with a level besides its
        # chunks is the means adapted to this cache (2 x layers x channels floats) for the calibrated
        # ladder, the fitted transform's statistics otherwise (checked against the CLI in encode_both).
        kv = kvscope.read_kv(path)
        means = 2 * kv.num_layers * kv.num_kv_heads * kv.head_dim * 4
        self.assertEqual({l["side_bytes"] for l in self.reports[1]["levels"]}, {means})
        self.assertEqual(self.reports[1]["model_from"], "profile")
        self.assertGreater(self.reports[0]["levels"][0]["side_bytes"], means)
        self.assertEqual(self.reports[0]["model_from"], "cache")
        with open(os.path.join(SOURCE_DIR, "samples", "profiles", "smollm2-135m-instruct.transform.json")) as f:
            levels = len(json.load(f)["transform"]["levels"])
        self.assertEqual(kvscope.Container(ladder).num_levels, levels)


class Example(unittest.TestCase):
    def test_sample_runs(self):
        # samples/python/example.py on a KV file: every level's size and error, the baselines.
        r = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "samples", "python", "example.py"),
                            Files.path("float16.h5")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        kv = kvscope.read_kv(Files.path("float16.h5"))
        c = kvscope.Container(kvscope.encode(kv))
        for level in (1, 2, 3):
            size = c.level_bytes(level) + c.level_table_bytes(level)
            self.assertIn(f"level {level}: {size:9d} bytes", r.stdout)
        self.assertIn("int8", r.stdout)


if __name__ == "__main__":
    unittest.main()
