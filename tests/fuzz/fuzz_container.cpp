// libFuzzer target for the .kvc reader and every chunk decoder behind it (FORMAT.md).
//
// Contract under test (bad input is a one-line kvscope::Error, never a crash): whatever the bytes, KvcReader either parses them
// or throws kvscope::Error, and decodeAll either decodes or throws kvscope::Error, without reading
// outside its buffers, without undefined behaviour and without allocating beyond the output limit.
// Only kvscope::Error is caught: any other exception, an abort (KVSCOPE_ASSERT) or a sanitizer
// report is a finding, and so is any disagreement between the v2 entropy decoder's paths (scalar,
// AVX2, AVX-512) on the same input. Build and run: tests/fuzz/README.md.
#include "codec/container.h"
#include "codec/simd_path.h"
#include "common/crc32.h"
#include "common/error.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace kvscope;

constexpr uint64_t kMaxOutput = uint64_t(64) << 20;  // 64 MiB of decoded KV per input

uint32_t getU32(const std::vector<uint8_t>& b, size_t at)
{
    return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24;
}
uint64_t getU64(const std::vector<uint8_t>& b, size_t at) { return getU32(b, at) | uint64_t(getU32(b, at + 4)) << 32; }
void putU32(std::vector<uint8_t>& b, size_t at, uint32_t v)
{
    for (int i = 0; i < 4; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i));
}
bool inside(const std::vector<uint8_t>& b, uint64_t off, uint64_t n) { return off <= b.size() && n <= b.size() - off; }

// Almost every mutation breaks a CRC, and a CRC mismatch stops the reader before the decoders.
// This rewrites every CRC that covers bytes inside the file (chunks in the index, the four
// sections, then the header, per FORMAT.md) so that mutations of sizes, tables, scales and
// entropy-coded streams reach the code that must validate them.
std::vector<uint8_t> withValidCrcs(std::vector<uint8_t> b)
{
    if (b.size() < kKvcHeaderSize) return b;
    const uint32_t levels = getU32(b, 48);
    const uint64_t idxOff = getU64(b, 72 + 16 * 3);
    const uint32_t idxSize = getU32(b, 72 + 16 * 3 + 8);
    if (levels > 0 && inside(b, idxOff, idxSize))
        for (uint64_t e = idxOff; e + 16 <= idxOff + idxSize; e += 16) {
            const uint64_t off = getU64(b, size_t(e));
            const uint32_t n = getU32(b, size_t(e) + 8);
            if (inside(b, off, n)) putU32(b, size_t(e) + 12, crc32(b.data() + off, n));
        }
    for (int s = 0; s < 4; ++s) {
        const size_t ref = 72 + 16 * size_t(s);
        const uint64_t off = getU64(b, ref);
        const uint32_t n = getU32(b, ref + 8);
        if (inside(b, off, n)) putU32(b, ref + 12, crc32(b.data() + off, n));
    }
    putU32(b, kKvcHeaderSize - 4, crc32(b.data(), kKvcHeaderSize - 4));
    return b;
}

void exercise(std::vector<uint8_t> bytes)
{
    std::unique_ptr<KvcReader> r;
    try {
        r = KvcReader::fromMemory(std::move(bytes), "fuzz.kvc");
    } catch (const Error&) {
        return;
    }
    r->setMaxOutputBytes(kMaxOutput);
    const CodecParams& p = r->params();
    const int levels = p.numLevels(), chunks = p.numChunks();
    for (int l = 1; l <= levels; ++l) {
        (void)r->levelBytes(l);
        (void)r->levelTableBytes(l);
    }

    // The default level for every chunk, as `kvscope-cli decode` does, once per entropy decoder
    // path this CPU has (scalar reference, AVX2, AVX-512): every path must refuse with the same
    // message or decode to the same bytes; a difference is a finding (trap). The transform codec's
    // fast paths fuse multiply-adds (FORMAT.md's tolerance), so there only the refusals must agree.
    const bool transform = p.codec == CodecId::Transform;
    std::string firstError;
    std::vector<uint8_t> firstBytes;
    bool first = true;
    for (SimdPath sp : {SimdPath::Scalar, SimdPath::Avx2, SimdPath::Avx512}) {
        if (!simdPathSupported(sp)) continue;
        setSimdPath(sp);
        std::string error;
        std::vector<uint8_t> bytes;
        try {
            const KvSet out = r->decodeAll({p.profile.defaultLevel});
            for (int k = 0; k < 2; ++k)
                for (int l = 0; l < p.shape.numLayers; ++l)
                    bytes.insert(bytes.end(), out.data(KvKind(k), l), out.data(KvKind(k), l) + out.tensorBytes());
        } catch (const Error& e) {
            error = e.what();
        }
        if (first) {
            firstError = error;
            firstBytes = std::move(bytes);
            first = false;
        } else if (error != firstError || (bytes != firstBytes && !transform)) {
            __builtin_trap();  // decoder paths disagree
        }
    }
    setSimdPath(bestSimdPath());
    // A mix of levels, as a streamer would ask for: varies with the input so all levels get turns.
    if (levels > 1) {
        std::vector<int> mix(static_cast<size_t>(chunks));
        for (int c = 0; c < chunks; ++c) mix[size_t(c)] = 1 + int((uint64_t(c) * 7 + r->fileBytes()) % uint64_t(levels));
        try {
            r->decodeAll(mix);
        } catch (const Error&) {
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    const std::vector<uint8_t> bytes(data, data + size);
    exercise(bytes);  // as they are: the CRC checks themselves
    std::vector<uint8_t> fixed = withValidCrcs(bytes);
    if (fixed != bytes) exercise(std::move(fixed));  // past the CRCs: the decoders
    return 0;
}
