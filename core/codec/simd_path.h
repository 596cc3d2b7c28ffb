// The instruction-set choice lives in common/ (the codec and the model share it); codec/ files
// include it under this name.
#pragma once

#include "common/simd_path.h"
