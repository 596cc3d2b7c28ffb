// The transform codec's model: names of the switches, the default levels and the decoder's view of a
// decode matrix. The math is in transform.h; the fit in transform_fit.cpp, the binary form in
// transform_model_io.cpp, the linear algebra in linalg.cpp, RoPE in rope.cpp and the chunk payload
// in transform_chunk.cpp.
#include "codec/transform.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvscope {

const char* basisName(TransformBasis b)
{
    return b == TransformBasis::Pca ? "pca" : b == TransformBasis::Hadamard ? "hadamard" : "none";
}
const char* weightingName(TransformWeighting w) { return w == TransformWeighting::Attention ? "attention" : "mse"; }
const char* allocationName(TransformAllocation a) { return a == TransformAllocation::Waterfill ? "waterfill" : "uniform"; }
const char* entropyName(TransformEntropy e)
{
    return e == TransformEntropy::Rans32 ? "rans32" : e == TransformEntropy::Rans ? "rans" : "fixed";
}

bool TransformSettings::operator==(const TransformSettings& o) const
{
    return ropeUndo == o.ropeUndo && basis == o.basis && acrossHeads == o.acrossHeads && weighting == o.weighting &&
           allocation == o.allocation && entropy == o.entropy && sinkTokens == o.sinkTokens &&
           recentTokens == o.recentTokens && layerGroup == o.layerGroup;
}

int TransformModel::codedComponents(int level, KvKind k, int layer) const
{
    int n = 0;
    for (float s : levelBlock(level, k, layer).step) n += s > 0;
    return n;
}

std::vector<TransformLevel> defaultTransformLevels()
{
    std::vector<TransformLevel> out;
    // Values get water levels 10x finer than keys: on SmolLM2 the values needed about 10x finer
    // levels than the keys for the same quality (a key's error is damped by the softmax, a value's
    // reaches the output through o_proj directly).
    for (double t : {0.1, 0.05, 0.025, 0.012, 0.006}) {
        TransformLevel l;
        char name[32];
        std::snprintf(name, sizeof name, "t %g/%g", t, t / 10);
        l.name = name;
        l.keyTheta = t;
        l.valueTheta = t / 10;
        out.push_back(l);
    }
    return out;
}

void prepareDecodeColumns(TransformBlock& b)
{
    const size_t C = b.mean.size();
    KVSCOPE_ASSERT(b.decode.size() == C * C);
    b.columns.resize(C * C);
    b.colLo.assign(C, int(C));
    b.colHi.assign(C, 0);
    b.decodeFinite = true;
    constexpr size_t kTile = 64;  // the transpose in tiles, so that wide blocks' columns are not read a cache line per value
    for (size_t c0 = 0; c0 < C; c0 += kTile)
        for (size_t j0 = 0; j0 < C; j0 += kTile)
            for (size_t c = c0; c < std::min(C, c0 + kTile); ++c)
                for (size_t j = j0; j < std::min(C, j0 + kTile); ++j) {
                    const float a = b.decode[c * C + j];
                    b.columns[j * C + c] = a;
                    b.decodeFinite = b.decodeFinite && std::isfinite(a);
                    if (a != 0.0f) b.colLo[j] = std::min(b.colLo[j], int(c)), b.colHi[j] = int(c) + 1;
                }
    for (size_t j = 0; j < C; ++j) b.colLo[j] = std::min(b.colLo[j], b.colHi[j]);
}

}  // namespace kvscope
