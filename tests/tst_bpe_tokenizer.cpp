// Byte-level BPE tokenizer (core/modelio/bpe_tokenizer.h) against Hugging Face `tokenizers` on the
// real llama3-byte-bpe tokenizer.json (skipped with a reason when ../shared is absent), plus small
// malformed / unsupported files that must be refused with a message naming the file.
#include "testmain.h"

#include "common/error.h"
#include "modelio/bpe_tokenizer.h"

#include <QTemporaryDir>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

using namespace kvscope;

using Ids = std::vector<int32_t>;
Q_DECLARE_METATYPE(std::string)
Q_DECLARE_METATYPE(Ids)

namespace {

const char* const kLlama3 = KVSCOPE_SOURCE_DIR "/../shared/tokenizers/llama3-byte-bpe/tokenizer.json";

std::string repeat(const std::string& s, int n)
{
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
}

bool exists(const char* path) { return std::ifstream(path).good(); }

// A tiny byte-level BPE file; `model` and extra top-level text are substituted by the tests.
std::string miniJson(const std::string& model)
{
    return R"({"version":"1.0","normalizer":null,"added_tokens":[],
  "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},
  "post_processor":null,"decoder":{"type":"ByteLevel"},"model":)" + model + "}";
}

}  // namespace

class TestBpeTokenizer : public QObject {
    Q_OBJECT

private:
    QTemporaryDir dir_;

    std::string write(const QString& name, const std::string& text)
    {
        const std::string path = dir_.filePath(name).toStdString();
        std::ofstream(path, std::ios::binary) << text;
        return path;
    }

    void expectError(const std::string& path, const char* needle)
    {
        kvscope_test::expectError(path, [&] { BpeTokenizer::fromJsonFile(path); }, needle);
    }

private slots:
    void llama3_data()
    {
        QTest::addColumn<std::string>("text");
        QTest::addColumn<Ids>("ids");
        // Produced with Hugging Face tokenizers 0.23.3:
        //   python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
        //   Tokenizer.from_file(".../llama3-byte-bpe/tokenizer.json").encode(text,
        //       add_special_tokens=False).ids   (add_special_tokens=True gives the same ids: the
        //   post-processor of this file is ByteLevel and adds no BOS)
        // and HF decode(ids) == text held for every row.
    QTest::newRow("english") << std::string("Hello world! The quick brown fox jumps over the lazy dog.") << Ids{9906, 1917, 0, 578, 4062, 14198, 39935, 35308, 927, 279, 16053, 5679, 13};
    QTest::newRow("empty") << std::string("") << Ids{};
    QTest::newRow("newlines3") << std::string("\012\012\012") << Ids{1432};
    QTest::newRow("double_space") << std::string("a  b") << Ids{64, 220, 293};
    QTest::newRow("leading_spaces") << std::string("  x") << Ids{220, 865};
    QTest::newRow("trailing_spaces") << std::string("end   ") << Ids{408, 262};
    QTest::newRow("mixed_ws") << std::string(" \011 hello\012  world \015\012\011\011end \012") << Ids{7163, 24748, 198, 220, 1917, 2591, 197, 6379, 720};
    QTest::newRow("tabs") << std::string("col1\011col2\011\011col3") << Ids{2119, 16, 47740, 17, 197, 47740, 18};
    QTest::newRow("digits") << std::string("1234567") << Ids{4513, 10961, 22};
    QTest::newRow("pi") << std::string("3.14159") << Ids{18, 13, 9335, 2946};
    QTest::newRow("contractions") << std::string("I'm sure you'll see DON'T we'VE it's") << Ids{40, 2846, 2771, 499, 3358, 1518, 45373, 17773, 584, 6, 4592, 433, 596};
    QTest::newRow("punct_runs") << std::string("Wait... what\077!\077! (yes) -- [ok] {x}; a->b != c && d || e ...") << Ids{14524, 1131, 1148, 27074, 27074, 320, 9891, 8, 1198, 510, 564, 60, 314, 87, 11308, 264, 405, 65, 976, 272, 1024, 294, 1393, 384, 2564};
    QTest::newRow("code") << std::string("int main() {\012    return 0;\012}\012") << Ids{396, 1925, 368, 341, 262, 471, 220, 15, 280, 534};
    QTest::newRow("german") << std::string("Gr\303\274\303\237e aus K\303\266ln, \303\234berm\303\244\303\237ig sch\303\266n!") << Ids{6600, 2448, 24352, 9608, 65994, 2312, 11, 50471, 76, 70047, 343, 75864, 0};
    QTest::newRow("chinese") << std::string("\346\210\221\347\210\261\350\207\252\347\204\266\350\257\255\350\250\200\345\244\204\347\220\206\343\200\202\344\273\212\345\244\251\345\244\251\346\260\224\345\276\210\345\245\275\357\274\201") << Ids{37046, 103312, 109683, 120074, 55642, 1811, 110916, 36827, 102146, 101600, 53901, 6447};
    QTest::newRow("japanese") << std::string("\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203\210\343\201\247\343\201\231\343\200\202\343\202\253\343\202\277\343\202\253\343\203\212\343\201\250\343\201\262\343\202\211\343\201\214\343\201\252") << Ids{102433, 102158, 16144, 57933, 62903, 71634, 38641, 1811, 71493, 47307, 71493, 96452, 19732, 104328, 33503, 29295, 26854};
    QTest::newRow("arabic") << std::string("\331\205\330\261\330\255\330\250\330\247 \330\250\330\247\331\204\330\271\330\247\331\204\331\205\330\214 \331\203\331\212\331\201 \330\255\330\247\331\204\331\203\330\237") << Ids{101244, 30925, 103645, 100700, 24102, 101952, 69885, 114804, 102656, 32173, 101735};
    QTest::newRow("hindi") << std::string("\340\244\250\340\244\256\340\244\270\340\245\215\340\244\244\340\245\207 \340\244\246\340\245\201\340\244\250\340\244\277\340\244\257\340\244\276, \340\244\206\340\244\252 \340\244\225\340\245\210\340\244\270\340\245\207 \340\244\271\340\245\210\340\244\202\077") << Ids{61196, 88344, 79468, 100365, 35470, 100291, 101391, 100322, 101201, 100991, 48909, 101671, 35470, 85410, 100400, 30};
    QTest::newRow("emoji") << std::string("I \342\235\244\357\270\217 \360\237\215\225 \360\237\221\215\360\237\217\275 \360\237\221\250\342\200\215\360\237\221\251\342\200\215\360\237\221\247\342\200\215\360\237\221\246 \360\237\217\263\357\270\217\342\200\215\360\237\214\210!") << Ids{40, 71570, 31643, 11410, 235, 243, 62904, 235, 9468, 237, 121, 62904, 101, 102470, 9468, 239, 102, 102470, 9468, 239, 100, 102470, 9468, 239, 99, 11410, 237, 111, 31643, 102470, 9468, 234, 230, 0};
    QTest::newRow("special_inside") << std::string("<|begin_of_text|>hi") << Ids{128000, 6151};
    QTest::newRow("specials_mixed") << std::string("a<|eot_id|> b<|start_header_id|>user<|end_header_id|>\012\012x") << Ids{64, 128009, 293, 128006, 882, 128007, 271, 87};
    QTest::newRow("long_word") << (std::string(300, 'a') + repeat("supercalifragilisticexpialidocious", 5)) << Ids{70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 70540, 33746, 300, 455, 3035, 278, 333, 4193, 321, 4633, 4683, 532, 307, 2168, 283, 784, 455, 3035, 278, 333, 4193, 321, 4633, 4683, 532, 307, 2168, 283, 784, 455, 3035, 278, 333, 4193, 321, 4633, 4683, 532, 307, 2168, 283, 784, 455, 3035, 278, 333, 4193, 321, 4633, 4683, 532, 307, 2168, 283, 784, 455, 3035, 278, 333, 4193, 321, 4633, 4683, 532, 307, 78287};
    QTest::newRow("nbsp_ideographic_space") << std::string("a\302\240b\343\200\200c") << Ids{64, 115648, 23249, 66};
    }

    void llama3()
    {
        if (!exists(kLlama3)) QSKIP("../shared/tokenizers/llama3-byte-bpe/tokenizer.json not present");
        static const BpeTokenizer tok = BpeTokenizer::fromJsonFile(kLlama3);
        QFETCH(std::string, text);
        QFETCH(Ids, ids);
        const Ids got = tok.encode(text, false);
        if (got != ids) {
            QString g, w;
            for (int32_t v : got) g += QString::number(v) + " ";
            for (int32_t v : ids) w += QString::number(v) + " ";
            QFAIL(qPrintable("got " + g + "\nwant " + w));
        }
        QCOMPARE(tok.encode(text, true), ids);  // no BOS from a ByteLevel post-processor
        QCOMPARE(tok.decode(got, false), text);
    }

    void llama3Properties()
    {
        if (!exists(kLlama3)) QSKIP("../shared/tokenizers/llama3-byte-bpe/tokenizer.json not present");
        const BpeTokenizer tok = BpeTokenizer::fromJsonFile(kLlama3);
        QCOMPARE(tok.vocabSize(), 128256);
        QCOMPARE(tok.bosId(), int32_t(-1));
        QCOMPARE(tok.decode({128000, 6151}, true), std::string("hi"));
        QCOMPARE(tok.decode({128000, 6151}, false), std::string("<|begin_of_text|>hi"));
        // Token 187 is the lone byte 0xFF, not valid UTF-8: U+FFFD, as HF decode([187, 64]) gives
        // '\ufffda'. "\u00ff" itself encodes to [127, 123] (its two UTF-8 bytes).
        QCOMPARE(tok.decode({187, 64}, false), std::string("\xef\xbf\xbd" "a"));
        QCOMPARE(tok.encode("\xc3\xbf", false), (Ids{127, 123}));
        QVERIFY_THROWS_EXCEPTION(Error, tok.decode({128256}, false));
        QVERIFY_THROWS_EXCEPTION(Error, tok.decode({-1}, false));
        // Invalid UTF-8 input is refused (HF takes only str, so it cannot be given such input).
        kvscope_test::expectUtf8Refused(tok);
        // Long single word: no quadratic blowup, round trip.
        const std::string longWord(200000, 'z');
        QCOMPARE(tok.decode(tok.encode(longWord, false), false), longWord);
    }

    void templateBos()
    {
        QVERIFY(dir_.isValid());
        const std::string model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"!":3,"c":4},"merges":["a b"]})";
        std::string text = miniJson(model);
        // Replace the null post-processor by a template that prepends <s> (id 5).
        const std::string from = R"("post_processor":null)";
        text.replace(text.find(from), from.size(),
                     R"("post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[5],"tokens":["<s>"]}}})");
        const std::string fromAdded = R"("added_tokens":[])";
        text.replace(text.find(fromAdded), fromAdded.size(),
                     R"("added_tokens":[{"id":5,"content":"<s>","special":true}])");
        // Byte-level vocabulary needs all 256 byte characters: add them after the small ones.
        std::string vocab = R"("a":0,"b":1,"ab":2,"!":3,"c":4)";
        std::string extra;
        int id = 6, n = 0;
        for (int b = 0; b < 256; ++b) {
            if (b == 'a' || b == 'b' || b == '!' || b == 'c') continue;
            // GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
            QString s = QString(QChar(char16_t(cp)));
            if (cp == '"' || cp == '\\') s = "\\" + s;
            extra += ",\"" + s.toStdString() + "\":" + std::to_string(id++);
        }
        text.replace(text.find(vocab), vocab.size(), vocab + extra);
        const BpeTokenizer tok = BpeTokenizer::fromJsonFile(write("tmpl.json", text));
        QCOMPARE(tok.bosId(), int32_t(5));
        QCOMPARE(tok.encode("ab!c", true), (Ids{5, 2, 3, 4}));
        QCOMPARE(tok.encode("ab!c", false), (Ids{2, 3, 4}));
        QCOMPARE(tok.encode("a<s>b", false), (Ids{0, 5, 1}));
        QCOMPARE(tok.decode(tok.encode("ab!c", true), true), std::string("ab!c"));
    }

    void badFiles()
    {
        QVERIFY(dir_.isValid());
        expectError(write("notjson.json", "{ this is not json"), "not valid JSON");
        expectError(dir_.filePath("missing.json").toStdString(), "cannot open");
        expectError(write("unigram.json", miniJson(R"({"type":"Unigram","vocab":[["a",0.0]]})")),
                    "Unigram");
        expectError(write("nomerges.json", miniJson(R"({"type":"BPE","vocab":{"a":0}})")),
                    "merges");
        // NFC is supported (tst_tokenizers); a normalizer we do not implement is named.
        std::string lower = miniJson(R"({"type":"BPE","vocab":{"a":0},"merges":[]})");
        lower.replace(lower.find("\"normalizer\":null"), 17, R"("normalizer":{"type":"Lowercase"})");
        expectError(write("lowercase.json", lower), "normalizer \"Lowercase\" not supported");
        std::string meta = miniJson(R"({"type":"BPE","vocab":{"a":0},"merges":[]})");
        const std::string pt = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";
        meta.replace(meta.find(pt), pt.size(), R"({"type":"Metaspace","replacement":"▁"})");
        expectError(write("metaspace.json", meta), "Metaspace");
        expectError(write("notbytelevel.json",
                          miniJson(R"({"type":"BPE","vocab":{"a":0},"merges":[]})")),
                    "not a byte-level vocabulary");
        expectError(write("badmerge.json",
                          miniJson(R"({"type":"BPE","vocab":{"a":0},"merges":["a x"]})")),
                    "not in the vocabulary");
    }
};

KVSCOPE_TEST_MAIN(TestBpeTokenizer)
#include "tst_bpe_tokenizer.moc"
