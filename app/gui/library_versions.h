// Versions of the libraries kvscope was built with, for the About box. Kept apart from Qt code:
// the .cpp includes hdf5.h, and the libtorch version comes from the build (torch headers never
// meet Qt's macros). A model's LlamaRuntime::describe() gives the runtime's own view once one
// is open.
#pragma once

#include <string>

namespace kvscope {

std::string hdf5Version();        // "1.10.8", from H5get_libversion (the library linked)
std::string libtorchBuildVersion();  // "1.13.0", the libtorch found by CMake; "" when unknown

}  // namespace kvscope
