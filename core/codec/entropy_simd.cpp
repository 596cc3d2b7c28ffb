// The dispatchers of the v2 entropy coder (the path itself is chosen in common/simd_path.cpp):
// they hand the decoder and encoder a kernel of entropy_avx2.cpp or entropy_avx512.cpp (their
// shared rules in entropy_x86.h), or nullptr for the scalar reference (entropy_stage.cpp). The kernels carry target attributes, so the binary
// runs on CPUs without AVX2 or AVX-512; they are only returned when simdPathSupported says so.
#include "codec/codec_detail.h"
#include "codec/entropy_x86.h"
#include "codec/simd_path.h"

#include "codec/rans.h"

namespace kvscope {

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
