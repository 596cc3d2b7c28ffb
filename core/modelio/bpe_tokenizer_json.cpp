// The reader of a Hugging Face tokenizer.json (bpe_tokenizer.h lists what is supported): each
// section of the file checked and turned into the BpeTokenizer::Impl the encoder runs.
#include "modelio/bpe_tokenizer.h"

#include "common/error.h"
#include "modelio/bpe_tokenizer_impl.h"
#include "modelio/utf8.h"

#include <unicode/normalizer2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace kvscope {

namespace {

using json = nlohmann::json;

// GPT-2 pre-tokenisation pattern, used by ByteLevel with use_regex = true.
const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

const char* const kMetaspace = "\xE2\x96\x81";  // U+2581 "▁", SentencePiece's visible space

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

}  // namespace kvscope
