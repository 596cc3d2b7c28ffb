#include "modelio/llama2c.h"

#include "common/error.h"

#include <cstring>
#include <fstream>

namespace kvscope {

static_assert(sizeof(float) == 4, "fp32 weights");

namespace {

bool hostIsLittleEndian()
{
    const uint32_t one = 1;
    unsigned char b;
    std::memcpy(&b, &one, 1);
    return b == 1;
}

int32_t readI32(const unsigned char* p)
{
    uint32_t v = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
    int32_t out;
    std::memcpy(&out, &v, 4);
    return out;
}

void checkRange(const std::string& path, const char* name, int value, int limit)
{
    if (value <= 0 || value > limit)
        throw inputError(path, "header", std::string(name) + " = " + std::to_string(value) +
                                             " is out of range (1.." + std::to_string(limit) + ")");
}

void validateConfig(const std::string& path, const Llama2cConfig& c)
{
    checkRange(path, "dim", c.dim, kLlama2cMaxDim);
    checkRange(path, "hidden_dim", c.hiddenDim, kLlama2cMaxHidden);
    checkRange(path, "n_layers", c.nLayers, kLlama2cMaxLayers);
    checkRange(path, "n_heads", c.nHeads, kLlama2cMaxHeads);
    checkRange(path, "n_kv_heads", c.nKvHeads, kLlama2cMaxHeads);
    checkRange(path, "vocab_size", c.vocabSize, kLlama2cMaxVocab);
    checkRange(path, "seq_len", c.seqLen, kLlama2cMaxSeqLen);
    if (c.dim % c.nHeads != 0)
        throw inputError(path, "header", "dim " + std::to_string(c.dim) +
                                             " is not a multiple of n_heads " + std::to_string(c.nHeads));
    if (c.nHeads % c.nKvHeads != 0)
        throw inputError(path, "header", "n_heads " + std::to_string(c.nHeads) +
                                             " is not a multiple of n_kv_heads " +
                                             std::to_string(c.nKvHeads));
    if (c.headSize() % 2 != 0)
        throw inputError(path, "header", "head size " + std::to_string(c.headSize()) +
                                             " is odd (RoPE needs pairs)");
}

// Element counts of each tensor (all fit in uint64 given the limits above).
struct Counts {
    uint64_t emb, rmsL, wq, wkv, wo, ffn, rmsF, freq, cls;
    uint64_t commonTotal() const { return emb + 2 * rmsL + wq + 2 * wkv + wo + 3 * ffn + rmsF; }
};

Counts counts(const Llama2cConfig& c)
{
    const uint64_t L = uint64_t(c.nLayers), d = uint64_t(c.dim), hs = uint64_t(c.headSize());
    Counts n;
    n.emb = uint64_t(c.vocabSize) * d;
    n.rmsL = L * d;
    n.wq = L * d * uint64_t(c.nHeads) * hs;
    n.wkv = L * d * uint64_t(c.nKvHeads) * hs;
    n.wo = L * uint64_t(c.nHeads) * hs * d;
    n.ffn = L * d * uint64_t(c.hiddenDim);
    n.rmsF = d;
    n.freq = uint64_t(c.seqLen) * hs / 2;
    n.cls = uint64_t(c.vocabSize) * d;
    return n;
}

class Reader {
public:
    Reader(const std::string& path, std::ifstream& in, uint64_t size, uint64_t pos)
        : path_(path), in_(in), size_(size), pos_(pos)
    {
    }

    void tensor(std::vector<float>& out, uint64_t count, const char* name)
    {
        if (count > (size_ - pos_) / 4)
            throw inputError(path_, name, "tensor runs past the end of the file");
        out.resize(size_t(count));
        in_.read(reinterpret_cast<char*>(out.data()), std::streamsize(count * 4));
        if (!in_ || uint64_t(in_.gcount()) != count * 4)
            throw inputError(path_, name, "read failed (file truncated while reading?)");
        pos_ += count * 4;
        if (!hostIsLittleEndian()) {
            for (float& f : out) {
                unsigned char b[4];
                std::memcpy(b, &f, 4);
                std::swap(b[0], b[3]);
                std::swap(b[1], b[2]);
                std::memcpy(&f, b, 4);
            }
        }
    }

    void skip(uint64_t count, const char* name)
    {
        if (count > (size_ - pos_) / 4)
            throw inputError(path_, name, "block runs past the end of the file");
        pos_ += count * 4;
        in_.seekg(std::streamoff(pos_));
        if (!in_) throw inputError(path_, name, "seek failed");
    }

    uint64_t pos() const { return pos_; }

private:
    const std::string& path_;
    std::ifstream& in_;
    uint64_t size_;
    uint64_t pos_;
};

[[noreturn]] void throwPickle(const std::string& path)
{
    throw inputError(path, "header",
                     "this looks like a PyTorch pickle (.bin/.pt); pickles are never loaded "
                     "(they can run code): export the model as safetensors or a llama2.c "
                     "checkpoint instead");
}

bool looksLikePickleProtocol(const unsigned char* h, uint64_t size)
{
    return size >= 2 && h[0] == 0x80 && h[1] >= 2 && h[1] <= 5;
}

}  // namespace

void permuteInterleavedToRotateHalf(float* rows, int nHeads, int headSize, int rowLen)
{
    KVSCOPE_ASSERT(headSize % 2 == 0 && nHeads >= 0 && rowLen >= 0);
    std::vector<float> tmp(size_t(headSize) * size_t(rowLen));
    for (int h = 0; h < nHeads; ++h) {
        float* head = rows + size_t(h) * size_t(headSize) * size_t(rowLen);
        for (int p = 0; p < headSize; ++p) {
            const int src = rotateHalfSourceRow(p, headSize);
            std::memcpy(tmp.data() + size_t(p) * size_t(rowLen), head + size_t(src) * size_t(rowLen),
                        size_t(rowLen) * sizeof(float));
        }
        std::memcpy(head, tmp.data(), tmp.size() * sizeof(float));
    }
}

Llama2cModel loadLlama2c(const std::string& path, bool permuteRope)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) throw inputError(path, "", "cannot open file");
    in.seekg(0, std::ios::end);
    const std::streamoff endPos = in.tellg();
    if (endPos < 0) throw inputError(path, "", "cannot determine the file size");
    const uint64_t size = uint64_t(endPos);
    in.seekg(0, std::ios::beg);

    unsigned char head[kLlama2cV1HeaderBytes] = {};
    const uint64_t headLen = size < uint64_t(kLlama2cV1HeaderBytes) ? size : kLlama2cV1HeaderBytes;
    in.read(reinterpret_cast<char*>(head), std::streamsize(headLen));
    if (!in && !in.eof()) throw inputError(path, "header", "read failed");
    in.clear();

    if (size >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) throwPickle(path);

    Llama2cModel m;
    Llama2cConfig& c = m.config;
    uint64_t dataStart = 0;
    const bool v1 = size >= 4 && uint32_t(readI32(head)) == kLlama2cMagic;
    if (v1) {
        if (size < uint64_t(kLlama2cV1HeaderBytes))
            throw inputError(path, "header", "v1 file shorter than its 256-byte header");
        const int32_t version = readI32(head + 4);
        if (version != 1)
            throw inputError(path, "header", "unsupported llama2.c version " + std::to_string(version) +
                                                 " (only 0 and 1 are supported)");
        c.version = 1;
        c.dim = readI32(head + 8);
        c.hiddenDim = readI32(head + 12);
        c.nLayers = readI32(head + 16);
        c.nHeads = readI32(head + 20);
        c.nKvHeads = readI32(head + 24);
        c.vocabSize = readI32(head + 28);
        c.seqLen = readI32(head + 32);
        if (head[36] > 1)
            throw inputError(path, "header", "shared_classifier flag is " + std::to_string(head[36]) +
                                                 ", expected 0 or 1");
        c.sharedClassifier = head[36] == 1;
        dataStart = kLlama2cV1HeaderBytes;
    } else {
        if (size < 28) {
            if (looksLikePickleProtocol(head, size)) throwPickle(path);
            throw inputError(path, "header", "file of " + std::to_string(size) +
                                                 " bytes is shorter than the 28-byte llama2.c header");
        }
        c.version = 0;
        c.dim = readI32(head);
        c.hiddenDim = readI32(head + 4);
        c.nLayers = readI32(head + 8);
        c.nHeads = readI32(head + 12);
        c.nKvHeads = readI32(head + 16);
        const int32_t vocab = readI32(head + 20);
        c.seqLen = readI32(head + 24);
        c.sharedClassifier = vocab > 0;
        c.vocabSize = vocab == INT32_MIN ? 0 : (vocab < 0 ? -vocab : vocab);
        dataStart = 28;
    }

    try {
        validateConfig(path, c);
    } catch (const Error&) {
        if (!v1 && looksLikePickleProtocol(head, size)) throwPickle(path);
        throw;
    }

    const Counts n = counts(c);
    uint64_t expected = n.commonTotal() + (c.sharedClassifier ? 0 : n.cls);
    if (!v1) expected += 2 * n.freq;
    expected = dataStart + 4 * expected;
    if (size != expected) {
        if (!v1 && looksLikePickleProtocol(head, size)) throwPickle(path);
        std::string reason = "file size " + std::to_string(size) + " does not match the header (expected " +
                             std::to_string(expected) + " bytes";
        if (!v1) {
            const uint64_t other = c.sharedClassifier ? expected + 4 * n.cls : expected - 4 * n.cls;
            if (size == other)
                reason += "; the size fits the opposite classifier sharing, but the sign of vocab_size says " +
                          std::string(c.sharedClassifier ? "shared" : "unshared");
            else if (size < expected)
                reason += "; truncated?";
        } else if (size < expected) {
            reason += "; truncated?";
        }
        reason += ")";
        throw inputError(path, "size", reason);
    }

    in.seekg(std::streamoff(dataStart));
    Reader r(path, in, size, dataStart);
    if (v1) {
        r.tensor(m.rmsAtt, n.rmsL, "rms_att");
        r.tensor(m.rmsFfn, n.rmsL, "rms_ffn");
        r.tensor(m.rmsFinal, n.rmsF, "rms_final");
        r.tensor(m.tokenEmbedding, n.emb, "token_embedding");
        r.tensor(m.wq, n.wq, "wq");
        r.tensor(m.wk, n.wkv, "wk");
        r.tensor(m.wv, n.wkv, "wv");
        r.tensor(m.wo, n.wo, "wo");
        r.tensor(m.w1, n.ffn, "w1");
        r.tensor(m.w2, n.ffn, "w2");
        r.tensor(m.w3, n.ffn, "w3");
    } else {
        r.tensor(m.tokenEmbedding, n.emb, "token_embedding");
        r.tensor(m.rmsAtt, n.rmsL, "rms_att");
        r.tensor(m.wq, n.wq, "wq");
        r.tensor(m.wk, n.wkv, "wk");
        r.tensor(m.wv, n.wkv, "wv");
        r.tensor(m.wo, n.wo, "wo");
        r.tensor(m.rmsFfn, n.rmsL, "rms_ffn");
        r.tensor(m.w1, n.ffn, "w1");
        r.tensor(m.w2, n.ffn, "w2");
        r.tensor(m.w3, n.ffn, "w3");
        r.tensor(m.rmsFinal, n.rmsF, "rms_final");
        r.skip(2 * n.freq, "freq_cis");
    }
    if (!c.sharedClassifier) r.tensor(m.wcls, n.cls, "wcls");
    KVSCOPE_ASSERT(r.pos() == size);

    m.ropeRotateHalf = permuteRope;
    if (permuteRope) {
        const int hs = c.headSize();
        for (int l = 0; l < c.nLayers; ++l) {
            permuteInterleavedToRotateHalf(m.wq.data() + size_t(l) * size_t(c.qDim()) * size_t(c.dim),
                                           c.nHeads, hs, c.dim);
            permuteInterleavedToRotateHalf(m.wk.data() + size_t(l) * size_t(c.kvDim()) * size_t(c.dim),
                                           c.nKvHeads, hs, c.dim);
        }
    }
    return m;
}

}  // namespace kvscope
