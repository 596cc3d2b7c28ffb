// kvscope._kvscope_runtime: the model runtime for Python (kvscope.Model, kvscope.eval_suite). A
// module of its own because it links libtorch: `import kvscope` loads only the codec part
// (module.cpp), and kvscope/__init__.py imports this one when kvscope.Model or eval_suite is first
// used. No torch header is included here; the runtime's interface (core/model) is torch-free.
//
// READ ME FIRST: every call goes through the functions kvscope-cli runs (app/cli/cli_model.h for
// info, capture and generate; runSuiteEval in cmd_suite.cpp for eval --suite), so Python and the
// CLI give the same cache, the same tokens and the same JSON. The KV objects returned are the
// codec module's kvscope.KV: that module is imported first, and pybind11 shares its registered
// types across modules.
#include "cli_eval.h"
#include "cli_model.h"

#include "common/error.h"
#include "kv/kv_set.h"
#include "model/model.h"
#include "modelio/llama_weights.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;
using kvscope::Error;
using kvscope::KvSet;
using json = nlohmann::json;

namespace {

// A str or os.PathLike as a path string.
std::string pathArg(const py::handle& h)
{
    return py::str(py::module_::import("os").attr("fspath")(h)).cast<std::string>();
}

// A profile argument: a path, or a kvscope.Profile (its path).
std::string profileArg(const py::object& p)
{
    if (p.is_none()) return "";
    if (py::isinstance<py::str>(p) || py::hasattr(p, "__fspath__")) return pathArg(p);
    if (py::hasattr(p, "path")) return p.attr("path").cast<std::string>();
    throw Error("profile: expected a path or a kvscope.Profile");
}

py::object toPython(const json& j)
{
    // The JSON text through Python's own parser: the same dict json.loads gives for the CLI's output.
    return py::module_::import("json").attr("loads")(py::str(j.dump()));
}

// The CLI's model group from keyword arguments.
kvscope::cli::ModelOpts modelOpts(const py::object& path, const py::object& tokenizer, int threads, const std::string& compute,
                                  const std::string& kvDtype, const std::string& weights, int block, bool attnMass)
{
    kvscope::cli::ModelOpts o;
    if (!path.is_none()) o.model = pathArg(path);
    if (!tokenizer.is_none()) o.tokenizer = pathArg(tokenizer);
    o.threads = threads;
    o.compute = compute;
    o.kvDtype = kvDtype;
    o.weights = weights;
    o.block = block;
    o.attnMass = attnMass;
    return o;
}

// A comma-separated list from None, a str, an int or a sequence of them.
std::string commaList(const py::object& v, const std::string& none)
{
    if (v.is_none()) return none;
    if (py::isinstance<py::str>(v)) return v.cast<std::string>();
    if (py::isinstance<py::int_>(v)) return std::to_string(v.cast<long>());
    std::string out;
    for (const py::handle& h : v) {
        if (!out.empty()) out += ",";
        out += py::str(h).cast<std::string>();
    }
    return out.empty() ? "none" : out;
}

// A loaded model, as the CLI's model group opens it.
class PyModel {
public:
    explicit PyModel(const kvscope::cli::ModelOpts& o)
    {
        const kvscope::RuntimeOptions ro = o.runtime();  // the CLI's checks and messages
        py::gil_scoped_release nogil;
        m_ = kvscope::Model::open(o.model, o.tokenizer, ro);
        info_ = kvscope::cli::modelInfoJson(*m_);
    }

    const kvscope::Model& model() const { return *m_; }
    const json& info() const { return info_; }

    // `capture`'s cache. Ctrl-C between prefill blocks cancels it (KeyboardInterrupt).
    std::shared_ptr<KvSet> capture(const std::string& text) const
    {
        bool interrupted = false;
        const kvscope::ProgressFn progress = [&](int, int) {
            py::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() != 0) {
                interrupted = true;
                return false;
            }
            return true;
        };
        try {
            py::gil_scoped_release nogil;
            return std::make_shared<KvSet>(kvscope::cli::captureContext(*m_, text, progress));
        } catch (const Error&) {
            if (interrupted) throw py::error_already_set();
            throw;
        }
    }

    json generate(const std::string& prompt, const py::object& kv, int maxNew, bool chat, double temperature, double topP,
                  uint64_t seed, bool stop) const
    {
        kvscope::cli::GenerateRequest r;
        r.prompt = prompt;
        r.maxNew = maxNew;
        r.chat = chat;
        r.sampling.temperature = temperature;
        r.sampling.topP = topP;
        r.sampling.seed = seed;
        r.noStop = !stop;
        std::shared_ptr<KvSet> cached;
        if (!kv.is_none()) {
            try {
                cached = kv.cast<std::shared_ptr<KvSet>>();
            } catch (const py::cast_error&) {
                throw Error("kv: expected a kvscope.KV, got " + py::str(py::type::of(kv).attr("__name__")).cast<std::string>());
            }
            r.kv = cached.get();
        }
        py::gil_scoped_release nogil;
        return kvscope::cli::generateJson(*m_, r);
    }

private:
    std::unique_ptr<kvscope::Model> m_;
    json info_;
};

const char* kGenerateDoc =
    "Greedy (temperature 0) or sampled tokens, as `kvscope-cli generate`. Without kv the prompt is the whole "
    "input (BOS + prompt, chat-wrapped when chat=True on a ChatML model). With kv (a captured context, e.g. "
    "capture() or a decoded container) the model continues that cache and the prompt is asked after it as the "
    "question, as `eval` and `stream` ask theirs (and `kvscope-cli generate KV.h5`): chat is then not consulted. stop=False "
    "keeps going past EOS / end-of-turn tokens (--no-stop).";

}  // namespace

PYBIND11_MODULE(_kvscope_runtime, m)
{
    m.doc() = "kvscope's model runtime for Python (libtorch): kvscope.Model and kvscope.eval_suite.";
    // kvscope.KV and kvscope.Error live in the codec module: registered before any is returned.
    const py::module_ codec = py::module_::import("kvscope._kvscope");
    static PyObject* error = py::object(codec.attr("Error")).release().ptr();  // kept for the process's life
    py::register_exception_translator([](std::exception_ptr ep) {
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const Error& e) {
            PyErr_SetString(error, e.what());
        }
    });

    py::class_<PyModel, std::shared_ptr<PyModel>>(m, "Model",
        "A model in kvscope's runtime (libtorch, CPU): a Hugging Face folder, a GGUF file or a llama2.c checkpoint "
        "(then tokenizer= names its tokenizer.bin). path None is the embedded default (SmolLM2-135M-Instruct, "
        "fetched by `kvscope-cli fetch-model`), as kvscope-cli resolves --model. The keywords are the CLI's model "
        "group: threads (0 = all cores), compute (fp32, bf16), kv_dtype (fp16, bf16, fp32), weights (auto, packed, "
        "expanded), block (prefill block in tokens), attn_mass (record the attention each token receives during "
        "capture, for the transform codec's token_importance).")
        .def(py::init([](const py::object& path, const py::object& tokenizer, int threads, const std::string& compute,
                         const std::string& kvDtype, const std::string& weights, int block, bool attnMass) {
                 return std::make_shared<PyModel>(modelOpts(path, tokenizer, threads, compute, kvDtype, weights, block, attnMass));
             }),
             py::arg("path") = py::none(), py::kw_only(), py::arg("tokenizer") = py::none(), py::arg("threads") = 0,
             py::arg("compute") = "fp32", py::arg("kv_dtype") = "fp16", py::arg("weights") = "auto", py::arg("block") = 512,
             py::arg("attn_mass") = false)
        .def_property_readonly("info", [](const PyModel& pm) { return toPython(pm.info()); },
                               "the object `kvscope-cli info --json` prints (a new dict each time)")
        .def_property_readonly("path", [](const PyModel& pm) { return pm.model().path(); })
        .def_property_readonly("name", [](const PyModel& pm) { return pm.model().spec().name; })
        .def_property_readonly("architecture", [](const PyModel& pm) { return pm.model().spec().config.architecture; })
        .def_property_readonly("num_layers", [](const PyModel& pm) { return pm.model().spec().config.numLayers; })
        .def_property_readonly("num_heads", [](const PyModel& pm) { return pm.model().spec().config.numHeads; })
        .def_property_readonly("num_kv_heads", [](const PyModel& pm) { return pm.model().spec().config.numKvHeads; })
        .def_property_readonly("head_dim", [](const PyModel& pm) { return pm.model().spec().config.headDim; })
        .def_property_readonly("vocab_size", [](const PyModel& pm) { return pm.model().spec().config.vocabSize; })
        .def_property_readonly("fingerprint", [](const PyModel& pm) { return pm.model().runtime().fingerprint(); },
                               "what KV files and profiles record as model_fingerprint")
        .def_property_readonly("chat", [](const PyModel& pm) { return pm.model().isChat(); },
                               "True for ChatML models (<|im_start|>, <|im_end|>)")
        .def("tokenize", [](const PyModel& pm, const std::string& text, bool special) {
            return pm.model().tokenizer().encode(text, special);
        }, py::arg("text"), py::kw_only(), py::arg("special") = true,
           "Token ids, as `kvscope-cli tokenize` (special=False: --no-special, no BOS or template tokens).")
        .def("detokenize", [](const PyModel& pm, const std::vector<int32_t>& ids, bool skipSpecial) {
            return pm.model().tokenizer().decode(ids, skipSpecial);
        }, py::arg("ids"), py::kw_only(), py::arg("skip_special") = true, "The text of token ids.")
        .def("capture", &PyModel::capture, py::arg("text"),
             "Prefills text as a context and returns its KV cache: the cache `kvscope-cli capture` writes for the same "
             "text and model options (the same values, tokens, RoPE table and attention statistics: query_sq, "
             "value_weight, and attn_mass when the model was opened with attn_mass=True); context is the text.")
        .def("generate", [](const PyModel& pm, const std::string& prompt, const py::object& kv, int maxNew, bool chat,
                            double temperature, double topP, uint64_t seed, bool stop) {
            return pm.generate(prompt, kv, maxNew, chat, temperature, topP, seed, stop)["text"].get<std::string>();
        }, py::arg("prompt"), py::arg("kv") = py::none(), py::kw_only(), py::arg("max_new_tokens") = 64,
           py::arg("chat") = false, py::arg("temperature") = 0.0, py::arg("top_p") = 1.0, py::arg("seed") = 0,
           py::arg("stop") = true, kGenerateDoc)
        .def("generate_json", [](const PyModel& pm, const std::string& prompt, const py::object& kv, int maxNew, bool chat,
                                 double temperature, double topP, uint64_t seed, bool stop) {
            return toPython(pm.generate(prompt, kv, maxNew, chat, temperature, topP, seed, stop));
        }, py::arg("prompt"), py::arg("kv") = py::none(), py::kw_only(), py::arg("max_new_tokens") = 64,
           py::arg("chat") = false, py::arg("temperature") = 0.0, py::arg("top_p") = 1.0, py::arg("seed") = 0,
           py::arg("stop") = true,
           "As generate, but returns the object `kvscope-cli generate --json` prints: prompt_tokens (the tokens run "
           "after the cache), cached_tokens, tokens (the generated ids), text, stopped_at_eos and timings.")
        .def("__repr__", [](const PyModel& pm) {
            const auto& c = pm.model().spec().config;
            return "<kvscope.Model " + pm.model().spec().name + ": " + c.architecture + ", " + std::to_string(c.numLayers) +
                   " layers, " + std::to_string(c.numHeads) + " heads / " + std::to_string(c.numKvHeads) + " KV heads x " +
                   std::to_string(c.headDim) + ">";
        });

    m.def("model_fingerprint", [](const py::object& path) {
        const std::string p = kvscope::resolveModelPath(path.is_none() ? "" : pathArg(path));
        py::gil_scoped_release nogil;
        return kvscope::weightsFingerprint(kvscope::loadLlamaWeights(p));
    }, py::arg("path") = py::none(),
       "The fingerprint kvscope records for a model (KV files, containers, profiles; `kvscope-cli info`'s "
       "'fingerprint'): its weights opened, no runtime built. None = the default model. Transformers caches coded with "
       "the transform codec carry it to find the model's calibrated default profile (kvscope.hf).");

    m.def("eval_suite", [](const py::object& suite, const py::object& model, const py::object& tokenizer, const std::string& codec,
                           const py::object& profile, const py::object& levels, const py::object& baselines,
                           const std::string& split, const py::object& items, int threads, int answerTokens,
                           int maxContinuation, const py::object& suiteCache, bool useSuiteCache, bool attnMass,
                           const std::string& compute, const std::string& kvDtype, const std::string& weights) {
        kvscope::cli::EvalOpts o;
        o.model = modelOpts(model, tokenizer, threads, compute, kvDtype, weights, 512, attnMass);
        o.answerTokens = answerTokens;
        o.maxContinuation = maxContinuation;
        o.profile.codec = codec;
        o.profile.profilePath = profileArg(profile);
        kvscope::cli::SuiteCliOpts so;
        so.suite = pathArg(suite);
        so.levels = commaList(levels, "all");
        so.baselines = commaList(baselines, "fp16,int8,kivi2,kivi4");
        so.split = split;
        if (!items.is_none()) so.items = commaList(items, "");
        if (!suiteCache.is_none()) so.cacheDir = pathArg(suiteCache);
        so.noCache = !useSuiteCache;
        json j;
        {
            py::gil_scoped_release nogil;
            j = kvscope::cli::runSuiteEval(o, so);
        }
        return toPython(j);
    }, py::arg("suite"), py::kw_only(), py::arg("model") = py::none(), py::arg("tokenizer") = py::none(),
       py::arg("codec") = "cachegen", py::arg("profile") = py::none(), py::arg("levels") = "all",
       py::arg("baselines") = "fp16,int8,kivi2,kivi4", py::arg("split") = "all", py::arg("items") = py::none(),
       py::arg("threads") = 1, py::arg("answer_tokens") = 32, py::arg("max_continuation") = 256,
       py::arg("suite_cache") = py::none(), py::arg("use_suite_cache") = true, py::arg("attn_mass") = false,
       py::arg("compute") = "fp32", py::arg("kv_dtype") = "fp16", py::arg("weights") = "auto",
       "The object `kvscope-cli eval --suite SUITE --json` prints, from the same function: fp16 (the bar), the "
       "baselines and the levels of codec on a quality suite, each row with accuracy, intervals, McNemar against "
       "fp16 and the iso-quality verdict. levels: 'all', 'none', an int or a list of ints (--levels); baselines: a "
       "comma-separated str or a list (--baselines); items: ids (--items); split: all, tune or eval; suite_cache: "
       "the reference cache directory (--suite-cache), use_suite_cache=False: --no-suite-cache. Progress goes to "
       "stderr as in the CLI. threads defaults to 1 here (the CLI's 0 is every core).");
}
