// kvscope.encode's bytes object and its size report (module.cpp binds it).
#include "encode_bytes.h"

#include "codec/chunk_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvscope::python {

namespace {

// What `kvscope-cli encode --json` reports for each level (writeAndReport in cmd_codec.cpp): the
// chunks, the tables unless they are the profile's, and the transform's side information.
void fillReport(py::dict d, const EncodeReport& r, const KvShape& shape)
{
    py::list levels;
    const double values = double(shape.totalValues());
    for (size_t l = 0; l < r.levelBytes.size(); ++l) {
        const uint64_t bytes = r.levelBytes[l] + (r.tablesFromProfile ? 0 : r.levelTableBytes[l]) + r.sideBytes;
        py::dict j;
        j["level"] = l + 1;
        j["chunk_bytes"] = r.levelBytes[l];
        j["table_bytes"] = r.levelTableBytes[l];
        j["side_bytes"] = r.sideBytes;
        j["bytes"] = bytes;
        j["bits_per_value"] = 8.0 * double(bytes) / values;
        levels.append(j);
    }
    d["file_bytes"] = r.fileBytes;
    d["default_level"] = r.defaultLevel;
    d["levels"] = levels;
    if (!r.modelFrom.empty()) d["model_from"] = r.modelFrom;
}

}  // namespace

// kvscope.encode's bytes, written by the container writer straight into the bytes object: no
// staging buffer and no second copy (docs/python.md, "Overhead"). The size is known only once the
// last chunk is coded, so the object is allocated at a guess, grown when a write goes past it and
// cut to the container's size at the end. For such sizes CPython's allocator is malloc, whose
// realloc grows or cuts a block in place or by remapping its pages: what was written is not copied
// again. The guess is this thread's last container size exactly (else a quarter of the cache's raw
// size): glibc serves a request no larger than the last large block it freed from memory it keeps
// mapped, while anything larger gets fresh pages that fault in as they are written (docs/python.md,
// "Overhead"). Resizing a bytes object needs the GIL, which the writer otherwise runs without.
py::bytes encodeToBytes(const KvSet& kv, const EncodeOptions& o, const py::object& report)
{
    thread_local size_t lastSize = 0;
    const size_t raw = kv.tensorBytes() * 2 * size_t(kv.shape().numLayers);
    const size_t guess = lastSize ? lastSize : raw / 4 + kKvcHeaderSize;
    PyObject* obj = PyBytes_FromStringAndSize(nullptr, py::ssize_t(guess));
    if (!obj) throw py::error_already_set();
    struct Owner {  // the reference, dropped on an exception (after the GIL is back)
        PyObject*& o;
        ~Owner() { Py_XDECREF(o); }
    } owner{obj};
    size_t capacity = guess;
    auto resize = [&](size_t n) {
        if (_PyBytes_Resize(&obj, py::ssize_t(n)) != 0) throw py::error_already_set();
        capacity = n;
    };
    const KvcPut put = [&](const void* data, size_t n, uint64_t offset) {
        if (offset + n > capacity) {
            py::gil_scoped_acquire gil;
            resize(std::max<size_t>(size_t(offset + n), capacity + capacity / 2));
        }
        std::memcpy(PyBytes_AS_STRING(obj) + offset, data, n);
    };
    EncodeReport rep;
    {
        py::gil_scoped_release nogil;
        rep = encodeTo(kv, o, put);
    }
    const uint64_t size = rep.fileBytes;
    if (!report.is_none()) fillReport(report.cast<py::dict>(), rep, kv.shape());
    if (size != capacity) resize(size_t(size));
    lastSize = size_t(size);
    return py::reinterpret_steal<py::bytes>(std::exchange(obj, nullptr));
}

}  // namespace kvscope::python
