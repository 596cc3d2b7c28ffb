// Versions of the libraries kvscope was built with, for the About box. The libtorch version comes
// from the build, so no torch header meets Qt's macros; HDF5's comes from kv/kv_h5.h
// (hdf5LibraryVersion). A model's LlamaRuntime::describe() gives the runtime's own view once one
// is open.
#pragma once

#include <string>

namespace kvscope {

std::string libtorchBuildVersion();  // "1.13.0", the libtorch found by CMake; "" when unknown

}  // namespace kvscope
