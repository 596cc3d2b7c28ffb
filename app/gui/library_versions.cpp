#include "library_versions.h"

namespace kvscope {

std::string libtorchBuildVersion()
{
#ifdef KVSCOPE_TORCH_VERSION
    return KVSCOPE_TORCH_VERSION;
#else
    return std::string();
#endif
}

}  // namespace kvscope
