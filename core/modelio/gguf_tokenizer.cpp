#include "modelio/gguf_tokenizer.h"

#include "common/error.h"
#include "modelio/bpe_tokenizer.h"
#include "modelio/gguf.h"
#include "modelio/utf8.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <unordered_map>

namespace kvscope {

namespace {

enum TokenType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

const char* const kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kMetaspace = "\xE2\x96\x81";  // "▁"

// Token types, defaulting to normal when the file has none; checked against the token count.
std::vector<int64_t> tokenTypes(const GgufFile& f, size_t n)
{
    if (!f.has("tokenizer.ggml.token_type")) return std::vector<int64_t>(n, kNormal);
    auto types = f.getIntArray("tokenizer.ggml.token_type");
    if (types.size() != n)
        throw inputError(f.path(), "metadata 'tokenizer.ggml.token_type'",
                         std::to_string(types.size()) + " entries for " + std::to_string(n) + " tokens");
    return types;
}

int32_t optionalId(const GgufFile& f, const char* key, size_t n)
{
    if (!f.has(key)) return -1;
    const int64_t id = f.getInt(key);
    if (id < 0 || uint64_t(id) >= n)
        throw inputError(f.path(), std::string("metadata '") + key + "'",
                         "id " + std::to_string(id) + " outside the " + std::to_string(n) + " tokens");
    return int32_t(id);
}

std::vector<std::string> readTokens(const GgufFile& f)
{
    auto tokens = f.getStringArray("tokenizer.ggml.tokens");
    if (tokens.empty() || tokens.size() > (1u << 24))
        throw inputError(f.path(), "metadata 'tokenizer.ggml.tokens'",
                         "token count " + std::to_string(tokens.size()) + " out of range");
    return tokens;
}

}  // namespace

std::vector<std::string> ggufPreTokenizerRegexes(const std::string& pre, const std::string& path)
{
    // The names and regexes llama.cpp (llama-vocab.cpp) gives each pre-tokenizer type.
    if (pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo" || pre == "jais")
        return {kGpt2Regex};
    if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
        pre == "codeshell" || pre == "exaone")
        return {"\\p{N}", kGpt2Regex};
    if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" ||
        pre == "dbrx" || pre == "smaug-bpe")
        return {kLlama3Regex};
    if (pre == "qwen2" || pre == "deepseek-r1-qwen") return {kQwen2Regex};
    throw inputError(path, "metadata 'tokenizer.ggml.pre'",
                     "pre-tokenizer \"" + pre +
                         "\" not supported (known: gpt2, mpt, olmo, jais, smollm, starcoder, refact, "
                         "command-r, codeshell, exaone, llama3, llama-bpe, falcon3, dbrx, smaug-bpe, "
                         "qwen2, deepseek-r1-qwen)");
}

ByteLevelBpeSpec ggufByteLevelSpec(const GgufFile& f)
{
    ByteLevelBpeSpec spec;
    spec.source = f.path();
    spec.tokens = readTokens(f);
    const size_t n = spec.tokens.size();
    if (!f.has("tokenizer.ggml.merges"))
        throw inputError(f.path(), "metadata 'tokenizer.ggml.merges'", "missing (gpt2 needs merges)");
    spec.merges = f.getStringArray("tokenizer.ggml.merges");
    if (!f.has("tokenizer.ggml.pre"))
        throw inputError(f.path(), "metadata 'tokenizer.ggml.pre'",
                         "missing: the file does not say how to split text before BPE");
    spec.splitPatterns = ggufPreTokenizerRegexes(f.getString("tokenizer.ggml.pre"), f.path());
    const auto types = tokenTypes(f, n);
    for (size_t i = 0; i < n; ++i) {
        if (types[i] == kControl) spec.specialIds.push_back(int32_t(i));
        if (types[i] == kUserDefined) spec.userIds.push_back(int32_t(i));
    }
    spec.bos = optionalId(f, "tokenizer.ggml.bos_token_id", n);
    spec.addBos = f.has("tokenizer.ggml.add_bos_token") && f.getBool("tokenizer.ggml.add_bos_token");
    if (spec.addBos && spec.bos < 0)
        throw inputError(f.path(), "metadata 'tokenizer.ggml.add_bos_token'",
                         "true but there is no bos_token_id");
    return spec;
}

struct GgufSpmTokenizer::Impl {
    std::string path;
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int64_t> types;
    std::unordered_map<std::string, int32_t> index;
    std::vector<const std::string*> matchWhole;  // control + user-defined, longest first
    int32_t byteIds[256];
    int32_t bos = -1, eos = -1, unk = -1;
    bool addBos = true;
    bool addSpacePrefix = true;

    int32_t find(const std::string& s) const
    {
        auto it = index.find(s);
        return it == index.end() ? -1 : it->second;
    }

    // One piece of text between control / user-defined tokens.
    void encodePiece(std::string text, bool prefixSpace, std::vector<int32_t>& out) const
    {
        if (prefixSpace) text = " " + text;
        std::string escaped;
        for (char c : text) {
            if (c == ' ') escaped += kMetaspace;
            else escaped += c;
        }
        // Symbols: one per UTF-8 character, kept as [start, len) into `escaped`, linked list.
        struct Sym {
            size_t start, len;
            int prev, next;
        };
        std::vector<Sym> syms;
        for (size_t i = 0; i < escaped.size();) {
            const size_t len = std::max<size_t>(1, utf8SeqLen(escaped, i));
            const int k = int(syms.size());
            syms.push_back({i, len, k - 1, -1});
            if (k > 0) syms[size_t(k) - 1].next = k;
            i += len;
        }
        struct Bigram {
            float score;
            int left;
            size_t len;  // combined length when queued; a mismatch marks a stale entry
            bool operator<(const Bigram& o) const
            {
                return score != o.score ? score < o.score : left > o.left;  // max score, leftmost
            }
        };
        std::priority_queue<Bigram> queue;
        const auto tryAdd = [&](int l) {
            if (l < 0 || syms[size_t(l)].next < 0) return;
            const Sym& a = syms[size_t(l)];
            const Sym& b = syms[size_t(a.next)];
            const int32_t id = find(escaped.substr(a.start, a.len + b.len));
            if (id >= 0) queue.push({scores[size_t(id)], l, a.len + b.len});
        };
        for (int i = 0; i + 1 < int(syms.size()); ++i) tryAdd(i);
        while (!queue.empty()) {
            const Bigram g = queue.top();
            queue.pop();
            Sym& a = syms[size_t(g.left)];
            if (a.len == 0 || a.next < 0 || a.len + syms[size_t(a.next)].len != g.len) continue;
            Sym& b = syms[size_t(a.next)];
            a.len += b.len;
            b.len = 0;
            a.next = b.next;
            if (a.next >= 0) syms[size_t(a.next)].prev = g.left;
            tryAdd(a.prev);
            tryAdd(g.left);
        }
        for (int i = syms.empty() ? -1 : 0; i >= 0; i = syms[size_t(i)].next) {
            const std::string piece = escaped.substr(syms[size_t(i)].start, syms[size_t(i)].len);
            const int32_t id = find(piece);
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
            // Only single characters can be missing (merges always form tokens): byte fallback.
            for (unsigned char b : piece) {
                if (byteIds[b] >= 0) out.push_back(byteIds[b]);
                else if (unk >= 0) out.push_back(unk);
                else throw Error(path + ": byte " + std::to_string(b) + " has no token and there is no unknown token");
            }
        }
    }
};

GgufSpmTokenizer GgufSpmTokenizer::fromGguf(const GgufFile& f)
{
    auto impl = std::make_shared<Impl>();
    Impl& t = *impl;
    t.path = f.path();
    t.tokens = readTokens(f);
    const size_t n = t.tokens.size();
    if (!f.has("tokenizer.ggml.scores"))
        throw inputError(f.path(), "metadata 'tokenizer.ggml.scores'", "missing (llama needs scores)");
    t.scores = f.getFloatArray("tokenizer.ggml.scores");
    if (t.scores.size() != n)
        throw inputError(f.path(), "metadata 'tokenizer.ggml.scores'",
                         std::to_string(t.scores.size()) + " entries for " + std::to_string(n) + " tokens");
    t.types = tokenTypes(f, n);
    for (size_t i = 0; i < n; ++i) {
        t.index.emplace(t.tokens[i], int32_t(i));  // first id of a duplicated piece wins
        if ((t.types[i] == kControl || t.types[i] == kUserDefined) && !t.tokens[i].empty())
            t.matchWhole.push_back(&t.tokens[i]);
    }
    std::stable_sort(t.matchWhole.begin(), t.matchWhole.end(),
                     [](const std::string* a, const std::string* b) { return a->size() > b->size(); });
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        t.byteIds[b] = t.find(name);
    }
    t.bos = optionalId(f, "tokenizer.ggml.bos_token_id", n);
    t.eos = optionalId(f, "tokenizer.ggml.eos_token_id", n);
    t.unk = optionalId(f, "tokenizer.ggml.unknown_token_id", n);
    if (f.has("tokenizer.ggml.add_bos_token")) t.addBos = f.getBool("tokenizer.ggml.add_bos_token");
    if (f.has("tokenizer.ggml.add_space_prefix"))
        t.addSpacePrefix = f.getBool("tokenizer.ggml.add_space_prefix");
    return GgufSpmTokenizer(std::move(impl));
}

std::vector<int32_t> GgufSpmTokenizer::encode(const std::string& utf8, bool addSpecial) const
{
    const Impl& t = *impl_;
    const size_t bad = utf8FirstInvalid(utf8);
    if (bad != std::string::npos)
        throw Error("tokenizer input is not valid UTF-8 at byte " + std::to_string(bad));
    std::vector<int32_t> out;
    if (addSpecial && t.addBos && t.bos >= 0) out.push_back(t.bos);
    bool prevSpecial = true;  // the text start counts as following a special token
    size_t segStart = 0;
    const auto flushText = [&](size_t end) {
        if (end > segStart) {
            t.encodePiece(utf8.substr(segStart, end - segStart), t.addSpacePrefix && prevSpecial, out);
            prevSpecial = false;
        }
    };
    for (size_t i = 0; i < utf8.size();) {
        const std::string* hit = nullptr;
        for (const std::string* s : t.matchWhole)
            if (utf8.compare(i, s->size(), *s) == 0) {
                hit = s;
                break;
            }
        if (!hit) {
            ++i;
            continue;
        }
        flushText(i);
        out.push_back(t.find(*hit));
        prevSpecial = true;
        i += hit->size();
        segStart = i;
    }
    flushText(utf8.size());
    return out;
}

std::string GgufSpmTokenizer::decode(const std::vector<int32_t>& ids, bool skipSpecial) const
{
    const Impl& t = *impl_;
    std::string out;
    bool first = true;  // no piece written yet
    for (size_t k = 0; k < ids.size(); ++k) {
        const int32_t id = ids[k];
        if (id < 0 || size_t(id) >= t.tokens.size())
            throw Error(t.path + ": token id " + std::to_string(id) + " out of range");
        const std::string& piece = t.tokens[size_t(id)];
        switch (t.types[size_t(id)]) {
        case kControl:
            if (!skipSpecial) out += piece;
            break;
        case kByte: {
            unsigned v = 0;
            if (std::sscanf(piece.c_str(), "<0x%2X>", &v) == 1) out += char(v);
            break;
        }
        case kUnknown:
            out += " \xE2\x81\x87 ";  // SentencePiece's surface for an unknown piece
            break;
        case kUserDefined:
            out += piece;
            break;
        default: {
            std::string text;
            for (size_t i = 0; i < piece.size();) {
                if (piece.compare(i, 3, kMetaspace) == 0) {
                    text += ' ';
                    i += 3;
                } else {
                    text += piece[i++];
                }
            }
            // The space add_space_prefix put before the text is not part of it.
            if (first && t.addSpacePrefix && !text.empty() && text[0] == ' ') text.erase(0, 1);
            out += text;
        }
        }
        if (!(skipSpecial && t.types[size_t(id)] == kControl)) first = false;
    }
    return utf8Lossy(out);
}

int GgufSpmTokenizer::vocabSize() const { return int(impl_->tokens.size()); }

int32_t GgufSpmTokenizer::bosId() const { return impl_->bos; }

int32_t GgufSpmTokenizer::eosId() const { return impl_->eos; }

int32_t GgufSpmTokenizer::specialId(const std::string& text) const
{
    for (const std::string* s : impl_->matchWhole)
        if (*s == text) return impl_->find(text);
    return -1;
}

}  // namespace kvscope
