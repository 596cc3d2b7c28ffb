#include "modelio/spm_tokenizer.h"

#include "common/error.h"
#include "modelio/spm_backend.h"
#include "modelio/utf8.h"

#include <dlfcn.h>

#include <mutex>

namespace kvscope {

namespace {

// The kvscope_spm plugin, opened once: next to the build tree's library when running from the
// build, else from the install location (both paths come from CMake).
SpmCreateFn spmCreate()
{
    static std::once_flag once;
    static SpmCreateFn create = nullptr;
    static std::string failure;
    std::call_once(once, [] {
        // AddressSanitizer refuses RTLD_DEEPBIND, and without it libsentencepiece's protobuf
        // symbols would bind to torch's libprotobuf (see spm_backend.h): refuse instead.
        if (dlsym(RTLD_DEFAULT, "__asan_init")) {
            failure = "unavailable in AddressSanitizer builds (the plugin needs RTLD_DEEPBIND)";
            return;
        }
        for (const char* path : {KVSCOPE_SPM_MODULE_BUILD, KVSCOPE_SPM_MODULE_INSTALL}) {
            void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
            if (!h) {
                failure += std::string(failure.empty() ? "" : "; ") + dlerror();
                continue;
            }
            create = reinterpret_cast<SpmCreateFn>(dlsym(h, kSpmCreateSymbol));
            if (create) return;
            failure += std::string(failure.empty() ? "" : "; ") + path + ": no " + kSpmCreateSymbol;
        }
    });
    if (!create) throw Error("SentencePiece plugin kvscope_spm not found: " + failure);
    return create;
}

}  // namespace

struct SpmTokenizer::Impl {
    std::string path;
    std::unique_ptr<SpmBackend> sp;
};

SpmTokenizer SpmTokenizer::load(const std::string& path)
{
    auto impl = std::make_shared<Impl>();
    impl->path = path;
    try {
        impl->sp.reset(spmCreate()());
    } catch (const Error& e) {
        throw inputError(path, "", e.what());
    }
    const std::string err = impl->sp->load(path);
    if (!err.empty()) throw inputError(path, "", "not a SentencePiece model: " + err);
    return SpmTokenizer(std::move(impl));
}

std::vector<int32_t> SpmTokenizer::encode(const std::string& utf8, bool addSpecial) const
{
    const size_t bad = utf8FirstInvalid(utf8);
    if (bad != std::string::npos)
        throw Error("tokenizer input is not valid UTF-8 at byte " + std::to_string(bad));
    std::vector<int> ids;
    const std::string err = impl_->sp->encode(utf8, ids);
    if (!err.empty()) throw Error(impl_->path + ": encode: " + err);
    std::vector<int32_t> out;
    if (addSpecial && bosId() >= 0) out.push_back(bosId());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
}

std::string SpmTokenizer::decode(const std::vector<int32_t>& ids, bool skipSpecial) const
{
    const SpmBackend& sp = *impl_->sp;
    std::string out;
    std::vector<int> run;  // ordinary ids between control tokens, decoded together
    const auto flush = [&] {
        if (run.empty()) return;
        std::string text;
        const std::string err = sp.decode(run, text);
        if (!err.empty()) throw Error(impl_->path + ": decode: " + err);
        out += text;
        run.clear();
    };
    for (int32_t id : ids) {
        if (id < 0 || id >= sp.pieceSize())
            throw Error(impl_->path + ": token id " + std::to_string(id) + " out of range");
        if (sp.isControl(id)) {
            flush();
            if (!skipSpecial) out += sp.idToPiece(id);
        } else {
            run.push_back(id);
        }
    }
    flush();
    return utf8Lossy(out);
}

int SpmTokenizer::vocabSize() const { return impl_->sp->pieceSize(); }

int32_t SpmTokenizer::bosId() const { return impl_->sp->bosId(); }

int32_t SpmTokenizer::eosId() const { return impl_->sp->eosId(); }

int32_t SpmTokenizer::specialId(const std::string& text) const
{
    const int id = impl_->sp->pieceToId(text);
    // PieceToId answers unk for an unknown piece; accept it only when the text really is unk's.
    if (id < 0 || impl_->sp->idToPiece(id) != text) return -1;
    return id;
}

}  // namespace kvscope
