"""kvscope.hf on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) in transformers (issue 33).

CTest py_hf (label model, opt-in). Exits 77 (skipped) without numpy, torch, transformers, gguf or
the model file (installer/fetch_model.sh).
"""

import json
import os
import subprocess
import sys
import unittest

MODEL = os.path.expanduser(os.environ.get("KVSCOPE_DEFAULT_MODEL", "~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
try:
    import numpy as np
    import torch
    import transformers  # noqa: F401
    import gguf  # noqa: F401
except ImportError as e:
    print("skip:", e)
    sys.exit(77)
if not os.path.exists(MODEL):
    print("skip: no default model at", MODEL)
    sys.exit(77)

import kvscope
from kvscope.hf import KVScopeCache, load_gguf_model
from transformers import DynamicCache

CLI = os.environ.get("KVSCOPE_CLI", "kvscope-cli")
PROMPT = "The capital of France is"
NEW_TOKENS = 16
_model = None


def model():
    global _model
    if _model is None:
        torch.manual_seed(0)
        _model = load_gguf_model(MODEL)
    return _model


def cli_generate(prompt, n):
    r = subprocess.run([CLI, "generate", "--model", MODEL, "--prompt", prompt, "--max-new-tokens", str(n),
                        "--kv-dtype", "fp32", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


def greedy(ids, cache):
    with torch.no_grad():
        out = model().generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               past_key_values=cache, max_new_tokens=NEW_TOKENS, do_sample=False,
                               pad_token_id=model().config.eos_token_id)
    return out[0, len(ids):].tolist()


def continuation_kl(context, continuation, cache):
    """Mean KL(full precision || cache) of the next-token distributions over the continuation
    (its tokens 1..n-1), the context prefilled into `cache` and compressed first, as `kvscope-cli
    eval` compresses a context and scores its continuation."""
    with torch.no_grad():
        ref = model()(torch.tensor([context + continuation])).logits[0, len(context):-1]
        model()(torch.tensor([context]), past_key_values=cache)
        if isinstance(cache, KVScopeCache):
            cache.compress()
        got = model()(torch.tensor([continuation]), past_key_values=cache).logits[0, :-1]
    p = torch.log_softmax(ref.double(), -1)
    q = torch.log_softmax(got.double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


class TransformersAgainstKvscope(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = cli_generate(PROMPT, NEW_TOKENS)
        cls.ids = cls.ref["prompt_tokens"] if isinstance(cls.ref["prompt_tokens"], list) else None
        if cls.ids is None:
            raise unittest.SkipTest("kvscope-cli generate --json gives no prompt ids")

    def test_greedy_equals_kvscope_runtime(self):
        self.assertEqual(greedy(self.ids, DynamicCache()), self.ref["tokens"])

    def test_compressed_prefix_is_what_kvscope_decodes(self):
        for level in (1, 3):
            with self.subTest(level=level):
                cache = KVScopeCache(level=level)
                tokens = greedy(self.ids, cache)
                self.assertEqual(len(tokens), NEW_TOKENS)
                P = len(self.ids)
                self.assertEqual(cache.segments[0]["start"], 0)
                self.assertEqual(cache.segments[0]["tokens"], P)
                # The prompt's states from a plain run, coded by kvscope directly.
                plain = DynamicCache()
                with torch.no_grad():
                    model()(torch.tensor([self.ids]), past_key_values=plain)
                kv = kvscope.KV.from_arrays([k[0].numpy() for k in plain.key_cache],
                                            [v[0].numpy() for v in plain.value_cache], dtype="float16")
                data = kvscope.encode(kv, level=level)
                self.assertEqual(cache.segments[0]["bytes"], len(data))
                dec = kvscope.decode(data)
                for l in range(kv.num_layers):
                    np.testing.assert_array_equal(cache.key_cache[l][0, :, :P].numpy(), dec.keys(l).astype(np.float32))
                    np.testing.assert_array_equal(cache.value_cache[l][0, :, :P].numpy(), dec.values(l).astype(np.float32))
                print(f"level {level}: greedy {tokens}, uncompressed {self.ref['tokens']}, "
                      f"{sum(a == b for a, b in zip(tokens, self.ref['tokens']))}/{NEW_TOKENS} equal, prompt {len(data)} bytes")


class CompressedContextQuality(unittest.TestCase):
    def test_kl_falls_with_the_level(self):
        samples = os.path.join(os.environ.get("KVSCOPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                               "samples", "contexts")
        with open(os.path.join(samples, "long_1k.txt")) as f:
            context = cli_generate(f.read(), 1)["prompt_tokens"]
        with open(os.path.join(samples, "long_1k.continuation.txt")) as f:
            continuation = cli_generate(f.read(), 1)["prompt_tokens"][:64]
        plain = continuation_kl(context, continuation, DynamicCache())
        self.assertLess(plain, 1e-6)  # the procedure itself changes nothing
        kl = {level: continuation_kl(context, continuation, KVScopeCache(level=level)) for level in (1, 2, 3)}
        print(f"{len(context)} context tokens, {len(continuation)} continuation tokens: KL "
              + ", ".join(f"level {l} {v:.5f}" for l, v in kl.items()))
        self.assertGreater(kl[1], kl[2])
        self.assertGreater(kl[2], kl[3])
        self.assertGreater(kl[3], 0)


if __name__ == "__main__":
    unittest.main()
