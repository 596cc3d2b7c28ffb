#include "codec/container.h"

#include "common/file_io.h"

#include "codec/quantize.h"
#include "codec/transform.h"
#include "common/crc32.h"
#include "common/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>

namespace kvscope {

namespace {

const uint8_t kMagic[8] = {0x89, 'K', 'V', 'C', '\r', '\n', 0x1a, '\n'};

// Section slots in the header, in this order, 16 bytes each from offset 72.
enum Section { kLevels = 0, kMeta = 1, kTables = 2, kIndex = 3, kNumSections = 4 };
const char* const kSectionNames[kNumSections] = {"levels section", "metadata section", "tables section",
                                                 "chunk index"};
constexpr size_t kIndexEntryBytes = 16;
constexpr size_t kMaxMetaString = size_t(1) << 30;

struct ByteWriter {
    std::vector<uint8_t> b;
    void u8(uint8_t v) { b.push_back(v); }
    void u16(uint16_t v) { for (int i = 0; i < 2; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void u32(uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void u64(uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); }
    void bytes(const void* p, size_t n) { b.insert(b.end(), (const uint8_t*)p, (const uint8_t*)p + n); }
    void str(const std::string& s) { u32(uint32_t(s.size())); bytes(s.data(), s.size()); }
};

struct ByteReader {
    const uint8_t* p;
    const uint8_t* end;
    std::string where;  // "file: section"

    const uint8_t* take(size_t n)
    {
        if (size_t(end - p) < n) throw Error(where + ": truncated");
        const uint8_t* r = p;
        p += n;
        return r;
    }
    uint8_t u8() { return *take(1); }
    uint16_t u16() { const uint8_t* q = take(2); return uint16_t(q[0] | q[1] << 8); }
    uint32_t u32() { const uint8_t* q = take(4); return uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24; }
    uint64_t u64() { uint64_t lo = u32(); return lo | uint64_t(u32()) << 32; }
    std::string str()
    {
        const uint32_t n = u32();
        if (n > kMaxMetaString) throw Error(where + ": string length " + std::to_string(n) + " is implausible");
        const uint8_t* q = take(n);
        return std::string((const char*)q, n);
    }
};

struct SectionRef {
    uint64_t offset = 0;
    uint32_t size = 0;
    uint32_t crc = 0;
};

class TempFile {
public:
    explicit TempFile(const std::string& path) : m_path(path), m_tmp(uniqueTempPath(path))
    {
        m_fd = ::open(m_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (m_fd < 0) throw inputError(path, "", std::string("cannot create the file: ") + std::strerror(errno));
    }
    ~TempFile()
    {
        if (m_fd >= 0) ::close(m_fd);
        if (!m_committed) std::remove(m_tmp.c_str());
    }
    void pwriteAll(const void* data, size_t n, uint64_t off)
    {
        const uint8_t* p = static_cast<const uint8_t*>(data);
        while (n > 0) {
            const ssize_t w = ::pwrite(m_fd, p, n, off_t(off));
            if (w <= 0) throw inputError(m_path, "", std::string("write failed: ") + std::strerror(errno));
            p += w;
            n -= size_t(w);
            off += uint64_t(w);
        }
    }
    void commit()
    {
        if (::fsync(m_fd) != 0 || ::close(m_fd) != 0) {
            m_fd = -1;
            throw inputError(m_path, "", std::string("write failed: ") + std::strerror(errno));
        }
        m_fd = -1;
        if (std::rename(m_tmp.c_str(), m_path.c_str()) != 0)
            throw inputError(m_path, "", std::string("cannot replace the file: ") + std::strerror(errno));
        m_committed = true;
    }

private:
    std::string m_path, m_tmp;
    int m_fd = -1;
    bool m_committed = false;
};

}  // namespace

// The one writer of the format; the file and the byte vector are two `put`s.
KvcWriteReport writeKvc(const KvSet& kv, const CodecParams& p, const KvcPut& put, const std::string& path,
                        const std::vector<LevelTables>* calibrated, const Progress& progress)
{
    KVSCOPE_ASSERT(kv.shape() == p.shape && kv.dtype() == p.dtype);
    if (p.codec == CodecId::CacheGen) {
        validateProfile(p.profile, "profile");
        if (int(p.profile.levels.front().keyBins.size()) != p.shape.numLayers)
            throw inputError("profile", "levels",
                             "bins cover " + std::to_string(p.profile.levels.front().keyBins.size()) +
                                 " layers, the KV cache has " + std::to_string(p.shape.numLayers));
    }
    if (p.codec == CodecId::Transform && !p.transform)
        throw inputError(path, "transform section", "the transform codec needs its model (prepareTransform)");
    const int chunks = p.numChunks(), levels = p.numLevels();
    const bool shared = p.codec == CodecId::CacheGen && p.profile.tables == TableMode::Shared;
    const double work = double(chunks) * levels * (shared && !calibrated ? 2 : 1);
    double done = 0;
    auto step = [&] {
        done += 1;
        if (progress && !progress(done / work)) throw Cancelled();
    };

    std::vector<LevelTables> tables;
    if (shared) {
        if (calibrated) {
            KVSCOPE_ASSERT(int(calibrated->size()) == levels);
            tables = *calibrated;
        } else {
            for (int l = 1; l <= levels; ++l) {
                LevelCounts counts;
                for (int c = 0; c < chunks; ++c, step()) countChunkSymbols(p, kv, c, l, counts);
                tables.push_back(tablesFromCounts(p, l, counts));
            }
        }
    }

    KvcWriteReport rep;
    rep.levelBytes.assign(size_t(levels), 0);
    rep.levelTableBytes.assign(size_t(levels), 0);
    uint64_t offset = kKvcHeaderSize;
    ByteWriter index;
    for (int c = 0; c < chunks; ++c)
        for (int l = 1; l <= levels; ++l, step()) {
            const std::vector<uint8_t> payload = encodeChunk(p, kv, c, l, shared ? &tables[size_t(l - 1)] : nullptr);
            if (payload.size() > UINT32_MAX) throw inputError(path, "chunk " + std::to_string(c), "payload over 4 GiB; use smaller chunks");
            put(payload.data(), payload.size(), offset);
            index.u64(offset);
            index.u32(uint32_t(payload.size()));
            index.u32(crc32(payload.data(), payload.size()));
            offset += payload.size();
            rep.levelBytes[size_t(l - 1)] += payload.size();
        }

    ByteWriter sections[kNumSections];
    for (int l = 1; l <= levels; ++l)
        for (KvKind k : {KvKind::Key, KvKind::Value})
            for (int layer = 0; layer < p.shape.numLayers; ++layer)
                sections[kLevels].u16(uint16_t(p.codec == CodecId::CacheGen ? p.binsFor(k, layer, l) : 0));
    sections[kMeta].str(kv.modelName);
    sections[kMeta].str(kv.modelFingerprint);
    sections[kMeta].str(kv.context);
    sections[kMeta].u32(uint32_t(kv.tokens.size()));
    for (int32_t t : kv.tokens) sections[kMeta].u32(uint32_t(t));
    if (shared) {
        std::vector<std::vector<uint8_t>> blobs(static_cast<size_t>(levels));
        for (int l = 1; l <= levels; ++l) {
            serializeLevelTables(p, l, tables[size_t(l - 1)], blobs[size_t(l - 1)]);
            sections[kTables].u32(uint32_t(blobs[size_t(l - 1)].size()));
            rep.levelTableBytes[size_t(l - 1)] = blobs[size_t(l - 1)].size();
        }
        for (auto& b : blobs) sections[kTables].bytes(b.data(), b.size());
    }
    sections[kIndex] = std::move(index);

    SectionRef refs[kNumSections];
    for (int s = 0; s < kNumSections; ++s) {
        refs[s].offset = offset;
        refs[s].size = uint32_t(sections[s].b.size());
        refs[s].crc = crc32(sections[s].b.data(), sections[s].b.size());
        if (sections[s].b.size() > UINT32_MAX) throw inputError(path, kSectionNames[s], "section over 4 GiB");
        put(sections[s].b.data(), sections[s].b.size(), offset);
        offset += sections[s].b.size();
    }
    // Version 1.1: the transform codec's model, referenced from the header's reserved bytes.
    SectionRef transformRef;
    if (p.codec == CodecId::Transform) {
        std::vector<uint8_t> t;
        serializeTransformModel(*p.transform, t);
        if (t.size() > UINT32_MAX) throw inputError(path, "transform section", "section over 4 GiB");
        transformRef = {offset, uint32_t(t.size()), crc32(t.data(), t.size())};
        put(t.data(), t.size(), offset);
        offset += t.size();
    }

    ByteWriter h;
    h.bytes(kMagic, 8);
    h.u16(p.entropy == EntropyLayout::Rans4x8 ? uint16_t(1) : kKvcVersionMajor);
    // x.0 files stay byte-identical; 2.1 adds the transform section, 2.2 per-head tables.
    const bool perHead = p.codec == CodecId::CacheGen && p.profile.tableScope == TableScope::Head;
    h.u16(p.codec == CodecId::Transform ? uint16_t(1) : perHead ? uint16_t(2) : uint16_t(0));
    h.u32(uint32_t(kKvcHeaderSize));
    h.u8(uint8_t(p.codec));
    h.u8(uint8_t(p.dtype));
    h.u8(uint8_t(p.profile.keyQuantizer));
    h.u8(uint8_t(p.profile.valueQuantizer));
    h.u8(uint8_t(p.profile.tables));
    h.u8(perHead ? 1 : 0);  // table_scope
    h.u8(0); h.u8(0);
    h.u32(uint32_t(p.shape.numLayers));
    h.u32(uint32_t(p.shape.numKvHeads));
    h.u32(uint32_t(p.shape.headDim));
    h.u32(uint32_t(p.shape.numTokens));
    h.u32(uint32_t(p.profile.chunkTokens));
    h.u32(uint32_t(chunks));
    h.u32(uint32_t(levels));
    h.u32(uint32_t(p.profile.deltaGroup));
    h.u32(uint32_t(p.profile.anchorBins));
    h.u32(uint32_t(p.defaultLevel()));
    h.u64(offset);  // file size
    for (const SectionRef& r : refs) {
        h.u64(r.offset);
        h.u32(r.size);
        h.u32(r.crc);
    }
    h.u64(transformRef.offset);  // offset 136: the transform section (zeros for other codecs)
    h.u32(transformRef.size);
    h.u32(transformRef.crc);
    while (h.b.size() < kKvcHeaderSize - 4) h.u8(0);
    h.u32(crc32(h.b.data(), h.b.size()));
    KVSCOPE_ASSERT(h.b.size() == kKvcHeaderSize);
    put(h.b.data(), h.b.size(), 0);
    rep.fileBytes = offset;
    return rep;
}

KvcWriteReport writeKvc(const KvSet& kv, const CodecParams& params, const std::string& path,
                        const std::vector<LevelTables>* calibrated, const Progress& progress)
{
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<TempFile> file;  // created at the first byte, after the checks and the calibration pass
    const KvcPut put = [&](const void* data, size_t n, uint64_t offset) {
        if (!file) file.emplace(path);
        file->pwriteAll(data, n, offset);
    };
    KvcWriteReport rep = writeKvc(kv, params, put, path, calibrated, progress);
    KVSCOPE_ASSERT(file);  // the header at least was written
    file->commit();
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
}

KvcWriteReport writeKvc(const KvSet& kv, const CodecParams& params, std::vector<uint8_t>& out,
                        const std::vector<LevelTables>* calibrated, const Progress& progress)
{
    const auto t0 = std::chrono::steady_clock::now();
    // Reserved at the cache's own size and an eighth (address space: pages are touched only as they
    // are written), so that a container of compressed levels never grows and copies itself.
    const size_t raw = size_t(params.shape.totalValues()) * dtypeSize(params.dtype);
    std::vector<uint8_t> b;
    b.reserve(raw + raw / 8 + (size_t(1) << 20));
    const KvcPut put = [&b](const void* data, size_t n, uint64_t offset) {
        if (b.size() < offset + n) b.resize(size_t(offset + n));
        if (n) std::memcpy(b.data() + offset, data, n);
    };
    KvcWriteReport rep = writeKvc(kv, params, put, "<memory>", calibrated, progress);
    out = std::move(b);
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
}

// ---------------------------------------------------------------------------------------------

std::unique_ptr<KvcReader> KvcReader::openFile(const std::string& path)
{
    std::unique_ptr<KvcReader> r(new KvcReader());
    r->m_name = path;
    r->m_fd = ::open(path.c_str(), O_RDONLY);
    if (r->m_fd < 0) throw inputError(path, "", std::string("cannot open: ") + std::strerror(errno));
    const off_t end = ::lseek(r->m_fd, 0, SEEK_END);
    if (end < 0) throw inputError(path, "", "cannot determine the file size");
    r->m_fileSize = uint64_t(end);
    r->parse();
    return r;
}

std::unique_ptr<KvcReader> KvcReader::fromMemory(std::vector<uint8_t> bytes, const std::string& name)
{
    std::unique_ptr<KvcReader> r(new KvcReader());
    r->m_name = name;
    r->m_memory = std::move(bytes);
    r->m_data = r->m_memory.data();
    r->m_fileSize = r->m_memory.size();
    r->parse();
    return r;
}

std::unique_ptr<KvcReader> KvcReader::fromBuffer(const uint8_t* data, size_t size, const std::string& name)
{
    std::unique_ptr<KvcReader> r(new KvcReader());
    r->m_name = name;
    r->m_data = data;
    r->m_fileSize = size;
    r->parse();
    return r;
}

KvcReader::~KvcReader()
{
    if (m_fd >= 0) ::close(m_fd);
}

void KvcReader::readAt(uint64_t offset, size_t size, uint8_t* dst, const std::string& what) const
{
    if (offset > m_fileSize || size > m_fileSize - offset)
        throw Error(where(what) + ": bytes " + std::to_string(offset) + "+" + std::to_string(size) +
                    " lie outside the file (" + std::to_string(m_fileSize) + " bytes)");
    if (m_fd < 0) {
        if (m_holeEnd > kKvcHeaderSize && offset + size > kKvcHeaderSize) {  // a skeleton
            if (offset < m_holeEnd)
                throw Error(where(what) + ": the chunk payloads are not part of this skeleton");
            offset -= m_holeEnd - kKvcHeaderSize;
        }
        if (size) std::memcpy(dst, m_data + offset, size);
        return;
    }
    while (size > 0) {
        const ssize_t n = ::pread(m_fd, dst, size, off_t(offset));
        if (n <= 0) throw Error(where(what) + ": read failed");
        dst += n;
        size -= size_t(n);
        offset += uint64_t(n);
    }
}

void KvcReader::parse()
{
    if (m_fileSize < kKvcHeaderSize)
        throw Error(where("header") + ": file is " + std::to_string(m_fileSize) + " bytes, shorter than the " +
                    std::to_string(kKvcHeaderSize) + "-byte header");
    std::vector<uint8_t> hb(kKvcHeaderSize);
    readAt(0, hb.size(), hb.data(), "header");
    if (std::memcmp(hb.data(), kMagic, 8) != 0) throw Error(where("header") + ": not a kvscope .kvc file (bad magic)");
    ByteReader h{hb.data() + 8, hb.data() + hb.size(), where("header")};
    const uint16_t major = h.u16(), minor = h.u16();
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
    const int chunks = dim("num_chunks"), levels = dim("num_levels");
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

    SectionRef refs[kNumSections];
    std::vector<uint8_t> sec[kNumSections];
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
    if (p.codec == CodecId::Transform) {
        SectionRef t;
        t.offset = h.u64();
        t.size = h.u32();
        t.crc = h.u32();
        if (minor < 1) throw Error(where("header") + ": the transform codec needs format version 1.1 or later");
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

uint32_t KvcReader::chunkBytes(int chunk, int level) const
{
    KVSCOPE_ASSERT(chunk >= 0 && chunk < m_params.numChunks() && level >= 1 && level <= m_params.numLevels());
    return m_index[size_t(chunk) * m_params.numLevels() + size_t(level - 1)].size;
}

uint32_t KvcReader::chunkCrc(int chunk, int level) const
{
    KVSCOPE_ASSERT(chunk >= 0 && chunk < m_params.numChunks() && level >= 1 && level <= m_params.numLevels());
    return m_index[size_t(chunk) * m_params.numLevels() + size_t(level - 1)].crc;
}

uint64_t KvcReader::levelBytes(int level) const
{
    uint64_t total = 0;
    for (int c = 0; c < m_params.numChunks(); ++c) total += chunkBytes(c, level);
    return total;
}

uint64_t KvcReader::levelTableBytes(int level) const { return m_tableBytes[size_t(level - 1)]; }

std::vector<uint8_t> KvcReader::readChunk(int chunk, int level) const
{
    if (chunk < 0 || chunk >= m_params.numChunks())
        throw Error(where("chunk " + std::to_string(chunk)) + ": no such chunk (file has " +
                    std::to_string(m_params.numChunks()) + ")");
    if (level < 1 || level > m_params.numLevels())
        throw Error(where("level " + std::to_string(level)) + ": no such level (file has " +
                    std::to_string(m_params.numLevels()) + ")");
    const IndexEntry& e = m_index[size_t(chunk) * m_params.numLevels() + size_t(level - 1)];
    const std::string place = "chunk " + std::to_string(chunk) + " level " + std::to_string(level);
    std::vector<uint8_t> b(e.size);
    readAt(e.offset, e.size, b.data(), place);
    if (crc32(b.data(), b.size()) != e.crc) throw Error(where(place) + ": CRC mismatch (corrupt chunk)");
    return b;
}

void KvcReader::decodePayloadInto(int chunk, int level, const uint8_t* data, size_t size, KvSet& out) const
{
    if (chunk < 0 || chunk >= m_params.numChunks() || level < 1 || level > m_params.numLevels())
        throw Error(where("chunk " + std::to_string(chunk) + " level " + std::to_string(level)) + ": no such chunk");
    const IndexEntry& e = m_index[size_t(chunk) * m_params.numLevels() + size_t(level - 1)];
    const std::string place = "chunk " + std::to_string(chunk) + " level " + std::to_string(level);
    if (size != e.size)
        throw Error(where(place) + ": payload of " + std::to_string(size) + " bytes, the index says " + std::to_string(e.size));
    if (crc32(data, size) != e.crc) throw Error(where(place) + ": CRC mismatch (corrupt chunk)");
    const bool shared = m_params.codec == CodecId::CacheGen && m_params.profile.tables == TableMode::Shared;
    decodeChunk(m_params, data, size, chunk, level, shared ? &m_tables[size_t(level - 1)] : nullptr, out, where(place));
}

std::vector<uint8_t> KvcReader::skeleton() const
{
    std::vector<uint8_t> b(kKvcHeaderSize + (m_fileSize - m_sectionsStart));
    readAt(0, kKvcHeaderSize, b.data(), "header");
    readAt(m_sectionsStart, m_fileSize - m_sectionsStart, b.data() + kKvcHeaderSize, "sections");
    return b;
}

std::unique_ptr<KvcReader> KvcReader::fromSkeleton(std::vector<uint8_t> bytes, const std::string& name)
{
    if (bytes.size() < kKvcHeaderSize)
        throw Error(name + ": header: skeleton is " + std::to_string(bytes.size()) + " bytes, shorter than the header");
    uint64_t declared = 0;
    for (int i = 0; i < 8; ++i) declared |= uint64_t(bytes[64 + size_t(i)]) << (8 * i);
    if (declared < bytes.size()) throw Error(name + ": header: declared file size is smaller than the skeleton");
    std::unique_ptr<KvcReader> r(new KvcReader());
    r->m_name = name;
    r->m_memory = std::move(bytes);
    r->m_data = r->m_memory.data();
    r->m_fileSize = declared;
    r->m_holeEnd = kKvcHeaderSize + (declared - r->m_memory.size());
    r->parse();
    if (r->m_sectionsStart != r->m_holeEnd)
        throw Error(name + ": header: the sections do not start where the skeleton's payload gap ends");
    return r;
}

void KvcReader::decodeChunkInto(int chunk, int level, KvSet& out) const
{
    const std::vector<uint8_t> b = readChunk(chunk, level);
    const bool shared = m_params.codec == CodecId::CacheGen && m_params.profile.tables == TableMode::Shared;
    decodeChunk(m_params, b.data(), b.size(), chunk, level, shared ? &m_tables[size_t(level - 1)] : nullptr, out,
                where("chunk " + std::to_string(chunk) + " level " + std::to_string(level)));
}

KvSet KvcReader::decodeAll(const std::vector<int>& levels, const Progress& progress) const
{
    const int chunks = m_params.numChunks();
    if (levels.size() != 1 && int(levels.size()) != chunks)
        throw Error(where("levels") + ": give one level, or one per chunk (" + std::to_string(chunks) + ")");
    const uint64_t outBytes = uint64_t(m_params.shape.totalValues()) * dtypeSize(m_params.dtype);
    if (outBytes > m_maxOutput)
        throw Error(where("header") + ": the decoded cache would take " + std::to_string(outBytes) +
                    " bytes, over the limit of " + std::to_string(m_maxOutput));
    KvSet out(m_params.shape, m_params.dtype);
    decodeAllInto(levels, out, progress);
    return out;
}

void KvcReader::decodeAllInto(const std::vector<int>& levels, KvSet& out, const Progress& progress) const
{
    const int chunks = m_params.numChunks();
    if (levels.size() != 1 && int(levels.size()) != chunks)
        throw Error(where("levels") + ": give one level, or one per chunk (" + std::to_string(chunks) + ")");
    if (!(out.shape() == m_params.shape) || out.dtype() != m_params.dtype)
        throw Error(where("output") + ": the cache to decode into is not of the file's shape and dtype");
    out.modelName = m_modelName;
    out.modelFingerprint = m_fingerprint;
    out.context = m_context;
    out.tokens = m_tokens;
    out.ropeInvFreq.clear();  // as decodeAll returns it: the file carries none of these
    out.ropePosition0 = 0;
    out.querySq.clear();
    out.valueWeight.clear();
    out.attnMass.clear();
    // Batches of chunks through decodeChunks (unit by unit across the batch: shared tables are
    // prepared once per batch and unit); progress is reported per batch.
    const bool shared = m_params.codec == CodecId::CacheGen && m_params.profile.tables == TableMode::Shared;
    constexpr int kBatch = 16;
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<ChunkPayload> batch;
    for (int c0 = 0; c0 < chunks; c0 += kBatch) {
        const int c1 = std::min(chunks, c0 + kBatch);
        bytes.clear();
        bytes.reserve(kBatch);
        batch.clear();
        std::exception_ptr readError;  // raised after the chunks before it decode, as one by one
        for (int c = c0; c < c1 && !readError; ++c) {
            const int level = levels.size() == 1 ? levels[0] : levels[size_t(c)];
            const std::string place = "chunk " + std::to_string(c) + " level " + std::to_string(level);
            try {
                if (m_data && m_holeEnd == 0 && level >= 1 && level <= m_params.numLevels()) {
                    // A whole file in memory: decoded in place, its CRC checked as readChunk does.
                    const IndexEntry& e = m_index[size_t(c) * m_params.numLevels() + size_t(level - 1)];
                    if (crc32(m_data + e.offset, e.size) != e.crc) throw Error(where(place) + ": CRC mismatch (corrupt chunk)");
                    batch.push_back({c, level, m_data + e.offset, e.size, where(place)});
                    continue;
                }
                bytes.push_back(readChunk(c, level));
                batch.push_back({c, level, bytes.back().data(), bytes.back().size(), where(place)});
            } catch (...) {
                readError = std::current_exception();
            }
        }
        decodeChunks(m_params, batch, shared ? &m_tables : nullptr, out);
        if (readError) std::rethrow_exception(readError);
        if (progress && !progress(double(c1) / chunks)) throw Cancelled();
    }
}

}  // namespace kvscope
