// The run-time choice of an instruction set (simd_path.h): CPU detection and the KVSCOPE_SIMD
// override, shared by the codec's entropy and transform kernels and the model's weight kernels.
#include "common/simd_path.h"

#include "common/error.h"

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#define KVSCOPE_SIMD_X86 1
#include <cpuid.h>
#endif

namespace kvscope {

const char* simdPathName(SimdPath p)
{
    switch (p) {
    case SimdPath::Scalar: return "scalar";
    case SimdPath::Avx2: return "avx2";
    case SimdPath::Avx512: return "avx512";
    }
    return "?";
}

bool parseSimdPath(const std::string& s, SimdPath* out)
{
    if (s == "scalar") *out = SimdPath::Scalar;
    else if (s == "avx2") *out = SimdPath::Avx2;
    else if (s == "avx512") *out = SimdPath::Avx512;
    else if (s == "auto") *out = bestSimdPath();
    else return false;
    return true;
}

bool simdPathSupported(SimdPath p)
{
#ifdef KVSCOPE_SIMD_X86
    static const bool f16c = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    }();
    static const bool avx2 = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                             __builtin_cpu_supports("fma");
    static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    switch (p) {
    case SimdPath::Scalar: return true;
    case SimdPath::Avx2: return avx2;
    case SimdPath::Avx512: return avx512;
    }
    return false;
#else
    return p == SimdPath::Scalar;
#endif
}

SimdPath bestSimdPath()
{
    if (simdPathSupported(SimdPath::Avx512)) return SimdPath::Avx512;
    if (simdPathSupported(SimdPath::Avx2)) return SimdPath::Avx2;
    return SimdPath::Scalar;
}

namespace {

SimdPath fromEnvironment()
{
    SimdPath p = bestSimdPath();
    const char* env = std::getenv("KVSCOPE_SIMD");
    SimdPath want;
    if (env && parseSimdPath(env, &want)) {
        while (!simdPathSupported(want)) want = SimdPath(uint8_t(want) - 1);
        p = want;
    }
    return p;
}

std::atomic<int>& chosenPath()
{
    static std::atomic<int> p{int(fromEnvironment())};
    return p;
}

}  // namespace

SimdPath simdPath() { return SimdPath(chosenPath().load(std::memory_order_relaxed)); }

void setSimdPath(SimdPath p)
{
    if (!simdPathSupported(p)) throw Error(std::string("SIMD path ") + simdPathName(p) + " is not supported by this CPU");
    chosenPath().store(int(p), std::memory_order_relaxed);
}

}  // namespace kvscope
