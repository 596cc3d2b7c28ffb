// The .kvc container: every chunk of a KV cache at every level of a codec, with a chunk index
// for random access and a CRC per chunk. Specification: core/codec/FORMAT.md.
#pragma once

#include "codec/chunk_codec.h"
#include "common/error.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

// Version 2 changed the entropy-coded streams of cachegen chunks (EntropyLayout); minor 1 (1.1 or
// 2.1) adds the transform codec's section. Readers accept majors 1 and 2.
constexpr uint16_t kKvcVersionMajor = 2;
// Minor 1: the transform codec's files; 2: cachegen with per-head tables; 3: transform files whose
// chunks chain (adapt_basis, container_chain.h); others x.0.
constexpr uint16_t kKvcVersionMinor = 3;
constexpr uint16_t kKvcOldestMajor = 1;
constexpr size_t kKvcHeaderSize = 160;

// Called with the fraction done in [0, 1]; returning false cancels (the operation throws
// kvscope::Cancelled and leaves no partial output behind).
using Progress = std::function<bool(double)>;

class Cancelled : public Error {
public:
    Cancelled() : Error("cancelled") {}
};

struct KvcWriteReport {
    uint64_t fileBytes = 0;
    std::vector<uint64_t> levelBytes;       // (levels) sum of chunk payloads of each level
    std::vector<uint64_t> levelTableBytes;  // (levels) shared tables stored once per level
    double seconds = 0;
};

// Encodes kv with params into `path` (written to a temporary, then renamed). The file is version
// 2 unless params.entropy is EntropyLayout::Rans4x8 (then 1: for compatibility tests).
// With TableMode::Shared, `calibrated` supplies one LevelTables per level; when it is null the
// tables are calibrated on kv itself (a first pass over every chunk) and stored in the file.
// Memory: the payloads of one chunk beyond kv. Throws kvscope::Error on I/O failure or bad values.
KvcWriteReport writeKvc(const KvSet& kv, const CodecParams& params, const std::string& path,
                        const std::vector<LevelTables>* calibrated = nullptr, const Progress& progress = {});
// The same bytes into `out` (replaced on success, untouched on failure): no file, no fsync;
// messages name the output "<memory>".
KvcWriteReport writeKvc(const KvSet& kv, const CodecParams& params, std::vector<uint8_t>& out,
                        const std::vector<LevelTables>* calibrated = nullptr, const Progress& progress = {});

// The writer both of them are: every byte of the file goes to put(data, size, offset), the chunk
// payloads first (in index order, from offset kKvcHeaderSize on), then the sections, and the header
// last, at offset 0. rep.fileBytes is the file's size; `name` names the output in messages.
using KvcPut = std::function<void(const void* data, size_t size, uint64_t offset)>;
KvcWriteReport writeKvc(const KvSet& kv, const CodecParams& params, const KvcPut& put, const std::string& name,
                        const std::vector<LevelTables>* calibrated = nullptr, const Progress& progress = {});

// Reads a .kvc from a file or from memory. The constructor validates the header, the sections
// and the whole index (every chunk inside the file) before anything else; chunk CRCs are checked
// when a chunk is read. Every failure throws kvscope::Error "name: place: reason".
class KvcReader {
public:
    static std::unique_ptr<KvcReader> openFile(const std::string& path);
    static std::unique_ptr<KvcReader> fromMemory(std::vector<uint8_t> bytes, const std::string& name);
    // Over a caller's bytes, not copied: they must outlive the reader and not change.
    static std::unique_ptr<KvcReader> fromBuffer(const uint8_t* data, size_t size, const std::string& name);
    ~KvcReader();

    const CodecParams& params() const { return m_params; }
    const std::string& name() const { return m_name; }
    uint64_t fileBytes() const { return m_fileSize; }
    const std::string& modelName() const { return m_modelName; }
    const std::string& modelFingerprint() const { return m_fingerprint; }
    const std::string& context() const { return m_context; }
    const std::vector<int32_t>& tokens() const { return m_tokens; }

    uint32_t chunkBytes(int chunk, int level) const;      // level is 1-based
    uint32_t chunkCrc(int chunk, int level) const;        // CRC-32 of that payload, from the index
    uint64_t levelBytes(int level) const;                 // all chunks of one level
    uint64_t levelTableBytes(int level) const;            // shared tables of one level (0 in-band)
    // The parsed shared tables, one per level (empty in-band): what a GPU decoder uploads.
    const std::vector<LevelTables>& sharedTables() const { return m_tables; }

    // The payload of (chunk, level) after its CRC was checked.
    std::vector<uint8_t> readChunk(int chunk, int level) const;
    // Decodes (chunk, level) into its tokens of out (shape and dtype of params()). Chained files
    // (container_chain.h) refuse a chunk that does not start a chain (chunk 0, a reset point).
    void decodeChunkInto(int chunk, int level, KvSet& out) const;
    // Checks that `data` is the payload of (chunk, level) (its size and CRC against the index), then
    // decodes it like decodeChunkInto. For payloads fetched elsewhere: a chunk server, Redis
    // (chained files: KvcChainDecoder).
    void decodePayloadInto(int chunk, int level, const uint8_t* data, size_t size, KvSet& out) const;

    // The file without its chunk payloads: the header, then every byte from the first section to
    // the end (sections and index). It is what a chunk server sends before any chunk, so that a
    // client can check and decode the payloads it fetches one at a time.
    std::vector<uint8_t> skeleton() const;
    // A reader over skeleton() bytes, validated like a whole file. readChunk, decodeChunkInto and
    // decodeAll throw (no payloads); decodePayloadInto works.
    static std::unique_ptr<KvcReader> fromSkeleton(std::vector<uint8_t> bytes, const std::string& name);

    // Decodes every chunk, chunk i at levels[i] (one entry = that level for every chunk).
    // Refuses (kvscope::Error) when the decoded cache would exceed maxOutputBytes(), and for a file
    // whose chunks chain (params().chainsChunks()) levels that change between chain starts.
    KvSet decodeAll(const std::vector<int>& levels, const Progress& progress = {}) const;
    // The same into `out`, which must have the file's shape and dtype (else kvscope::Error): no
    // allocation, for decoding again and again. Its metadata becomes the file's, as decodeAll's; when
    // it throws (a corrupt chunk), out holds the chunks decoded before.
    void decodeAllInto(const std::vector<int>& levels, KvSet& out, const Progress& progress = {}) const;

    // Largest decoded cache decodeAll will allocate (default 64 GiB); a header declaring more is
    // refused before allocation, so a hostile file cannot exhaust memory.
    void setMaxOutputBytes(uint64_t n) { m_maxOutput = n; }
    uint64_t maxOutputBytes() const { return m_maxOutput; }

private:
    KvcReader() = default;
    // parse() reads the header and every section in the format's order (container_parse.cpp);
    // Parse carries the header's bytes, counts and the sections' bytes from step to step.
    struct Parse;
    void parse();
    void parseHeader(Parse& s);
    void readSections(Parse& s);
    void parseTransformSection(Parse& s);
    void parseLevels(const Parse& s);
    void parseMetadata(const Parse& s);
    void parseTables(const Parse& s);
    void parseIndex(const Parse& s);
    void readAt(uint64_t offset, size_t size, uint8_t* dst, const std::string& what) const;
    void decodeChainInto(const std::vector<int>& levels, KvSet& out, const Progress& progress) const;  // container_chain.cpp
    std::string where(const std::string& place) const { return m_name + ": " + place; }

    struct IndexEntry {
        uint64_t offset;
        uint32_t size;
        uint32_t crc;
    };
    std::string m_name;
    int m_fd = -1;
    std::vector<uint8_t> m_memory;
    const uint8_t* m_data = nullptr;  // the bytes of a reader in memory: m_memory's, or fromBuffer's
    uint64_t m_fileSize = 0;
    uint64_t m_sectionsStart = 0;  // offset of the first section (payloads end there)
    uint64_t m_holeEnd = 0;        // skeletons: file offsets [header, m_holeEnd) are absent
    CodecParams m_params;
    std::string m_modelName, m_fingerprint, m_context;
    std::vector<int32_t> m_tokens;
    std::vector<IndexEntry> m_index;  // (chunks, levels)
    std::vector<LevelTables> m_tables;
    std::vector<uint64_t> m_tableBytes;
    uint64_t m_maxOutput = uint64_t(64) << 30;
};

}  // namespace kvscope
