// The suite file format: parsing, splits, the options of a question, answer normalisation
// (suite.h).
#include "eval/suite.h"

#include "common/error.h"
#include "common/file_io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <set>

namespace kvscope {

using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxSuiteBytes = 64u << 20;
constexpr size_t kMaxItems = 4096, kMaxQuestions = 4096, kMaxOptions = 64;

// ---- parsing -------------------------------------------------------------------------------

const json& member(const json& obj, const char* key, bool* present)
{
    static const json none;
    auto it = obj.find(key);
    *present = it != obj.end();
    return *present ? *it : none;
}

std::string text(const json& obj, const char* key, const std::string& file, const std::string& place, bool required,
                 bool allowEmpty = false)
{
    bool present = false;
    const json& v = member(obj, key, &present);
    const std::string where = place + (place.empty() ? "" : ".") + key;
    if (!present) {
        if (required) throw inputError(file, where, "missing");
        return {};
    }
    if (!v.is_string()) throw inputError(file, where, std::string("expected a string, got ") + v.type_name());
    std::string s = v.get<std::string>();
    if (!allowEmpty && s.find_first_not_of(" \t\r\n") == std::string::npos) throw inputError(file, where, "empty");
    return s;
}

void onlyKeys(const json& obj, std::initializer_list<const char*> keys, const std::string& file, const std::string& place)
{
    for (auto it = obj.begin(); it != obj.end(); ++it) {
        bool known = false;
        for (const char* k : keys) known = known || it.key() == k;
        if (!known) throw inputError(file, place + (place.empty() ? "" : ".") + it.key(), "unknown key");
    }
}

}  // namespace

// The options of a question as scored: its choices (distinct, in order) plus the answer when
// absent; without choices, the item's distinct answers in order.
std::vector<std::string> suiteOptions(const SuiteItem& item, const SuiteQuestion& q, int* gold)
{
    std::vector<std::string> opts;
    auto add = [&](const std::string& s) {
        if (std::find(opts.begin(), opts.end(), s) == opts.end()) opts.push_back(s);
    };
    if (q.choices.empty())
        for (const SuiteQuestion& o : item.questions) add(o.answer);
    else
        for (const std::string& c : q.choices) add(c);
    add(q.answer);
    *gold = int(std::find(opts.begin(), opts.end(), q.answer) - opts.begin());
    return opts;
}


size_t Suite::questionCount() const
{
    size_t n = 0;
    for (const SuiteItem& i : items) n += i.questions.size();
    return n;
}

Suite parseSuite(const std::string& textIn, const std::string& file)
{
    if (textIn.size() > kMaxSuiteBytes) throw inputError(file, "", "larger than 64 MiB");
    if (jsonNestingDepth(textIn.data(), textIn.size(), 16) > 8) throw inputError(file, "", "nested deeper than a suite is");
    json j;
    try {
        j = json::parse(textIn);
    } catch (const json::exception& e) {
        std::string what = e.what();
        throw inputError(file, "json", what.substr(what.find(']') == std::string::npos ? 0 : what.find(']') + 2));
    }
    if (!j.is_object()) throw inputError(file, "", std::string("expected an object, got ") + j.type_name());
    onlyKeys(j, {"name", "items"}, file, "");
    Suite s;
    s.source = file;
    s.name = text(j, "name", file, "", true);
    bool present = false;
    const json& items = member(j, "items", &present);
    if (!present) throw inputError(file, "items", "missing");
    if (!items.is_array()) throw inputError(file, "items", std::string("expected an array, got ") + items.type_name());
    if (items.empty()) throw inputError(file, "items", "empty");
    if (items.size() > kMaxItems) throw inputError(file, "items", "more than 4096 items");
    std::set<std::string> ids;
    for (size_t i = 0; i < items.size(); ++i) {
        const std::string place = "items[" + std::to_string(i) + "]";
        const json& it = items[i];
        if (!it.is_object()) throw inputError(file, place, std::string("expected an object, got ") + it.type_name());
        onlyKeys(it, {"id", "context", "continuation", "questions"}, file, place);
        SuiteItem item;
        item.id = text(it, "id", file, place, true);
        if (!ids.insert(item.id).second) throw inputError(file, place + ".id", "duplicate id '" + item.id + "'");
        item.context = text(it, "context", file, place, true);
        item.continuation = text(it, "continuation", file, place, false, true);
        const json& qs = member(it, "questions", &present);
        if (!present) throw inputError(file, place + ".questions", "missing");
        if (!qs.is_array()) throw inputError(file, place + ".questions", std::string("expected an array, got ") + qs.type_name());
        if (qs.size() > kMaxQuestions) throw inputError(file, place + ".questions", "more than 4096 questions");
        for (size_t k = 0; k < qs.size(); ++k) {
            const std::string qp = place + ".questions[" + std::to_string(k) + "]";
            const json& q = qs[k];
            if (!q.is_object()) throw inputError(file, qp, std::string("expected an object, got ") + q.type_name());
            onlyKeys(q, {"question", "answer", "choices", "kind"}, file, qp);
            SuiteQuestion sq;
            sq.question = text(q, "question", file, qp, true);
            sq.answer = text(q, "answer", file, qp, true);
            sq.kind = text(q, "kind", file, qp, false, true);
            const json& ch = member(q, "choices", &present);
            if (present) {
                if (!ch.is_array()) throw inputError(file, qp + ".choices", std::string("expected an array, got ") + ch.type_name());
                if (ch.size() > kMaxOptions) throw inputError(file, qp + ".choices", "more than 64 choices");
                for (size_t c = 0; c < ch.size(); ++c) {
                    const std::string cp = qp + ".choices[" + std::to_string(c) + "]";
                    if (!ch[c].is_string()) throw inputError(file, cp, std::string("expected a string, got ") + ch[c].type_name());
                    if (ch[c].get<std::string>().find_first_not_of(" \t\r\n") == std::string::npos)
                        throw inputError(file, cp, "empty");
                    sq.choices.push_back(ch[c].get<std::string>());
                }
                if (sq.choices.empty()) throw inputError(file, qp + ".choices", "empty (leave the key out for the default)");
            }
            item.questions.push_back(std::move(sq));
        }
        for (size_t k = 0; k < item.questions.size(); ++k) {
            int gold = 0;
            const size_t n = suiteOptions(item, item.questions[k], &gold).size();
            const std::string qp = place + ".questions[" + std::to_string(k) + "]";
            if (n < 2)
                throw inputError(file, qp + (item.questions[k].choices.empty() ? ".answer" : ".choices"),
                                 "fewer than 2 distinct options (give choices, or more questions in the item)");
            if (n > kMaxOptions) throw inputError(file, qp, "more than 64 options (give choices)");
        }
        s.items.push_back(std::move(item));
    }
    return s;
}

Suite loadSuite(const std::string& path)
{
    return parseSuite(readSmallFile(path, kMaxSuiteBytes), path);
}

SuiteSplit parseSuiteSplit(const std::string& s)
{
    if (s == "all") return SuiteSplit::All;
    if (s == "tune") return SuiteSplit::Tune;
    if (s == "eval") return SuiteSplit::Eval;
    throw Error("--split: expected all, tune or eval, got '" + s + "'");
}

const char* suiteSplitName(SuiteSplit s)
{
    return s == SuiteSplit::Tune ? "tune" : s == SuiteSplit::Eval ? "eval" : "all";
}

Suite selectSplit(const Suite& suite, SuiteSplit split)
{
    if (split == SuiteSplit::All) return suite;
    if (suite.items.size() < 2) throw inputError(suite.source, "items", "a split needs at least 2 items");
    Suite out = suite;
    out.items.clear();
    for (size_t i = 0; i < suite.items.size(); ++i)
        if ((i % 2 == 0) == (split == SuiteSplit::Tune)) out.items.push_back(suite.items[i]);
    return out;
}

Suite selectItems(const Suite& suite, const std::vector<std::string>& ids)
{
    for (const std::string& id : ids)
        if (std::none_of(suite.items.begin(), suite.items.end(), [&](const SuiteItem& i) { return i.id == id; }))
            throw inputError(suite.source, "items", "no item with id '" + id + "'");
    Suite out = suite;
    out.items.clear();
    for (const SuiteItem& i : suite.items)
        if (std::find(ids.begin(), ids.end(), i.id) != ids.end()) out.items.push_back(i);
    return out;
}

// ---- answers ---------------------------------------------------------------------------------

std::string normalizeAnswer(const std::string& s, bool keepTrailing)
{
    std::string out;
    for (unsigned char c : s) {
        if (c < 0x80 && (std::ispunct(c) || std::isspace(c))) {
            if (!out.empty() && out.back() != ' ') out += ' ';
        } else {
            out += char(c < 0x80 ? std::tolower(c) : c);
        }
    }
    if (!keepTrailing && !out.empty() && out.back() == ' ') out.pop_back();
    return out;
}

bool answerExactMatch(const std::string& generated, const std::string& answer)
{
    const std::string g = normalizeAnswer(generated), a = normalizeAnswer(answer);
    return !a.empty() && (g == a || g.compare(0, a.size() + 1, a + " ") == 0);
}

}  // namespace kvscope
