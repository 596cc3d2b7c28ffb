#include "codec/container.h"
#include "codec/container_chain.h"
#include "codec/container_layout.h"

#include "common/file_io.h"

#include "codec/quantize.h"
#include "codec/transform.h"
#include "common/crc32.h"
#include "common/error.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>

namespace kvscope {

using namespace kvc;

namespace {

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

// The 160-byte header (FORMAT.md) of a file of fileSize bytes whose sections are refs and transformRef.
ByteWriter headerBytes(const CodecParams& p, int chunks, int levels, const SectionRef* refs, const SectionRef& transformRef,
                       uint64_t fileSize)
{
    ByteWriter h;
    h.bytes(kMagic, 8);
    h.u16(p.entropy == EntropyLayout::Rans4x8 ? uint16_t(1) : kKvcVersionMajor);
    // x.0 files stay byte-identical; 2.1 adds the transform section, 2.2 per-head tables, 2.3 chained chunks.
    const bool perHead = p.codec == CodecId::CacheGen && p.profile.tableScope == TableScope::Head;
    h.u16(p.codec == CodecId::Transform ? uint16_t(p.chainsChunks() ? 3 : 1) : perHead ? uint16_t(2) : uint16_t(0));
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
    h.u64(fileSize);
    for (int s = 0; s < kNumSections; ++s) {
        const SectionRef& r = refs[s];
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
    return h;
}

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
    auto writePayload = [&](int c, int l, const std::vector<uint8_t>& payload) {
        if (payload.size() > UINT32_MAX) throw inputError(path, "chunk " + std::to_string(c), "payload over 4 GiB; use smaller chunks");
        put(payload.data(), payload.size(), offset);
        index.u64(offset);
        index.u32(uint32_t(payload.size()));
        index.u32(crc32(payload.data(), payload.size()));
        offset += payload.size();
        rep.levelBytes[size_t(l - 1)] += payload.size();
    };
    if (p.chainsChunks()) {
        // Each level is one chain (container_chain.h), coded whole, then written chunk-major.
        const auto perLevel = encodeChainLevels(p, kv, [&] {
            for (int c = 0; c < chunks; ++c) step();
        });
        for (int c = 0; c < chunks; ++c)
            for (int l = 1; l <= levels; ++l) writePayload(c, l, perLevel[size_t(l - 1)][size_t(c)]);
    }
    // Every level of as many chunks as there are threads per encodeChunks call (the transform
    // codec's chunks in parallel; the same bytes as one encodeChunk each), written in order.
    const int group = std::max(1, omp_get_max_threads());
    for (int c0 = p.chainsChunks() ? chunks : 0; c0 < chunks; c0 += group) {
        std::vector<ChunkRequest> batch;
        for (int c = c0; c < std::min(chunks, c0 + group); ++c)
            for (int l = 1; l <= levels; ++l) batch.push_back({c, l});
        const std::vector<std::vector<uint8_t>> payloads = encodeChunks(p, kv, batch, shared ? &tables : nullptr);
        for (size_t i = 0; i < batch.size(); ++i, step()) writePayload(batch[i].chunk, batch[i].level, payloads[i]);
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
        const TransformSettings& ms = p.transform->settings;  // the chain a reader runs: the one coded here
        if (ms.adaptPriorTokens != p.profile.transform.adaptPriorTokens ||
            (p.chainsChunks() && (ms.adaptSweeps != p.profile.transform.adaptSweeps ||
                                  ms.adaptResetChunks != p.profile.transform.adaptResetChunks)))
            throw inputError(path, "transform section", "the model's adapt_basis differs from the profile's (prepareTransform)");
        if (t.size() > UINT32_MAX) throw inputError(path, "transform section", "section over 4 GiB");
        transformRef = {offset, uint32_t(t.size()), crc32(t.data(), t.size())};
        put(t.data(), t.size(), offset);
        offset += t.size();
    }

    const ByteWriter h = headerBytes(p, chunks, levels, refs, transformRef, offset);
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
    if (m_params.chainsChunks()) return decodeChainInto(levels, out, progress);
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
