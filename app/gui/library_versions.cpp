#include "library_versions.h"

#include <hdf5.h>

namespace kvscope {

std::string hdf5Version()
{
    unsigned major = 0, minor = 0, release = 0;
    if (H5get_libversion(&major, &minor, &release) < 0) return std::string();
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::string libtorchBuildVersion()
{
#ifdef KVSCOPE_TORCH_VERSION
    return KVSCOPE_TORCH_VERSION;
#else
    return std::string();
#endif
}

}  // namespace kvscope
