// Golden bad inputs: every file under tests/data/bad/<reader>/ is an input a fuzzer found (or one
// kept next to such a finding, or a real file the reader refuses), and <file>.error is the one
// line the reader must throw for it, with "{path}" standing for the file's path. Each file is
// given to its reader exactly as the fuzz target does (tests/fuzz/fuzz_<reader>.cpp); a crash, a
// sanitizer report, another exception or another message fails the test. Adding a row is adding
// two files; the reader is the folder.
#include "codec/container.h"
#include "codec/profile.h"
#include "common/error.h"
#include "common/file_io.h"
#include "kvio/kv_h5.h"
#include "modelio/bpe_tokenizer.h"
#include "modelio/gguf.h"
#include "modelio/hf_config.h"
#include "modelio/safetensors.h"
#include "transport/link.h"
#include "transport/protocol.h"
#include "testmain.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace kvscope;

namespace {

const std::string kBad = std::string(KVSCOPE_TEST_DATA) + "/bad";

std::string slurp(const std::string& path)
{
    std::ifstream f(path, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

std::vector<std::string> listDir(const std::string& dir)
{
    std::vector<std::string> names;
    if (DIR* d = ::opendir(dir.c_str())) {
        while (dirent* e = ::readdir(d)) {
            const std::string n = e->d_name;
            if (n[0] != '.') names.push_back(n);
        }
        ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    return names;
}

// The readers by folder name, each reading `path` as its fuzz target reads its input.
const std::map<std::string, std::function<void(const std::string&)>>& readers()
{
    static const std::map<std::string, std::function<void(const std::string&)>> r = {
        {"gguf", [](const std::string& p) { GgufFile::open(p); }},
        {"safetensors", [](const std::string& p) { SafetensorsFile::open(p); }},
        {"tokenizer_json", [](const std::string& p) { BpeTokenizer::fromJsonFile(p); }},
        {"hf_config", [](const std::string& p) { parseHfConfig(slurp(p), p); }},
        {"profile", [](const std::string& p) { profileFromJson(slurp(p), p); }},
        {"trace", [](const std::string& p) { LinkSchedule::loadTrace(p, 1.0); }},
        {"bandwidth", [](const std::string& p) { LinkSchedule::parse(slurp(p), p); }},
        {"kv_h5", [](const std::string& p) { readKvH5(p); }},
        // As fuzz_container: open, then decode every chunk at the default level.
        {"container", [](const std::string& p) {
             const auto r = KvcReader::openFile(p);
             r->decodeAll({r->params().profile.defaultLevel});
         }},
    };
    return r;
}

}  // namespace

class TestBadInputs : public QObject {
    Q_OBJECT
private slots:
    void eachGivesItsError_data();
    void eachGivesItsError();
};

void TestBadInputs::eachGivesItsError_data()
{
    QTest::addColumn<QString>("reader");
    QTest::addColumn<QString>("file");
    int rows = 0;
    for (const std::string& reader : listDir(kBad)) {
        if (reader == "README.md") continue;
        QVERIFY2(readers().count(reader), ("no reader for tests/data/bad/" + reader).c_str());
        for (const std::string& n : listDir(kBad + "/" + reader)) {
            if (n.size() > 6 && n.compare(n.size() - 6, 6, ".error") == 0) continue;
            QTest::newRow((reader + "/" + n).c_str()) << QString::fromStdString(reader) << QString::fromStdString(n);
            ++rows;
        }
    }
    QVERIFY2(rows > 0, "tests/data/bad holds no input");
}

void TestBadInputs::eachGivesItsError()
{
    QFETCH(QString, reader);
    QFETCH(QString, file);
    const std::string path = kBad + "/" + reader.toStdString() + "/" + file.toStdString();
    std::string want = slurp(path + ".error");
    QVERIFY2(!want.empty(), ("missing " + path + ".error").c_str());
    while (!want.empty() && want.back() == '\n') want.pop_back();
    for (size_t at; (at = want.find("{path}")) != std::string::npos;) want.replace(at, 6, path);
    try {
        readers().at(reader.toStdString())(path);
    } catch (const Error& e) {
        QCOMPARE(std::string(e.what()), want);
        return;
    }
    QFAIL(("no kvscope::Error for " + path).c_str());
}

KVSCOPE_TEST_MAIN(TestBadInputs)
#include "tst_bad_inputs.moc"
