// Small file helpers shared by the readers: a read-only memory map of a whole file, and reading a
// small text file (config, index, profile) with a size limit. Errors are kvscope::Error
// "path: place: reason".
#pragma once

#include <cstdint>
#include <string>

namespace kvscope {

// The whole of a regular, non-empty file mapped read-only; unmapped when destroyed. Move-only.
class MappedFile {
public:
    // Throws "path: open: ..." (missing, not a regular file), "path: header: truncated: the file is
    // empty" or "path: mmap: ...".
    static MappedFile open(const std::string& path);
    MappedFile() = default;
    MappedFile(MappedFile&& o) noexcept;
    MappedFile& operator=(MappedFile&& o) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();

    const uint8_t* data() const { return m_data; }
    uint64_t size() const { return m_size; }

private:
    void release();
    int m_fd = -1;
    const uint8_t* m_data = nullptr;
    uint64_t m_size = 0;
};

// The file's bytes; throws "path: open: ..." or "path: read: file larger than `limit` bytes".
std::string readSmallFile(const std::string& path, uint64_t limit);

// Writes `text` to a temporary next to `path` (uniqueTempPath) and renames it over `path`, so a
// failed write never leaves a half file where the user's was, and two processes writing the same
// file never share a temporary (the last rename wins, whole). Throws "path: reason".
void writeFileAtomic(const std::string& path, const std::string& text);
// path + ".tmp-<pid>": a temporary name no other process uses at the same time (two processes
// saving the same file, e.g. two evaluations filling the same cache, each write their own).
std::string uniqueTempPath(const std::string& path);

// $XDG_CACHE_HOME/kvscope/<sub> ($HOME/.cache when XDG_CACHE_HOME is unset, ./.cache without HOME).
std::string userCacheDir(const std::string& sub);
// Creates `dir` and its parents; throws "path: not a directory (what)" or "path: cannot create the
// what directory: reason".
void makeDirs(const std::string& dir, const std::string& what);
// True when `path` names a regular file.
bool isRegularFile(const std::string& path);

// Deepest bracket nesting of JSON text `s` (brackets inside strings ignored); stops counting past
// `limit`. Readers check it before parsing, so a hostile "[[[[..." cannot exhaust the stack of a
// recursive JSON parser.
int jsonNestingDepth(const char* s, size_t n, int limit);

}  // namespace kvscope
