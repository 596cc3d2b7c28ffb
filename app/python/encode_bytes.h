// kvscope.encode: the container written straight into a Python bytes object (encode_bytes.cpp).
#pragma once

#include "codec_glue.h"

#include <pybind11/pybind11.h>

namespace kvscope::python {

namespace py = pybind11;

// The bytes `kvscope-cli encode` writes with options o. When report is a dict it receives the
// sizes `encode --json` reports (file_bytes, default_level, levels, model_from). Releases the GIL
// while the codec runs; throws kvscope::Error with the CLI's message on bad options.
py::bytes encodeToBytes(const KvSet& kv, const EncodeOptions& o, const py::object& report);

}  // namespace kvscope::python
