// The BPE tokenizer's pipeline (bpe_tokenizer.h): added tokens, normalizer, pre-tokenizer, BPE
// merges, post-processor, and the decoders on the way back; also the tokenizer built from a GGUF
// vocabulary. The tokenizer.json reader is bpe_tokenizer_json.cpp.
#include "modelio/bpe_tokenizer.h"

#include "common/error.h"
#include "modelio/bpe_tokenizer_impl.h"
#include "modelio/utf8.h"

#include <unicode/unistr.h>

#include <algorithm>
#include <cstdio>
#include <queue>
#include <utility>

namespace kvscope {

namespace {

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

std::shared_ptr<pcre2_code> BpeTokenizer::Impl::compile(const std::string& pattern, const std::string& place) const
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

void BpeTokenizer::Impl::setupByteLevelTables()
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

void BpeTokenizer::Impl::addMerge(size_t rank, const std::string& a, const std::string& b, const std::string& place)
{
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end())
        throw err(place, "token of merge \"" + a + " " + b + "\" not in the vocabulary");
    const uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
    merges.emplace(key, Merge{int32_t(rank), iab->second});  // first (lowest) rank wins
}

void BpeTokenizer::Impl::addAdded(const std::string& content, int32_t id, bool special)
{
    if (size_t(id) >= idToToken.size()) {
        idToToken.resize(size_t(id) + 1);
        isAdded.resize(size_t(id) + 1, 0);
    }
    idToToken[size_t(id)] = content;
    isAdded[size_t(id)] = special ? 2 : 1;
    added.push_back({content, id});
}

void BpeTokenizer::Impl::indexAdded()
{
    std::stable_sort(added.begin(), added.end(),
                     [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
    addedByFirst.assign(256, {});
    for (size_t k = 0; k < added.size(); ++k)
        addedByFirst[uint8_t(added[k].content[0])].push_back(k);
}

void BpeTokenizer::Impl::finish(bool requireAllBytes)
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

void BpeTokenizer::Impl::split(const pcre2_code* re, pcre2_match_data* md, const std::string& text,
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

void BpeTokenizer::Impl::initialSymbols(const std::string& word, std::vector<int32_t>& syms) const
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

void BpeTokenizer::Impl::bpe(const std::string& word, std::vector<int32_t>& out) const
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

std::string BpeTokenizer::Impl::normalize(std::string text) const
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

void BpeTokenizer::Impl::encodePlain(const std::string& raw, bool atStart, pcre2_match_data* md,
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

std::string BpeTokenizer::Impl::runDecoders(std::vector<std::string> toks) const
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
