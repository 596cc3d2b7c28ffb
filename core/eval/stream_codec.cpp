#include "eval/stream_codec.h"

#include "eval/transform_default.h"
#include "model/model.h"

namespace kvscope {

std::string ownTransformLadder(const std::string& fingerprint, std::string* why)
{
    std::string path, reason;
    try {
        const DefaultTransform d = findDefaultTransform(fingerprint);
        if (!fingerprint.empty() && d.ladder.modelFingerprint == fingerprint) path = d.ladderPath;
        else reason = "no transform ladder tuned for this model (fingerprint " + (fingerprint.empty() ? std::string("unknown") : fingerprint) +
                      "; only the generic one, whose levels were never measured on it)";
    } catch (const std::exception& e) {
        reason = std::string("no shipped transform ladder: ") + e.what();
    }
    if (why) *why = reason;
    return path;
}

StreamCodecChoice defaultStreamCodec(const Model& model, const std::function<void(const std::string&)>& log)
{
    StreamCodecChoice c;
    const std::string fp = model.runtime().fingerprint();
    std::string why;
    const std::string ladder = ownTransformLadder(fp, &why);
    if (ladder.empty()) {
        c.reason = "cachegen levels: " + why;
        return c;
    }
    const bool cached = !cachedDefaultTransform(fp).empty();
    c.codec = CodecId::Transform;
    c.profilePath = ensureDefaultTransform(model, log);
    c.reason = "transform ladder of " + model.spec().name + " (" + ladder + "), " +
               (cached ? "calibrated earlier: " : "calibrated now: ") + c.profilePath;
    return c;
}

}  // namespace kvscope
