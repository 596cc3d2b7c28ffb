// Safetensors reader and Hugging Face config parser (core/modelio/safetensors.h, hf_config.h):
// small files written here byte by byte with known values, corrupt files that must be refused
// with a "path: ..." message, sharded index folders, pickle refusal, and config.json variants of
// the supported architectures. With KVSCOPE_PYTHON_SAFETENSORS naming a python that has the
// `safetensors` and `numpy` packages, one file written by the reference library is read back.
#include "testmain.h"

#include "common/error.h"
#include "common/half.h"
#include "modelio/hf_config.h"
#include "modelio/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using namespace kvscope;

namespace {

// Builds a safetensors file: header JSON given verbatim (or laid out from tensors), then data.
struct StBuilder {
    struct Tensor {
        std::string name, dtype, shape;  // shape as JSON text, e.g. "[2,3]"
        std::vector<uint8_t> data;
    };
    std::vector<Tensor> tensors;
    std::string metadata;  // JSON object text, or "" for none

    template <class T>
    void add(const std::string& name, const std::string& dtype, const std::string& shape, const std::vector<T>& v)
    {
        Tensor t{name, dtype, shape, {}};
        t.data.resize(v.size() * sizeof(T));
        if (!v.empty()) std::memcpy(t.data.data(), v.data(), t.data.size());
        tensors.push_back(std::move(t));
    }
    std::string header() const
    {
        std::string h = "{";
        uint64_t off = 0;
        bool first = true;
        if (!metadata.empty()) { h += "\"__metadata__\":" + metadata; first = false; }
        for (const Tensor& t : tensors) {
            if (!first) h += ",";
            first = false;
            h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + t.shape +
                 ",\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.data.size()) + "]}";
            off += t.data.size();
        }
        return h + "}";
    }
    std::vector<uint8_t> data() const
    {
        std::vector<uint8_t> d;
        for (const Tensor& t : tensors) d.insert(d.end(), t.data.begin(), t.data.end());
        return d;
    }
    static std::vector<uint8_t> file(const std::string& header, const std::vector<uint8_t>& data, int64_t lenOverride = -1)
    {
        std::vector<uint8_t> b(8);
        const uint64_t n = lenOverride >= 0 ? uint64_t(lenOverride) : header.size();
        std::memcpy(b.data(), &n, 8);
        b.insert(b.end(), header.begin(), header.end());
        b.insert(b.end(), data.begin(), data.end());
        return b;
    }
    std::vector<uint8_t> bytes() const { return file(header(), data()); }
};

const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 32768})";

const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
  "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 32768,
  "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936})";

const char* kSmolLM = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
  "hidden_size": 576, "intermediate_size": 1536, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
  "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_theta": 100000,
  "tie_word_embeddings": true, "vocab_size": 49152})";

const char* kRopeParameters = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
  "vocab_size": 128256})";

}  // namespace

class TestSafetensors : public QObject {
    Q_OBJECT

    QTemporaryDir dir_;

    std::string pathOf(const std::string& name) { return dir_.filePath(QString::fromStdString(name)).toStdString(); }

    std::string write(const std::string& name, const std::vector<uint8_t>& bytes)
    {
        const std::string path = pathOf(name);
        QDir().mkpath(QFileInfo(QString::fromStdString(path)).path());
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        return path;
    }
    std::string writeText(const std::string& name, const std::string& text)
    {
        return write(name, std::vector<uint8_t>(text.begin(), text.end()));
    }

    template <class F>
    void expectError(const std::string& path, F&& f, const std::string& needle)
    {
        kvscope_test::expectError(path, std::forward<F>(f), needle);
    }

    void expectOpenError(const std::string& name, const std::vector<uint8_t>& bytes, const std::string& needle)
    {
        const std::string p = write(name, bytes);
        expectError(p, [&] { SafetensorsFile::open(p); }, needle);
    }

    ModelConfig config(const std::string& name, const std::string& text)
    {
        return loadHfConfig(writeText(name, text));
    }

    // A copy of `json` with `from` replaced by `to` (which must occur).
    static std::string edit(std::string json, const std::string& from, const std::string& to)
    {
        const size_t at = json.find(from);
        KVSCOPE_ASSERT(at != std::string::npos);
        return json.replace(at, from.size(), to);
    }

private slots:
    void initTestCase() { QVERIFY(dir_.isValid()); }

    void readsF32F16BF16Exactly()
    {
        StBuilder b;
        b.metadata = R"({"format":"pt","note":"hi"})";
        const std::vector<float> f32 = {1.5f, -2.25f, 0.0f, 3.0e-8f, -1.0e30f, 7.0f};
        const std::vector<float> f16vals = {0.5f, -1.0f, 65504.0f, 5.9604645e-8f};  // exact in fp16
        const std::vector<float> bf16vals = {1.0f, -3.0f, 0.15625f, std::ldexp(1.0f, 100)};  // exact in bf16
        std::vector<uint16_t> h, bf;
        for (float v : f16vals) h.push_back(floatToHalf(v));
        for (float v : bf16vals) bf.push_back(floatToBf16(v));
        b.add("a.f32", "F32", "[2,3]", f32);
        b.add("b.f16", "F16", "[4]", h);
        b.add("c.bf16", "BF16", "[2,2]", bf);
        b.add("d.i64", "I64", "[1]", std::vector<int64_t>{42});
        b.add("e.u8", "U8", "[3]", std::vector<uint8_t>{1, 2, 3});  // leaves later tensors unaligned
        b.add("f.f16", "F16", "[1]", std::vector<uint16_t>{floatToHalf(-0.25f)});
        b.add("g.empty", "F32", "[0,4]", std::vector<float>{});
        b.add("h.scalar", "F32", "[]", std::vector<float>{9.0f});
        const std::string p = write("good.safetensors", b.bytes());

        const SafetensorsFile f = SafetensorsFile::open(p);
        QCOMPARE(f.tensors().size(), size_t(8));
        QCOMPARE(f.metadata().size(), size_t(2));
        QCOMPARE(f.metadata().at("format"), std::string("pt"));
        QCOMPARE(f.metadata().at("note"), std::string("hi"));
        QVERIFY(f.find("nope") == nullptr);

        const SafetensorsTensor* a = f.find("a.f32");
        QVERIFY(a);
        QCOMPARE(a->dtype, std::string("F32"));
        QCOMPARE(a->shape, (std::vector<int64_t>{2, 3}));
        QCOMPARE(a->end - a->begin, uint64_t(24));
        QCOMPARE(f.readF32(*a), f32);
        QCOMPARE(f.readF32(*f.find("b.f16")), f16vals);
        QCOMPARE(f.readF32(*f.find("c.bf16")), bf16vals);
        QCOMPARE(f.readF32(*f.find("f.f16")), std::vector<float>{-0.25f});
        QCOMPARE(f.readF32(*f.find("g.empty")), std::vector<float>{});
        QCOMPARE(f.readF32(*f.find("h.scalar")), std::vector<float>{9.0f});
        QCOMPARE(f.find("h.scalar")->elements(), uint64_t(1));

        const SafetensorsTensor* i = f.find("d.i64");
        int64_t v;
        std::memcpy(&v, f.raw(*i), 8);
        QCOMPARE(v, int64_t(42));
        expectError(p, [&] { f.readF32(*i); }, "cannot be read as float");
        SafetensorsTensor forged = *a;
        forged.end += 4;
        expectError(p, [&] { f.readF32(forged); }, "does not describe data");
        forged.name = "missing";
        expectError(p, [&] { f.raw(forged); }, "no such tensor");

        // Gaps and out-of-order offsets are fine; tensors() is sorted by offset.
        const std::string hdr = R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                                R"("x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
        std::vector<uint8_t> data(16, 0);
        const float two = 2.0f;
        std::memcpy(data.data() + 8, &two, 4);
        const SafetensorsFile g = SafetensorsFile::open(write("gap.safetensors", StBuilder::file(hdr, data)));
        QCOMPARE(g.tensors().front().name, std::string("x"));
        QCOMPARE(g.readF32(*g.find("y")), std::vector<float>{2.0f});
        QVERIFY(g.metadata().empty());
    }

    void refusesBadFiles()
    {
        StBuilder b;
        b.add("w", "F32", "[2,2]", std::vector<float>{1, 2, 3, 4});
        const std::vector<uint8_t> good = b.bytes();
        const std::string hdr = b.header();

        expectOpenError("empty.safetensors", {}, "truncated");
        expectOpenError("short.safetensors", {1, 0, 0}, "truncated");
        std::vector<uint8_t> cut(good.begin(), good.begin() + 8 + long(hdr.size()) / 2);
        expectOpenError("cut_header.safetensors", cut, "truncated");
        std::vector<uint8_t> cutData(good.begin(), good.end() - 1);
        expectOpenError("cut_data.safetensors", cutData, "past the data area");
        expectOpenError("huge_n.safetensors", StBuilder::file(hdr, {}, int64_t(1) << 40), "exceeds the limit");
        expectOpenError("max_n.safetensors", StBuilder::file(hdr, {}, INT64_MAX), "exceeds the limit");
        expectOpenError("bad_json.safetensors", StBuilder::file("{\"w\": [1, 2", {}), "invalid JSON");
        expectOpenError("not_object.safetensors", StBuilder::file("[1,2,3]", {}), "not an object");
        expectOpenError("deep.safetensors", StBuilder::file(std::string(100000, '['), {}), "nested deeper");

        auto withHeader = [&](const std::string& name, const std::string& h, const std::string& needle) {
            expectOpenError(name, StBuilder::file(h, b.data()), needle);
        };
        withHeader("outside.safetensors", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[4,20]}})", "past the data area");
        withHeader("reversed.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", "end before they begin");
        withHeader("mismatch.safetensors", R"({"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", "need 24");
        withHeader("mismatch16.safetensors", R"({"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,16]}})", "need 8");
        withHeader("overflow.safetensors",
                   R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", "overflows");
        withHeader("overflow2.safetensors",
                   R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,16]}})", "overflows");
        withHeader("unknown_dtype.safetensors", R"({"w":{"dtype":"F17","shape":[2,2],"data_offsets":[0,16]}})", "unknown dtype 'F17'");
        withHeader("overlap.safetensors",
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   "overlaps");
        withHeader("overlap_nested.safetensors",
                   R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                   R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                   "overlaps");
        withHeader("extra_field.safetensors", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16],"x":1}})", "unexpected field 'x'");
        withHeader("missing_field.safetensors", R"({"w":{"dtype":"F32","shape":[2,2]}})", "needs the fields");
        withHeader("dtype_type.safetensors", R"({"w":{"dtype":4,"shape":[2,2],"data_offsets":[0,16]}})", "dtype is not a string");
        withHeader("neg_shape.safetensors", R"({"w":{"dtype":"F32","shape":[-2,-2],"data_offsets":[0,16]}})", "non-negative integer");
        withHeader("float_shape.safetensors", R"({"w":{"dtype":"F32","shape":[2.0,2],"data_offsets":[0,16]}})", "non-negative integer");
        withHeader("shape_type.safetensors", R"({"w":{"dtype":"F32","shape":"2x2","data_offsets":[0,16]}})", "shape is not an array");
        withHeader("offsets3.safetensors", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8,16]}})", "two integers");
        withHeader("offsets_neg.safetensors", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[-1,15]}})", "non-negative");
        withHeader("entry_type.safetensors", R"({"w":[1,2]})", "entry is not an object");
        withHeader("meta_type.safetensors", R"({"__metadata__":{"a":1}})", "value is not a string");
        withHeader("meta_obj.safetensors", R"({"__metadata__":"x"})", "__metadata__: not an object");

        const std::string missing = pathOf("does_not_exist.safetensors");
        expectError(missing, [&] { SafetensorsFile::open(missing); }, "open");
        expectError(dir_.path().toStdString(), [&] { SafetensorsFile::open(dir_.path().toStdString()); }, "not a regular file");
    }

    void shardedIndex()
    {
        StBuilder b;
        b.add("w", "F32", "[1]", std::vector<float>{1});
        write("sharded/model-00001-of-00002.safetensors", b.bytes());
        write("sharded/model-00002-of-00002.safetensors", b.bytes());
        writeText("sharded/model.safetensors.index.json", R"({"metadata":{"total_size":8},"weight_map":{
            "a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors",
            "c":"model-00001-of-00002.safetensors"}})");
        const std::string folder = pathOf("sharded");
        QCOMPARE(safetensorsShards(folder), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                                      "model-00002-of-00002.safetensors"}));

        write("single/model.safetensors", b.bytes());
        QCOMPARE(safetensorsShards(pathOf("single")), std::vector<std::string>{"model.safetensors"});

        writeText("missing/model.safetensors.index.json", R"({"weight_map":{"a":"model-1.safetensors"}})");
        const std::string missingIndex = pathOf("missing/model.safetensors.index.json");
        expectError(missingIndex, [&] { safetensorsShards(pathOf("missing")); }, "shard 'model-1.safetensors' is missing");

        write("x.safetensors", b.bytes());  // exists one level up: must still be refused
        writeText("traversal/model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
        const std::string travIndex = pathOf("traversal/model.safetensors.index.json");
        expectError(travIndex, [&] { safetensorsShards(pathOf("traversal")); }, "not a plain file name");
        writeText("abs/model.safetensors.index.json", R"({"weight_map":{"a":"/etc/passwd"}})");
        expectError(pathOf("abs/model.safetensors.index.json"), [&] { safetensorsShards(pathOf("abs")); }, "not a plain file name");
        writeText("dotdot/model.safetensors.index.json", R"({"weight_map":{"a":".."}})");
        expectError(pathOf("dotdot/model.safetensors.index.json"), [&] { safetensorsShards(pathOf("dotdot")); }, "not a plain file name");
        writeText("badmap/model.safetensors.index.json", R"({"weight_map":["a"]})");
        expectError(pathOf("badmap/model.safetensors.index.json"), [&] { safetensorsShards(pathOf("badmap")); }, "weight_map: not an object");
        writeText("badjson/model.safetensors.index.json", R"({"weight_map":)");
        expectError(pathOf("badjson/model.safetensors.index.json"), [&] { safetensorsShards(pathOf("badjson")); }, "invalid JSON");

        QDir(dir_.path()).mkpath("nothing");
        expectError(pathOf("nothing"), [&] { safetensorsShards(pathOf("nothing")); }, "no model.safetensors");
    }

    void refusesPickles()
    {
        const std::string p = "/some/where/pytorch_model.bin";
        try {
            refusePickleCheckpoint(p);
            QFAIL("no error");
        } catch (const Error& e) {
            QCOMPARE(std::string(e.what()),
                     p + ": PyTorch pickle checkpoints are never loaded (they can run code); convert to safetensors, "
                         "e.g. with transformers' save_pretrained(safe_serialization=True)");
        }
        writeText("pickle/pytorch_model.bin", "not really a pickle");
        const std::string bin = pathOf("pickle/pytorch_model.bin");
        QCOMPARE(findPickleCheckpoint(pathOf("pickle")), bin);
        expectError(bin, [&] { safetensorsShards(pathOf("pickle")); }, "PyTorch pickle checkpoints are never loaded");
        writeText("pt/weights.pth", "x");
        QCOMPARE(findPickleCheckpoint(pathOf("pt")), pathOf("pt/weights.pth"));
        QCOMPARE(findPickleCheckpoint(pathOf("single")), std::string());
    }

    void referenceLibraryFile()
    {
        const QByteArray py = qgetenv("KVSCOPE_PYTHON_SAFETENSORS");
        if (py.isEmpty()) QSKIP("set KVSCOPE_PYTHON_SAFETENSORS to a python with safetensors and numpy");
        const std::string out = pathOf("reference.safetensors");
        const QString script = QStringLiteral(
            "import sys, numpy as np\n"
            "from safetensors.numpy import save_file\n"
            "save_file({'w32': np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5,\n"
            "           'w16': np.array([1.0, -2.5, 0.125], dtype=np.float16),\n"
            "           'ids': np.array([[1, 2], [3, 4]], dtype=np.int32)},\n"
            "          sys.argv[1], metadata={'format': 'np'})\n");
        QProcess proc;
        proc.start(QString::fromLocal8Bit(py), {"-c", script, QString::fromStdString(out)});
        QVERIFY(proc.waitForFinished(60000));
        QVERIFY2(proc.exitCode() == 0, proc.readAllStandardError().constData());

        const SafetensorsFile f = SafetensorsFile::open(out);
        QCOMPARE(f.metadata().at("format"), std::string("np"));
        const SafetensorsTensor* w32 = f.find("w32");
        QVERIFY(w32);
        QCOMPARE(w32->shape, (std::vector<int64_t>{3, 4}));
        std::vector<float> want(12);
        for (int i = 0; i < 12; ++i) want[size_t(i)] = float(i) * 0.5f;
        QCOMPARE(f.readF32(*w32), want);
        QCOMPARE(f.readF32(*f.find("w16")), (std::vector<float>{1.0f, -2.5f, 0.125f}));
        const SafetensorsTensor* ids = f.find("ids");
        QCOMPARE(ids->dtype, std::string("I32"));
        int32_t v[4];
        std::memcpy(v, f.raw(*ids), 16);
        QCOMPARE(v[3], 4);
    }

    void configLlama32()
    {
        const ModelConfig c = config("llama32.json", kLlama32);
        QCOMPARE(c.architecture, std::string("LlamaForCausalLM"));
        QCOMPARE(c.modelType, std::string("llama"));
        QCOMPARE(c.hiddenSize, 2048);
        QCOMPARE(c.intermediateSize, 8192);
        QCOMPARE(c.numLayers, 16);
        QCOMPARE(c.numHeads, 32);
        QCOMPARE(c.numKvHeads, 8);
        QCOMPARE(c.headDim, 64);
        QCOMPARE(c.vocabSize, 128256);
        QCOMPARE(c.rmsNormEps, 1e-5);
        QCOMPARE(c.ropeTheta, 500000.0);
        QVERIFY(c.tieWordEmbeddings);
        QCOMPARE(c.maxPositionEmbeddings, 131072);
        QCOMPARE(c.rope.type, std::string("llama3"));
        QCOMPARE(c.rope.factor, 32.0);
        QCOMPARE(c.rope.lowFreqFactor, 1.0);
        QCOMPARE(c.rope.highFreqFactor, 4.0);
        QCOMPARE(c.rope.originalMaxPositionEmbeddings, 8192);
        QCOMPARE(c.bosTokenId, 128000);
        QCOMPARE(c.eosTokenId, 128001);
        QVERIFY(isSupportedArchitecture("LlamaForCausalLM"));
        QVERIFY(isSupportedArchitecture("qwen2"));
        QVERIFY(!isSupportedArchitecture("GPT2LMHeadModel"));
    }

    void configMistralQwenSmol()
    {
        const ModelConfig m = config("mistral.json", kMistral);
        QCOMPARE(m.architecture, std::string("MistralForCausalLM"));
        QCOMPARE(m.headDim, 128);
        QCOMPARE(m.numKvHeads, 8);
        QCOMPARE(m.ropeTheta, 1e6);
        QVERIFY(!m.tieWordEmbeddings);
        QCOMPARE(m.rope.type, std::string());
        QCOMPARE(m.eosTokenId, 2);

        const ModelConfig q = config("qwen2.json", kQwen2);
        QCOMPARE(q.modelType, std::string("qwen2"));
        QCOMPARE(q.headDim, 64);
        QCOMPARE(q.numKvHeads, 2);
        QCOMPARE(q.rmsNormEps, 1e-6);
        QVERIFY(q.tieWordEmbeddings);
        QCOMPARE(q.rope.type, std::string());
        QCOMPARE(q.vocabSize, 151936);

        const ModelConfig s = config("smollm.json", kSmolLM);
        QCOMPARE(s.headDim, 64);
        QCOMPARE(s.numHeads, 9);
        QCOMPARE(s.numKvHeads, 3);
        QCOMPARE(s.ropeTheta, 100000.0);
        QVERIFY(s.tieWordEmbeddings);
        QCOMPARE(s.bosTokenId, 0);

        // Defaults: no kv heads, no rope_theta, model_type only.
        const ModelConfig d = config("defaults.json", R"({"model_type":"llama","hidden_size":64,
            "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100})");
        QCOMPARE(d.architecture, std::string("LlamaForCausalLM"));
        QCOMPARE(d.numKvHeads, 4);
        QCOMPARE(d.headDim, 16);
        QCOMPARE(d.ropeTheta, 10000.0);
        QCOMPARE(d.bosTokenId, -1);
        QVERIFY(!d.tieWordEmbeddings);
    }

    // Qwen3, Phi-3 and Gemma 3 configs as their checkpoints ship them (sizes of Qwen3-0.6B,
    // Phi-3-mini-4k and Gemma 3 270M), and the features kvscope refuses by key.
    void configQwen3Phi3Gemma3()
    {
        const ModelConfig q = config("qwen3.json", R"({"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3",
            "hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,
            "num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"rms_norm_eps":1e-06,"rope_theta":1000000,
            "tie_word_embeddings":true,"attention_bias":false,"hidden_act":"silu","use_sliding_window":false,
            "sliding_window":null,"max_window_layers":28})");
        QCOMPARE(q.architecture, std::string("Qwen3ForCausalLM"));
        QCOMPARE(q.headDim, 128);
        QVERIFY(q.qkNorm);
        QVERIFY(!q.sandwichNorm);
        QCOMPARE(q.slidingWindow, 0);

        const ModelConfig p = config("phi3.json", R"({"architectures":["Phi3ForCausalLM"],"model_type":"phi3",
            "hidden_size":3072,"intermediate_size":8192,"num_hidden_layers":32,"num_attention_heads":32,
            "num_key_value_heads":32,"vocab_size":32064,"rms_norm_eps":1e-05,"rope_theta":10000.0,
            "rope_scaling":null,"sliding_window":2047,"hidden_act":"silu","max_position_embeddings":4096,
            "original_max_position_embeddings":4096,"tie_word_embeddings":false})");
        QCOMPARE(p.modelType, std::string("phi3"));
        QCOMPARE(p.headDim, 96);
        QCOMPARE(p.slidingWindow, 2047);
        QVERIFY(p.layerIsSliding(0) && p.layerIsSliding(31));
        QVERIFY(!p.qkNorm);

        const ModelConfig g = config("gemma3.json", R"({"architectures":["Gemma3ForCausalLM"],"model_type":"gemma3_text",
            "hidden_size":640,"intermediate_size":2048,"num_hidden_layers":18,"num_attention_heads":4,
            "num_key_value_heads":1,"head_dim":256,"vocab_size":262144,"rms_norm_eps":1e-06,"rope_theta":1000000.0,
            "rope_local_base_freq":10000.0,"rope_scaling":null,"sliding_window":512,"query_pre_attn_scalar":256,
            "hidden_activation":"gelu_pytorch_tanh","final_logit_softcapping":null,"attn_logit_softcapping":null,
            "layer_types":["sliding_attention","sliding_attention","sliding_attention","sliding_attention",
            "sliding_attention","full_attention","sliding_attention","sliding_attention","sliding_attention",
            "sliding_attention","sliding_attention","full_attention","sliding_attention","sliding_attention",
            "sliding_attention","sliding_attention","sliding_attention","full_attention"],"max_position_embeddings":32768})");
        QCOMPARE(g.architecture, std::string("Gemma3ForCausalLM"));
        QCOMPARE(g.hiddenAct, std::string("gelu_pytorch_tanh"));
        QVERIFY(g.qkNorm && g.sandwichNorm && g.normPlusOne);
        QVERIFY(g.tieWordEmbeddings);
        QCOMPARE(g.embedScale, std::sqrt(640.0));
        QCOMPARE(g.queryPreAttnScalar, 256.0);
        QCOMPARE(g.ropeTheta, 1e6);
        QCOMPARE(g.ropeLocalTheta, 1e4);
        QCOMPARE(g.slidingWindow, 512);
        QCOMPARE(g.attnSoftcap, 0.0);
        QCOMPARE(g.finalSoftcap, 0.0);
        for (int l = 0; l < 18; ++l) QCOMPARE(g.layerIsSliding(l), (l + 1) % 6 != 0);

        // The older sliding_window_pattern key gives the same layers.
        const ModelConfig g2 = config("gemma3_pattern.json", R"({"model_type":"gemma3_text","hidden_size":64,
            "intermediate_size":128,"num_hidden_layers":7,"num_attention_heads":2,"num_key_value_heads":1,
            "head_dim":32,"vocab_size":100,"sliding_window":16,"sliding_window_pattern":3,
            "final_logit_softcapping":30.0})");
        QCOMPARE(g2.architecture, std::string("Gemma3ForCausalLM"));
        QCOMPARE(g2.finalSoftcap, 30.0);
        QCOMPARE(g2.queryPreAttnScalar, 32.0);
        for (int l = 0; l < 7; ++l) QCOMPARE(g2.layerIsSliding(l), l != 2 && l != 5);

        // Refused by key.
        const char* base = R"("hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":100)";
        auto bad = [&](const std::string& name, const std::string& extra, const std::string& needle) {
            const std::string path = dir_.filePath(QString::fromStdString(name)).toStdString();
            expectError(path, [&] { parseHfConfig("{" + std::string(base) + "," + extra + "}", path); }, needle);
        };
        bad("longrope.json", R"("model_type":"phi3","rope_scaling":{"type":"longrope","long_factor":[1],"short_factor":[1]})",
            "rope_scaling.rope_type: unsupported rope scaling type 'longrope'");
        bad("partial.json", R"("model_type":"phi3","partial_rotary_factor":0.75)", "partial_rotary_factor");
        bad("act.json", R"("model_type":"llama","hidden_act":"relu")", "hidden_act: unsupported activation 'relu'");
        bad("softcap.json", R"("model_type":"llama","final_logit_softcapping":30.0)", "final_logit_softcapping: not supported for llama");
        bad("qwen3swa.json", R"("model_type":"qwen3","use_sliding_window":true)", "use_sliding_window");
        bad("layer_types.json", R"("model_type":"gemma3_text","layer_types":["full_attention"])", "layer_types: not a list of 2");
        bad("gemma2.json", R"("model_type":"gemma2")", "unsupported model type 'gemma2'");
    }

    void configRopeParameters()
    {
        const ModelConfig c = config("rope_params.json", kRopeParameters);
        QCOMPARE(c.ropeTheta, 500000.0);
        QCOMPARE(c.rope.type, std::string("llama3"));
        QCOMPARE(c.rope.factor, 8.0);
        QCOMPARE(c.rope.originalMaxPositionEmbeddings, 8192);
        const ModelConfig d = config("rope_default.json",
                                     edit(kSmolLM, "\"rope_theta\": 100000,",
                                          "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 250000.0},"));
        QCOMPARE(d.ropeTheta, 250000.0);
        QCOMPARE(d.rope.type, std::string());
        const ModelConfig l = config("rope_linear.json",
                                     edit(kSmolLM, "\"rope_theta\": 100000,",
                                          "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0},"));
        QCOMPARE(l.rope.type, std::string("linear"));
        QCOMPARE(l.rope.factor, 2.0);
    }

    void configRefusesBad()
    {
        auto bad = [&](const std::string& name, const std::string& text, const std::string& needle) {
            const std::string p = writeText(name, text);
            expectError(p, [&] { loadHfConfig(p); }, needle);
        };
        bad("no_hidden.json", edit(kSmolLM, "\"hidden_size\": 576,", ""), "hidden_size: missing");
        bad("heads.json", edit(kSmolLM, "\"num_attention_heads\": 9", "\"num_attention_heads\": 7"),
            "num_attention_heads: 7 does not divide hidden_size 576");
        bad("kv.json", edit(kSmolLM, "\"num_key_value_heads\": 3", "\"num_key_value_heads\": 2"),
            "num_key_value_heads: 2 does not divide");
        bad("gpt2.json", edit(kSmolLM, "\"LlamaForCausalLM\"", "\"GPT2LMHeadModel\""),
            "architectures: unsupported architecture 'GPT2LMHeadModel'");
        bad("gpt2_type.json", edit(kSmolLM, "\"model_type\": \"llama\"", "\"model_type\": \"gpt2\""), "unsupported model type 'gpt2'");
        bad("zero.json", edit(kSmolLM, "\"num_hidden_layers\": 30", "\"num_hidden_layers\": 0"), "num_hidden_layers: 0 is outside");
        bad("string_int.json", edit(kSmolLM, "\"vocab_size\": 49152", "\"vocab_size\": \"49152\""), "vocab_size: not an integer");
        bad("frac.json", edit(kSmolLM, "\"vocab_size\": 49152", "\"vocab_size\": 49152.5"), "vocab_size: not an integer");
        bad("odd_head.json", edit(kSmolLM, "\"hidden_size\": 576,", "\"hidden_size\": 576, \"head_dim\": 63,"), "head_dim: 63 is odd");
        bad("eps.json", edit(kSmolLM, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1"), "rms_norm_eps: must be a positive");
        bad("theta.json", edit(kSmolLM, "\"rope_theta\": 100000", "\"rope_theta\": 0"), "rope_theta: must be a positive");
        bad("tie.json", edit(kSmolLM, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1"), "tie_word_embeddings: not a boolean");
        bad("yarn.json", edit(kLlama32, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""), "rope_scaling.rope_type: unsupported rope scaling type 'yarn'");
        bad("llama3_nomax.json", edit(kLlama32, "\"original_max_position_embeddings\": 8192, ", ""),
            "rope_scaling.original_max_position_embeddings: missing");
        bad("llama3_freq.json", edit(kLlama32, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5"),
            "rope_scaling.high_freq_factor: must be greater");
        bad("rope_params_theta.json", edit(kRopeParameters, "\"rope_theta\": 500000.0", "\"rope_theta\": \"big\""),
            "rope_parameters.rope_theta: not a number");
        bad("not_json.json", "{\"hidden_size\": ", "invalid JSON");
        bad("array.json", "[]", "not an object");
        bad("no_arch.json", R"({"hidden_size": 64})", "architectures: missing");
        const std::string missing = pathOf("no_such_config.json");
        expectError(missing, [&] { loadHfConfig(missing); }, "open");
    }
};

KVSCOPE_TEST_MAIN(TestSafetensors)
#include "tst_safetensors.moc"
