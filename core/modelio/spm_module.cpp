// kvscope_spm: the plugin that owns libsentencepiece (see spm_backend.h for why it is separate).
#include "modelio/spm_backend.h"

#include <sentencepiece_processor.h>

namespace {

class Backend final : public kvscope::SpmBackend {
public:
    std::string load(const std::string& path) override
    {
        const auto status = sp_.Load(path);
        return status.ok() ? std::string() : status.ToString();
    }
    std::string encode(const std::string& text, std::vector<int>& ids) const override
    {
        const auto status = sp_.Encode(text, &ids);
        return status.ok() ? std::string() : status.ToString();
    }
    std::string decode(const std::vector<int>& ids, std::string& text) const override
    {
        const auto status = sp_.Decode(ids, &text);
        return status.ok() ? std::string() : status.ToString();
    }
    int pieceSize() const override { return sp_.GetPieceSize(); }
    int bosId() const override { return sp_.bos_id(); }
    int eosId() const override { return sp_.eos_id(); }
    bool isControl(int id) const override { return sp_.IsControl(id); }
    std::string idToPiece(int id) const override { return sp_.IdToPiece(id); }
    int pieceToId(const std::string& piece) const override { return sp_.PieceToId(piece); }

private:
    sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) kvscope::SpmBackend* kvscope_spm_create()
{
    return new Backend();
}
