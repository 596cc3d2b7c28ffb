// The instruction-set choice lives in common/ (the codec and the model share it); codec/ files
// include it under this name. The entropy coders and the encoders produce the same bytes on every
// path; the transform decoder's fast paths are within FORMAT.md's tolerance of its scalar
// reference. Tests and `bench codec` force one to compare them.
#pragma once

#include "common/simd_path.h"

namespace kvscope {

// Intel AMX tiles for the transform decoder's inverse transform on the AVX-512 path
// (transform_kernels.h, AmxProduct; FORMAT.md's tolerance). Supported: the CPU has AMX-BF16 and
// the kernel grants the tile state. Enabled: supported and not switched off by KVSCOPE_AMX=0
// (read once) or setAmxEnabled(false); setAmxEnabled(true) where unsupported leaves it off.
bool amxSupported();
bool amxEnabled();
void setAmxEnabled(bool on);

}  // namespace kvscope
