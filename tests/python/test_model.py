"""kvscope.Model and kvscope.eval_suite against kvscope-cli on the default model (issue 33).

CTest py_model (labels model and python) with PYTHONPATH=<build>/python, KVSCOPE_CLI and
KVSCOPE_SOURCE_DIR set; by hand: PYTHONPATH=build/dev/python KVSCOPE_CLI=build/dev/app/cli/kvscope-cli
/usr/bin/python3 tests/python/test_model.py -v. Exits 77 (CTest's skip) without numpy, without the
runtime module (KVSCOPE_PYTHON_RUNTIME=OFF) or without the default model (kvscope-cli fetch-model).
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

MODEL = os.environ.get("KVSCOPE_MODEL") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvscope", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.path.exists(MODEL):
    print("skip: no default model at", MODEL, "(kvscope-cli fetch-model)")
    sys.exit(77)
try:
    from kvscope import _kvscope_runtime  # noqa: F401
except ImportError as e:
    print("skip: the runtime module is not built:", e)
    sys.exit(77)

CLI = os.environ.get("KVSCOPE_CLI", "kvscope-cli")
SOURCE_DIR = os.environ.get("KVSCOPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CONTEXT = ("The lighthouse on Skerry Point was built in 1871 by the engineer Ada Morven. Its lamp burned whale oil "
           "until 1902, when a paraffin burner replaced it, and the keeper's logbook records every storm since.")
QUESTION = "Who built the lighthouse?"
PROMPT = "The capital of France is"
tmp = None
model = None


def cli(*args, ok=True):
    r = subprocess.run([CLI, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise AssertionError(f"kvscope-cli {' '.join(args)} failed: {r.stderr}")
    return r


def cli_json(*args):
    return json.loads(cli(*args, "--json").stdout)


def cli_error(*args):
    """The one-line message kvscope-cli prints after 'error: '."""
    r = cli(*args, ok=False)
    assert r.returncode != 0, f"kvscope-cli {' '.join(args)} succeeded"
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), line
    return line[len("error: "):]


def path(name):
    return os.path.join(tmp.name, name)


def setUpModule():
    global tmp, model
    tmp = tempfile.TemporaryDirectory(prefix="kvscope-pymodel-")
    with open(path("ctx.txt"), "w") as f:
        f.write(CONTEXT)
    model = kvscope.Model(threads=1)


def tearDownModule():
    tmp.cleanup()


def assert_same_cache(test, a, b):
    """Same shape, dtype, metadata, values and attention statistics."""
    test.assertEqual(a.shape, b.shape)
    test.assertEqual(a.dtype, b.dtype)
    test.assertEqual(a.tokens, b.tokens)
    test.assertEqual(a.context, b.context)
    test.assertEqual(a.model_name, b.model_name)
    test.assertEqual(a.model_fingerprint, b.model_fingerprint)
    test.assertTrue(a.same_bytes(b))
    np.testing.assert_array_equal(a.rope_inv_freq, b.rope_inv_freq)
    test.assertEqual(a.rope_position0, b.rope_position0)
    for l in range(a.num_layers):
        np.testing.assert_array_equal(a.keys(l), b.keys(l))
        np.testing.assert_array_equal(a.values(l), b.values(l))
        for stat in ("query_sq", "value_weight", "attn_mass"):
            x, y = getattr(a, stat)(l), getattr(b, stat)(l)
            test.assertEqual(x is None, y is None, f"layer {l} {stat}")
            if x is not None:
                np.testing.assert_array_equal(x, y)


class Capture(unittest.TestCase):
    def test_same_cache_as_cli_capture(self):
        cli("capture", "--context", path("ctx.txt"), "--out", path("cli.h5"), "--threads", "1")
        ref = kvscope.read_kv(path("cli.h5"))
        kv = model.capture(CONTEXT)
        self.assertEqual(kv.tokens, cli_json("tokenize", "--text", "<|im_start|>user\n" + CONTEXT)["ids"])
        self.assertIsNotNone(kv.query_sq(0))  # the statistics the transform codec weights errors by
        self.assertIsNone(kv.attn_mass(0))
        assert_same_cache(self, kv, ref)
        # The same container bytes, CacheGen and the transform codec (which reads the statistics).
        self.assertEqual(kvscope.encode(kv), kvscope.encode(ref))
        self.assertEqual(kvscope.encode(kv, codec="transform"), kvscope.encode(ref, codec="transform"))

    def test_attention_mass_as_cli(self):
        cli("capture", "--context", path("ctx.txt"), "--out", path("mass.h5"), "--threads", "1", "--attn-mass")
        kv = kvscope.Model(threads=1, attn_mass=True).capture(CONTEXT)
        mass = kv.attn_mass(0)
        self.assertEqual(mass.shape, (kv.num_kv_heads, kv.num_tokens))
        self.assertGreater(float(mass.sum()), 0)
        assert_same_cache(self, kv, kvscope.read_kv(path("mass.h5")))


class Generate(unittest.TestCase):
    def test_greedy_tokens_as_cli(self):
        for chat in (False, True):
            with self.subTest(chat=chat):
                flags = ["--chat"] if chat else []
                ref = cli_json("generate", "--prompt", PROMPT, "--max-new-tokens", "12", "--threads", "1", *flags)
                got = model.generate_json(PROMPT, max_new_tokens=12, chat=chat)
                self.assertEqual(got["prompt_tokens"], ref["prompt_tokens"])
                self.assertEqual(got["tokens"], ref["tokens"])
                if not got["stopped_at_eos"]:
                    self.assertEqual(len(got["tokens"]), 12)
                self.assertEqual(model.generate(PROMPT, max_new_tokens=12, chat=chat), ref["text"])

    def test_from_a_cache_as_cli(self):
        # generate KV.h5: the question after the captured context, from the file and from memory.
        cli("capture", "--context", path("ctx.txt"), "--out", path("gen.h5"), "--threads", "1")
        ref = cli_json("generate", path("gen.h5"), "--prompt", QUESTION, "--max-new-tokens", "16", "--threads", "1")
        self.assertEqual(ref["cached_tokens"], kvscope.read_kv(path("gen.h5")).num_tokens)
        for kv in (kvscope.read_kv(path("gen.h5")), model.capture(CONTEXT)):
            got = model.generate_json(QUESTION, kv=kv, max_new_tokens=16)
            self.assertEqual(got["prompt_tokens"], ref["prompt_tokens"])
            self.assertEqual(got["tokens"], ref["tokens"])
        self.assertIn("Morven", ref["text"])  # the model read the cached context

    def test_from_a_compressed_cache_as_cli(self):
        kv = model.capture(CONTEXT)
        decoded = kvscope.decode(kvscope.encode(kv, level=1))
        decoded.write(path("dec.h5"))
        ref = cli_json("generate", path("dec.h5"), "--prompt", QUESTION, "--max-new-tokens", "16", "--threads", "1")
        self.assertEqual(model.generate_json(QUESTION, kv=decoded, max_new_tokens=16)["tokens"], ref["tokens"])


class TokensAndInfo(unittest.TestCase):
    def test_tokenize_as_cli(self):
        self.assertEqual(model.tokenize(CONTEXT), cli_json("tokenize", "--text", CONTEXT)["ids"])
        self.assertEqual(model.tokenize(CONTEXT, special=False), cli_json("tokenize", "--text", CONTEXT, "--no-special")["ids"])
        self.assertEqual(model.detokenize(model.tokenize(CONTEXT, special=False)), CONTEXT)

    def test_info_as_cli(self):
        ref = cli_json("info", "--threads", "1")
        got = model.info
        for k in ("load_s",):
            ref.pop(k)
            got.pop(k)
        self.assertEqual(got, ref)
        self.assertEqual((model.architecture, model.num_layers, model.num_heads, model.num_kv_heads, model.head_dim),
                         (ref["architecture"], ref["num_layers"], ref["num_heads"], ref["num_kv_heads"], ref["head_dim"]))
        self.assertEqual(model.fingerprint, model.capture("Hi.").model_fingerprint)
        # kvscope.model_fingerprint: the same without building a runtime (what kvscope.hf records).
        self.assertEqual(kvscope.model_fingerprint(), ref["fingerprint"])
        self.assertEqual(kvscope.model_fingerprint(ref["path"]), ref["fingerprint"])


class Errors(unittest.TestCase):
    def check(self, cli_args, call):
        expected = cli_error(*cli_args)
        with self.assertRaises(kvscope.Error) as e:
            call()
        self.assertEqual(str(e.exception), expected)

    def test_missing_model(self):
        self.check(["info", path("no-such-model.gguf")], lambda: kvscope.Model(path("no-such-model.gguf")))

    def test_not_a_model(self):
        self.check(["info", path("ctx.txt")], lambda: kvscope.Model(path("ctx.txt")))

    def test_bad_option(self):
        self.check(["info", "--compute", "fp16"], lambda: kvscope.Model(compute="fp16"))

    def test_cache_of_another_shape(self):
        kvscope.synthetic(layers=4, kv_heads=2, head_dim=32, tokens=40).write(path("synth.h5"))
        self.check(["generate", path("synth.h5"), "--prompt", QUESTION, "--threads", "1"],
                   lambda: model.generate(QUESTION, kv=kvscope.read_kv(path("synth.h5"))))

    def test_no_new_tokens(self):
        self.check(["generate", "--prompt", PROMPT, "--max-new-tokens", "0"], lambda: model.generate(PROMPT, max_new_tokens=0))

    def test_not_a_cache(self):
        with self.assertRaises(kvscope.Error):
            model.generate(PROMPT, kv=b"not a cache")

    def test_bad_suite(self):
        self.check(["eval", "--suite", path("ctx.txt"), "--threads", "1"], lambda: kvscope.eval_suite(path("ctx.txt")))


def strip_times(j):
    """The figures of an eval --suite object without its timings (seconds differ run to run)."""
    if isinstance(j, dict):
        return {k: strip_times(v) for k, v in j.items() if k != "timings" and not k.endswith("_s")}
    if isinstance(j, list):
        return [strip_times(v) for v in j]
    return j


class Suite(unittest.TestCase):
    def test_eval_suite_as_cli(self):
        # One item of mini.json, fp16, int8 and CacheGen level 1 (about 15 s a run on an idle 2-core
        # machine). The CLI writes the reference cache, eval_suite reads it: figures equal but timings.
        suite = os.path.join(SOURCE_DIR, "samples", "suites", "mini.json")
        cache = path("suite-ref")
        ref = cli_json("eval", "--suite", suite, "--items", "caemholm", "--baselines", "int8", "--levels", "1",
                       "--suite-cache", cache, "--threads", "1")
        got = kvscope.eval_suite(suite, items=["caemholm"], baselines=["int8"], levels=[1], suite_cache=cache, threads=1)
        self.assertEqual([(r["codec"], r["level"]) for r in got["results"]], [("fp16", 1), ("int8", 1), ("cachegen", 1)])
        self.assertEqual(got["items"], ["caemholm"])
        self.assertGreater(got["questions"], 0)
        self.assertEqual(ref["reference_cache"]["prefills"], 1)
        self.assertEqual(got["reference_cache"]["prefills"], 0)  # read from the CLI's cache
        for j in (ref, got):
            j.pop("reference_cache")
        self.assertEqual(strip_times(got), strip_times(ref))


class Example(unittest.TestCase):
    def test_example_with_the_model(self):
        # samples/python/example.py --model: the capture, every level, the answer from each decoded cache.
        r = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "samples", "python", "example.py"), "--model",
                            "--context", path("ctx.txt"), "--question", QUESTION], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        kv = model.capture(CONTEXT)
        self.assertIn(f"original: {model.generate(QUESTION, kv=kv, max_new_tokens=16)!r}", r.stdout)
        answer = model.generate(QUESTION, kv=kvscope.decode(kvscope.encode(kv), level=1), max_new_tokens=16)
        self.assertIn(f"level 1:  {answer!r}", r.stdout)
        self.assertIn("level 3:  ", r.stdout)


class Import(unittest.TestCase):
    def test_codec_part_loads_no_torch(self):
        code = ("import sys, kvscope; kvscope.synthetic(); maps = open('/proc/self/maps').read(); "
                "print('kvscope._kvscope_runtime' in sys.modules, 'libtorch' in maps)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["False", "False"])
        code = "import kvscope; print(kvscope.Model.__module__, 'Model' in dir(kvscope))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["kvscope._kvscope_runtime", "True"])


if __name__ == "__main__":
    unittest.main()
