#!/usr/bin/env python3
"""Cut the long measurement contexts from wrenfield_history.txt and write manifest.json.

Exact command (from the repository root, with a venv that has `gguf` and `tokenizers`):

    python3 -m venv /opt/samplesenv && /opt/samplesenv/bin/pip install gguf tokenizers
    /opt/samplesenv/bin/python samples/contexts/build_contexts.py \
        --gguf ~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf

Token counts are those of the tokenizer embedded in the GGUF file (SmolLM2: byte-level BPE,
49152 entries, llama.cpp pre-tokenizer "smollm" = single digits, then the GPT-2 split), counted
without BOS/EOS or a chat template. Without --gguf the script estimates 4.43 characters a token
(the measured ratio on wrenfield_history.txt) and says so in the manifest ("tokens_exact": false).

Cutting rule, for each target T in (1000, 4000, 8000):
  * the context is the prefix of wrenfield_history.txt that ends with the last sentence of a
    paragraph of body text (never a heading), the one whose token count is closest to T; it has
    no trailing newline;
  * the continuation starts right after it, with the paragraph break "\\n\\n", and takes whole
    sentences until it holds at least 250 tokens; it has no trailing space or newline;
  * so context + continuation, concatenated byte for byte, is a prefix of the source text, and
    tokenizing the two files separately gives the same tokens as tokenizing the concatenation
    (checked below; a context ending in "\\n\\n" would not: the split makes "\\n\\n" one token
    at the end of a text but two before a letter).
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = "wrenfield_history.txt"
TARGETS = [(1000, "long_1k"), (4000, "long_4k"), (8000, "long_8k")]
MIN_CONT_TOKENS = 250
CHARS_PER_TOKEN = 4.43
DEMOS = ["technical_note", "story", "conversation"]


def load_gguf_tokenizer(path):
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    reader = GGUFReader(path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    pre = strings("tokenizer.ggml.pre")[0] if "tokenizer.ggml.pre" in reader.fields else ""
    if pre != "smollm":
        sys.exit(f"unexpected pre-tokenizer {pre!r}: this script knows SmolLM2's only")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()

    def count(text):
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text, "tokenizer round trip failed"
        return len(ids)

    return count


def estimate(text):
    return round(len(text) / CHARS_PER_TOKEN)


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


def write(name, text):
    with open(os.path.join(HERE, name), "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", help="GGUF model whose tokenizer counts tokens")
    args = ap.parse_args()
    count = load_gguf_tokenizer(os.path.expanduser(args.gguf)) if args.gguf else estimate
    exact = bool(args.gguf)

    src = read(SOURCE)
    # paragraph breaks after body text (not after a heading)
    breaks = [m.start() + len(m.group(1)) for m in re.finditer(r"([.!?]\"?)\n\n", src)]
    sentence_ends = sorted({m.end() for m in re.finditer(r"[.!?]\"?( |\n)", src)})

    entries = []
    for name in DEMOS:
        text = read(name + ".txt")
        entries.append({
            "id": name, "kind": "demo", "file": name + ".txt", "question_file": name + ".json",
            "approx_tokens": round(count(text), -2), "tokens": count(text), "chars": len(text),
        })

    for target, name in TARGETS:
        cut = min(breaks, key=lambda b: abs(count(src[:b]) - target))
        ctx = src[:cut]
        cont = None
        for end in sentence_ends:
            if end <= cut:
                continue
            piece = src[cut:end].rstrip()
            if count(piece) >= MIN_CONT_TOKENS:
                cont = piece
                break
        if cont is None:
            sys.exit(f"{name}: not enough text after the context for a continuation")
        if exact and count(ctx) + count(cont) != count(ctx + cont):
            sys.exit(f"{name}: the cut changes the tokenization")
        write(name + ".txt", ctx)
        write(name + ".continuation.txt", cont)
        entries.append({
            "id": name, "kind": "long", "file": name + ".txt",
            "continuation_file": name + ".continuation.txt",
            "approx_tokens": target, "tokens": count(ctx), "chars": len(ctx),
            "continuation_tokens": count(cont), "continuation_chars": len(cont),
        })

    manifest = {
        "version": 1,
        "tokenizer": "SmolLM2-135M-Instruct (GGUF), no BOS" if exact else "estimate, 4.43 chars/token",
        "tokens_exact": exact,
        "contexts": entries,
    }
    write("manifest.json", json.dumps(manifest, indent=2) + "\n")
    for e in entries:
        print(e["id"], e["chars"], e["tokens"], e.get("continuation_tokens", ""))


if __name__ == "__main__":
    main()
