// KvcReader::parse: the .kvc header and its sections (FORMAT.md), read and checked in the order
// the format lays them out, each step refusing with "file: place: reason" before anything is
// trusted: the fixed header, the section slots and their CRCs, the transform section, levels,
// metadata, shared tables and the chunk index.
#include "codec/container.h"
#include "codec/container_layout.h"

#include "codec/transform.h"
#include "common/crc32.h"
#include "common/error.h"

#include <algorithm>
#include <cstring>

namespace kvscope {

using namespace kvc;

// What the steps of parse() pass on: the header's bytes and the reader over them (it goes on to
// the section slots and the transform section's slot), the counts the header declares and every
// section's checked bytes.
struct KvcReader::Parse {
    std::vector<uint8_t> headerBytes;
    ByteReader h{nullptr, nullptr, ""};
    uint16_t major = 0, minor = 0;
    int chunks = 0, levels = 0;
    SectionRef refs[kNumSections];
    std::vector<uint8_t> sec[kNumSections];
};

void KvcReader::parse()
{
    Parse s;
    parseHeader(s);
    readSections(s);
    if (m_params.codec == CodecId::Transform) parseTransformSection(s);
    parseLevels(s);
    parseMetadata(s);
    parseTables(s);
    parseIndex(s);
}

// The fixed header: size, magic, version, CRC, then the codec's ids, the shape and the counts.
void KvcReader::parseHeader(Parse& s)
{
    if (m_fileSize < kKvcHeaderSize)
        throw Error(where("header") + ": file is " + std::to_string(m_fileSize) + " bytes, shorter than the " +
                    std::to_string(kKvcHeaderSize) + "-byte header");
    std::vector<uint8_t>& hb = s.headerBytes;
    hb.resize(kKvcHeaderSize);
    readAt(0, hb.size(), hb.data(), "header");
    if (std::memcmp(hb.data(), kMagic, 8) != 0) throw Error(where("header") + ": not a kvscope .kvc file (bad magic)");
    s.h = ByteReader{hb.data() + 8, hb.data() + hb.size(), where("header")};
    ByteReader& h = s.h;
    const uint16_t major = s.major = h.u16(), minor = s.minor = h.u16();
    (void)minor;  // minor versions only add fields in reserved space (x.1: the transform section)
    if (major < kKvcOldestMajor || major > kKvcVersionMajor)
        throw Error(where("header") + ": format version " + std::to_string(major) + " is not supported (this build reads " +
                    std::to_string(kKvcOldestMajor) + ".." + std::to_string(kKvcVersionMajor) + ")");
    const uint32_t stored = uint32_t(hb[156]) | uint32_t(hb[157]) << 8 | uint32_t(hb[158]) << 16 | uint32_t(hb[159]) << 24;
    if (crc32(hb.data(), kKvcHeaderSize - 4) != stored) throw Error(where("header") + ": CRC mismatch (corrupt header)");
    if (h.u32() != kKvcHeaderSize) throw Error(where("header") + ": unexpected header size");

    CodecParams& p = m_params;
    p.entropy = major == 1 ? EntropyLayout::Rans4x8 : EntropyLayout::Rans32x16;
    const uint8_t codec = h.u8(), dtype = h.u8(), kq = h.u8(), vq = h.u8(), tm = h.u8(), scope = h.u8();
    h.take(2);
    if (codec > uint8_t(CodecId::Transform)) throw Error(where("header") + ": unknown codec id " + std::to_string(codec));
    if (dtype > uint8_t(DType::F32)) throw Error(where("header") + ": unknown dtype id " + std::to_string(dtype));
    if (kq > 1 || vq > 1) throw Error(where("header") + ": unknown quantizer id");
    if (tm > 1) throw Error(where("header") + ": unknown table mode " + std::to_string(tm));
    if (scope > 1) throw Error(where("header") + ": unknown table scope " + std::to_string(scope));
    if (scope == 1 && (major < 2 || minor < 2 || codec != uint8_t(CodecId::CacheGen)))
        throw Error(where("header") + ": per-head tables need a cachegen file of format version 2.2 or later");
    p.profile.tableScope = TableScope(scope);
    p.codec = CodecId(codec);
    p.dtype = DType(dtype);
    p.profile.keyQuantizer = Quantizer(kq);
    p.profile.valueQuantizer = Quantizer(vq);
    p.profile.tables = TableMode(tm);
    auto dim = [&](const char* what) {
        const uint32_t v = h.u32();
        if (v > (1u << 30)) throw Error(where("header") + ": " + what + " " + std::to_string(v) + " is implausible");
        return int(v);
    };
    p.shape.numLayers = dim("num_layers");
    p.shape.numKvHeads = dim("num_kv_heads");
    p.shape.headDim = dim("head_dim");
    p.shape.numTokens = dim("num_tokens");
    validateShape(p.shape, where("header"));
    p.profile.chunkTokens = dim("chunk_tokens");
    const int chunks = s.chunks = dim("num_chunks"), levels = s.levels = dim("num_levels");
    p.profile.deltaGroup = dim("delta_group");
    p.profile.anchorBins = dim("anchor_bins");
    p.profile.defaultLevel = dim("default_level");
    if (p.profile.chunkTokens < 16 || p.profile.chunkTokens > 8192)
        throw Error(where("header") + ": chunk_tokens " + std::to_string(p.profile.chunkTokens) + " is outside 16..8192");
    if (chunks != p.numChunks())
        throw Error(where("header") + ": num_chunks " + std::to_string(chunks) + " does not match " +
                    std::to_string(p.shape.numTokens) + " tokens in chunks of " + std::to_string(p.profile.chunkTokens));
    if (levels < 1 || levels > 64 || (p.codec != CodecId::CacheGen && p.codec != CodecId::Transform && levels != 1))
        throw Error(where("header") + ": num_levels " + std::to_string(levels) + " is invalid for this codec");
    const uint64_t declaredSize = h.u64();
    if (declaredSize != m_fileSize)
        throw Error(where("header") + ": file is " + std::to_string(m_fileSize) + " bytes, header says " +
                    std::to_string(declaredSize) + " (truncated or padded)");
}

// The four section slots: each must lie inside the file and match its CRC; payloads end where
// the first section starts.
void KvcReader::readSections(Parse& state)
{
    ByteReader& h = state.h;
    SectionRef* refs = state.refs;
    std::vector<uint8_t>* sec = state.sec;
    for (int s = 0; s < kNumSections; ++s) {
        refs[s].offset = h.u64();
        refs[s].size = h.u32();
        refs[s].crc = h.u32();
        if (refs[s].offset < kKvcHeaderSize || refs[s].offset > m_fileSize || refs[s].size > m_fileSize - refs[s].offset)
            throw Error(where(kSectionNames[s]) + ": lies outside the file");
        sec[s].resize(refs[s].size);
        readAt(refs[s].offset, refs[s].size, sec[s].data(), kSectionNames[s]);
        if (crc32(sec[s].data(), sec[s].size()) != refs[s].crc) throw Error(where(kSectionNames[s]) + ": CRC mismatch");
    }

    m_sectionsStart = m_fileSize;
    for (int s = 0; s < kNumSections; ++s) m_sectionsStart = std::min<uint64_t>(m_sectionsStart, refs[s].offset);
}

// The transform codec's model (format 1.1 and later): its slot follows the four sections'.
void KvcReader::parseTransformSection(Parse& s)
{
    CodecParams& p = m_params;
    ByteReader& h = s.h;
    const int levels = s.levels;
    SectionRef t;
    t.offset = h.u64();
    t.size = h.u32();
    t.crc = h.u32();
    if (s.minor < 1) throw Error(where("header") + ": the transform codec needs format version 1.1 or later");
    if (t.offset < kKvcHeaderSize || t.offset > m_fileSize || t.size > m_fileSize - t.offset || t.size == 0)
        throw Error(where("transform section") + ": lies outside the file");
    std::vector<uint8_t> tb(t.size);
    readAt(t.offset, t.size, tb.data(), "transform section");
    if (crc32(tb.data(), tb.size()) != t.crc) throw Error(where("transform section") + ": CRC mismatch");
    TransformModel m = parseTransformModel(tb.data(), tb.size(), p.shape, where("transform section"));
    if (m.numLevels() != levels)
        throw Error(where("transform section") + ": holds " + std::to_string(m.numLevels()) + " levels, the header says " +
                    std::to_string(levels));
    if (p.profile.defaultLevel < 1 || p.profile.defaultLevel > levels)
        throw Error(where("header") + ": default_level " + std::to_string(p.profile.defaultLevel) + " names no level");
    p.profile.transform = m.settings;
    p.profile.transformDefaultLevel = p.profile.defaultLevel;
    p.transform = std::make_shared<const TransformModel>(std::move(m));
    m_sectionsStart = std::min<uint64_t>(m_sectionsStart, t.offset);
}

// Levels: bins per (level, kind, layer).
void KvcReader::parseLevels(const Parse& s)
{
    CodecParams& p = m_params;
    const int levels = s.levels;
    const std::vector<uint8_t>* sec = s.sec;
    const size_t L = size_t(p.shape.numLayers);
    if (sec[kLevels].size() != size_t(levels) * 2 * L * 2)
        throw Error(where("levels section") + ": size does not match levels x layers");
    ByteReader lr{sec[kLevels].data(), sec[kLevels].data() + sec[kLevels].size(), where("levels section")};
    for (int l = 0; l < levels; ++l) {
        CodecLevel lev;
        lev.name = "level " + std::to_string(l + 1);
        for (size_t i = 0; i < L; ++i) lev.keyBins.push_back(lr.u16());
        for (size_t i = 0; i < L; ++i) lev.valueBins.push_back(lr.u16());
        p.profile.levels.push_back(std::move(lev));
    }
    p.profile.numLayers = int(L);
    if (p.codec == CodecId::CacheGen) {
        try {
            validateProfile(p.profile, where("header"));
        } catch (const Error& e) {
            throw Error(std::string(e.what()));
        }
    } else if (p.codec != CodecId::Transform) {
        p.profile.defaultLevel = 1;
    }
}

// Metadata: model name, fingerprint, context text and the token ids.
void KvcReader::parseMetadata(const Parse& s)
{
    const CodecParams& p = m_params;
    const std::vector<uint8_t>* sec = s.sec;
    ByteReader mr{sec[kMeta].data(), sec[kMeta].data() + sec[kMeta].size(), where("metadata section")};
    m_modelName = mr.str();
    m_fingerprint = mr.str();
    m_context = mr.str();
    const uint32_t ntok = mr.u32();
    if (ntok != 0 && ntok != uint32_t(p.shape.numTokens))
        throw Error(where("metadata section") + ": " + std::to_string(ntok) + " tokens listed for a cache of " +
                    std::to_string(p.shape.numTokens));
    const uint8_t* tb = mr.take(size_t(ntok) * 4);
    m_tokens.resize(ntok);
    for (uint32_t i = 0; i < ntok; ++i)
        m_tokens[i] = int32_t(uint32_t(tb[4 * i]) | uint32_t(tb[4 * i + 1]) << 8 | uint32_t(tb[4 * i + 2]) << 16 | uint32_t(tb[4 * i + 3]) << 24);
    if (mr.p != mr.end) throw Error(where("metadata section") + ": unexpected trailing bytes");
}

// Shared tables, one blob per level (cachegen files with shared tables only).
void KvcReader::parseTables(const Parse& s)
{
    const CodecParams& p = m_params;
    const int levels = s.levels;
    const std::vector<uint8_t>* sec = s.sec;
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    m_tableBytes.assign(size_t(levels), 0);
    if (shared) {
        ByteReader tr{sec[kTables].data(), sec[kTables].data() + sec[kTables].size(), where("tables section")};
        for (int l = 0; l < levels; ++l) m_tableBytes[size_t(l)] = tr.u32();
        for (int l = 0; l < levels; ++l) {
            const uint8_t* blob = tr.take(m_tableBytes[size_t(l)]);
            m_tables.push_back(parseLevelTables(p, l + 1, blob, m_tableBytes[size_t(l)],
                                                where("tables section: level " + std::to_string(l + 1))));
        }
        if (tr.p != tr.end) throw Error(where("tables section") + ": unexpected trailing bytes");
    } else if (!sec[kTables].empty()) {
        throw Error(where("tables section") + ": present although the file uses in-band tables");
    }
}

// The chunk index: (chunk, level) -> offset, size, CRC, every payload inside the payload area.
void KvcReader::parseIndex(const Parse& s)
{
    const int chunks = s.chunks, levels = s.levels;
    const std::vector<uint8_t>* sec = s.sec;
    const SectionRef* refs = s.refs;
    if (sec[kIndex].size() != size_t(chunks) * size_t(levels) * kIndexEntryBytes)
        throw Error(where("chunk index") + ": holds " + std::to_string(sec[kIndex].size()) + " bytes, expected " +
                    std::to_string(size_t(chunks) * levels * kIndexEntryBytes));
    ByteReader ir{sec[kIndex].data(), sec[kIndex].data() + sec[kIndex].size(), where("chunk index")};
    const uint64_t payloadEnd = refs[kLevels].offset;  // sections follow the payloads
    for (int c = 0; c < chunks; ++c)
        for (int l = 0; l < levels; ++l) {
            IndexEntry e;
            e.offset = ir.u64();
            e.size = ir.u32();
            e.crc = ir.u32();
            if (e.offset < kKvcHeaderSize || e.offset > payloadEnd || e.size > payloadEnd - e.offset)
                throw Error(where("chunk index") + ": chunk " + std::to_string(c) + " level " + std::to_string(l + 1) +
                            " points outside the payload area");
            m_index.push_back(e);
        }
}

}  // namespace kvscope
