#include "modelio/bpe_tokenizer.h"

#include "common/error.h"
#include "modelio/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace kvscope {

namespace {

using json = nlohmann::json;

// GPT-2 pre-tokenisation pattern, used by ByteLevel with use_regex = true.
const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

const char* const kMetaspace = "\xE2\x96\x81";  // U+2581 "▁", SentencePiece's visible space

struct RegexDeleter {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

struct MatchDataDeleter {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

void replaceAll(std::string& s, const std::string& from, const std::string& to)
{
    if (from.empty()) return;
    std::string out;
    size_t pos = 0;
    for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
        out.append(s, pos, hit - pos).append(to);
    out.append(s, pos, std::string::npos);
    s.swap(out);
}

bool startsWith(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// "<0x41>" -> 0x41, or -1 when `tok` is not a byte-fallback token.
int byteToken(const std::string& tok)
{
    if (tok.size() != 6 || tok.compare(0, 3, "<0x") != 0 || tok[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; ++k) {
        const char c = tok[size_t(k)];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

}  // namespace

struct BpeTokenizer::Impl {
    std::string path;
    bool byteLevel = false;

    // --- model ---
    std::unordered_map<std::string, int32_t> vocab;
    std::vector<std::string> idToToken;  // model tokens (as spelled in the vocab) and added content
    std::vector<uint8_t> isAdded;        // per id: 1 added, 2 added + special
    struct Merge {
        int32_t rank;
        int32_t newId;
    };
    std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> merge
    bool ignoreMerges = false;
    bool byteFallback = false;
    bool fuseUnk = false;
    int32_t unk = -1;
    int32_t byteIds[256];  // id of "<0xXX>" for byte_fallback, -1 when absent

    // --- added tokens ---
    struct Added {
        std::string content;
        int32_t id;
    };
    std::vector<Added> added;                       // sorted longest first
    std::vector<std::vector<size_t>> addedByFirst;  // first byte -> indices into `added`

    // --- normalizer ---
    struct Norm {
        enum Kind { Unicode, Prepend, Replace } kind;
        const icu::Normalizer2* unicode = nullptr;  // NFC / NFD / NFKC / NFKD
        std::string a, b;                           // Prepend: a; Replace: a -> b
    };
    std::vector<Norm> norms;

    // --- pre-tokenizer ---
    std::vector<std::shared_ptr<pcre2_code>> splits;  // Isolated splits, in order
    bool metaspace = false;
    std::string metaReplacement;
    enum class Prepend { Always, First, Never } metaPrepend = Prepend::Always;
    bool metaSplit = true;
    std::string byteToUnicode[256];
    std::unordered_map<uint32_t, uint8_t> unicodeToByte;

    // --- post-processor ---
    bool template_ = false;
    std::vector<std::vector<int32_t>> templateItems;  // empty vector marks the sequence slot
    int32_t bos = -1;

    // --- decoder ---
    struct Dec {
        enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
        std::string a, b;  // Replace: a -> b; Strip: a = content; Metaspace: a = replacement
        int start = 0, stop = 0;
        bool prepend = true;  // Metaspace: prepend_scheme != never
    };
    std::vector<Dec> decoders;

    int vocabSize = 0;

    Error err(const std::string& place, const std::string& reason) const
    {
        return inputError(path, place, reason);
    }

    std::shared_ptr<pcre2_code> compile(const std::string& pattern, const std::string& place) const
    {
        int code = 0;
        PCRE2_SIZE offset = 0;
        pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof(msg));
            throw err(place, "regex does not compile at offset " + std::to_string(offset) + ": " +
                                 reinterpret_cast<const char*>(msg));
        }
        return std::shared_ptr<pcre2_code>(re, RegexDeleter());
    }

    void setupByteLevelTables()
    {
        // GPT-2 bytes_to_unicode: printable bytes map to themselves, the others to 256 + n in order.
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                                   (b >= 0xAE && b <= 0xFF);
            const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
            utf8Append(byteToUnicode[b], cp);
            unicodeToByte[cp] = uint8_t(b);
        }
    }

    void addMerge(size_t rank, const std::string& a, const std::string& b, const std::string& place)
    {
        auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
        if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end())
            throw err(place, "token of merge \"" + a + " " + b + "\" not in the vocabulary");
        const uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
        merges.emplace(key, Merge{int32_t(rank), iab->second});  // first (lowest) rank wins
    }

    void addAdded(const std::string& content, int32_t id, bool special)
    {
        if (size_t(id) >= idToToken.size()) {
            idToToken.resize(size_t(id) + 1);
            isAdded.resize(size_t(id) + 1, 0);
        }
        idToToken[size_t(id)] = content;
        isAdded[size_t(id)] = special ? 2 : 1;
        added.push_back({content, id});
    }

    void indexAdded()
    {
        std::stable_sort(added.begin(), added.end(),
                         [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
        addedByFirst.assign(256, {});
        for (size_t k = 0; k < added.size(); ++k)
            addedByFirst[uint8_t(added[k].content[0])].push_back(k);
    }

    // Final checks shared by every way of building a tokenizer. GGUF vocabularies may lack a few
    // control bytes (SmolLM2 has no token for byte 4), so for them a missing byte is an error only
    // when the text contains it.
    void finish(bool requireAllBytes)
    {
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof(name), "<0x%02X>", b);
            auto it = vocab.find(name);
            byteIds[b] = it == vocab.end() ? -1 : it->second;
        }
        if (byteLevel) {
            setupByteLevelTables();
            for (int b = 0; b < 256 && requireAllBytes; ++b)
                if (!vocab.count(byteToUnicode[b]))
                    throw err("model.vocab", "byte " + std::to_string(b) +
                                                 " has no token (not a byte-level vocabulary)");
        }
        for (const auto& kv : merges)
            if (size_t(kv.second.newId) >= idToToken.size())
                throw err("model.merges", "merge result out of range");
        indexAdded();
        vocabSize = int(idToToken.size());
    }

    // ----- encoding -----

    // Isolated split: every match and every gap between matches is its own piece.
    void split(const pcre2_code* re, pcre2_match_data* md, const std::string& text,
               std::vector<std::string>& out) const
    {
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        size_t pos = 0, prev = 0;
        while (pos <= text.size()) {
            const int rc = pcre2_match(re, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md,
                                       nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof(msg));
                throw Error(path + ": pre_tokenizer: regex match failed: " +
                            std::string(reinterpret_cast<const char*>(msg)));
            }
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            const size_t s = ov[0], e = ov[1];
            if (e == s) {  // empty match: not a piece; step one code point
                if (s >= text.size()) break;
                pos = s + std::max<size_t>(1, utf8SeqLen(text, s));
                continue;
            }
            if (s > prev) out.push_back(text.substr(prev, s - prev));
            out.push_back(text.substr(s, e - s));
            prev = pos = e;
        }
        if (prev < text.size()) out.push_back(text.substr(prev));
    }

    // The initial symbols of a word: one per character, or its bytes / unk when unknown.
    void initialSymbols(const std::string& word, std::vector<int32_t>& syms) const
    {
        bool lastUnk = false;
        for (size_t i = 0; i < word.size();) {
            const size_t len = std::max<size_t>(1, utf8SeqLen(word, i));
            auto it = vocab.find(word.substr(i, len));
            if (it != vocab.end()) {
                syms.push_back(it->second);
                lastUnk = false;
                i += len;
                continue;
            }
            bool allBytes = byteFallback;
            for (size_t k = 0; allBytes && k < len; ++k) allBytes = byteIds[uint8_t(word[i + k])] >= 0;
            if (allBytes) {
                for (size_t k = 0; k < len; ++k) syms.push_back(byteIds[uint8_t(word[i + k])]);
                lastUnk = false;
            } else if (unk >= 0) {
                if (!(fuseUnk && lastUnk)) syms.push_back(unk);
                lastUnk = true;
            } else {
                throw Error(path + ": model: character '" + word.substr(i, len) +
                            "' is not in the vocabulary and there is no unk_token");
            }
            i += len;
        }
    }

    // Merges adjacent symbols by rank (lowest first, leftmost on ties) until no merge applies.
    void bpe(const std::string& word, std::vector<int32_t>& out) const
    {
        if (ignoreMerges) {
            auto it = vocab.find(word);
            if (it != vocab.end()) {
                out.push_back(it->second);
                return;
            }
        }
        std::vector<int32_t> ids;
        initialSymbols(word, ids);
        struct Sym {
            int32_t id;
            int prev, next;
            bool alive;
        };
        std::vector<Sym> syms(ids.size());
        for (size_t k = 0; k < ids.size(); ++k)
            syms[k] = {ids[k], int(k) - 1, k + 1 < ids.size() ? int(k) + 1 : -1, true};
        struct Cand {
            int32_t rank;
            int pos;
            int32_t newId;
            bool operator>(const Cand& o) const
            {
                return rank != o.rank ? rank > o.rank : pos > o.pos;
            }
        };
        std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
        const auto lookup = [&](int a, int b) -> const Merge* {
            const uint64_t key = (uint64_t(uint32_t(syms[a].id)) << 32) | uint32_t(syms[b].id);
            auto it = merges.find(key);
            return it == merges.end() ? nullptr : &it->second;
        };
        const auto push = [&](int a) {
            if (a < 0 || syms[a].next < 0) return;
            if (const Merge* m = lookup(a, syms[a].next)) heap.push({m->rank, a, m->newId});
        };
        for (int i = 0; i + 1 < int(syms.size()); ++i) push(i);
        while (!heap.empty()) {
            const Cand c = heap.top();
            heap.pop();
            Sym& left = syms[c.pos];
            if (!left.alive || left.next < 0) continue;
            const Merge* m = lookup(c.pos, left.next);
            if (!m || m->newId != c.newId) continue;  // stale entry
            const int r = left.next;
            left.id = c.newId;
            left.next = syms[r].next;
            syms[r].alive = false;
            if (left.next >= 0) syms[left.next].prev = c.pos;
            push(left.prev);
            push(c.pos);
        }
        for (int i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
    }

    std::string normalize(std::string text) const
    {
        for (const Norm& n : norms) {
            switch (n.kind) {
            case Norm::Unicode: {
                UErrorCode status = U_ZERO_ERROR;
                const icu::UnicodeString in = icu::UnicodeString::fromUTF8(text);
                const icu::UnicodeString outU = n.unicode->normalize(in, status);
                if (U_FAILURE(status))
                    throw Error(path + ": normalizer: ICU normalization failed: " +
                                u_errorName(status));
                text.clear();
                outU.toUTF8String(text);
                break;
            }
            case Norm::Prepend:
                if (!text.empty()) text = n.a + text;
                break;
            case Norm::Replace:
                replaceAll(text, n.a, n.b);
                break;
            }
        }
        return text;
    }

    // One piece of text between added tokens; `atStart` when it begins the input.
    void encodePlain(const std::string& raw, bool atStart, pcre2_match_data* md,
                     std::vector<int32_t>& out) const
    {
        std::string text = normalize(raw);
        std::vector<std::string> pieces{text}, next;
        if (metaspace) {
            replaceAll(pieces[0], " ", metaReplacement);
            const bool prepend = metaPrepend == Prepend::Always ||
                                 (metaPrepend == Prepend::First && atStart);
            if (prepend && !startsWith(pieces[0], metaReplacement))
                pieces[0] = metaReplacement + pieces[0];
            if (metaSplit) {  // split before every replacement character (MergedWithNext)
                const std::string whole = pieces[0];
                pieces.clear();
                size_t start = 0;
                for (size_t hit = whole.find(metaReplacement, 1); hit != std::string::npos;
                     hit = whole.find(metaReplacement, hit + metaReplacement.size())) {
                    pieces.push_back(whole.substr(start, hit - start));
                    start = hit;
                }
                pieces.push_back(whole.substr(start));
            }
        }
        for (const auto& re : splits) {
            next.clear();
            for (const auto& p : pieces) split(re.get(), md, p, next);
            pieces.swap(next);
        }
        std::string mapped;
        for (const auto& p : pieces) {
            if (p.empty()) continue;
            if (!byteLevel) {
                bpe(p, out);
                continue;
            }
            mapped.clear();
            for (unsigned char b : p) mapped += byteToUnicode[b];
            bpe(mapped, out);
        }
    }

    // ----- decoding -----

    // Hugging Face decoders work on the list of token strings; each step maps the list.
    std::string runDecoders(std::vector<std::string> toks) const
    {
        for (const Dec& d : decoders) {
            switch (d.kind) {
            case Dec::ByteLevel: {
                // Every character back to its byte; a token with a character outside the table
                // (an added token) passes through as its UTF-8 bytes.
                std::string bytes;
                for (const auto& tok : toks) {
                    std::string mapped;
                    bool ok = true;
                    for (size_t i = 0; i < tok.size() && ok;) {
                        const size_t len = std::max<size_t>(1, utf8SeqLen(tok, i));
                        auto it = unicodeToByte.find(utf8DecodeAt(tok, i, len));
                        if (it == unicodeToByte.end()) ok = false;
                        else mapped += char(it->second);
                        i += len;
                    }
                    bytes += ok ? mapped : tok;
                }
                toks.assign(1, utf8Lossy(bytes));
                break;
            }
            case Dec::Replace:
                for (auto& t : toks) replaceAll(t, d.a, d.b);
                break;
            case Dec::ByteFallback: {
                std::vector<std::string> outT;
                std::string pending;  // consecutive <0xXX> bytes
                size_t pendingCount = 0;
                const auto flush = [&] {
                    if (!pendingCount) return;
                    if (utf8FirstInvalid(pending) == std::string::npos) {
                        outT.push_back(pending);
                    } else {  // not UTF-8: one U+FFFD per byte
                        std::string r;
                        for (size_t k = 0; k < pendingCount; ++k) r += "\xEF\xBF\xBD";
                        outT.push_back(r);
                    }
                    pending.clear();
                    pendingCount = 0;
                };
                for (auto& t : toks) {
                    const int b = byteToken(t);
                    if (b >= 0) {
                        pending += char(b);
                        ++pendingCount;
                    } else {
                        flush();
                        outT.push_back(std::move(t));
                    }
                }
                flush();
                toks.swap(outT);
                break;
            }
            case Dec::Fuse: {
                std::string all;
                for (const auto& t : toks) all += t;
                toks.assign(1, all);
                break;
            }
            case Dec::Strip:
                for (auto& t : toks) {
                    for (int k = 0; k < d.start && startsWith(t, d.a); ++k) t.erase(0, d.a.size());
                    for (int k = 0; k < d.stop && t.size() >= d.a.size() &&
                                    t.compare(t.size() - d.a.size(), d.a.size(), d.a) == 0;
                         ++k)
                        t.erase(t.size() - d.a.size());
                }
                break;
            case Dec::Metaspace:
                // As Hugging Face: every replacement character becomes a space, except in the
                // first token, where they are dropped unless the prepend scheme is "never".
                for (size_t i = 0; i < toks.size(); ++i)
                    replaceAll(toks[i], d.a, i == 0 && d.prepend ? std::string() : std::string(" "));
                break;
            }
        }
        std::string out;
        for (const auto& t : toks) out += t;
        return out;
    }
};

namespace {

using Impl = BpeTokenizer::Impl;

std::string typeOf(const json& j)
{
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return std::string();
    return j["type"].get<std::string>();
}

std::string typeName(const json& j)
{
    const std::string t = typeOf(j);
    return t.empty() ? j.dump() : "\"" + t + "\"";
}

bool isFalse(const json& j, const char* key)
{
    return !j.contains(key) || j[key].is_null() || (j[key].is_boolean() && !j[key].get<bool>());
}

bool isTrue(const json& j, const char* key)
{
    return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

std::string stringField(const Impl& t, const json& j, const char* key, const std::string& place)
{
    if (!j.contains(key) || !j[key].is_string())
        throw t.err(place, std::string("needs a string \"") + key + "\"");
    return j[key].get<std::string>();
}

// Replace-style pattern {"String": "x"}; Regex patterns are refused by name.
std::string stringPattern(const Impl& t, const json& j, const std::string& place)
{
    if (!j.contains("pattern") || !j["pattern"].is_object())
        throw t.err(place, "needs a pattern");
    if (j["pattern"].contains("String") && j["pattern"]["String"].is_string()) {
        std::string p = j["pattern"]["String"].get<std::string>();
        if (p.empty()) throw t.err(place, "empty pattern");
        return p;
    }
    throw t.err(place, "pattern " + j["pattern"].dump() + " not supported (only String)");
}

// A step or a Sequence of steps, flattened.
std::vector<json> stepsOf(const json& j, const char* listKey)
{
    std::vector<json> steps;
    if (typeOf(j) == "Sequence" && j.contains(listKey) && j[listKey].is_array())
        for (const auto& s : j[listKey]) steps.push_back(s);
    else
        steps.push_back(j);
    return steps;
}

void parseModel(Impl& t, const json& m)
{
    if (!m.is_object()) throw t.err("model", "missing or not an object");
    const std::string type = m.contains("type") ? typeOf(m) : std::string("BPE");
    if (type != "BPE") throw t.err("model", "model type \"" + type + "\" not supported (only BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
        throw t.err("model", "dropout not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
            throw t.err("model", std::string(k) + " not supported");
    t.ignoreMerges = isTrue(m, "ignore_merges");
    t.byteFallback = isTrue(m, "byte_fallback");
    t.fuseUnk = isTrue(m, "fuse_unk");

    if (!m.contains("vocab") || !m["vocab"].is_object())
        throw t.err("model.vocab", "missing or not an object");
    int32_t maxId = -1;
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
        if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
            it.value().get<int64_t>() > (1 << 30))
            throw t.err("model.vocab", "id of \"" + it.key() + "\" is not a valid integer");
        // The id tables are dense (one string per id): ids far beyond the entry count would make
        // a small file allocate gigabytes. Real vocabularies are dense; allow generous gaps.
        const size_t idLimit = 2 * m["vocab"].size() + 1024;
        if (uint64_t(it.value().get<int64_t>()) >= idLimit)
            throw t.err("model.vocab", "id " + std::to_string(it.value().get<int64_t>()) + " of \"" + it.key() +
                                           "\" is far beyond the " + std::to_string(m["vocab"].size()) +
                                           " entries (at most " + std::to_string(idLimit - 1) + ")");
        const int32_t id = it.value().get<int32_t>();
        t.vocab[it.key()] = id;
        maxId = std::max(maxId, id);
    }
    t.idToToken.assign(size_t(maxId + 1), std::string());
    t.isAdded.assign(size_t(maxId + 1), 0);
    for (const auto& kv : t.vocab) t.idToToken[size_t(kv.second)] = kv.first;

    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
        if (!m["unk_token"].is_string()) throw t.err("model.unk_token", "not a string");
        auto it = t.vocab.find(m["unk_token"].get<std::string>());
        if (it == t.vocab.end()) throw t.err("model.unk_token", "not in the vocabulary");
        t.unk = it->second;
    }

    if (!m.contains("merges") || !m["merges"].is_array())
        throw t.err("model.merges", "missing or not an array");
    const json& merges = m["merges"];
    t.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const json& e = merges[i];
        const std::string place = "model.merges[" + std::to_string(i) + "]";
        std::string a, b;
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            const size_t sp = s.find(' ', 1);  // a leading space is part of the first token
            if (sp == std::string::npos) throw t.err(place, "\"" + s + "\" has no space");
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            a = e[0].get<std::string>();
            b = e[1].get<std::string>();
        } else {
            throw t.err(place, "neither \"a b\" nor a pair of strings");
        }
        t.addMerge(i, a, b, place);
    }
}

void parseAdded(Impl& t, const json& j, bool haveNormalizer)
{
    if (j.is_null()) return;
    if (!j.is_array()) throw t.err("added_tokens", "not an array");
    for (size_t i = 0; i < j.size(); ++i) {
        const json& e = j[i];
        const std::string place = "added_tokens[" + std::to_string(i) + "]";
        if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() ||
            !e.contains("content") || !e["content"].is_string() || e["id"].get<int64_t>() < 0 ||
            e["id"].get<int64_t>() > (1 << 30))
            throw t.err(place, "needs an integer id and a string content");
        // As for the vocabulary: the id tables are dense, so an id is bounded by the entries.
        const size_t idLimit = 2 * (t.idToToken.size() + j.size()) + 1024;
        if (uint64_t(e["id"].get<int64_t>()) >= idLimit)
            throw t.err(place, "id " + std::to_string(e["id"].get<int64_t>()) + " is far beyond the " +
                                   std::to_string(t.idToToken.size()) + " vocabulary ids and " +
                                   std::to_string(j.size()) + " added tokens (at most " +
                                   std::to_string(idLimit - 1) + ")");
        for (const char* k : {"lstrip", "rstrip", "single_word"})
            if (!isFalse(e, k)) throw t.err(place, std::string(k) + " not supported");
        const bool special = isTrue(e, "special");
        // A normalized added token is matched in normalized text; we match raw text only.
        if (haveNormalizer && !special && !isFalse(e, "normalized"))
            throw t.err(place, "normalized=true with a normalizer not supported");
        const std::string content = e["content"].get<std::string>();
        if (content.empty()) throw t.err(place, "empty content");
        t.addAdded(content, e["id"].get<int32_t>(), special);
    }
}

void parseNormalizer(Impl& t, const json& j)
{
    if (j.is_null()) return;
    const auto steps = stepsOf(j, "normalizers");
    for (size_t i = 0; i < steps.size(); ++i) {
        const json& s = steps[i];
        const std::string st = typeOf(s);
        const std::string place = "normalizer[" + std::to_string(i) + "]";
        Impl::Norm n{Impl::Norm::Unicode, nullptr, {}, {}};
        if (st == "NFC" || st == "NFD" || st == "NFKC" || st == "NFKD") {
            UErrorCode status = U_ZERO_ERROR;
            n.unicode = st == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                        : st == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                        : st == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                       : icu::Normalizer2::getNFKDInstance(status);
            if (U_FAILURE(status) || !n.unicode)
                throw t.err(place, st + ": ICU has no data: " + u_errorName(status));
        } else if (st == "Prepend") {
            n.kind = Impl::Norm::Prepend;
            n.a = stringField(t, s, "prepend", place);
        } else if (st == "Replace") {
            n.kind = Impl::Norm::Replace;
            n.a = stringPattern(t, s, place);
            n.b = stringField(t, s, "content", place);
        } else {
            throw t.err(place, "normalizer " + typeName(s) + " not supported");
        }
        t.norms.push_back(n);
    }
}

void parsePreTokenizer(Impl& t, const json& j)
{
    if (j.is_null()) return;  // SentencePiece-style files normalise spaces instead
    const auto steps = stepsOf(j, "pretokenizers");
    for (size_t i = 0; i < steps.size(); ++i) {
        const json& s = steps[i];
        const std::string st = typeOf(s);
        const std::string place = "pre_tokenizer[" + std::to_string(i) + "]";
        if (t.byteLevel) throw t.err(place, "ByteLevel must be the last step");
        if (st == "Split") {
            if (!s.contains("pattern") || !s["pattern"].is_object() ||
                !s["pattern"].contains("Regex") || !s["pattern"]["Regex"].is_string())
                throw t.err(place, "Split pattern other than Regex not supported");
            if (!s.contains("behavior") || s["behavior"] != "Isolated")
                throw t.err(place, "Split behavior " +
                                       (s.contains("behavior") ? s["behavior"].dump() : "missing") +
                                       " not supported (only Isolated)");
            if (!isFalse(s, "invert")) throw t.err(place, "Split invert not supported");
            t.splits.push_back(t.compile(s["pattern"]["Regex"].get<std::string>(), place));
        } else if (st == "Digits") {
            // Unicode numbers (\p{N}, Rust's char::is_numeric), one by one or in runs.
            t.splits.push_back(t.compile(isTrue(s, "individual_digits") ? "\\p{N}" : "\\p{N}+", place));
        } else if (st == "ByteLevel") {
            if (!isFalse(s, "add_prefix_space"))
                throw t.err(place, "ByteLevel add_prefix_space not supported");
            const bool useRegex = !s.contains("use_regex") ||
                                  (s["use_regex"].is_boolean() && s["use_regex"].get<bool>());
            if (useRegex) t.splits.push_back(t.compile(kGpt2Pattern, place));
            t.byteLevel = true;
        } else if (st == "Metaspace") {
            if (t.metaspace || !t.splits.empty())
                throw t.err(place, "Metaspace must be the only pre-tokenizer");
            t.metaspace = true;
            t.metaReplacement = s.contains("replacement") && s["replacement"].is_string()
                                    ? s["replacement"].get<std::string>()
                                    : std::string(kMetaspace);
            if (t.metaReplacement.empty() || utf8SeqLen(t.metaReplacement, 0) != t.metaReplacement.size())
                throw t.err(place, "Metaspace replacement must be one character");
            std::string scheme = "always";
            if (s.contains("prepend_scheme") && s["prepend_scheme"].is_string())
                scheme = s["prepend_scheme"].get<std::string>();
            else if (s.contains("add_prefix_space") && s["add_prefix_space"].is_boolean())
                scheme = s["add_prefix_space"].get<bool>() ? "always" : "never";  // older files
            if (scheme == "always") t.metaPrepend = Impl::Prepend::Always;
            else if (scheme == "first") t.metaPrepend = Impl::Prepend::First;
            else if (scheme == "never") t.metaPrepend = Impl::Prepend::Never;
            else throw t.err(place, "Metaspace prepend_scheme \"" + scheme + "\" not supported");
            t.metaSplit = !s.contains("split") || isTrue(s, "split");
        } else {
            throw t.err(place, "pre-tokenizer " + typeName(s) + " not supported");
        }
    }
}

void parseTemplate(Impl& t, const json& p, const std::string& place)
{
    if (!p.contains("single") || !p["single"].is_array())
        throw t.err(place, "TemplateProcessing without a single template");
    const json specials = p.contains("special_tokens") ? p["special_tokens"] : json::object();
    bool seenSeq = false;
    for (const auto& item : p["single"]) {
        if (item.contains("Sequence")) {
            if (item["Sequence"].value("id", std::string()) != "A" || seenSeq)
                throw t.err(place, "single template sequence other than one \"A\" not supported");
            seenSeq = true;
            t.templateItems.push_back({});
        } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
            const std::string name = item["SpecialToken"]["id"].get<std::string>();
            if (!specials.contains(name) || !specials[name].contains("ids") ||
                !specials[name]["ids"].is_array() || specials[name]["ids"].empty())
                throw t.err(place, "special token \"" + name + "\" has no ids");
            std::vector<int32_t> ids;
            for (const auto& v : specials[name]["ids"]) {
                const int32_t id = v.get<int32_t>();
                if (id < 0 || size_t(id) >= t.idToToken.size())
                    throw t.err(place, "special token \"" + name + "\" id out of range");
                ids.push_back(id);
            }
            if (!seenSeq && t.templateItems.empty() && t.bos < 0) t.bos = ids[0];
            t.templateItems.push_back(ids);
        } else {
            throw t.err(place, "template item " + item.dump() + " not supported");
        }
    }
    if (!seenSeq) throw t.err(place, "single template has no sequence");
    t.template_ = true;
}

void parsePostProcessor(Impl& t, const json& j)
{
    if (j.is_null()) return;
    for (const auto& s : stepsOf(j, "processors")) {
        const std::string st = typeOf(s);
        if (st == "ByteLevel") continue;  // only changes offsets
        if (st == "TemplateProcessing" && !t.template_) {
            parseTemplate(t, s, "post_processor");
            continue;
        }
        throw t.err("post_processor", "post-processor " + typeName(s) + " not supported");
    }
}

void parseDecoder(Impl& t, const json& j)
{
    if (j.is_null()) throw t.err("decoder", "null decoder not supported");
    const auto steps = stepsOf(j, "decoders");
    for (size_t i = 0; i < steps.size(); ++i) {
        const json& s = steps[i];
        const std::string st = typeOf(s);
        const std::string place = "decoder[" + std::to_string(i) + "]";
        Impl::Dec d{Impl::Dec::Fuse, {}, {}, 0, 0, true};
        if (st == "ByteLevel") {
            d.kind = Impl::Dec::ByteLevel;
        } else if (st == "Replace") {
            d.kind = Impl::Dec::Replace;
            d.a = stringPattern(t, s, place);
            d.b = stringField(t, s, "content", place);
        } else if (st == "ByteFallback") {
            d.kind = Impl::Dec::ByteFallback;
        } else if (st == "Fuse") {
            d.kind = Impl::Dec::Fuse;
        } else if (st == "Strip") {
            d.kind = Impl::Dec::Strip;
            d.a = stringField(t, s, "content", place);
            if (d.a.empty() || utf8SeqLen(d.a, 0) != d.a.size())
                throw t.err(place, "Strip content must be one character");
            if (!s.contains("start") || !s["start"].is_number_unsigned() || !s.contains("stop") ||
                !s["stop"].is_number_unsigned() || s["start"].get<uint64_t>() > 1024 ||
                s["stop"].get<uint64_t>() > 1024)
                throw t.err(place, "Strip needs small non-negative start and stop");
            d.start = s["start"].get<int>();
            d.stop = s["stop"].get<int>();
        } else if (st == "Metaspace") {
            d.kind = Impl::Dec::Metaspace;
            d.a = s.contains("replacement") && s["replacement"].is_string()
                      ? s["replacement"].get<std::string>()
                      : std::string(kMetaspace);
            if (s.contains("prepend_scheme") && s["prepend_scheme"].is_string())
                d.prepend = s["prepend_scheme"].get<std::string>() != "never";
            else if (s.contains("add_prefix_space") && s["add_prefix_space"].is_boolean())
                d.prepend = s["add_prefix_space"].get<bool>();
        } else {
            throw t.err(place, "decoder " + typeName(s) + " not supported");
        }
        t.decoders.push_back(d);
    }
}

// The two families must not be mixed: a byte-level file spells bytes as characters, a
// SentencePiece-style one spells spaces as "▁"; a mix would tokenise without error but wrongly.
void checkFamily(const Impl& t)
{
    const bool byteDecoder = std::any_of(t.decoders.begin(), t.decoders.end(),
                                         [](const Impl::Dec& d) { return d.kind == Impl::Dec::ByteLevel; });
    if (t.byteLevel) {
        if (t.metaspace) throw t.err("pre_tokenizer", "Metaspace mixed with ByteLevel not supported");
        for (const auto& n : t.norms)
            if (n.kind != Impl::Norm::Unicode)
                throw t.err("normalizer", "Prepend/Replace with a ByteLevel pre-tokenizer not supported");
        if (t.byteFallback) throw t.err("model", "byte_fallback with a ByteLevel pre-tokenizer not supported");
        if (t.decoders.size() != 1 || !byteDecoder)
            throw t.err("decoder", "a ByteLevel pre-tokenizer needs the ByteLevel decoder alone");
    } else {
        if (byteDecoder)
            throw t.err("decoder", t.metaspace ? "ByteLevel decoder with a Metaspace pre-tokenizer not supported"
                                               : "ByteLevel decoder without a ByteLevel pre-tokenizer not supported");
        if (!t.splits.empty())
            throw t.err("pre_tokenizer", "Split/Digits without ByteLevel not supported");
    }
}

}  // namespace

BpeTokenizer BpeTokenizer::fromJsonFile(const std::string& path)
{
    auto impl = std::make_shared<Impl>();
    Impl& t = *impl;
    t.path = path;
    std::ifstream in(path, std::ios::binary);
    if (!in) throw inputError(path, "", "cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    json root;
    try {
        root = json::parse(ss.str());
    } catch (const json::exception& e) {
        throw inputError(path, "", std::string("not valid JSON: ") + e.what());
    }
    if (!root.is_object()) throw inputError(path, "", "top level is not a JSON object");

    const auto field = [&](const char* k) { return root.contains(k) ? root[k] : json(); };
    try {
        if (!root.contains("model")) throw t.err("model", "missing");
        parseModel(t, root["model"]);
        parseNormalizer(t, field("normalizer"));
        parseAdded(t, field("added_tokens"), !t.norms.empty());
        parsePreTokenizer(t, field("pre_tokenizer"));
        parsePostProcessor(t, field("post_processor"));
        parseDecoder(t, field("decoder"));
        checkFamily(t);
    } catch (const json::exception& e) {
        throw inputError(path, "", std::string("unexpected JSON structure: ") + e.what());
    }
    t.finish(true);
    return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::fromByteLevelSpec(const ByteLevelBpeSpec& spec)
{
    auto impl = std::make_shared<Impl>();
    Impl& t = *impl;
    t.path = spec.source;
    t.byteLevel = true;
    t.idToToken = spec.tokens;
    t.isAdded.assign(spec.tokens.size(), 0);
    for (size_t i = 0; i < spec.tokens.size(); ++i) t.vocab.emplace(spec.tokens[i], int32_t(i));
    for (size_t i = 0; i < spec.merges.size(); ++i) {
        const std::string& s = spec.merges[i];
        const std::string place = "merges[" + std::to_string(i) + "]";
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw t.err(place, "\"" + s + "\" has no space");
        t.addMerge(i, s.substr(0, sp), s.substr(sp + 1), place);
    }
    for (size_t i = 0; i < spec.splitPatterns.size(); ++i)
        t.splits.push_back(t.compile(spec.splitPatterns[i], "pre-tokenizer regex " + std::to_string(i)));
    const auto addIds = [&](const std::vector<int32_t>& ids, bool special) {
        for (int32_t id : ids) {
            if (id < 0 || size_t(id) >= spec.tokens.size() || spec.tokens[size_t(id)].empty())
                throw t.err("special tokens", "id " + std::to_string(id) + " out of range or empty");
            t.addAdded(spec.tokens[size_t(id)], id, special);
        }
    };
    addIds(spec.specialIds, true);
    addIds(spec.userIds, false);
    if (spec.addBos) {
        if (spec.bos < 0 || size_t(spec.bos) >= spec.tokens.size())
            throw t.err("bos", "BOS id " + std::to_string(spec.bos) + " out of range");
        t.template_ = true;
        t.templateItems = {{spec.bos}, {}};
    }
    t.bos = spec.bos;
    t.decoders.push_back({Impl::Dec::ByteLevel, {}, {}, 0, 0, true});
    t.finish(false);
    return BpeTokenizer(std::move(impl));
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& utf8, bool addSpecial) const
{
    const Impl& t = *impl_;
    const size_t bad = utf8FirstInvalid(utf8);
    if (bad != std::string::npos)
        throw Error("tokenizer input is not valid UTF-8 at byte " + std::to_string(bad));
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
        pcre2_match_data_create(4, nullptr));  // ovector of 4 pairs suffices (we read pair 0)
    std::vector<int32_t> ids;
    // Added tokens split the text, leftmost-longest.
    size_t segStart = 0;
    for (size_t i = 0; i < utf8.size();) {
        const Impl::Added* hit = nullptr;
        for (size_t k : t.addedByFirst[uint8_t(utf8[i])]) {
            const auto& a = t.added[k];
            if (utf8.compare(i, a.content.size(), a.content) == 0) {
                hit = &a;  // sorted longest first
                break;
            }
        }
        if (!hit) {
            ++i;
            continue;
        }
        if (i > segStart)
            t.encodePlain(utf8.substr(segStart, i - segStart), segStart == 0, md.get(), ids);
        ids.push_back(hit->id);
        i += hit->content.size();
        segStart = i;
    }
    if (segStart < utf8.size()) t.encodePlain(utf8.substr(segStart), segStart == 0, md.get(), ids);

    if (!addSpecial || !t.template_) return ids;
    std::vector<int32_t> out;
    for (const auto& item : t.templateItems) {
        if (item.empty())
            out.insert(out.end(), ids.begin(), ids.end());
        else
            out.insert(out.end(), item.begin(), item.end());
    }
    return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skipSpecial) const
{
    const Impl& t = *impl_;
    std::vector<std::string> toks;
    toks.reserve(ids.size());
    for (int32_t id : ids) {
        if (id < 0 || size_t(id) >= t.idToToken.size() ||
            (t.idToToken[size_t(id)].empty() && !t.isAdded[size_t(id)]))
            throw Error(t.path + ": token id " + std::to_string(id) + " out of range");
        if (skipSpecial && t.isAdded[size_t(id)] == 2) continue;
        toks.push_back(t.idToToken[size_t(id)]);
    }
    return utf8Lossy(t.runDecoders(std::move(toks)));
}

int BpeTokenizer::vocabSize() const { return impl_->vocabSize; }

int32_t BpeTokenizer::bosId() const { return impl_->bos; }

int32_t BpeTokenizer::specialId(const std::string& text) const
{
    for (const auto& a : impl_->added)
        if (a.content == text) return a.id;
    return -1;
}

bool BpeTokenizer::isByteLevel() const { return impl_->byteLevel; }

}  // namespace kvscope
