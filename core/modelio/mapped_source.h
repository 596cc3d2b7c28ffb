// What a checkpoint reader parses (GGUF, safetensors): the path its errors name and the whole file
// mapped read-only. A reader's state derives from it; mapFile comes before parsing.
#pragma once

#include "common/file_io.h"

#include <cstdint>
#include <string>

namespace kvscope {

struct MappedSource {
    std::string path;
    MappedFile file;
    const uint8_t* map = nullptr;  // file.data()
    uint64_t size = 0;             // file.size()

    // Throws what MappedFile::open throws ("path: open: ...", "path: mmap: ...").
    void mapFile(const std::string& p)
    {
        path = p;
        file = MappedFile::open(p);
        map = file.data();
        size = file.size();
    }
};

}  // namespace kvscope
