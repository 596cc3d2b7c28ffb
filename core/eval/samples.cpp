#include "eval/samples.h"

#include "common/error.h"
#include "common/file_io.h"
#include "kvscope/config.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace kvscope {

namespace {

using json = nlohmann::json;
constexpr size_t kMaxText = 64u << 20;

bool exists(const std::string& p)
{
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0;
}

json readJson(const std::string& path)
{
    try {
        return json::parse(readSmallFile(path, 1u << 20));
    } catch (const json::exception& e) {
        throw inputError(path, "", std::string("invalid JSON: ") + e.what());
    }
}

std::string str(const json& j, const char* key, const std::string& path)
{
    if (!j.contains(key)) return "";
    if (!j[key].is_string()) throw inputError(path, key, "not a string");
    return j[key].get<std::string>();
}

void readQuestion(SampleContext& s, const std::string& path)
{
    const json q = readJson(path);
    if (!q.is_object()) throw inputError(path, "", "not a JSON object");
    s.question = str(q, "question", path);
    s.answer = str(q, "answer", path);
    if (q.contains("answer_aliases")) {
        if (!q["answer_aliases"].is_array()) throw inputError(path, "answer_aliases", "not a list");
        for (const json& a : q["answer_aliases"]) {
            if (!a.is_string()) throw inputError(path, "answer_aliases", "not a list of strings");
            s.answerAliases.push_back(a.get<std::string>());
        }
    }
}

std::string lower(std::string s)
{
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

std::string samplesDir()
{
    if (const char* env = std::getenv("KVSCOPE_SAMPLES"); env && *env) return env;
    for (const char* d : {KVSCOPE_SAMPLES_SOURCE_DIR, KVSCOPE_SAMPLES_INSTALL_DIR})
        if (exists(std::string(d) + "/contexts/manifest.json")) return d;
    throw Error(std::string("the sample contexts are missing (looked in ") + KVSCOPE_SAMPLES_SOURCE_DIR + " and " +
                KVSCOPE_SAMPLES_INSTALL_DIR + "; set KVSCOPE_SAMPLES)");
}

std::vector<std::string> sampleIds()
{
    const std::string path = samplesDir() + "/contexts/manifest.json";
    const json m = readJson(path);
    std::vector<std::string> ids;
    if (!m.contains("contexts") || !m["contexts"].is_array()) throw inputError(path, "contexts", "missing or not a list");
    for (const json& c : m["contexts"]) ids.push_back(str(c, "id", path));
    return ids;
}

SampleContext loadSampleContext(const std::string& idOrPath)
{
    SampleContext s;
    if (idOrPath.find('/') == std::string::npos && !exists(idOrPath)) {
        const std::string dir = samplesDir() + "/contexts";
        const std::string path = dir + "/manifest.json";
        const json m = readJson(path);
        if (!m.contains("contexts") || !m["contexts"].is_array()) throw inputError(path, "contexts", "missing or not a list");
        for (const json& c : m["contexts"]) {
            if (str(c, "id", path) != idOrPath) continue;
            s.id = idOrPath;
            s.path = dir + "/" + str(c, "file", path);
            s.text = readSmallFile(s.path, kMaxText);
            if (const std::string f = str(c, "continuation_file", path); !f.empty()) s.continuation = readSmallFile(dir + "/" + f, kMaxText);
            if (const std::string f = str(c, "question_file", path); !f.empty()) readQuestion(s, dir + "/" + f);
            return s;
        }
        std::string known;
        for (const json& c : m["contexts"]) known += (known.empty() ? "" : ", ") + str(c, "id", path);
        throw inputError(idOrPath, "", "neither a file nor a sample context (samples: " + known + ")");
    }
    s.path = idOrPath;
    s.id = idOrPath.substr(idOrPath.find_last_of('/') + 1);
    s.text = readSmallFile(idOrPath, kMaxText);
    const std::string stem = idOrPath.size() > 4 && idOrPath.compare(idOrPath.size() - 4, 4, ".txt") == 0
                                 ? idOrPath.substr(0, idOrPath.size() - 4)
                                 : idOrPath;
    if (exists(stem + ".continuation.txt")) s.continuation = readSmallFile(stem + ".continuation.txt", kMaxText);
    if (exists(stem + ".json")) readQuestion(s, stem + ".json");
    return s;
}

bool answerMatches(const SampleContext& s, const std::string& response)
{
    const std::string r = lower(response);
    if (!s.answer.empty() && r.find(lower(s.answer)) != std::string::npos) return true;
    return std::any_of(s.answerAliases.begin(), s.answerAliases.end(),
                       [&](const std::string& a) { return r.find(lower(a)) != std::string::npos; });
}

}  // namespace kvscope
