// Shared helpers of the libFuzzer targets whose reader only takes a path.
//
// MemFile is one anonymous in-memory file (memfd) per process, rewritten for every input and
// named by its /proc/self/fd path, so a path-taking reader (mmap, fopen, HDF5) sees exactly the
// input bytes and nothing is left on disk, whatever happens to the process.
// TempDir is a folder for readers that take a folder, in $TMPDIR, else /dev/shm, else /tmp; it is
// removed at exit (a crash may leave it behind, named kvscope-fuzz-*).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

namespace kvscope::fuzz {

class MemFile {
public:
    explicit MemFile(const char* name)
    {
        m_fd = ::memfd_create(name, 0);
        if (m_fd < 0) {
            std::perror("memfd_create");
            std::abort();
        }
        m_path = "/proc/self/fd/" + std::to_string(m_fd);
    }
    // Replaces the file's contents with data[0, size).
    const std::string& write(const uint8_t* data, size_t size)
    {
        if (::ftruncate(m_fd, 0) != 0) std::abort();
        size_t done = 0;
        while (done < size) {
            const ssize_t n = ::pwrite(m_fd, data + done, size - done, off_t(done));
            if (n <= 0) std::abort();
            done += size_t(n);
        }
        return m_path;
    }
    const std::string& path() const { return m_path; }

private:
    int m_fd = -1;
    std::string m_path;
};

class TempDir {
public:
    TempDir()
    {
        // tmpfs when there is one: a file write per input on a disk file system costs more than
        // the reader under test.
        const char* base = std::getenv("TMPDIR");
        const bool shm = ::access("/dev/shm", W_OK) == 0;
        std::string pattern =
            std::string(base && *base ? base : shm ? "/dev/shm" : "/tmp") + "/kvscope-fuzz-XXXXXX";
        if (!::mkdtemp(pattern.data())) {
            std::perror("mkdtemp");
            std::abort();
        }
        m_path = pattern;
    }
    ~TempDir()
    {
        if (DIR* d = ::opendir(m_path.c_str())) {
            while (dirent* e = ::readdir(d)) {
                const std::string n = e->d_name;
                if (n != "." && n != "..") ::unlink((m_path + "/" + n).c_str());
            }
            ::closedir(d);
        }
        ::rmdir(m_path.c_str());
    }
    // Writes `name` inside the folder; returns its path.
    std::string write(const std::string& name, const uint8_t* data, size_t size) const
    {
        const std::string p = m_path + "/" + name;
        FILE* f = std::fopen(p.c_str(), "wb");
        if (!f) std::abort();
        if (size && std::fwrite(data, 1, size, f) != size) std::abort();
        std::fclose(f);
        return p;
    }
    const std::string& path() const { return m_path; }

private:
    std::string m_path;
};

}  // namespace kvscope::fuzz
