// kvscope._kvscope: the core's KV caches, codec and container for Python (pybind11). The pure-Python
// package (kvscope/__init__.py) re-exports it; kvscope/_kvscope.pyi holds the types.
//
// READ ME FIRST: KV.keys(l) and KV.values(l) are numpy views of the KvSet's own storage, not
// copies: each holds a reference to its KV, so the storage lives as long as any view does. A KvSet
// never reallocates after construction, which is what makes this safe. bfloat16 has no numpy
// type: keys(l) then returns a float32 copy, keys(l, raw=True) the uint16 bit patterns as a view.
#include "codec_glue.h"
#include "encode_bytes.h"

#include "codec/container.h"
#include "codec/profile.h"
#include "common/error.h"
#include "common/half.h"
#include "kv/kv_set.h"
#include "kvio/kv_h5.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <string>
#include <vector>

namespace py = pybind11;
using kvscope::DType;
using kvscope::Error;
using kvscope::KvcReader;
using kvscope::KvKind;
using kvscope::KvSet;
using kvscope::KvShape;
using json = nlohmann::json;

namespace {

PyObject* g_error = nullptr;  // kvscope.Error (RuntimeError, ValueError)

// A str or os.PathLike as a path string.
std::string pathArg(const py::handle& h)
{
    return py::str(py::module_::import("os").attr("fspath")(h)).cast<std::string>();
}

bool isPath(const py::handle& h)
{
    return py::isinstance<py::str>(h) || py::hasattr(h, "__fspath__");
}

py::object toPython(const json& j)
{
    switch (j.type()) {
    case json::value_t::null: return py::none();
    case json::value_t::boolean: return py::bool_(j.get<bool>());
    case json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case json::value_t::number_float: return py::float_(j.get<double>());
    case json::value_t::string: return py::str(j.get<std::string>());
    case json::value_t::array: {
        py::list l;
        for (const json& x : j) l.append(toPython(x));
        return std::move(l);
    }
    case json::value_t::object: {
        py::dict d;
        for (auto it = j.begin(); it != j.end(); ++it) d[py::str(it.key())] = toPython(it.value());
        return std::move(d);
    }
    default: return py::none();
    }
}

void checkLayer(const KvSet& kv, int layer)
{
    if (layer < 0 || layer >= kv.shape().numLayers)
        throw Error("layer " + std::to_string(layer) + " out of range (the cache has " +
                    std::to_string(kv.shape().numLayers) + " layers)");
}

// (heads, tokens, head_dim) of one tensor: a view for fp16/fp32 (and raw bf16), a float32 copy for bf16.
py::array tensorArray(const std::shared_ptr<KvSet>& kv, KvKind kind, int layer, bool raw)
{
    checkLayer(*kv, layer);
    const KvShape& s = kv->shape();
    const std::vector<py::ssize_t> shape{s.numKvHeads, s.numTokens, s.headDim};
    uint8_t* data = kv->data(kind, layer);
    if (kv->dtype() == DType::BF16 && !raw) {
        py::array_t<float> out(shape);
        const auto* bits = reinterpret_cast<const uint16_t*>(data);
        float* dst = out.mutable_data();
        for (size_t i = 0, n = s.layerValues(); i < n; ++i) dst[i] = kvscope::bf16ToFloat(bits[i]);
        return std::move(out);
    }
    const py::dtype dt = kv->dtype() == DType::F32 ? py::dtype("float32") : raw ? py::dtype("uint16") : py::dtype("float16");
    const py::ssize_t item = py::ssize_t(kvscope::dtypeSize(kv->dtype()));
    const std::vector<py::ssize_t> strides{py::ssize_t(s.numTokens) * s.headDim * item, py::ssize_t(s.headDim) * item, item};
    return py::array(dt, shape, strides, data, py::cast(kv));
}

// One layer's attention statistics (KvSet::querySq, valueWeight, attnMass) as a float32 array of
// `shape`, or None when the cache has none for that layer.
py::object statArray(const KvSet& kv, const std::vector<std::vector<float>>& stat, int layer, std::vector<py::ssize_t> shape)
{
    checkLayer(kv, layer);
    if (size_t(layer) >= stat.size() || stat[size_t(layer)].empty()) return py::none();
    const std::vector<float>& v = stat[size_t(layer)];
    py::array_t<float> out(shape);
    if (size_t(out.size()) != v.size()) throw Error("layer " + std::to_string(layer) + ": statistics of an unexpected size");
    std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(float));
    return std::move(out);
}

DType dtypeArg(const std::string& s)
{
    DType t;
    if (!kvscope::parseDType(s, &t)) throw Error("dtype: unknown dtype '" + s + "' (float16, bfloat16 or float32)");
    return t;
}

// numpy's name of an array's dtype ("float16", "uint16", ...).
std::string npName(const py::array& a) { return py::str(a.dtype().attr("name")).cast<std::string>(); }

// The RoPE the keys carry (KvSet::ropeInvFreq, ropePosition0): what the transform codec undoes before
// coding them. None clears it.
void setRope(KvSet& kv, const py::object& invFreq, int position0)
{
    if (position0 < 0) throw Error("rope_position0: " + std::to_string(position0) + " is negative");
    if (invFreq.is_none()) {
        kv.ropeInvFreq.clear();
        kv.ropePosition0 = 0;
        return;
    }
    const py::array_t<float, py::array::c_style | py::array::forcecast> f(py::module_::import("numpy").attr("asarray")(invFreq));
    const int half = kv.shape().headDim / 2;
    if (f.ndim() != 1 || f.shape(0) != half)
        throw Error("rope_inv_freq: expected head_dim / 2 = " + std::to_string(half) + " frequencies, got shape (" +
                    std::to_string(f.ndim() ? f.shape(0) : 0) + (f.ndim() > 1 ? ", ..." : "") + ")");
    for (int i = 0; i < half; ++i)
        if (!(f.data()[i] > 0 && std::isfinite(f.data()[i])))
            throw Error("rope_inv_freq[" + std::to_string(i) + "]: " + std::to_string(f.data()[i]) + " is not a positive frequency");
    kv.ropeInvFreq.assign(f.data(), f.data() + half);
    kv.ropePosition0 = position0;
}

// The tensors of one kind: a (layers, heads, tokens, head_dim) array or a sequence of
// (heads, tokens, head_dim) arrays, as numpy arrays.
std::vector<py::array> layerArrays(const py::object& obj, const char* what)
{
    py::module_ np = py::module_::import("numpy");
    std::vector<py::array> out;
    py::object whole = obj;
    if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) whole = np.attr("asarray")(obj);
    if (py::isinstance<py::array>(whole)) {
        const py::array a = whole.cast<py::array>();
        if (a.ndim() != 4)
            throw Error(std::string(what) + ": expected (layers, heads, tokens, head_dim) or a list of (heads, tokens, head_dim), got " +
                        std::to_string(a.ndim()) + " dimensions");
        for (py::ssize_t l = 0; l < a.shape(0); ++l) out.push_back(whole[py::int_(l)].cast<py::array>());
        return out;
    }
    for (const py::handle& h : obj) out.push_back(np.attr("asarray")(h).cast<py::array>());
    return out;
}

std::shared_ptr<KvSet> fromArrays(const py::object& keys, const py::object& values, const py::object& dtype,
                                  const py::object& tokens, const std::string& context, const std::string& modelName,
                                  const std::string& modelFingerprint, const py::object& ropeInvFreq, int ropePosition0)
{
    py::module_ np = py::module_::import("numpy");
    const std::vector<py::array> k = layerArrays(keys, "keys"), v = layerArrays(values, "values");
    if (k.empty()) throw Error("keys: no layers");
    if (k.size() != v.size())
        throw Error("values: " + std::to_string(v.size()) + " layers, keys have " + std::to_string(k.size()));
    const py::array& first = k.front();
    if (first.ndim() != 3) throw Error("keys[0]: expected (heads, tokens, head_dim), got " + std::to_string(first.ndim()) + " dimensions");
    KvShape shape{int(k.size()), int(first.shape(0)), int(first.shape(2)), int(first.shape(1))};
    const std::string firstType = npName(first);
    DType t = DType::F16;
    if (!dtype.is_none()) t = dtypeArg(dtype.cast<std::string>());
    else if (firstType == "float16") t = DType::F16;
    else if (firstType == "float32") t = DType::F32;
    else if (firstType == "bfloat16") t = DType::BF16;
    else throw Error("keys[0]: dtype " + firstType + " is not float16 or float32 (bfloat16: pass uint16 bit patterns with dtype='bfloat16', "
                     "or give dtype= to convert)");
    kvscope::validateShape(shape, "from_arrays");
    auto kv = std::make_shared<KvSet>(shape, t);
    for (int kind = 0; kind < 2; ++kind)
        for (int l = 0; l < shape.numLayers; ++l) {
            const py::array& a = (kind == 0 ? k : v)[size_t(l)];
            const std::string where = std::string(kind == 0 ? "keys" : "values") + "[" + std::to_string(l) + "]";
            if (a.ndim() != 3 || a.shape(0) != shape.numKvHeads || a.shape(1) != shape.numTokens || a.shape(2) != shape.headDim)
                throw Error(where + ": shape differs from keys[0] (" + std::to_string(shape.numKvHeads) + ", " +
                            std::to_string(shape.numTokens) + ", " + std::to_string(shape.headDim) + ")");
            const std::string type = npName(a);
            uint8_t* dst = kv->data(KvKind(kind), l);
            const bool same = (t == DType::F16 && type == "float16") || (t == DType::F32 && type == "float32") ||
                              (t == DType::BF16 && (type == "uint16" || type == "bfloat16"));
            if (same) {
                const py::array c = np.attr("ascontiguousarray")(a).cast<py::array>();
                std::memcpy(dst, c.data(), kv->tensorBytes());
                continue;
            }
            if (a.dtype().kind() != 'f')
                throw Error(where + ": dtype " + type + " is not a floating-point type (bfloat16 bit patterns: uint16 with dtype='bfloat16')");
            const py::array_t<float, py::array::c_style | py::array::forcecast> f(a);
            const float* src = f.data();
            const size_t n = shape.layerValues();
            if (t == DType::F32) std::memcpy(dst, src, n * 4);
            else if (t == DType::F16) kvscope::floatToHalfN(src, reinterpret_cast<uint16_t*>(dst), n);
            else
                for (size_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(dst)[i] = kvscope::floatToBf16(src[i]);
        }
    if (!tokens.is_none()) {
        kv->tokens = tokens.cast<std::vector<int32_t>>();
        if (!kv->tokens.empty() && int(kv->tokens.size()) != shape.numTokens)
            throw Error("tokens: " + std::to_string(kv->tokens.size()) + " ids for a cache of " + std::to_string(shape.numTokens) + " tokens");
    }
    kv->context = context;
    kv->modelName = modelName;
    kv->modelFingerprint = modelFingerprint;
    setRope(*kv, ropeInvFreq, ropePosition0);
    return kv;
}

// A buffer's bytes in place (bytes, bytearray, a C-contiguous numpy array or memoryview); `info`
// holds the buffer, so they stay valid while it lives.
std::pair<const uint8_t*, size_t> bufferSpan(const py::buffer_info& info)
{
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
        if (info.shape[size_t(d)] > 1 && info.strides[size_t(d)] != expect) throw Error("data: the buffer is not contiguous");
        expect *= info.shape[size_t(d)];
    }
    return {static_cast<const uint8_t*>(info.ptr), size_t(info.size) * size_t(info.itemsize)};
}

std::vector<uint8_t> bufferBytes(const py::object& data)
{
    const py::buffer_info info = py::buffer(data).request();
    const auto [p, n] = bufferSpan(info);
    return std::vector<uint8_t>(p, p + n);
}

std::vector<int> levelsArg(const py::object& level)
{
    if (level.is_none()) return {};
    if (py::isinstance<py::int_>(level)) return {level.cast<int>()};
    return level.cast<std::vector<int>>();
}

// A container from bytes (any buffer) or from a path.
std::shared_ptr<KvcReader> openContainer(const py::object& data, const std::string& name)
{
    if (isPath(data)) {
        const std::string path = pathArg(data);
        py::gil_scoped_release nogil;
        return KvcReader::openFile(path);
    }
    std::vector<uint8_t> bytes = bufferBytes(data);
    py::gil_scoped_release nogil;
    return KvcReader::fromMemory(std::move(bytes), name);
}

// Decodes into `out` (a KV of the file's shape and dtype) when it is given, else into a new KV.
std::shared_ptr<KvSet> decodeReader(const KvcReader& r, const py::object& level, const py::object& out = py::none())
{
    const std::vector<int> levels = kvscope::python::checkedLevels(r, levelsArg(level));
    if (!out.is_none()) {
        std::shared_ptr<KvSet> kv = out.cast<std::shared_ptr<KvSet>>();
        py::gil_scoped_release nogil;
        r.decodeAllInto(levels, *kv);
        return kv;
    }
    py::gil_scoped_release nogil;
    return std::make_shared<KvSet>(r.decodeAll(levels));
}

void checkChunk(const KvcReader& r, int chunk, int level)
{
    if (chunk < 0 || chunk >= r.params().numChunks())
        throw Error(r.name() + ": chunk " + std::to_string(chunk) + " does not exist (the file has " +
                    std::to_string(r.params().numChunks()) + ")");
    kvscope::python::checkedLevels(r, {level});
}

py::dict levelDict(const kvscope::CodecLevel& l)
{
    py::dict d;
    d["name"] = l.name;
    d["key_bins"] = l.keyBins;
    d["value_bins"] = l.valueBins;
    d["measured"] = l.measuredJson.empty() ? py::object(py::dict()) : toPython(json::parse(l.measuredJson));
    return d;
}

// A loaded profile file: read-only, so that encode(profile=...) can hand its path to the CLI's
// option handling and stay byte-identical to `kvscope-cli encode --profile`.
struct Profile {
    std::string path;
    kvscope::CodecProfile p;
};

// kvscope.Error: a subclass of RuntimeError and ValueError that carries kvscope::Error's message.
void bindError(py::module_& m)
{
    g_error = PyErr_NewExceptionWithDoc("kvscope.Error",
                                        "Bad input: a corrupt file, a malformed profile, an impossible option. The message is "
                                        "the one-line error kvscope-cli prints after 'error: '.",
                                        py::make_tuple(py::handle(PyExc_RuntimeError), py::handle(PyExc_ValueError)).ptr(), nullptr);
    m.attr("Error") = py::handle(g_error);
    py::register_exception_translator([](std::exception_ptr ep) {
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const kvscope::Error& e) {
            PyErr_SetString(g_error, e.what());
        }
    });
}

// kvscope.KV: the KvSet, its arrays (views, see READ ME FIRST) and metadata.
void bindKv(py::module_& m)
{
    py::class_<KvSet, std::shared_ptr<KvSet>>(m, "KV",
        "A captured KV cache: per layer, keys and values of shape (kv_heads, tokens, head_dim), keys after RoPE in the "
        "Hugging Face rotate_half layout.")
        .def_static("read", [](const py::object& path) {
            const std::string p = pathArg(path);
            py::gil_scoped_release nogil;
            return std::make_shared<KvSet>(kvscope::readKvH5(p));
        }, py::arg("path"), "Reads an HDF5 KV file (as kvscope-cli capture writes them).")
        .def_static("from_arrays", &fromArrays, py::arg("keys"), py::arg("values"), py::kw_only(), py::arg("dtype") = py::none(),
                    py::arg("tokens") = py::none(), py::arg("context") = "", py::arg("model_name") = "",
                    py::arg("model_fingerprint") = "", py::arg("rope_inv_freq") = py::none(), py::arg("rope_position0") = 0,
                    "A cache from arrays (copied): keys and values as (layers, heads, tokens, head_dim) arrays or lists of "
                    "(heads, tokens, head_dim) arrays. dtype (float16, bfloat16, float32) defaults to the arrays' own; "
                    "other float arrays are rounded to it, uint16 arrays are bfloat16 bit patterns. rope_inv_freq "
                    "(head_dim / 2) and rope_position0 (the position of token 0) describe the RoPE the keys carry, "
                    "which the transform codec undoes.")
        .def("write", [](const KvSet& kv, const py::object& path, int gzip, int chunkTokens) {
            const std::string p = pathArg(path);
            kvscope::H5WriteOptions opt;
            opt.gzipLevel = gzip;
            opt.chunkTokens = chunkTokens;
            py::gil_scoped_release nogil;
            kvscope::writeKvH5(kv, p, opt);
        }, py::arg("path"), py::kw_only(), py::arg("gzip") = 0, py::arg("chunk_tokens") = 256,
           "Writes an HDF5 KV file (temporary file, then rename).")
        .def("keys", [](const std::shared_ptr<KvSet>& kv, int layer, bool raw) { return tensorArray(kv, KvKind::Key, layer, raw); },
             py::arg("layer"), py::kw_only(), py::arg("raw") = false,
             "Keys of one layer, (heads, tokens, head_dim): a writable view for float16/float32; bfloat16 gives a float32 "
             "copy, or with raw=True the uint16 bit patterns as a view.")
        .def("values", [](const std::shared_ptr<KvSet>& kv, int layer, bool raw) { return tensorArray(kv, KvKind::Value, layer, raw); },
             py::arg("layer"), py::kw_only(), py::arg("raw") = false, "Values of one layer, as keys().")
        .def_property_readonly("num_layers", [](const KvSet& kv) { return kv.shape().numLayers; })
        .def_property_readonly("num_kv_heads", [](const KvSet& kv) { return kv.shape().numKvHeads; })
        .def_property_readonly("head_dim", [](const KvSet& kv) { return kv.shape().headDim; })
        .def_property_readonly("num_tokens", [](const KvSet& kv) { return kv.shape().numTokens; })
        .def_property_readonly("shape", [](const KvSet& kv) {
            const KvShape& s = kv.shape();
            return py::make_tuple(s.numLayers, s.numKvHeads, s.numTokens, s.headDim);
        }, "(layers, kv_heads, tokens, head_dim)")
        .def_property_readonly("dtype", [](const KvSet& kv) { return std::string(kvscope::dtypeName(kv.dtype())); })
        .def_property_readonly("nbytes", [](const KvSet& kv) { return kv.tensorBytes() * 2 * size_t(kv.shape().numLayers); })
        .def_readwrite("tokens", &KvSet::tokens, "token ids (empty when unknown)")
        .def_readwrite("context", &KvSet::context)
        .def_readwrite("model_name", &KvSet::modelName)
        .def_readwrite("model_fingerprint", &KvSet::modelFingerprint)
        .def("query_sq", [](const KvSet& kv, int layer) {
            const KvShape& s = kv.shape();
            return statArray(kv, kv.querySq, layer, {s.numKvHeads, s.headDim});
        }, py::arg("layer"),
           "(kv_heads, head_dim) float32 copy: mean over the prefill's queries of the squared query, summed over each "
           "KV head's query heads (what the transform codec weights key errors by); None when not captured.")
        .def("value_weight", [](const KvSet& kv, int layer) {
            const KvShape& s = kv.shape();
            return statArray(kv, kv.valueWeight, layer, {s.numKvHeads, s.headDim, s.headDim});
        }, py::arg("layer"), "(kv_heads, head_dim, head_dim) float32 copy: sum of W_o^T W_o over each KV head's query heads; None when not captured.")
        .def("attn_mass", [](const KvSet& kv, int layer) {
            const KvShape& s = kv.shape();
            return statArray(kv, kv.attnMass, layer, {s.numKvHeads, s.numTokens});
        }, py::arg("layer"),
           "(kv_heads, tokens) float32 copy: the mean attention probability each token received during the prefill "
           "(capture with attn_mass); None when not captured.")
        .def_property("rope_inv_freq", [](const KvSet& kv) -> py::object {
            if (kv.ropeInvFreq.empty()) return py::none();
            py::array_t<float> out(py::ssize_t(kv.ropeInvFreq.size()));
            std::memcpy(out.mutable_data(), kv.ropeInvFreq.data(), kv.ropeInvFreq.size() * sizeof(float));
            return std::move(out);
        }, [](KvSet& kv, const py::object& f) { setRope(kv, f, kv.ropePosition0); },
           "(head_dim / 2) float32: the RoPE the keys carry (None when unknown); settable")
        .def_property("rope_position0", [](const KvSet& kv) { return kv.ropePosition0; },
                      [](KvSet& kv, int p) {
                          if (kv.ropeInvFreq.empty()) throw Error("rope_position0: set rope_inv_freq first");
                          setRope(kv, py::cast(kv.ropeInvFreq), p);
                      }, "position of token 0 (the RoPE angle of token t is (rope_position0 + t) * rope_inv_freq)")
        .def("same_bytes", [](const KvSet& a, const KvSet& b) { return kvscope::sameBytes(a, b); }, py::arg("other"),
             "True when both have the same shape, dtype and stored bytes (metadata is not compared).")
        .def("__repr__", [](const KvSet& kv) {
            const KvShape& s = kv.shape();
            return "<kvscope.KV " + std::to_string(s.numLayers) + " layers x " + std::to_string(s.numKvHeads) + " heads x " +
                   std::to_string(s.numTokens) + " tokens x " + std::to_string(s.headDim) + " " + kvscope::dtypeName(kv.dtype()) +
                   (kv.modelName.empty() ? "" : ", " + kv.modelName) + ">";
        });
}

// The module's functions: read_kv, synthetic, encode, decode, stats, compare.
void bindFunctions(py::module_& m)
{
    m.def("read_kv", [](const py::object& path) {
        const std::string p = pathArg(path);
        py::gil_scoped_release nogil;
        return std::make_shared<KvSet>(kvscope::readKvH5(p));
    }, py::arg("path"), "Reads an HDF5 KV file: kvscope.KV.");

    m.def("synthetic", [](int layers, int kvHeads, int headDim, int tokens, const std::string& dtype, uint64_t seed) {
        kvscope::SyntheticSpec spec;
        spec.shape = {layers, kvHeads, headDim, tokens};
        spec.dtype = dtypeArg(dtype);
        spec.seed = seed;
        kvscope::validateShape(spec.shape, "synthetic cache");
        auto kv = std::make_shared<KvSet>(kvscope::makeSyntheticKv(spec));
        kv->modelName = "synthetic";  // as `kvscope-cli synth` names it
        return kv;
    }, py::kw_only(), py::arg("layers") = 8, py::arg("kv_heads") = 4, py::arg("head_dim") = 64, py::arg("tokens") = 1024,
       py::arg("dtype") = "float16", py::arg("seed") = 1,
       "The synthetic cache `kvscope-cli synth` writes with the same options (for tests and demos).");

    m.def("encode", [](const KvSet& kv, const std::string& codec, const py::object& profile, const py::object& level,
                       const py::object& chunkTokens, const py::object& deltaGroup, const py::object& anchorBins,
                       const std::string& tables, const std::string& tableScope, const std::string& keyQuantizer,
                       const std::string& valueQuantizer, bool forceProfile, const py::object& report) {
        kvscope::python::EncodeOptions o;
        o.codec = codec;
        if (py::isinstance<Profile>(profile)) o.profilePath = profile.cast<const Profile&>().path;
        else if (!profile.is_none()) o.profilePath = pathArg(profile);
        if (!level.is_none()) {
            o.level = level.cast<int>();
            if (o.level < 1) throw Error("level: " + std::to_string(o.level) + " is not a level (levels count from 1)");
        }
        if (!chunkTokens.is_none()) o.chunkTokens = chunkTokens.cast<int>();
        if (!deltaGroup.is_none()) o.deltaGroup = deltaGroup.cast<int>();
        if (!anchorBins.is_none()) o.anchorBins = anchorBins.cast<int>();
        o.tables = tables;
        o.tableScope = tableScope;
        o.keyQuantizer = keyQuantizer;
        o.valueQuantizer = valueQuantizer;
        o.forceProfile = forceProfile;
        return kvscope::python::encodeToBytes(kv, o, report);
    }, py::arg("kv"), py::arg("codec") = "cachegen", py::arg("profile") = py::none(), py::arg("level") = py::none(), py::kw_only(),
       py::arg("chunk_tokens") = py::none(), py::arg("delta_group") = py::none(), py::arg("anchor_bins") = py::none(),
       py::arg("tables") = "", py::arg("table_scope") = "", py::arg("key_quantizer") = "", py::arg("value_quantizer") = "",
       py::arg("force_profile") = false, py::arg("report") = py::none(),
       "Compresses kv into a .kvc container: the bytes `kvscope-cli encode` writes with the same options (--codec, "
       "--profile, --chunk-tokens, ...). level=N keeps CacheGen level N alone (a profile listing only that level). "
       "report: a dict to fill with the sizes `kvscope-cli encode --json` reports (file_bytes, default_level, levels: "
       "level, chunk_bytes, table_bytes, side_bytes, bytes, bits_per_value; transform: model_from).");

    m.def("_bench_codec", [](const KvSet& kv, int level, int repeats, const std::string& codec, const py::object& profile) {
        kvscope::python::EncodeOptions o;
        o.codec = codec;
        if (!profile.is_none()) o.profilePath = pathArg(profile);
        py::gil_scoped_release nogil;
        return kvscope::python::benchCodecSeconds(kv, o, level, repeats);
    }, py::arg("kv"), py::arg("level"), py::kw_only(), py::arg("repeats") = 3, py::arg("codec") = "cachegen",
       py::arg("profile") = py::none(),
       "(encode s, decode s): what `kvscope-cli bench codec --threads 1 --level N` times (every chunk coded in memory, "
       "no container), the calling thread's CPU time, best of repeats. For samples/python/bench_overhead.py.");

    m.def("decode", [](const py::object& data, const py::object& level, const std::string& name, const py::object& out) {
        if (isPath(data)) return decodeReader(*openContainer(data, name), level, out);
        const py::buffer_info info = py::buffer(data).request();  // read in place, not copied
        const auto [p, n] = bufferSpan(info);
        std::unique_ptr<KvcReader> r;
        {
            py::gil_scoped_release nogil;
            r = KvcReader::fromBuffer(p, n, name);
        }
        return decodeReader(*r, level, out);
    }, py::arg("data"), py::arg("level") = py::none(), py::kw_only(), py::arg("name") = "<bytes>", py::arg("out") = py::none(),
       "Decodes a .kvc container (bytes or a path) as `kvscope-cli decode --level`: level None = the file's default, an "
       "int for every chunk, or a list with one level per chunk. out=KV (the file's shape and dtype) decodes into that "
       "cache instead of a new one, and returns it.");

    m.def("stats", [](const KvSet& kv, int deltaGroup, int bins, bool perChannel) {
        json j;
        {
            py::gil_scoped_release nogil;
            j = kvscope::python::statsJson(kv, deltaGroup, bins, perChannel);
        }
        return toPython(j);
    }, py::arg("kv"), py::kw_only(), py::arg("delta_group") = 10, py::arg("bins") = 32, py::arg("per_channel") = false,
       "The figures `kvscope-cli stats --json` prints (without 'file'), as a dict.");

    m.def("compare", [](const KvSet& reference, const KvSet& decoded) {
        json j;
        {
            py::gil_scoped_release nogil;
            j = kvscope::python::compareJson(reference, decoded);
        }
        return toPython(j);
    }, py::arg("reference"), py::arg("decoded"),
       "Reconstruction error (max_abs_error, rms_error, per-layer figures) as `kvscope-cli decode --source` reports it.");
}

// kvscope.Container: a .kvc file's index, chunks and levels.
void bindContainer(py::module_& m)
{
    py::class_<KvcReader, std::shared_ptr<KvcReader>>(m, "Container", "A .kvc container: its chunks, levels and metadata.")
        .def(py::init([](const py::object& data, const std::string& name) { return openContainer(data, name); }),
             py::arg("data"), py::kw_only(), py::arg("name") = "<bytes>",
             "Opens a container from bytes (any buffer) or a path; validates the header, sections and index.")
        .def_property_readonly("name", &KvcReader::name)
        .def_property_readonly("codec", [](const KvcReader& r) { return std::string(kvscope::codecName(r.params().codec)); })
        .def_property_readonly("dtype", [](const KvcReader& r) { return std::string(kvscope::dtypeName(r.params().dtype)); })
        .def_property_readonly("shape", [](const KvcReader& r) {
            const KvShape& s = r.params().shape;
            return py::make_tuple(s.numLayers, s.numKvHeads, s.numTokens, s.headDim);
        }, "(layers, kv_heads, tokens, head_dim)")
        .def_property_readonly("num_chunks", [](const KvcReader& r) { return r.params().numChunks(); })
        .def_property_readonly("num_levels", [](const KvcReader& r) { return r.params().numLevels(); })
        .def_property_readonly("default_level", [](const KvcReader& r) { return r.params().profile.defaultLevel; })
        .def_property_readonly("chunk_tokens", [](const KvcReader& r) { return r.params().profile.chunkTokens; })
        .def_property_readonly("file_bytes", &KvcReader::fileBytes)
        .def_property_readonly("model_name", &KvcReader::modelName)
        .def_property_readonly("model_fingerprint", &KvcReader::modelFingerprint)
        .def_property_readonly("context", &KvcReader::context)
        .def_property_readonly("tokens", &KvcReader::tokens)
        .def_property_readonly("levels", [](const KvcReader& r) {
            py::list out;
            for (const kvscope::CodecLevel& l : r.params().profile.levels) out.append(levelDict(l));
            return out;
        }, "each level's name and bins per layer (the bins matter to CacheGen only)")
        .def("chunk_range", [](const KvcReader& r, int chunk) {
            checkChunk(r, chunk, 1);
            return py::make_tuple(r.params().chunkStart(chunk), r.params().chunkLength(chunk));
        }, py::arg("chunk"), "(first token, tokens) of a chunk")
        .def("chunk_bytes", [](const KvcReader& r, int chunk, int level) {
            checkChunk(r, chunk, level);
            return r.chunkBytes(chunk, level);
        }, py::arg("chunk"), py::arg("level"))
        .def("level_bytes", [](const KvcReader& r, int level) {
            kvscope::python::checkedLevels(r, {level});
            return r.levelBytes(level);
        }, py::arg("level"), "bytes of every chunk of one level")
        .def("level_table_bytes", [](const KvcReader& r, int level) {
            kvscope::python::checkedLevels(r, {level});
            return r.levelTableBytes(level);
        }, py::arg("level"), "bytes of the level's shared tables (0 in-band)")
        .def_property_readonly("chunks", [](const KvcReader& r) {
            py::list out;
            for (int c = 0; c < r.params().numChunks(); ++c) {
                py::list levels;
                for (int l = 1; l <= r.params().numLevels(); ++l) {
                    py::dict d;
                    d["level"] = l;
                    d["bytes"] = r.chunkBytes(c, l);
                    d["crc"] = r.chunkCrc(c, l);
                    levels.append(d);
                }
                py::dict d;
                d["index"] = c;
                d["start"] = r.params().chunkStart(c);
                d["tokens"] = r.params().chunkLength(c);
                d["levels"] = levels;
                out.append(d);
            }
            return out;
        }, "per chunk: index, start, tokens and each level's bytes and CRC-32")
        .def("read_chunk", [](const KvcReader& r, int chunk, int level) {
            checkChunk(r, chunk, level);
            const std::vector<uint8_t> b = r.readChunk(chunk, level);
            return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
        }, py::arg("chunk"), py::arg("level"), "the payload of (chunk, level), its CRC checked")
        .def("decode", [](const KvcReader& r, const py::object& level, const py::object& out) { return decodeReader(r, level, out); },
             py::arg("level") = py::none(), py::kw_only(), py::arg("out") = py::none(), "as kvscope.decode")
        .def("__repr__", [](const KvcReader& r) {
            return "<kvscope.Container " + r.name() + ": " + kvscope::codecName(r.params().codec) + ", " +
                   std::to_string(r.params().numChunks()) + " chunks x " + std::to_string(r.params().numLevels()) + " levels>";
        });
}

// kvscope.Profile: a loaded profile file.
void bindProfile(py::module_& m)
{
    py::class_<Profile>(m, "Profile", "A codec profile file (JSON), read-only.")
        .def_static("load", [](const py::object& path) {
            Profile p;
            p.path = pathArg(path);
            p.p = kvscope::loadProfile(p.path);
            return p;
        }, py::arg("path"), "Loads and validates a profile; errors name the file and the field.")
        .def_readonly("path", &Profile::path)
        .def_property_readonly("model_fingerprint", [](const Profile& p) { return p.p.modelFingerprint; })
        .def_property_readonly("num_layers", [](const Profile& p) { return p.p.numLayers; })
        .def_property_readonly("chunk_tokens", [](const Profile& p) { return p.p.chunkTokens; })
        .def_property_readonly("delta_group", [](const Profile& p) { return p.p.deltaGroup; })
        .def_property_readonly("anchor_bins", [](const Profile& p) { return p.p.anchorBins; })
        .def_property_readonly("key_quantizer", [](const Profile& p) { return std::string(kvscope::quantizerName(p.p.keyQuantizer)); })
        .def_property_readonly("value_quantizer", [](const Profile& p) { return std::string(kvscope::quantizerName(p.p.valueQuantizer)); })
        .def_property_readonly("tables", [](const Profile& p) { return std::string(kvscope::tableModeName(p.p.tables)); })
        .def_property_readonly("table_scope", [](const Profile& p) { return std::string(kvscope::tableScopeName(p.p.tableScope)); })
        .def_property_readonly("default_level", [](const Profile& p) { return p.p.defaultLevel; })
        .def_property_readonly("calibrated_tables", [](const Profile& p) { return p.p.hasCalibratedTables(); })
        .def_property_readonly("levels", [](const Profile& p) {
            py::list out;
            for (const kvscope::CodecLevel& l : p.p.levels) out.append(levelDict(l));
            return out;
        }, "CacheGen levels: name, key_bins, value_bins (per layer), measured")
        .def_property_readonly("transform_levels", [](const Profile& p) {
            py::list out;
            for (const kvscope::TransformLevel& l : p.p.transformLevels) {
                py::dict d;
                d["name"] = l.name;
                d["key_theta"] = l.keyTheta;
                d["value_theta"] = l.valueTheta;
                d["measured"] = l.measuredJson.empty() ? py::object(py::dict()) : toPython(json::parse(l.measuredJson));
                out.append(d);
            }
            return out;
        })
        .def_property_readonly("transform_model", [](const Profile& p) { return !p.p.transformModel.empty(); },
                               "True when the profile carries a calibrated transform model")
        .def("to_json", [](const Profile& p) { return toPython(json::parse(kvscope::profileToJson(p.p))); },
             "the profile as a dict (the file's JSON)")
        .def("__repr__", [](const Profile& p) {
            return "<kvscope.Profile " + p.path + ": " + std::to_string(p.p.levels.size()) + " levels, chunks of " +
                   std::to_string(p.p.chunkTokens) + " tokens>";
        });
}

}  // namespace

PYBIND11_MODULE(_kvscope, m)
{
    m.doc() = "kvscope's core for Python: KV caches (HDF5 KV files), the CacheGen-style codec and its .kvc container.";

    bindError(m);
    bindKv(m);
    bindFunctions(m);
    bindContainer(m);
    bindProfile(m);
}
