// The weights of one Llama-family model in one shape, whatever file they came from.
//
// READ ME FIRST
//  - Three sources: a Hugging Face folder (config.json + safetensors), a GGUF file, a llama2.c
//    checkpoint. Each loader maps its names and layouts onto the Hugging Face ones below, so the
//    runtime (llama_runtime.h) has one code path.
//  - Matrices are in PyTorch Linear layout (out_features, in_features), row-major: float32, or
//    (GGUF) packed in the file's stored ggml type, one row of blocks per output feature, so a
//    quantised model takes its file size in memory; the runtime expands packed rows to fp32 tile
//    by tile as the forward needs them (HostTensor::packed). 1-D tensors are always float32.
//  - RoPE: every source ends up in the Hugging Face rotate_half layout (pairs (i, i + head_dim/2)).
//    GGUF "llama" files and llama2.c files store q/k rows in the interleaved order (pairs
//    (2i, 2i+1)); their loaders permute the rows back (llama2c.h: permuteInterleavedToRotateHalf).
//    GGUF "qwen2" files are not permuted by llama.cpp's converter and are taken as they are.
//  - Fused projections (Phi-3's qkv_proj and gate_up_proj, GGUF attn_qkv and the double-height
//    ffn_up) are split into q/k/v and gate/up rows at load time, so the runtime sees one layout.
//  - Gemma's RMSNorm multiplies by (1 + w): the Hugging Face loader adds the 1 to every norm
//    weight; llama.cpp's converter already did so in GGUF files. The runtime always computes w * x.
//  - Validation: every expected tensor must be present with its exact shape, and no tensor may be
//    left over (a leftover means an architecture feature we would silently ignore).
//
// Tensor names (i = layer):
//   model.embed_tokens.weight                 (vocab, hidden)
//   model.layers.i.input_layernorm.weight     (hidden)
//   model.layers.i.self_attn.q_proj.weight    (heads*head_dim, hidden)     .bias when present
//   model.layers.i.self_attn.k_proj.weight    (kv_heads*head_dim, hidden)  .bias when present
//   model.layers.i.self_attn.v_proj.weight    (kv_heads*head_dim, hidden)  .bias when present
//   model.layers.i.self_attn.o_proj.weight    (hidden, heads*head_dim)
//   model.layers.i.self_attn.q_norm.weight    (head_dim)   qkNorm only (Qwen3, Gemma 3)
//   model.layers.i.self_attn.k_norm.weight    (head_dim)   qkNorm only
//   model.layers.i.post_attention_layernorm.weight (hidden)  Llama: before the MLP; Gemma: on the
//                                             attention output (sandwichNorm)
//   model.layers.i.pre_feedforward_layernorm.weight  (hidden)  sandwichNorm only (Gemma)
//   model.layers.i.post_feedforward_layernorm.weight (hidden)  sandwichNorm only (Gemma)
//   model.layers.i.mlp.gate_proj.weight       (intermediate, hidden)
//   model.layers.i.mlp.up_proj.weight         (intermediate, hidden)
//   model.layers.i.mlp.down_proj.weight       (hidden, intermediate)
//   model.norm.weight                         (hidden)
//   lm_head.weight                            (vocab, hidden); absent when tied to embed_tokens
//
// Every input error throws kvscope::Error "path: place: reason".
#pragma once

#include "modelio/hf_config.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvscope {

struct LlamaSpec {
    std::string name;          // general.name, the folder name, or the file stem
    std::string format;        // "safetensors", "gguf", "llama2.c"
    std::string sourcePath;    // what was opened
    ModelConfig config;        // architecture, sizes, norms, RoPE (hf_config.h)
    bool qkvBias = false;      // detected from the tensors present (Qwen2 has them)
    bool tiedEmbeddings = false;  // no lm_head: the output projection is embed_tokens
    std::string weightTypes;   // what the file stored, e.g. "Q4_1 x 211, F32 x 61"
    uint64_t parameters = 0;   // values held (packed or float32)
    uint64_t weightBytes = 0;  // bytes the tensors take in memory (packed bytes + 4 per float)
};

struct HostTensor {
    std::vector<int64_t> shape;  // PyTorch order
    std::vector<float> data;     // row-major float32; empty when packed
    // Packed (GGUF matrices only): shape[0] rows of ggmlRowBytes(ggmlType, shape[1]) bytes each,
    // the file's stored blocks (q/k rows already permuted like `data` would be).
    std::vector<uint8_t> packed;
    uint32_t ggmlType = 0;

    bool isPacked() const { return !packed.empty(); }
    uint64_t elements() const;
    uint64_t rowBytes() const;  // bytes of one packed row (shape[1] values)
    // Row r (of shape[0]) as float32 into out (shape[1] values), packed or not.
    void readRow(int64_t r, float* out) const;
    // The whole tensor as float32 (a copy; what a packed tensor expands to).
    std::vector<float> toFloat() const;
};

struct LlamaWeights {
    LlamaSpec spec;
    std::map<std::string, HostTensor> tensors;
};

// Opens a model: a folder (config.json + safetensors), a .gguf file, or a llama2.c checkpoint
// (any other regular file; checked by size against its header). Pickles are refused.
LlamaWeights loadLlamaWeights(const std::string& path);

// Each source on its own.
LlamaWeights loadHfWeights(const std::string& folder);
LlamaWeights loadGgufWeights(const std::string& path);
LlamaWeights loadLlama2cWeights(const std::string& path);

// A stable short identifier of a model's weights and shape ("sha256-like" hex of 16 digits,
// computed over the spec and a sample of every tensor), recorded in KV files and profiles.
std::string weightsFingerprint(const LlamaWeights& w);

// Checks names and shapes against the spec (see the list above); throws naming the tensor.
void validateLlamaWeights(const LlamaWeights& w);

}  // namespace kvscope
