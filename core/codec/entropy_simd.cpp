// The run-time choice of the v2 entropy coder's instruction set (simd_path.h): CPU detection, the
// KVSCOPE_SIMD override, and the dispatchers that hand the decoder and encoder a kernel of
// entropy_avx2.cpp or entropy_avx512.cpp (their shared rules in entropy_x86.h), or nullptr for
// the scalar reference (entropy_stage.cpp). The kernels carry target attributes, so the binary
// runs on CPUs without AVX2 or AVX-512; they are only returned when simdPathSupported says so.
#include "codec/codec_detail.h"
#include "codec/entropy_x86.h"
#include "codec/simd_path.h"

#include "codec/rans.h"
#include "common/error.h"

#include <atomic>
#include <cstdlib>

#ifdef KVSCOPE_SIMD_X86
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
    static const bool avx2 = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("fma");
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

namespace detail {

CountFn countKernel(SimdPath path, int stride)
{
#ifdef KVSCOPE_SIMD_X86
    if (path == SimdPath::Avx512 && stride <= 32) return countAvx512;
    if (path == SimdPath::Avx2 && stride <= 32) return countAvx2;
#else
    (void)path;
    (void)stride;
#endif
    return nullptr;
}

W32EncFn w32EncodeKernel(SimdPath path, int D, bool small)
{
#ifdef KVSCOPE_SIMD_X86
    if (path == SimdPath::Avx512 && D % 16 == 0) return avx512EncodeKernel(small);
    if ((path == SimdPath::Avx2 || path == SimdPath::Avx512) && D % 8 == 0) return avx2EncodeKernel(small);
#else
    (void)path;
    (void)D;
    (void)small;
#endif
    return nullptr;
}

bool w32RowUsesSlots(SimdPath path, int D)
{
#ifdef KVSCOPE_SIMD_X86
    return (path == SimdPath::Avx2 || (path == SimdPath::Avx512 && D % 16 != 0)) && D % 8 == 0;
#else
    (void)path;
    (void)D;
    return false;
#endif
}

void w32SlotIndex(const CodingTable& t, int alphabet, uint32_t* slots)
{
#ifdef KVSCOPE_SIMD_X86
    if (simdPathSupported(SimdPath::Avx2)) return slotIndexAvx2(t, alphabet, slots);
#endif
    for (int sy = 0; sy < alphabet; ++sy)
        for (uint32_t k = 0; k < t.freq(sy); ++k) slots[t.start(sy) + k] = uint32_t(sy) | k << 8 | (t.freq(sy) - 1) << 20;
}

W32RowFn w32RowKernel(SimdPath path, RowOut k, int D, bool uniform)
{
#ifdef KVSCOPE_SIMD_X86
    if (path == SimdPath::Avx512 && D % 16 == 0) return avx512RowKernel(k, uniform);
    if ((path == SimdPath::Avx2 || path == SimdPath::Avx512) && D % 8 == 0) return avx2RowKernel(k);
#else
    (void)path;
    (void)k;
    (void)D;
    (void)uniform;
#endif
    return nullptr;
}

}  // namespace detail

}  // namespace kvscope
