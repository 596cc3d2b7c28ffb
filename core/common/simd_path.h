// Which instruction set kvscope's kernels use (the codec's entropy and transform kernels, the
// model's weight kernels): the scalar reference, AVX2 or AVX-512, chosen at run time from the CPU
// (the binary itself only assumes x86-64 or any other target). The entropy coders and the encoders
// produce the same bytes on every path; the transform decoder's fast paths and the weight kernels
// are within stated tolerances of their scalar references. Tests and `bench codec` force one to
// compare them.
#pragma once

#include <cstdint>
#include <string>

namespace kvscope {

enum class SimdPath : uint8_t { Scalar = 0, Avx2 = 1, Avx512 = 2 };

const char* simdPathName(SimdPath p);  // "scalar", "avx2", "avx512"
// Parses "scalar", "avx2", "avx512" or "auto" (the best this CPU has). Returns false otherwise.
bool parseSimdPath(const std::string& s, SimdPath* out);

// Whether this CPU (and this build) can run path p.
bool simdPathSupported(SimdPath p);
// The best supported path.
SimdPath bestSimdPath();

// The path decoders use now: set by setSimdPath, else by the environment variable KVSCOPE_SIMD
// (scalar, avx2, avx512, auto; read once), else bestSimdPath(). A request the CPU cannot honour
// falls back to the best supported path below it.
SimdPath simdPath();
// Forces a path for this process (tests, benchmarks). Throws kvscope::Error when the CPU lacks it.
void setSimdPath(SimdPath p);

}  // namespace kvscope
