#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets to tests/fuzz/corpus/<target>/.

Usage: python3 tests/fuzz/make_seeds.py [KVSCOPE_CLI]
Every seed is a small valid input (or one that reaches deep into a reader before it fails); the
fuzzers mutate from there. With KVSCOPE_CLI (a built kvscope-cli) the HDF5 seeds are written by
`kvscope-cli synth` and the transform-codec containers by `kvscope-cli encode`; without it they
are left as they are.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- GGUF ---------------------------------------------------------------------------------------
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


SCALAR = {"u8": (0, "<B"), "i8": (1, "<b"), "u16": (2, "<H"), "i16": (3, "<h"), "u32": (4, "<I"),
          "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "u64": (10, "<Q"), "i64": (11, "<q"),
          "f64": (12, "<d")}


def gvalue(kind, v):
    if kind == "str":
        return struct.pack("<I", 8) + gstr(v)
    if kind.startswith("arr:"):
        ek = kind[4:]
        if ek == "str":
            body = b"".join(gstr(x) for x in v)
            return struct.pack("<IIQ", 9, 8, len(v)) + body
        code, fmt = SCALAR[ek]
        return struct.pack("<IIQ", 9, code, len(v)) + b"".join(struct.pack(fmt, x) for x in v)
    code, fmt = SCALAR[kind]
    return struct.pack("<I", code) + struct.pack(fmt, v)


def gguf(meta, tensors, version=3, alignment=32):
    """meta: [(key, kind, value)]; tensors: [(name, dims, ggml_type, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta))
    for k, kind, v in meta:
        out += gstr(k) + gvalue(kind, v)
    offset = 0
    infos, blobs = b"", b""
    for name, dims, typ, data in tensors:
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", typ, offset)
        pad = (-len(data)) % alignment
        blobs += data + b"\0" * pad
        offset += len(data) + pad
    out += infos
    out += b"\0" * ((-len(out)) % alignment)
    return out + blobs


def f16(x):
    return struct.pack("<e", x)


def seeds_gguf():
    f32 = struct.pack("<8f", *[0.5 * i - 1 for i in range(8)])
    f16s = b"".join(f16(0.25 * i) for i in range(8))
    bf16 = b"".join(struct.pack("<f", 1.5 * i)[2:] for i in range(4))
    q8 = f16(0.1) + bytes((i * 7) & 0xFF for i in range(32))
    q4 = f16(0.2) + bytes(range(16))
    q41 = f16(0.2) + f16(-1.0) + bytes(range(16))
    base = [("general.architecture", "str", "llama"), ("general.alignment", "u32", 32),
            ("llama.block_count", "u32", 2), ("llama.rope.freq_base", "f32", 10000.0),
            ("flag", "bool", True), ("i64", "i64", -5), ("f64", "f64", 1e-5), ("u8", "u8", 7),
            ("ints", "arr:i32", [1, 2, 3]), ("floats", "arr:f32", [0.5, 1.5])]
    tensors = [("a.f32", [8], 0, f32), ("b.f16", [4, 2], 1, f16s), ("c.bf16", [4], 30, bf16),
               ("d.q8_0", [32], 8, q8), ("e.q4_0", [32], 2, q4), ("f.q4_1", [32], 3, q41)]
    put("fuzz_gguf", "types.gguf", gguf(base, tensors))
    put("fuzz_gguf", "v2-align64.gguf", gguf(base[:3] + [("general.alignment", "u32", 64)], tensors[:2], 2, 64))
    # a byte-level BPE tokenizer (gpt2 model) in the metadata
    toks = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ġh", "he", "ll", "<|endoftext|>"]
    tok = [("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", "smollm"),
           ("tokenizer.ggml.tokens", "arr:str", toks), ("tokenizer.ggml.merges", "arr:str", ["Ġ h", "h e", "l l"]),
           ("tokenizer.ggml.token_type", "arr:i32", [1] * (len(toks) - 1) + [3]),
           ("tokenizer.ggml.bos_token_id", "u32", len(toks) - 1), ("tokenizer.ggml.add_bos_token", "bool", False)]
    put("fuzz_gguf", "gpt2-tokenizer.gguf", gguf(tok, []))
    shutil.copy(os.path.join(ROOT, "tests/data/tokenizers/tiny-spm.gguf"), os.path.join(CORPUS, "fuzz_gguf"))


# ---- safetensors --------------------------------------------------------------------------------
def safetensors(header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors():
    a = struct.pack("<4f", 1, 2, 3, 4)
    b = b"".join(f16(0.5 * i) for i in range(6))
    c = b"".join(struct.pack("<f", i)[2:] for i in range(2))
    hdr = {"__metadata__": {"format": "pt"},
           "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
           "b": {"dtype": "F16", "shape": [3, 2], "data_offsets": [16, 28]},
           "c": {"dtype": "BF16", "shape": [2], "data_offsets": [28, 32]},
           "s": {"dtype": "I8", "shape": [], "data_offsets": [32, 33]}}
    put("fuzz_safetensors", "three-dtypes.safetensors", safetensors(hdr, a + b + c + b"\x05"))
    put("fuzz_safetensors", "empty.safetensors", safetensors({}, b""))
    index = {"metadata": {"total_size": 64},
             "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    put("fuzz_safetensors", "model.safetensors.index.json", json.dumps(index, indent=1))


# ---- tokenizer.json -----------------------------------------------------------------------------
SP_TOKENIZER = {
    "model": {"type": "BPE", "vocab": {"<unk>": 0, "▁": 1, "a": 2, "▁a": 3, "<0x41>": 4},
              "merges": ["▁ a"], "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True},
    "added_tokens": [{"id": 0, "content": "<unk>", "special": True, "normalized": False}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                       {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": None, "post_processor": None,
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                 {"type": "ByteFallback"}, {"type": "Fuse"},
                                                 {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}


def byte_level_vocab():
    # GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest from U+0100 on.
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def seeds_tokenizer():
    put("fuzz_tokenizer_json", "sp-bpe.json", json.dumps(SP_TOKENIZER, ensure_ascii=False))
    base = byte_level_vocab()
    vocab = {t: i for i, t in enumerate(base)}
    merges = ["Ġ w", "h e", "l l", "he ll", "o r"]
    for m in merges:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    bos = len(vocab)
    tj = {"model": {"type": "BPE", "vocab": vocab, "merges": merges, "unk_token": None, "byte_fallback": False,
                    "fuse_unk": False, "ignore_merges": False},
          "added_tokens": [{"id": bos, "content": "<|begin_of_text|>", "special": True, "normalized": False}],
          "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
               "behavior": "Isolated", "invert": False},
              {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
          "post_processor": {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                                      "tokens": ["<|begin_of_text|>"]}}},
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}
    put("fuzz_tokenizer_json", "byte-level.json", json.dumps(tj, ensure_ascii=False))


# ---- config.json --------------------------------------------------------------------------------
def seeds_config():
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 100, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
             "max_position_embeddings": 2048,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}}
    put("fuzz_hf_config", "llama3.json", json.dumps(llama, indent=1))
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
               "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8,
               "head_dim": 16, "vocab_size": 32, "sliding_window": 4096, "rope_scaling": None}
    put("fuzz_hf_config", "mistral.json", json.dumps(mistral, indent=1))
    qwen = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "vocab_size": 16, "rope_scaling": {"type": "linear", "factor": 2.0}}
    put("fuzz_hf_config", "qwen2-linear.json", json.dumps(qwen))


# ---- codec profiles -----------------------------------------------------------------------------
def seeds_profile():
    p = {"format": "kvscope-profile", "version": 1, "model_fingerprint": "abc", "num_layers": 4,
         "chunk_tokens": 256, "delta_group": 10, "anchor_bins": 0, "key_quantizer": "token",
         "value_quantizer": "channel", "tables": "inband", "default_level": 1,
         "levels": [{"name": "only", "key_bins": [32, 32, 16, 16],
                     "value_bins": [{"start": 0, "end": 1, "bins": 32}, {"start": 1, "end": 4, "bins": 16}],
                     "measured": {"bits_per_value": 1.9, "sizes": [1, 2, 3]}}]}
    put("fuzz_profile", "one-level.json", json.dumps(p, indent=1))
    put("fuzz_profile", "minimal.json",
        '{"format":"kvscope-profile","version":1,"levels":[{"key_bins":[8,8],"value_bins":[6,6]}]}')
    two = dict(p, levels=[dict(p["levels"][0], name="a"), {"name": "b", "key_bins": [4] * 4, "value_bins": [4] * 4}],
               default_level=2, delta_group=0, anchor_bins=64, key_quantizer="channel", value_quantizer="token")
    put("fuzz_profile", "two-levels.json", json.dumps(two))


# ---- link schedules: first byte 't' (Mahimahi trace) or 'b' (--bandwidth text) ------------------
def seeds_link():
    with open("/work/shared/traces/ATT-LTE-driving-2016.down") if os.path.exists(
            "/work/shared/traces/ATT-LTE-driving-2016.down") else open(os.devnull) as f:
        lines = f.read().split("\n")[:40]
    put("fuzz_link", "trace-lte", "t" + ("\n".join(lines) if any(lines) else "1\n1\n3\n7\n12\n12\n20") + "\n")
    put("fuzz_link", "trace-crlf", "t5\r\n5\r\n\r\n10 \r\n")
    put("fuzz_link", "bandwidth-steps", "b1Gbit:0.5,50Mbit:1.25,2.5MB")
    put("fuzz_link", "bandwidth-one", "b100kbit")


# ---- chunk protocol: a client's byte stream ------------------------------------------------------
def frame(t, payload):
    return b"KVS1" + bytes([t, 0, 0, 0]) + struct.pack("<I", len(payload)) + payload


def request(t, codec, chunk, level, ctx):
    return frame(t, bytes([codec]) + struct.pack("<IIH", chunk, level, len(ctx)) + ctx)


def seeds_protocol():
    # '@' is the fuzzer's name for the store's first context (fuzz_protocol.cpp).
    put("fuzz_protocol", "session", request(1, 0, 0, 0, b"@") + request(2, 0, 0, 1, b"@") +
        request(2, 0, 1, 3, b"@") + request(3, 0, 0, 0, b"@"))
    put("fuzz_protocol", "int8", request(1, 1, 0, 0, b"@") + request(2, 1, 0, 1, b"@"))
    put("fuzz_protocol", "unknown-context", request(2, 0, 0, 1, b"0123456789abcdef"))


def seeds_kv_h5(cli):
    if not cli:
        return
    d = os.path.join(CORPUS, "fuzz_kv_h5")
    os.makedirs(d, exist_ok=True)
    subprocess.run([cli, "synth", "--out", os.path.join(d, "f16.h5"), "--layers", "2", "--kv-heads", "1",
                    "--head-dim", "4", "--tokens", "3"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([cli, "synth", "--out", os.path.join(d, "bf16.h5"), "--layers", "1", "--kv-heads", "1",
                    "--head-dim", "2", "--tokens", "2", "--dtype", "bfloat16"], check=True, stdout=subprocess.DEVNULL)


# ---- containers: transform-codec files (the CacheGen and baseline seeds are the golden files) -----
def seeds_container(cli):
    """Two small transform-codec files, the model fitted on the cache and stored in the file: 4-state
    and 32-state symbol streams. 48 channels, so the inverse transform's register groups (32 and
    64 channels) end inside the block."""
    if not cli:
        return
    import tempfile
    d = os.path.join(CORPUS, "fuzz_container")
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        kv = os.path.join(tmp, "kv.h5")
        subprocess.run([cli, "synth", "--out", kv, "--layers", "1", "--kv-heads", "2", "--head-dim", "24",
                        "--tokens", "64", "--seed", "5"], check=True, stdout=subprocess.DEVNULL)
        for entropy in ("rans", "rans32"):
            profile = os.path.join(tmp, entropy + ".json")
            with open(profile, "w") as f:
                json.dump({"format": "kvscope-profile", "version": 2, "chunk_tokens": 32,
                           "levels": [{"key_bins": [16], "value_bins": [16]}],
                           "transform": {"rope_undo": False, "entropy": entropy,
                                         "levels": [{"key_theta": 0.1, "value_theta": 0.01}]}}, f)
            subprocess.run([cli, "encode", kv, "--codec", "transform", "--profile", profile, "--out",
                            os.path.join(d, "transform-%s.kvc" % entropy)], check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    seeds_gguf()
    seeds_safetensors()
    seeds_tokenizer()
    seeds_config()
    seeds_profile()
    seeds_link()
    seeds_protocol()
    seeds_kv_h5(sys.argv[1] if len(sys.argv) > 1 else None)
    seeds_container(sys.argv[1] if len(sys.argv) > 1 else None)
