#include "model/bpe_tokenizer.h"

#include "common/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
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

void appendUtf8(std::string& out, uint32_t cp)
{
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not valid (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t utf8SeqLen(const std::string& s, size_t i)
{
    const auto b = [&](size_t k) { return uint8_t(s[k]); };
    const size_t n = s.size();
    const uint8_t c = b(i);
    if (c < 0x80) return 1;
    const auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (!cont(i + 1) || !cont(i + 2)) return 0;
        if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
        if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // surrogate
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
        if (c == 0xF0 && b(i + 1) < 0x90) return 0;   // overlong
        if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // > U+10FFFF
        return 4;
    }
    return 0;
}

// Decodes one code point of a string already known to be valid UTF-8.
uint32_t decodeAt(const std::string& s, size_t i, size_t len)
{
    const auto b = [&](size_t k) { return uint32_t(uint8_t(s[k])); };
    switch (len) {
    case 1: return b(i);
    case 2: return ((b(i) & 0x1F) << 6) | (b(i + 1) & 0x3F);
    case 3: return ((b(i) & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    default:
        return ((b(i) & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
               (b(i + 3) & 0x3F);
    }
}

// Invalid sequences become U+FFFD (one per maximal invalid prefix, close to Rust's lossy rule).
std::string utf8Lossy(const std::string& s)
{
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const size_t len = utf8SeqLen(s, i);
        if (len) {
            out.append(s, i, len);
            i += len;
            continue;
        }
        // Skip the lead byte and the continuation bytes that still form a valid prefix.
        const uint8_t c = uint8_t(s[i]);
        size_t skip = 1;
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
        while (skip < want && i + skip < s.size() && (uint8_t(s[i + skip]) & 0xC0) == 0x80) {
            const uint8_t n1 = uint8_t(s[i + 1]);
            if (skip == 1 && ((c == 0xE0 && n1 < 0xA0) || (c == 0xED && n1 >= 0xA0) ||
                              (c == 0xF0 && n1 < 0x90) || (c == 0xF4 && n1 >= 0x90) || c > 0xF4))
                break;
            ++skip;
        }
        out += "\xEF\xBF\xBD";
        i += skip;
    }
    return out;
}

struct RegexDeleter {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

struct MatchDataDeleter {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

struct BpeTokenizer::Impl {
    std::string path;
    std::unordered_map<std::string, int32_t> vocab;
    std::vector<std::string> idToToken;  // model tokens (byte-level mapped form) and added content
    std::vector<uint8_t> isAdded;        // per id: 1 added, 2 added + special
    struct Merge {
        int32_t rank;
        int32_t newId;
    };
    std::unordered_map<uint64_t, Merge> merges;
    bool ignoreMerges = false;

    struct Added {
        std::string content;
        int32_t id;
    };
    std::vector<Added> added;                      // sorted longest first
    std::vector<std::vector<size_t>> addedByFirst;  // first byte -> indices into `added`

    std::vector<std::shared_ptr<pcre2_code>> splits;  // Split(Isolated) steps, then GPT-2 regex

    std::string byteToUnicode[256];
    std::unordered_map<uint32_t, uint8_t> unicodeToByte;

    bool template_ = false;
    std::vector<std::vector<int32_t>> templateItems;  // empty vector marks the sequence slot
    int32_t bos = -1;
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
                throw Error("BPE tokenizer: regex match failed: " +
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

    void bpe(const std::string& word, std::vector<int32_t>& out) const
    {
        if (ignoreMerges) {
            auto it = vocab.find(word);
            if (it != vocab.end()) {
                out.push_back(it->second);
                return;
            }
        }
        struct Sym {
            int32_t id;
            int prev, next;
            bool alive;
        };
        std::vector<Sym> syms;
        for (size_t i = 0; i < word.size();) {
            const size_t len = std::max<size_t>(1, utf8SeqLen(word, i));
            auto it = vocab.find(word.substr(i, len));
            if (it == vocab.end())
                throw Error(path + ": BPE: character '" + word.substr(i, len) +
                            "' is not in the vocabulary and there is no unk_token");
            const int n = int(syms.size());
            syms.push_back({it->second, n - 1, -1, true});
            if (n > 0) syms[n - 1].next = n;
            i += len;
        }
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

    void encodePlain(const std::string& text, pcre2_match_data* md,
                     std::vector<int32_t>& out) const
    {
        std::vector<std::string> pieces{text}, next;
        for (const auto& re : splits) {
            next.clear();
            for (const auto& p : pieces) split(re.get(), md, p, next);
            pieces.swap(next);
        }
        std::string mapped;
        for (const auto& p : pieces) {
            if (p.empty()) continue;
            mapped.clear();
            for (unsigned char b : p) mapped += byteToUnicode[b];
            bpe(mapped, out);
        }
    }
};

namespace {

using Impl = BpeTokenizer::Impl;

std::string typeOf(const json& j)
{
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return std::string();
    return j["type"].get<std::string>();
}

bool isFalse(const json& j, const char* key)
{
    return !j.contains(key) || j[key].is_null() || (j[key].is_boolean() && !j[key].get<bool>());
}

void parseModel(Impl& t, const json& m)
{
    const std::string type = m.is_object() && m.contains("type") ? typeOf(m) : std::string("BPE");
    if (!m.is_object()) throw t.err("model", "missing or not an object");
    if (type != "BPE") throw t.err("model", "model type \"" + type + "\" not supported (only BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
        throw t.err("model", "dropout not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
            throw t.err("model", std::string(k) + " not supported");
    if (!isFalse(m, "byte_fallback")) throw t.err("model", "byte_fallback not supported");
    t.ignoreMerges = m.contains("ignore_merges") && m["ignore_merges"].is_boolean() &&
                     m["ignore_merges"].get<bool>();

    if (!m.contains("vocab") || !m["vocab"].is_object())
        throw t.err("model.vocab", "missing or not an object");
    int32_t maxId = -1;
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
        if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
            it.value().get<int64_t>() > (1 << 30))
            throw t.err("model.vocab", "id of \"" + it.key() + "\" is not a valid integer");
        const int32_t id = it.value().get<int32_t>();
        t.vocab[it.key()] = id;
        maxId = std::max(maxId, id);
    }
    t.idToToken.assign(size_t(maxId + 1), std::string());
    t.isAdded.assign(size_t(maxId + 1), 0);
    for (const auto& kv : t.vocab) t.idToToken[size_t(kv.second)] = kv.first;

    if (!m.contains("merges") || !m["merges"].is_array())
        throw t.err("model.merges", "missing or not an array");
    const json& merges = m["merges"];
    t.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const json& e = merges[i];
        std::string a, b;
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                throw t.err("model.merges[" + std::to_string(i) + "]",
                            "\"" + s + "\" is not two tokens separated by one space");
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            a = e[0].get<std::string>();
            b = e[1].get<std::string>();
        } else {
            throw t.err("model.merges[" + std::to_string(i) + "]",
                        "neither \"a b\" nor a pair of strings");
        }
        auto ia = t.vocab.find(a), ib = t.vocab.find(b), iab = t.vocab.find(a + b);
        if (ia == t.vocab.end() || ib == t.vocab.end() || iab == t.vocab.end())
            throw t.err("model.merges[" + std::to_string(i) + "]",
                        "token of merge \"" + a + " " + b + "\" not in the vocabulary");
        const uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
        t.merges.emplace(key, Impl::Merge{int32_t(i), iab->second});  // first (lowest) rank wins
    }
}

void parseAdded(Impl& t, const json& j)
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
        for (const char* k : {"lstrip", "rstrip", "single_word"})
            if (!isFalse(e, k)) throw t.err(place, std::string(k) + " not supported");
        const std::string content = e["content"].get<std::string>();
        if (content.empty()) throw t.err(place, "empty content");
        const int32_t id = e["id"].get<int32_t>();
        const bool special = e.contains("special") && e["special"].is_boolean() &&
                             e["special"].get<bool>();
        if (size_t(id) >= t.idToToken.size()) {
            t.idToToken.resize(size_t(id) + 1);
            t.isAdded.resize(size_t(id) + 1, 0);
        }
        t.idToToken[size_t(id)] = content;
        t.isAdded[size_t(id)] = special ? 2 : 1;
        t.added.push_back({content, id});
    }
    std::stable_sort(t.added.begin(), t.added.end(), [](const Impl::Added& x, const Impl::Added& y) {
        return x.content.size() > y.content.size();
    });
    t.addedByFirst.assign(256, {});
    for (size_t k = 0; k < t.added.size(); ++k)
        t.addedByFirst[uint8_t(t.added[k].content[0])].push_back(k);
}

void parsePreTokenizer(Impl& t, const json& j)
{
    if (j.is_null()) throw t.err("pre_tokenizer", "null pre_tokenizer not supported (need ByteLevel)");
    std::vector<json> steps;
    const std::string type = typeOf(j);
    if (type == "Sequence") {
        if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
            throw t.err("pre_tokenizer", "Sequence without pretokenizers");
        for (const auto& s : j["pretokenizers"]) steps.push_back(s);
    } else {
        steps.push_back(j);
    }
    for (size_t i = 0; i < steps.size(); ++i) {
        const json& s = steps[i];
        const std::string st = typeOf(s);
        const std::string place = "pre_tokenizer[" + std::to_string(i) + "]";
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
        } else if (st == "ByteLevel") {
            if (i + 1 != steps.size()) throw t.err(place, "ByteLevel must be the last step");
            if (!isFalse(s, "add_prefix_space"))
                throw t.err(place, "ByteLevel add_prefix_space not supported");
            const bool useRegex = !s.contains("use_regex") ||
                                  (s["use_regex"].is_boolean() && s["use_regex"].get<bool>());
            if (useRegex) t.splits.push_back(t.compile(kGpt2Pattern, place));
            return;
        } else {
            throw t.err(place, "pre-tokenizer \"" + (st.empty() ? s.dump() : st) +
                                   "\" not supported");
        }
    }
    throw t.err("pre_tokenizer", "no ByteLevel step (only byte-level BPE is supported)");
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
            for (const auto& v : specials[name]["ids"]) ids.push_back(v.get<int32_t>());
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
    std::vector<json> steps;
    if (typeOf(j) == "Sequence" && j.contains("processors") && j["processors"].is_array())
        for (const auto& s : j["processors"]) steps.push_back(s);
    else
        steps.push_back(j);
    for (const auto& s : steps) {
        const std::string st = typeOf(s);
        if (st == "ByteLevel") continue;  // only changes offsets
        if (st == "TemplateProcessing" && !t.template_) {
            parseTemplate(t, s, "post_processor");
            continue;
        }
        throw t.err("post_processor", "post-processor \"" + st + "\" not supported");
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

    try {
        if (root.contains("normalizer") && !root["normalizer"].is_null())
            throw t.err("normalizer", "normalizer \"" + typeOf(root["normalizer"]) +
                                          "\" not supported");
        if (!root.contains("model")) throw t.err("model", "missing");
        parseModel(t, root["model"]);
        parseAdded(t, root.contains("added_tokens") ? root["added_tokens"] : json());
        parsePreTokenizer(t, root.contains("pre_tokenizer") ? root["pre_tokenizer"] : json());
        parsePostProcessor(t, root.contains("post_processor") ? root["post_processor"] : json());
        const json dec = root.contains("decoder") ? root["decoder"] : json();
        if (typeOf(dec) != "ByteLevel")
            throw t.err("decoder", "decoder " + (dec.is_null() ? std::string("null")
                                                               : "\"" + typeOf(dec) + "\"") +
                                       " not supported (only ByteLevel)");
    } catch (const json::exception& e) {
        throw inputError(path, "", std::string("unexpected JSON structure: ") + e.what());
    }

    // GPT-2 bytes_to_unicode: printable bytes map to themselves, the others to 256 + n in order.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                               (b >= 0xAE && b <= 0xFF);
        const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
        appendUtf8(t.byteToUnicode[b], cp);
        t.unicodeToByte[cp] = uint8_t(b);
    }
    for (int b = 0; b < 256; ++b)
        if (!t.vocab.count(t.byteToUnicode[b]))
            throw t.err("model.vocab", "byte " + std::to_string(b) +
                                           " has no token (not a byte-level vocabulary)");
    for (const auto& kv : t.merges)
        if (size_t(kv.second.newId) >= t.idToToken.size())
            throw t.err("model.merges", "merge result out of range");
    t.vocabSize = int(t.idToToken.size());
    return BpeTokenizer(std::move(impl));
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& utf8, bool addSpecial) const
{
    const Impl& t = *impl_;
    for (size_t i = 0; i < utf8.size();) {
        const size_t len = utf8SeqLen(utf8, i);
        if (!len)
            throw Error("BPE tokenizer: input is not valid UTF-8 at byte " + std::to_string(i));
        i += len;
    }
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
        pcre2_match_data_create(4, nullptr));  // ovector of 4 pairs suffices (we read pair 0)
    std::vector<int32_t> ids;
    // Added tokens split the text, leftmost-longest.
    size_t segStart = 0;
    for (size_t i = 0; i < utf8.size();) {
        const Impl::Added* hit = nullptr;
        if (!t.addedByFirst.empty())
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
        if (i > segStart) t.encodePlain(utf8.substr(segStart, i - segStart), md.get(), ids);
        ids.push_back(hit->id);
        i += hit->content.size();
        segStart = i;
    }
    if (segStart < utf8.size()) t.encodePlain(utf8.substr(segStart), md.get(), ids);

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
    std::string bytes;
    for (int32_t id : ids) {
        if (id < 0 || size_t(id) >= t.idToToken.size() ||
            (t.idToToken[size_t(id)].empty() && !t.isAdded[size_t(id)]))
            throw Error("BPE tokenizer: token id " + std::to_string(id) + " out of range");
        if (skipSpecial && t.isAdded[size_t(id)] == 2) continue;
        const std::string& tok = t.idToToken[size_t(id)];
        // ByteLevel decoder: map every character back to its byte; a token with a character
        // outside the table (e.g. an added token) passes through as its UTF-8 bytes.
        std::string mapped;
        bool ok = true;
        for (size_t i = 0; i < tok.size();) {
            const size_t len = std::max<size_t>(1, utf8SeqLen(tok, i));
            auto it = t.unicodeToByte.find(decodeAt(tok, i, len));
            if (it == t.unicodeToByte.end()) {
                ok = false;
                break;
            }
            mapped += char(it->second);
            i += len;
        }
        bytes += ok ? mapped : tok;
    }
    return utf8Lossy(bytes);
}

int BpeTokenizer::vocabSize() const { return impl_->vocabSize; }

int32_t BpeTokenizer::bosId() const { return impl_->bos; }

}  // namespace kvscope
