// The boundary between kvscope and Debian's libsentencepiece.
//
// Why a separate module: libsentencepiece.so carries its own copy of protobuf-lite and exports
// those symbols, while libtorch loads the system libprotobuf.so. Linked into one process, the two
// interpose each other's symbols and the process crashes during static initialisation. So
// libsentencepiece is only ever loaded inside kvscope_spm (a small plugin, spm_module.cpp),
// opened with dlopen(RTLD_LOCAL | RTLD_DEEPBIND): its protobuf symbols stay private to it.
// Calls cross the boundary through this abstract class (virtual calls need no symbol lookup);
// no sentencepiece type appears here.
#pragma once

#include <string>
#include <vector>

namespace kvscope {

class SpmBackend {
public:
    virtual ~SpmBackend() = default;
    // Each returns "" on success, else the library's error text.
    virtual std::string load(const std::string& path) = 0;
    virtual std::string encode(const std::string& text, std::vector<int>& ids) const = 0;
    virtual std::string decode(const std::vector<int>& ids, std::string& text) const = 0;
    virtual int pieceSize() const = 0;
    virtual int bosId() const = 0;
    virtual int eosId() const = 0;
    virtual bool isControl(int id) const = 0;
    virtual std::string idToPiece(int id) const = 0;
    virtual int pieceToId(const std::string& piece) const = 0;
};

// The plugin's one exported function; returns a new backend owned by the caller.
using SpmCreateFn = SpmBackend* (*)();
constexpr const char* kSpmCreateSymbol = "kvscope_spm_create";

}  // namespace kvscope
