"""kvscope.hf on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) in transformers (issue 33).

CTest py_hf (labels model, python), run with the venv installer/setup.sh makes (transformers and
gguf from PyPI over Debian's python3-torch). Exits 77 (skipped) without numpy, torch, transformers,
gguf or the model file (installer/fetch_model.sh).
"""

import json
import os
import subprocess
import sys
import unittest

MODEL = os.path.expanduser(os.environ.get("KVSCOPE_DEFAULT_MODEL", "~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
SOURCE_DIR = os.environ.get("KVSCOPE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
try:
    import numpy as np
    import torch
    import transformers  # noqa: F401
    import gguf  # noqa: F401
except ImportError as e:
    print(f"skip: {e} ({sys.executable}; installer/setup.sh makes a venv with transformers and gguf, then rerun cmake)")
    sys.exit(77)
if not os.path.exists(MODEL):
    print("skip: no default model at", MODEL)
    sys.exit(77)

import kvscope
from kvscope.hf import KVScopeCache
from transformers import DynamicCache

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(SOURCE_DIR, "samples", "python"))
import hf_quality  # noqa: E402  (samples/python/hf_quality.py: the procedure next to kvscope-cli eval)

CLI = os.environ.get("KVSCOPE_CLI", "kvscope-cli")
# Greedy tokens of transformers and of kvscope's runtime (fp32 KV), 32 each, on three prompts.
# (Prompts whose answers run past 32 tokens: "The capital of France is" stops at EOS after 30.)
PROMPTS = ["The history of the printing press begins", "def fibonacci(n):", "Once upon a time, in a small village by the sea,"]
NEW_TOKENS = 32
_hf = None


def hf():
    global _hf
    if _hf is None:
        torch.set_num_threads(1)
        _hf = hf_quality.Hf(MODEL)
    return _hf


def model():
    return hf().model


def cli_generate(prompt, n):
    r = subprocess.run([CLI, "generate", "--model", MODEL, "--prompt", prompt, "--max-new-tokens", str(n),
                        "--kv-dtype", "fp32", "--threads", "1", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


def ladder_levels():
    """Levels of the default model's transform ladder (samples/profiles)."""
    with open(os.path.join(SOURCE_DIR, "samples", "profiles", "smollm2-135m-instruct.transform.json")) as f:
        return len(json.load(f)["transform"]["levels"])


def greedy(ids, cache):
    with torch.no_grad():
        out = model().generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               past_key_values=cache, max_new_tokens=NEW_TOKENS, do_sample=False,
                               pad_token_id=model().config.eos_token_id)
    return out[0, len(ids):].tolist()


class TransformersAgainstKvscope(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.refs = [cli_generate(p, NEW_TOKENS) for p in PROMPTS]

    def test_greedy_equals_kvscope_runtime(self):
        # The same GGUF in both runtimes: 32 greedy tokens on each of three prompts, token for token.
        for prompt, ref in zip(PROMPTS, self.refs):
            with self.subTest(prompt=prompt):
                self.assertEqual(len(ref["tokens"]), NEW_TOKENS)
                self.assertEqual(greedy(ref["prompt_tokens"], DynamicCache()), ref["tokens"])

    def test_compressed_prefix_is_what_kvscope_decodes(self):
        ids, ref = self.refs[0]["prompt_tokens"], self.refs[0]["tokens"]
        for level in (1, 3):
            with self.subTest(level=level):
                cache = KVScopeCache(level=level)
                tokens = greedy(ids, cache)
                self.assertEqual(len(tokens), NEW_TOKENS)
                P = len(ids)
                self.assertEqual(cache.segments[0]["start"], 0)
                self.assertEqual(cache.segments[0]["tokens"], P)
                # The prompt's states from a plain run, coded by kvscope directly.
                plain = DynamicCache()
                with torch.no_grad():
                    model()(torch.tensor([ids]), past_key_values=plain)
                kv = kvscope.KV.from_arrays([k[0].numpy() for k in plain.key_cache],
                                            [v[0].numpy() for v in plain.value_cache], dtype="float16")
                report = {}
                data = kvscope.encode(kv, level=level, report=report)
                self.assertEqual(cache.segments[0]["container_bytes"], len(data))
                self.assertEqual(cache.segments[0]["bytes"], report["levels"][0]["bytes"])
                dec = kvscope.decode(data)
                for l in range(kv.num_layers):
                    np.testing.assert_array_equal(cache.key_cache[l][0, :, :P].numpy(), dec.keys(l).astype(np.float32))
                    np.testing.assert_array_equal(cache.value_cache[l][0, :, :P].numpy(), dec.values(l).astype(np.float32))
                print(f"level {level}: greedy {sum(a == b for a, b in zip(tokens, ref))}/{NEW_TOKENS} tokens equal to "
                      f"the uncompressed run's, prompt {len(data)} bytes")


    def test_level_none_decodes_the_default_level(self):
        # KVScopeCache() (CacheGen, no level): every level coded, the profile's default decoded.
        torch.manual_seed(33)
        k, v = torch.randn(1, 3, 300, 64), torch.randn(1, 3, 300, 64)
        cache = KVScopeCache()
        for l in range(4):
            cache.update(k.clone(), v.clone(), l)
        cache.compress()
        kv = kvscope.KV.from_arrays([k[0].numpy()] * 4, [v[0].numpy()] * 4, dtype="float16")
        report = {}
        data = kvscope.encode(kv, report=report)
        self.assertEqual(report["default_level"], 2)
        self.assertEqual(cache.segments[0]["bytes"], report["levels"][1]["bytes"])
        np.testing.assert_array_equal(cache.key_cache[3][0].numpy(), kvscope.decode(data, level=2).keys(3).astype(np.float32))

    def test_transform_prefix_is_the_calibrated_ladder(self):
        # KVScopeCache(codec="transform", model=...) codes the prompt with the default ladder calibrated
        # for the model (the profile `kvscope-cli eval --codec transform` writes; NextToKvscopeEval,
        # which runs first, calibrates it when it is missing): RoPE undone with the model's own
        # frequencies, the level asked for decoded.
        from kvscope.hf import model_rope_inv_freq
        self.assertEqual(model().kvscope_fingerprint, kvscope.model_fingerprint(MODEL))
        ids = self.refs[2]["prompt_tokens"]
        plain = DynamicCache()
        with torch.no_grad():
            model()(torch.tensor([ids]), past_key_values=plain)
        kv = kvscope.KV.from_arrays([k[0].numpy() for k in plain.key_cache], [v[0].numpy() for v in plain.value_cache],
                                    dtype="float16", model_fingerprint=model().kvscope_fingerprint,
                                    rope_inv_freq=model_rope_inv_freq(model()))
        report = {}
        data = kvscope.encode(kv, codec="transform", report=report)
        self.assertEqual(report["model_from"], "profile")
        levels = len(report["levels"])
        for level in (1, levels):
            with self.subTest(level=level):
                cache = KVScopeCache(codec="transform", level=level, model=model())
                tokens = greedy(ids, cache)
                self.assertEqual(len(tokens), NEW_TOKENS)
                self.assertEqual(cache.segments[0]["container_bytes"], len(data))
                self.assertEqual(cache.segments[0]["bytes"], report["levels"][level - 1]["bytes"])
                dec = kvscope.decode(data, level=level)
                P = len(ids)
                for l in range(kv.num_layers):
                    np.testing.assert_array_equal(cache.key_cache[l][0, :, :P].numpy(), dec.keys(l).astype(np.float32))
                    np.testing.assert_array_equal(cache.value_cache[l][0, :, :P].numpy(), dec.values(l).astype(np.float32))
                print(f"transform level {level}: greedy {sum(a == b for a, b in zip(tokens, self.refs[2]['tokens']))}/"
                      f"{NEW_TOKENS} tokens equal to the uncompressed run's, prompt {report['levels'][level - 1]['bytes']} bytes")


class NextToKvscopeEval(unittest.TestCase):
    """samples/python/hf_quality.py on long_1k: every row of `kvscope-cli eval --context long_1k` (the
    baselines and each level of the default profile) and of `eval --codec transform --only-transform`
    (each level of the default transform ladder) measured by transformers with KVScopeCache."""

    @classmethod
    def setUpClass(cls):
        cls.m = hf_quality.measure(MODEL, "long_1k", CLI, threads=1, hf=hf())
        cls.rows = {(r["codec"], r["level"] if r["codec"] in ("cachegen", "transform") else None): r for r in cls.m["rows"]}
        print(json.dumps(cls.m))

    def test_same_tokens_same_states(self):
        m = self.m
        self.assertEqual((m["num_tokens"], m["continuation_tokens"]), (978, 256))
        # The prompt's KV of the two runtimes: fp32 forward passes of the same dequantised weights,
        # each rounded to fp16 (measured: at most 0.14 % of a layer's absmax apart, 54 % bit-identical).
        self.assertLess(m["kv_agreement"]["max_rel_error"], 0.005)
        self.assertGreater(m["kv_agreement"]["identical"], 0.4)
        # Perplexity of the continuation, uncompressed: the two runtimes' logits in one figure
        # (measured: 14.3935 and 14.3940).
        self.assertAlmostEqual(m["original"]["hf_ppl"] / m["original"]["cli_ppl"], 1.0, delta=0.001)
        self.assertEqual(m["original"]["hf_answer"], m["original"]["cli_answer"])

    def test_every_level_of_the_default_profile(self):
        levels = sorted(l for c, l in self.rows if c == "cachegen")
        self.assertEqual(levels, [1, 2, 3])
        for side in ("hf", "cli"):
            kl = [self.rows[("cachegen", l)][side]["kl"] for l in levels]
            self.assertGreater(kl[0], kl[1], side)
            self.assertGreater(kl[1], kl[2], side)
            self.assertGreater(kl[2], 0, side)

    def test_every_level_of_the_transform_ladder(self):
        ladder = ladder_levels()
        levels = sorted(l for c, l in self.rows if c == "transform")
        self.assertEqual(levels, list(range(1, ladder + 1)))
        for side in ("hf", "cli"):
            kl = [self.rows[("transform", l)][side]["kl"] for l in levels]
            bits = [self.rows[("transform", l)][side]["bits_per_value"] for l in levels]
            self.assertEqual(bits, sorted(bits), side)  # each level spends more bits than the one below
            self.assertGreater(kl[0], 4 * kl[-1], side)
            self.assertGreater(kl[-1], 0, side)

    def test_figures_match_eval(self):
        self.assertEqual(sorted(c for c, _ in self.rows),
                         ["cachegen"] * 3 + ["fp16", "int8", "kivi2", "kivi4"] + ["transform"] * ladder_levels() + ["zstd"])
        split = []  # rows whose greedy answers part (see below)
        for key, r in self.rows.items():
            with self.subTest(row=key):
                hf_row, cli_row = r["hf"], r["cli"]
                # The same codec on states that agree to fp16 rounding: the same size (zstd's
                # lossless size follows the bits that differ: 14.755 and 14.771 bits measured).
                self.assertAlmostEqual(hf_row["bits_per_value"] / cli_row["bits_per_value"], 1.0, delta=0.005)
                if abs(hf_row["token_agreement"] - cli_row["token_agreement"]) > 0.1:
                    split.append(key)
                if key[0] in ("fp16", "zstd"):
                    # Lossless on fp16 KV: eval's KL is 0; transformers' is the fp16 rounding of its fp32 states.
                    self.assertEqual(cli_row["kl"], 0)
                    self.assertLess(hf_row["kl"], 1e-5)
                    continue
                # Lossy rows: KL measured within 6 % of eval's for int8 (the smallest, 9.1e-5 against
                # 8.7e-5), 2.4 % at CacheGen level 3, 2.3 % at transform level 2, < 1 % elsewhere; delta
                # PPL within 0.1 points (transform included: the same calibrated ladder on both sides). The
                # references differ (fp32 KV here, fp16 KV in eval, the continuation's own KV too), and
                # the codec's bins flip for the values whose fp16 images differ between the runtimes.
                self.assertAlmostEqual(hf_row["kl"] / cli_row["kl"], 1.0, delta=0.15)
                self.assertAlmostEqual(hf_row["delta_ppl_pct"], cli_row["delta_ppl_pct"], delta=0.3)
        # A 32-token greedy answer follows the argmax token by token, so where two tokens' logits
        # are within the runtimes' fp16 noise it can part at that token and stay apart (measured
        # 2026-12-06 with a freshly calibrated ladder: transform level 5 took 527 for 441 at token
        # 11, agreement 0.31 against 0.91, while its KL agreed to 1.5 %). One row of the 15 may part
        # so; more means the answers differ for another reason than a near-tie.
        self.assertLessEqual(len(split), 1, "greedy answers part on %s" % split)


class Notebook(unittest.TestCase):
    def test_notebook_runs_and_transformers_answers_as_kvscope(self):
        # samples/python/notebook.py: capture, statistics, every level, answers from kvscope's runtime
        # and from transformers with KVScopeCache. The same compressed context gives the same greedy
        # answer in both runtimes, level by level.
        r = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "samples", "python", "notebook.py"),
                            "--new-tokens", "16"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        lines = r.stdout.splitlines()
        ours = {l.split(":")[0].strip(): l.split(":", 1)[1].strip() for l in lines if l.startswith("  level ") or l.startswith("  original:")}
        theirs = {}
        for l in lines:
            if l.startswith("  transformers, "):
                name, answer = l[len("  transformers, "):].split(":", 1)
                theirs[name.split(" (")[0]] = answer.strip()
        self.assertEqual(sorted(theirs), ["level 1", "level 2", "level 3", "original"])
        self.assertEqual(theirs, {k: ours[k] for k in theirs})


if __name__ == "__main__":
    unittest.main()
