#include "common/file_io.h"

#include <algorithm>

#include "common/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

namespace kvscope {

MappedFile MappedFile::open(const std::string& path)
{
    MappedFile f;
    f.m_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.m_fd < 0) throw inputError(path, "open", std::strerror(errno));
    struct stat st;
    if (fstat(f.m_fd, &st) != 0) throw inputError(path, "stat", std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw inputError(path, "open", "not a regular file");
    f.m_size = uint64_t(st.st_size);
    if (f.m_size == 0) throw inputError(path, "header", "truncated: the file is empty");
    void* m = mmap(nullptr, size_t(f.m_size), PROT_READ, MAP_PRIVATE, f.m_fd, 0);
    if (m == MAP_FAILED) throw inputError(path, "mmap", std::strerror(errno));
    f.m_data = static_cast<const uint8_t*>(m);
    return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : m_fd(std::exchange(o.m_fd, -1)), m_data(std::exchange(o.m_data, nullptr)), m_size(std::exchange(o.m_size, 0))
{
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept
{
    if (this != &o) {
        release();
        m_fd = std::exchange(o.m_fd, -1);
        m_data = std::exchange(o.m_data, nullptr);
        m_size = std::exchange(o.m_size, 0);
    }
    return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release()
{
    if (m_data) munmap(const_cast<uint8_t*>(m_data), size_t(m_size));
    if (m_fd >= 0) ::close(m_fd);
    m_data = nullptr;
    m_fd = -1;
}

std::string readSmallFile(const std::string& path, uint64_t limit)
{
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw inputError(path, "open", std::strerror(errno));
    std::string out;
    char buf[65536];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) {
        out.append(buf, got);
        if (out.size() > limit) {
            std::fclose(f);
            throw inputError(path, "read", "file larger than " + std::to_string(limit) + " bytes");
        }
    }
    const bool err = std::ferror(f) != 0;
    std::fclose(f);
    if (err) throw inputError(path, "read", "read error");
    return out;
}

int jsonNestingDepth(const char* s, size_t n, int limit)
{
    int depth = 0, maxDepth = 0;
    bool inString = false;
    for (size_t i = 0; i < n; ++i) {
        const char c = s[i];
        if (inString) {
            if (c == '\\') ++i;
            else if (c == '"') inString = false;
        } else if (c == '"') {
            inString = true;
        } else if (c == '{' || c == '[') {
            maxDepth = std::max(maxDepth, ++depth);
            if (maxDepth > limit) return maxDepth;
        } else if (c == '}' || c == ']') {
            --depth;
        }
    }
    return maxDepth;
}

std::string userCacheDir(const std::string& sub)
{
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    std::string base = xdg && *xdg ? xdg : "";
    if (base.empty()) {
        const char* home = std::getenv("HOME");
        base = std::string(home && *home ? home : ".") + "/.cache";
    }
    return base + "/kvscope/" + sub;
}

void makeDirs(const std::string& dir, const std::string& what)
{
    for (size_t i = 0; i <= dir.size(); ++i) {
        if (i == dir.size() || (dir[i] == '/' && i > 0)) {
            const std::string path = dir.substr(0, i);
            struct stat st;
            if (::stat(path.c_str(), &st) == 0) {
                if (!S_ISDIR(st.st_mode)) throw inputError(path, "", "not a directory (" + what + ")");
            } else if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
                throw inputError(path, "", "cannot create the " + what + " directory: " + std::strerror(errno));
            }
        }
    }
}

bool isRegularFile(const std::string& path)
{
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string uniqueTempPath(const std::string& path) { return path + ".tmp-" + std::to_string(long(::getpid())); }

void writeFileAtomic(const std::string& path, const std::string& text)
{
    const std::string tmp = uniqueTempPath(path);
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw inputError(path, "", "cannot create the file");
        out << text;
        out.flush();
        if (!out) {
            std::remove(tmp.c_str());
            throw inputError(path, "", "write failed");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw inputError(path, "", "cannot replace the file");
    }
}

}  // namespace kvscope
