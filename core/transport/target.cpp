#include "transport/target.h"

#include "common/error.h"

#include <algorithm>

namespace kvscope {

// Modelled target hardware. Sources (figures, not measurements of ours):
//  - NVIDIA A100 Tensor Core GPU datasheet (A100 SXM4 80GB): 312 TFLOPS dense BF16, 2,039 GB/s HBM2e.
//  - NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5): 989 TFLOPS dense BF16 (1,979 with
//    sparsity), 3.35 TB/s HBM3.
//  - Parameter counts: Llama 2 7B 6.74e9 (Touvron et al., 2023, "Llama 2", table 1 model card);
//    Llama 3 8B 8.03e9 (Meta's Llama 3 model card).
// Derived: prefill costs ~2 FLOPs per parameter per token (Kaplan et al., 2020, "Scaling laws",
// section 2.1; attention adds under 10% at these context lengths), at an assumed 50% model FLOPs
// utilisation for a compute-bound prefill: A100 + 7B: 312e12 * 0.5 / (2 * 6.74e9) = 11,570
// tokens/s; H100 + 8B: 989e12 * 0.5 / (2 * 8.03e9) = 30,790 tokens/s. No forward pass is faster
// than one read of the fp16 weights: 13.5 GB / 2,039 GB/s = 6.6 ms (A100), 16.1 GB / 3,350 GB/s =
// 4.8 ms (H100), so a modelled pass takes max(tokens / prefill rate, weight pass) (a roofline): the
// question's few tokens are memory-bound (6.6 ms, not the 1.6 ms its FLOPs would take), a
// 256-token chunk's recompute compute-bound (22.1 ms). The first token is the argmax of the
// question pass's last logits (no further pass), as in the measured path. KV decode (entropy decoding into fp16) is assumed to run at
// a quarter of HBM bandwidth (510 and 840 GB/s of fp16 output); at these cache sizes it is well
// under a millisecond either way, so the assumption hardly moves a TTFT.
// KV size per token (fp16, K and V): Llama 2 7B has 32 layers of 32 KV heads x 128 (its
// config.json: num_hidden_layers 32, hidden_size 4096, num_key_value_heads 32): 2 x 32 x 4096 x 2 B
// = 524,288 B; Llama 3 8B has 32 layers of 8 KV heads x 128 (grouped-query attention,
// num_key_value_heads 8): 2 x 32 x 1024 x 2 B = 131,072 B.
TargetHardware targetPreset(const std::string& name)
{
    TargetHardware t;
    t.name = name;
    if (name == "a100-7b") {
        t.prefillTokensPerSecond = 312e12 * 0.5 / (2 * 6.74e9);
        t.decodeGBps = 2039 * 0.25;
        t.weightPassSeconds = 2 * 6.74e9 / 2039e9;
        t.kvBytesPerToken = 2.0 * 32 * 4096 * 2;
        t.citation = "NVIDIA A100 datasheet (312 TFLOPS BF16, 2039 GB/s), Llama 2 7B (6.74e9 params), 50% MFU";
    } else if (name == "h100-8b") {
        t.prefillTokensPerSecond = 989e12 * 0.5 / (2 * 8.03e9);
        t.decodeGBps = 3350 * 0.25;
        t.weightPassSeconds = 2 * 8.03e9 / 3350e9;
        t.kvBytesPerToken = 2.0 * 32 * 1024 * 2;
        t.citation = "NVIDIA H100 SXM datasheet (989 TFLOPS BF16, 3.35 TB/s), Llama 3 8B (8.03e9 params), 50% MFU";
    } else {
        throw inputError("--target", "'" + name + "'", "expected one of a100-7b, h100-8b (or --target-prefill/--target-decode)");
    }
    return t;
}

std::vector<std::string> targetPresetNames() { return {"a100-7b", "h100-8b"}; }

double modelledPassSeconds(const TargetHardware& target, int tokens)
{
    return std::max(double(tokens) / target.prefillTokensPerSecond, std::max(0.0, target.weightPassSeconds));
}

double kvLinkScale(const TargetHardware& target, double servedBytesPerToken)
{
    if (!(target.kvBytesPerToken > 0) || !(servedBytesPerToken > 0)) return 1.0;
    return servedBytesPerToken / target.kvBytesPerToken;
}

double fp16KvBytesPerToken(const KvShape& shape) { return 2.0 * shape.numLayers * shape.channels() * 2; }

}  // namespace kvscope
