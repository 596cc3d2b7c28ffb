"""transformers generating with kvscope.hf.KVScopeCache, next to `kvscope-cli eval` on the same text.

    PYTHONPATH=build/dev/python KVSCOPE_CLI=build/dev/app/cli/kvscope-cli \
        ~/.cache/kvscope/pyenv/bin/python samples/python/hf_quality.py [--context long_1k] [--json]

The same sample context (a sample id of samples/contexts, with its continuation and question), the
same tokens and the same procedure on both sides, one row per codec and level `kvscope-cli eval
--context ID` measures (fp16, int8, kivi2, kivi4, zstd and every level of the default CacheGen
profile) and, with --transform (the default), every level of the transform codec's default
profile (`eval --codec transform --only-transform`: the calibrated ladder of the model, as
`--codec transform` without `--profile` uses it):
- kvscope: `kvscope-cli eval --context ID --no-text --json` (its runtime, KV in fp16, each row
  against its own fp16 run);
- transformers: the default model's GGUF file loaded by transformers (`kvscope.hf.load_gguf_model`),
  the context prefilled once in full precision; for each row a `KVScopeCache(codec, level,
  model=...)` (the model's RoPE and fingerprint, which the transform codec needs) takes
  those states, compresses them (`kvscope.encode`, then `kvscope.decode`), and, as eval does, the
  cache is cut to n-1 tokens and the last context token is run again followed by the continuation
  (KL and perplexity over every continuation token), and the question is answered greedily from
  the whole compressed context (token agreement with transformers' own answer from the
  uncompressed cache). KL and delta PPL are against transformers' own uncompressed run (fp32 KV).

The context's tokens are those `kvscope-cli capture` prefills (BOS and the opened chat turn), the
continuation's those of `kvscope-cli tokenize --no-special` (at most --max-continuation), the
question's those `kvscope-cli generate KV.h5 --prompt Q` runs after the cache. It also compares
the prompt's KV of both runtimes (capture's fp16 file against transformers' states rounded to
fp16) and the perplexity of the uncompressed runs: the two models' logits in one figure each.
"""

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch

import kvscope
from kvscope.hf import KVScopeCache, load_gguf_model
from transformers import DynamicCache

from cli_run import cli_json

DEFAULT_MODEL = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kvscope", "models",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
SOURCE_DIR = os.environ.get("KVSCOPE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def sample(context_id):
    """(text, continuation, question) of a sample id, as samples/contexts/manifest.json lists it."""
    folder = os.path.join(SOURCE_DIR, "samples", "contexts")
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
        entry = next((c for c in json.load(f)["contexts"] if c["id"] == context_id), None)
    if entry is None or "continuation_file" not in entry:
        raise SystemExit(f"--context {context_id}: not a sample with a continuation (samples/contexts/manifest.json)")

    def read(name):
        with open(os.path.join(folder, entry[name]), encoding="utf-8") as f:
            return f.read()

    question = json.loads(read("question_file"))["question"] if "question_file" in entry else None
    return read("file"), read("continuation_file"), question


class Hf:
    """The default model in transformers, with the scoring and answering procedure of eval."""

    def __init__(self, path):
        os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's per-tensor progress bar
        self.model = load_gguf_model(path)
        self.eos = self.model.config.eos_token_id

    def forward(self, ids, cache):
        with torch.no_grad():
            return self.model(torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0]

    def prefill(self, context):
        plain = DynamicCache()
        self.forward(context, plain)
        return plain

    def compressed(self, plain, codec, level):
        """A KVScopeCache holding the plain prefill's states (copies), compressed."""
        cache = KVScopeCache(codec=codec, level=level, residual_length=0, model=self.model)
        for l in range(len(plain.key_cache)):
            cache.update(plain.key_cache[l].clone(), plain.value_cache[l].clone(), l)
        cache.compress()
        return cache

    def score(self, cache, context, continuation):
        """(log-probs (m, vocab), mean NLL) of the continuation after the cache cut to n-1 tokens."""
        cache = copy.deepcopy(cache)
        cache.crop(len(context) - 1)
        logits = self.forward([context[-1]] + continuation[:-1], cache)
        logp = torch.log_softmax(logits.double(), -1)
        nll = -float(logp[torch.arange(len(continuation)), torch.tensor(continuation)].mean())
        return logp, nll

    def answer(self, cache, context, question, n):
        cache = copy.deepcopy(cache)
        ids = context + question
        with torch.no_grad():
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      past_key_values=cache, max_new_tokens=n, do_sample=False,
                                      eos_token_id=self.eos, pad_token_id=self.eos)
        tokens = out[0, len(ids):].tolist()
        return tokens[:-1] if tokens and tokens[-1] == self.eos else tokens  # eval's answers leave the stop id out


def kl(ref, cand):
    """Mean over positions of KL(ref || cand), each position's clamped at 0 (as eval does)."""
    return float(torch.clamp((ref.exp() * (ref - cand)).sum(-1), min=0).mean())


def agreement(a, b):
    """eval's token_agreement: identical positions / the longer answer's length (1 when both are empty)."""
    n = max(len(a), len(b))
    return 1.0 if n == 0 else sum(x == y for x, y in zip(a, b)) / n


def kv_agreement(plain, kv):
    """transformers' prompt states rounded to fp16 against capture's fp16 file: the largest
    difference relative to the layer's absmax, and the share of values that are bit-identical."""
    worst, same, total = 0.0, 0, 0
    for l in range(kv.num_layers):
        for got, ref in ((plain.key_cache[l], kv.keys(l)), (plain.value_cache[l], kv.values(l))):
            a = got[0].numpy().astype(np.float16)
            worst = max(worst, float(np.abs(a.astype(np.float32) - ref.astype(np.float32)).max() / np.abs(ref).max()))
            same += int((a == ref).sum())
            total += a.size
    return {"max_rel_error": worst, "identical": same / total}


def measure(model_path=DEFAULT_MODEL, context_id="long_1k", cli=os.environ.get("KVSCOPE_CLI", "kvscope-cli"),
            threads=1, max_continuation=256, answer_tokens=32, hf=None, log=print, transform=True):
    """Both sides on one sample: a dict with the tokens' counts, the uncompressed runs' agreement and
    one entry per row of eval (codec, level, then `hf` and `cli`: kl, delta_ppl_pct, token_agreement,
    bits_per_value); with transform, the rows of `eval --codec transform --only-transform` too."""
    torch.set_num_threads(threads)
    load = os.getloadavg()
    text, continuation_text, question = sample(context_id)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvscope-hf-") as tmp:
        kv_path = os.path.join(tmp, "ctx.h5")
        cli_json(cli, "capture", "--model", model_path, "--context", context_id, "--out", kv_path, "--threads", str(threads))
        kv = kvscope.read_kv(kv_path)
        context = list(kv.tokens)
        continuation = cli_json(cli, "tokenize", "--tokenizer", model_path, "--text", continuation_text,
                                "--no-special")["ids"][:max_continuation]
        gen = cli_json(cli, "generate", kv_path, "--model", model_path, "--prompt", question, "--max-new-tokens",
                       str(answer_tokens), "--threads", str(threads))
        question_ids = gen["prompt_tokens"]
    log(f"{context_id}: {len(context)} context tokens, {len(continuation)} continuation tokens, "
        f"{len(question_ids)} question tokens")
    common = ("--model", model_path, "--context", context_id, "--no-text", "--threads", str(threads),
              "--max-continuation", str(max_continuation), "--answer-tokens", str(answer_tokens))
    ev = cli_json(cli, "eval", *common)
    if transform:
        ev["results"] += cli_json(cli, "eval", *common, "--codec", "transform", "--only-transform")["results"]
    t_cli = time.perf_counter() - t0
    log(f"kvscope-cli eval: {len(ev['results'])} rows, {t_cli:.0f} s with capture, tokenize and generate")

    t0 = time.perf_counter()
    hf = hf or Hf(model_path)
    plain = hf.prefill(context)
    ref, ref_nll = hf.score(plain, context, continuation)
    ref_answer = hf.answer(plain, context, question_ids, answer_tokens)
    out = {
        "context": context_id, "num_tokens": len(context), "continuation_tokens": len(continuation),
        "kv_agreement": kv_agreement(plain, kv),
        "original": {"hf_ppl": math.exp(ref_nll), "cli_ppl": ev["original"]["ppl"], "hf_answer": ref_answer,
                     "cli_answer": gen["tokens"]},
        "rows": [],
    }
    fp16_bits = 16.0
    for row in ev["results"]:
        codec, level = row["codec"], row.get("level")
        cache = hf.compressed(plain, codec, level if codec in ("cachegen", "transform") else None)
        logp, nll = hf.score(cache, context, continuation)
        values = 2 * len(cache.key_cache) * cache.key_cache[0][0].numel()
        answer = hf.answer(cache, context, question_ids, answer_tokens)
        got = {"kl": kl(ref, logp), "delta_ppl_pct": 100 * (math.exp(nll - ref_nll) - 1),
               "token_agreement": agreement(ref_answer, answer), "answer": answer,
               "bits_per_value": 8 * cache.compressed_bytes / values}
        want = {k: row.get(k) for k in ("kl", "delta_ppl_pct", "token_agreement", "bits_per_value")}
        out["rows"].append({"codec": codec, "level": level, "hf": got, "cli": want})
        log(f"  {codec:8s} {level if level is not None else '':>2}  KL hf {got['kl']:.5f} cli {want['kl']:.5f}  "
            f"dPPL% hf {got['delta_ppl_pct']:+.3f} cli {want['delta_ppl_pct']:+.3f}  agreement hf "
            f"{got['token_agreement']:.3f} cli {want['token_agreement']:.3f}  bits/value hf {got['bits_per_value']:.3f} "
            f"cli {want['bits_per_value']:.3f} (fp16 {fp16_bits:.0f})")
    out["seconds"] = {"cli": t_cli, "hf": time.perf_counter() - t0}
    out["load_start"], out["load_end"] = load, os.getloadavg()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="the default model's GGUF file")
    ap.add_argument("--context", default="long_1k", help="a sample id with a continuation (samples/contexts)")
    ap.add_argument("--cli", default=os.environ.get("KVSCOPE_CLI", "kvscope-cli"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-continuation", type=int, default=256)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--no-transform", action="store_true", help="leave out the transform codec's levels")
    ap.add_argument("--json", action="store_true", help="print one JSON object (progress to stderr)")
    a = ap.parse_args()
    log = (lambda s: print(s, file=sys.stderr)) if a.json else print
    out = measure(a.model, a.context, a.cli, a.threads, a.max_continuation, a.answer_tokens, log=log,
                  transform=not a.no_transform)
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
