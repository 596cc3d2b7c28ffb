// Every tokenizer family behind core/modelio/tokenizer.h against its reference implementation, on
// multilingual text, emoji, whitespace runs, digits, code and text that looks like special tokens.
// Expected ids live in tests/data/tokenizers/*.json, written by make_expected.py there (Hugging
// Face `tokenizers` for tokenizer.json and the GGUF vocabulary, python `sentencepiece` for
// tokenizer.model). Files from ../shared or ~/.cache are skipped with a reason when absent.
#include "testmain.h"

#include <dlfcn.h>

#include "common/error.h"
#include "modelio/gguf.h"
#include "modelio/gguf_tokenizer.h"
#include "modelio/tokenizer.h"

#include <QDir>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

using namespace kvscope;

using Ids = std::vector<int32_t>;

namespace {

const std::string kShared = KVSCOPE_SOURCE_DIR "/../shared/tokenizers/";
const std::string kData = KVSCOPE_TEST_DATA "/tokenizers/";

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string smollmPath() { return QDir::homePath().toStdString() + "/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }

QJsonObject readJson(const std::string& path)
{
    QFile f(QString::fromStdString(path));
    if (!f.open(QIODevice::ReadOnly)) return {};
    return QJsonDocument::fromJson(f.readAll()).object();
}

Ids toIds(const QJsonValue& v)
{
    Ids out;
    for (const auto& x : v.toArray()) out.push_back(int32_t(x.toInt()));
    return out;
}

QString show(const Ids& ids)
{
    QString s;
    for (int32_t v : ids) s += QString::number(v) + " ";
    return s;
}

// Checks every case of an expected-ids file; `skip(name)` leaves out cases a family cannot share
// with its reference. Returns the number of cases compared.
template <class Skip>
int checkCases(const Tokenizer& tok, const QJsonObject& expected, Skip skip)
{
    int compared = 0;
    QStringList failures;
    for (const auto& v : expected["cases"].toArray()) {
        const QJsonObject c = v.toObject();
        const QString name = c["name"].toString();
        if (skip(name)) continue;
        const std::string text = c["text"].toString().toStdString();
        const Ids ids = toIds(c["ids"]), idsSpecial = toIds(c["ids_special"]);
        const Ids got = tok.encode(text, false), gotSpecial = tok.encode(text, true);
        if (got != ids) failures << name + ": got  " + show(got) + "\n   want " + show(ids);
        if (gotSpecial != idsSpecial)
            failures << name + " (special): got  " + show(gotSpecial) + "\n   want " + show(idsSpecial);
        if (c["decoded"].isString() && tok.decode(idsSpecial, false) != c["decoded"].toString().toStdString())
            failures << name + ": decode gives \"" + QString::fromStdString(tok.decode(idsSpecial, false)) + "\"";
        if (tok.decode(idsSpecial, true) != c["decoded_skip"].toString().toStdString())
            failures << name + ": decode(skipSpecial) gives \"" +
                            QString::fromStdString(tok.decode(idsSpecial, true)) + "\"";
        ++compared;
    }
    if (!failures.isEmpty()) QTest::qFail(qPrintable(failures.join("\n")), __FILE__, __LINE__);
    return compared;
}

int checkCases(const Tokenizer& tok, const QJsonObject& expected)
{
    return checkCases(tok, expected, [](const QString&) { return false; });
}

}  // namespace

// Defined after the class: moc misreads the raw JSON strings it holds.
void brokenJsonFiles(const QTemporaryDir& dir);

class TestTokenizers : public QObject {
    Q_OBJECT

private:
    QTemporaryDir dir_;

    // `file` with the top-level fields of `variant` replaced, written to the temporary folder.
    std::string variantOf(const std::string& file, const QJsonObject& variant, const QString& name)
    {
        QJsonObject j = readJson(file);
        for (auto it = variant.begin(); it != variant.end(); ++it) j[it.key()] = it.value();
        const QString path = dir_.filePath(name);
        QFile out(path);
        if (!out.open(QIODevice::WriteOnly)) return std::string();
        out.write(QJsonDocument(j).toJson(QJsonDocument::Compact));
        return path.toStdString();
    }

    std::string write(const QString& name, const std::string& text)
    {
        const std::string path = dir_.filePath(name).toStdString();
        std::ofstream(path, std::ios::binary) << text;
        return path;
    }

private slots:
    void mistralSentencePieceBpe()
    {
        const std::string file = kShared + "mistral-sp-bpe/tokenizer.json";
        if (!exists(file)) QSKIP("../shared/tokenizers/mistral-sp-bpe not present");
        const auto tok = loadTokenizer(kShared + "mistral-sp-bpe");  // folder: finds tokenizer.json
        QCOMPARE(tok->description(), std::string("SentencePiece-style BPE (tokenizer.json)"));
        QCOMPARE(tok->vocabSize(), 32000);
        QCOMPARE(tok->bosId(), int32_t(1));
        QCOMPARE(tok->eosId(), int32_t(2));  // from tokenizer_config.json next to it
        QCOMPARE(tok->specialId("</s>"), int32_t(2));
        QCOMPARE(tok->specialId("hello"), int32_t(-1));
        QCOMPARE(tok->encode("Hello world", true), (Ids{1, 22557, 1526}));
        QCOMPARE(checkCases(*tok, readJson(kData + "mistral-sp-bpe.json")), 22);
        kvscope_test::expectUtf8Refused(*tok);
        QCOMPARE(loadTokenizer(file, 0, 7)->eosId(), int32_t(7));  // eosHint wins
    }

    void mistralMetaspace()
    {
        const std::string file = kShared + "mistral-sp-bpe/tokenizer.json";
        if (!exists(file)) QSKIP("../shared/tokenizers/mistral-sp-bpe not present");
        const QJsonObject expected = readJson(kData + "mistral-metaspace.json");
        const auto tok = loadTokenizer(variantOf(file, expected["variant"].toObject(), "metaspace.json"));
        QCOMPARE(checkCases(*tok, expected), 22);
    }

    void llama3Nfc()
    {
        const std::string file = kShared + "llama3-byte-bpe/tokenizer.json";
        if (!exists(file)) QSKIP("../shared/tokenizers/llama3-byte-bpe not present");
        const QJsonObject expected = readJson(kData + "llama3-nfc.json");
        const auto tok = loadTokenizer(variantOf(file, expected["variant"].toObject(), "nfc.json"));
        QCOMPARE(tok->description(), std::string("byte-level BPE (tokenizer.json)"));
        QCOMPARE(tok->encode("e\xcc\x81", false), tok->encode("\xc3\xa9", false));  // e + U+0301 = é
        QCOMPARE(checkCases(*tok, expected), 22);
    }

    void smollm2Gguf()
    {
        if (!exists(smollmPath())) QSKIP("~/.cache/kvscope/models/SmolLM2-135M-Instruct.Q4_1.gguf not present (kvscope-cli fetch-model)");
        const auto tok = loadTokenizer(smollmPath());
        QCOMPARE(tok->description(), std::string("byte-level BPE (GGUF, gpt2)"));
        QCOMPARE(tok->vocabSize(), 49152);
        QCOMPARE(tok->bosId(), int32_t(1));
        QCOMPARE(tok->eosId(), int32_t(2));
        QCOMPARE(tok->specialId("<|im_start|>"), int32_t(1));
        QCOMPARE(tok->encode("<|im_start|>user", true).front(), int32_t(1));  // add_bos_token false
        QCOMPARE(checkCases(*tok, readJson(kData + "smollm2-gguf.json")), 22);
        kvscope_test::expectUtf8Refused(*tok);
    }

    void tinySentencePieceModel()
    {
        const QJsonObject expected = readJson(kData + "tiny-spm.json");
        std::unique_ptr<Tokenizer> tok;
        try {
            tok = loadTokenizer(kData + "tiny-spm.model");
        } catch (const kvscope::Error& e) {
            if (std::string(e.what()).find("AddressSanitizer") != std::string::npos) QSKIP("tokenizer.model is unavailable under AddressSanitizer");
            throw;
        }
        QCOMPARE(tok->description(), std::string("SentencePiece (tokenizer.model)"));
        QCOMPARE(tok->vocabSize(), expected["vocab_size"].toInt());
        QCOMPARE(tok->bosId(), int32_t(expected["bos"].toInt()));
        QCOMPARE(tok->eosId(), int32_t(expected["eos"].toInt()));
        QCOMPARE(tok->specialId("</s>"), tok->eosId());
        QCOMPARE(tok->decode({tok->bosId()}, false), std::string("<s>"));
        QCOMPARE(checkCases(*tok, expected), 22);
        kvscope_test::expectUtf8Refused(*tok);
    }

    // The same vocabulary as a GGUF "llama" tokenizer (llama.cpp's SPM semantics). llama.cpp
    // matches control pieces such as "<s>" in the text, sentencepiece does not: those cases differ
    // by design and are left out.
    void tinySentencePieceGguf()
    {
        const QJsonObject expected = readJson(kData + "tiny-spm.json");
        const auto tok = tokenizerFromGguf(GgufFile::open(kData + "tiny-spm.gguf"));
        QCOMPARE(tok->description(), std::string("SentencePiece (GGUF, llama)"));
        QCOMPARE(tok->vocabSize(), expected["vocab_size"].toInt());
        QCOMPARE(tok->encode("<s>", false), (Ids{tok->bosId()}));
        const int n = checkCases(*tok, expected, [](const QString& name) {
            return name == "special_like" || name == "special_broken";
        });
        QCOMPARE(n, 20);
        kvscope_test::expectUtf8Refused(*tok);
    }

    void dispatchAndBadInput()
    {
        QVERIFY(dir_.isValid());
        const std::string empty = dir_.filePath("emptydir").toStdString();
        QVERIFY(QDir().mkpath(QString::fromStdString(empty)));
        kvscope_test::expectError(empty, [&] { loadTokenizer(empty); }, "no tokenizer.json or tokenizer.model");
        const std::string txt = write("vocab.txt", "a\nb\n");
        kvscope_test::expectError(txt, [&] { loadTokenizer(txt); }, "unknown tokenizer file type");
        const std::string notModel = write("broken.model", "not a protobuf");
        // (AddressSanitizer builds have no SentencePiece plugin: then that is the error.)
        const bool asan = dlsym(RTLD_DEFAULT, "__asan_init") != nullptr;
        kvscope_test::expectError(notModel, [&] { loadTokenizer(notModel); },
                                  asan ? "AddressSanitizer" : "not a SentencePiece model");

        brokenJsonFiles(dir_);

        // GGUF: a pre-tokenizer name we do not know is refused, never guessed.
        kvscope_test::expectError("x.gguf", [] { ggufPreTokenizerRegexes("no-such-pre", "x.gguf"); },
                                  "tokenizer.ggml.pre': pre-tokenizer \"no-such-pre\" not supported");
        QCOMPARE(ggufPreTokenizerRegexes("smollm", "x.gguf").size(), size_t(2));
    }
};


// A small SentencePiece-style file that works; then one broken field at a time, each refused with
// a message naming the file and the field.
void brokenJsonFiles(const QTemporaryDir& dir)
{
    const auto writeFile = [](const QTemporaryDir& d, const char* name, const std::string& text) {
        const std::string path = d.filePath(name).toStdString();
        std::ofstream(path, std::ios::binary) << text;
        return path;
    };
    // A small SentencePiece-style file; each case below breaks one field.
    const std::string good = R"j({"model":{"type":"BPE","vocab":{"<unk>":0,"▁":1,"a":2,"▁a":3},
        "merges":["▁ a"],"unk_token":"<unk>","byte_fallback":false,"fuse_unk":true},
      "added_tokens":[{"id":0,"content":"<unk>","special":true,"normalized":false}],
      "normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},
        {"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
      "pre_tokenizer":null,"post_processor":null,
      "decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},
        {"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]}})j";
    const auto tok = loadTokenizer(writeFile(dir, "good.json", good));
    QCOMPARE(tok->encode("a a", false), (Ids{3, 3}));
    QCOMPARE(tok->encode("bcd a", false), (Ids{1, 0, 3}));  // fuse_unk: one <unk> for "bcd"
    QCOMPARE(tok->decode({3, 3}, false), std::string("a a"));

    const auto broken = [&](const char* name, const std::string& from, const std::string& to,
                            const char* needle) {
        std::string text = good;
        const size_t at = text.find(from);
        QVERIFY2(at != std::string::npos, name);
        text.replace(at, from.size(), to);
        const std::string path = writeFile(dir, name, text);
        kvscope_test::expectError(path, [&] { loadTokenizer(path); }, needle);
    };
    broken("unknown_pre.json", R"j("pre_tokenizer":null)j",
           R"j("pre_tokenizer":{"type":"BertPreTokenizer"})j",
           "pre_tokenizer[0]: pre-tokenizer \"BertPreTokenizer\" not supported");
    broken("unknown_norm.json", R"j({"type":"Prepend","prepend":"▁"})j", R"j({"type":"Lowercase"})j",
           "normalizer[0]: normalizer \"Lowercase\" not supported");
    broken("regex_replace.json", R"j({"String":" "})j", R"j({"Regex":"\\s"})j",
           "normalizer[1]: pattern {\"Regex\":\"\\\\s\"} not supported");
    broken("unknown_decoder.json", R"j({"type":"Fuse"})j", R"j({"type":"WordPiece"})j",
           "decoder[1]: decoder \"WordPiece\" not supported");
    broken("unigram.json", R"j("type":"BPE")j", R"j("type":"Unigram")j", "model type \"Unigram\" not supported");
    broken("mixed.json", R"j("pre_tokenizer":null)j",
           R"j("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false})j", "ByteLevel");
    broken("split_removed.json", R"j("pre_tokenizer":null)j",
           R"j("pre_tokenizer":{"type":"Split","pattern":{"Regex":"a"},"behavior":"Removed"})j",
           "Split behavior \"Removed\" not supported");
    broken("bad_unk.json", R"j("unk_token":"<unk>")j", R"j("unk_token":"<nope>")j",
           "model.unk_token: not in the vocabulary");
    broken("bad_regex.json", R"j("pre_tokenizer":null)j",
           R"j("pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(["},"behavior":"Isolated"},{"type":"ByteLevel"}]})j",
           "regex does not compile");

}

KVSCOPE_TEST_MAIN(TestTokenizers)
#include "tst_tokenizers.moc"
