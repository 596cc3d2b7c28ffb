#include "modelio/llama2c_tokenizer.h"

#include "common/error.h"

#include <cstring>
#include <fstream>
#include <iterator>

namespace kvscope {

namespace {

uint32_t readU32(const unsigned char* p)
{
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

int hexValue(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

}  // namespace

Llama2cTokenizer Llama2cTokenizer::load(const std::string& path, int expectedVocabSize)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) throw inputError(path, "", "cannot open file");
    in.seekg(0, std::ios::end);
    const std::streamoff end = in.tellg();
    if (end < 0) throw inputError(path, "", "cannot determine the file size");
    // Tokenizer files are small; cap what we are willing to hold.
    if (uint64_t(end) > (uint64_t(1) << 30)) throw inputError(path, "", "file too large for a tokenizer");
    in.seekg(0, std::ios::beg);
    std::vector<unsigned char> buf(static_cast<size_t>(end));
    if (!buf.empty()) in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(buf.size()));
    if (!in) throw inputError(path, "", "read failed");

    const size_t size = buf.size();
    if (size >= 2 && buf[0] == 0x80 && buf[1] >= 2 && buf[1] <= 5)
        throw inputError(path, "header", "this looks like a PyTorch pickle; pickles are never loaded");
    if (size < 4) throw inputError(path, "header", "file shorter than the 4-byte max_token_length");
    Llama2cTokenizer t;
    const int32_t maxLen = int32_t(readU32(buf.data()));
    if (maxLen <= 0 || maxLen > kMaxTokenLength)
        throw inputError(path, "header", "max_token_length " + std::to_string(maxLen) + " is out of range");
    t.maxTokenLength_ = maxLen;

    size_t pos = 4;
    while (pos < size) {
        const int id = int(t.pieces_.size());
        const std::string place = "token " + std::to_string(id) + " at offset " + std::to_string(pos);
        if (expectedVocabSize > 0 && id >= expectedVocabSize)
            throw inputError(path, place, "more tokens than the expected vocabulary size " +
                                              std::to_string(expectedVocabSize));
        if (id >= kMaxTokens) throw inputError(path, place, "too many tokens");
        if (size - pos < 8) throw inputError(path, place, "truncated token header");
        float score;
        std::memcpy(&score, buf.data() + pos, 4);  // little-endian host assumed, as llama2.c
        const int32_t len = int32_t(readU32(buf.data() + pos + 4));
        pos += 8;
        if (len < 0 || len > maxLen)
            throw inputError(path, place, "token length " + std::to_string(len) +
                                              " outside 0..max_token_length " + std::to_string(maxLen));
        if (size_t(len) > size - pos) throw inputError(path, place, "token bytes run past the end of the file");
        std::string piece(reinterpret_cast<const char*>(buf.data() + pos), size_t(len));
        pos += size_t(len);
        t.index_.emplace(piece, id);
        t.pieces_.push_back(std::move(piece));
        t.scores_.push_back(score);
    }
    if (expectedVocabSize > 0 && int(t.pieces_.size()) != expectedVocabSize)
        throw inputError(path, "tokens", "found " + std::to_string(t.pieces_.size()) +
                                             " tokens, expected " + std::to_string(expectedVocabSize));
    if (t.pieces_.size() < 3) throw inputError(path, "tokens", "fewer than 3 tokens (no <unk>, <s>, </s>)");
    return t;
}

int Llama2cTokenizer::lookup(const std::string& piece) const
{
    auto it = index_.find(piece);
    return it == index_.end() ? -1 : it->second;
}

std::vector<int> Llama2cTokenizer::encode(const std::string& text, bool bos, bool eos) const
{
    std::vector<int> tokens;
    if (bos) tokens.push_back(kBos);
    if (!text.empty()) {
        const int prefix = lookup(" ");
        tokens.push_back(prefix >= 0 ? prefix : int(' ') + 3);
    }
    const auto byteFallback = [&](const std::string& s) {
        for (unsigned char b : s) {
            const int id = int(b) + 3;
            if (id >= vocabSize()) throw Error("tokenizer: byte fallback id " + std::to_string(id) +
                                               " is outside the vocabulary");
            tokens.push_back(id);
        }
    };
    std::string cp;
    for (size_t i = 0; i < text.size(); ++i) {
        const unsigned char ch = static_cast<unsigned char>(text[i]);
        if ((ch & 0xC0) != 0x80) cp.clear();
        cp.push_back(char(ch));
        const bool nextIsCont = i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
        if (nextIsCont && cp.size() < 4) continue;
        const int id = lookup(cp);
        if (id >= 0)
            tokens.push_back(id);
        else
            byteFallback(cp);
        cp.clear();
    }
    // Score-greedy merges: the best adjacent pair, leftmost on ties, until none applies.
    for (;;) {
        float best = -1e10f;
        int bestId = -1;
        size_t bestIdx = 0;
        for (size_t i = 0; i + 1 < tokens.size(); ++i) {
            const int id = lookup(pieces_[size_t(tokens[i])] + pieces_[size_t(tokens[i + 1])]);
            if (id >= 0 && scores_[size_t(id)] > best) {
                best = scores_[size_t(id)];
                bestId = id;
                bestIdx = i;
            }
        }
        if (bestId < 0) break;
        tokens[bestIdx] = bestId;
        tokens.erase(tokens.begin() + std::ptrdiff_t(bestIdx) + 1);
    }
    if (eos) tokens.push_back(kEos);
    return tokens;
}

std::string Llama2cTokenizer::decode(int prev, int token) const
{
    if (token < 0 || token >= vocabSize())
        throw Error("tokenizer: token id " + std::to_string(token) + " is outside the vocabulary of " +
                    std::to_string(vocabSize()));
    std::string piece = pieces_[size_t(token)];
    if (prev == kBos && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>') {
        const int hi = hexValue(piece[3]), lo = hexValue(piece[4]);
        if (hi >= 0 && lo >= 0) return std::string(1, char(hi * 16 + lo));
    }
    return piece;
}

std::string Llama2cTokenizer::decodeAll(const std::vector<int>& tokens, int prev) const
{
    std::string out;
    for (int t : tokens) {
        out += decode(prev, t);
        prev = t;
    }
    return out;
}

}  // namespace kvscope
