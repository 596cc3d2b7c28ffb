#include "stream/streamer.h"

#include "model/generate.h"
#include "stream/stream_run.h"
#include "transport/planner.h"
#include "transport/protocol.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace kvscope {

namespace {
const std::string kNoJson;
}

std::vector<double> measuredLevelKl(const CodecProfile& profile, CodecId codec)
{
    std::vector<std::string> measured;
    if (codec == CodecId::Transform)
        for (const TransformLevel& l : profile.transformLevels) measured.push_back(l.measuredJson);
    else
        for (const CodecLevel& l : profile.levels) measured.push_back(l.measuredJson);
    std::vector<double> kl;
    bool any = false;
    for (const std::string& m : measured) {
        const nlohmann::json j = m.empty() ? nlohmann::json() : nlohmann::json::parse(m, nullptr, false);
        const bool has = j.is_object() && j.contains("mean_kl") && j["mean_kl"].is_number();
        kl.push_back(has ? j["mean_kl"].get<double>() : std::numeric_limits<double>::quiet_NaN());
        any = any || has;
    }
    if (!any) kl.clear();
    return kl;
}

Streamer::Streamer(const Model& model, std::string host, int port, std::vector<int32_t> contextTokens,
                   std::vector<int32_t> question, const KvSet& original)
    : m_model(model), m_host(std::move(host)), m_port(port), m_tokens(std::move(contextTokens)),
      m_question(std::move(question)), m_original(original)
{
    m_context = contextKey(model.runtime().fingerprint(), m_tokens);
}

Streamer::~Streamer() = default;

void Streamer::prepare(const StreamOptions& options, const std::string& logPrefix)
{
    ChunkClient client(m_host, m_port);
    auto fetch = [&](CodecId codec) -> std::unique_ptr<KvcReader> {
        Request r;
        r.type = FrameType::SkeletonRequest;
        r.codec = codec;
        r.context = m_context;
        const Reply rep = client.request(r, uint64_t(256) << 20, monoSeconds() + 60);
        if (rep.type == FrameType::Error) {
            if (codec == m_codec)
                throw Error("chunk server: " + std::string(rep.payload.begin(), rep.payload.end()));
            return nullptr;
        }
        return KvcReader::fromSkeleton(rep.payload, std::string("context ") + m_context + " (" + codecName(codec) + ")");
    };
    try {
        m_cachegen = fetch(m_codec);
        m_int8 = fetch(CodecId::Int8);
    } catch (const NetError& e) {
        throw Error(m_host + ":" + std::to_string(m_port) + ": " + e.what());
    }
    const KvShape& s = m_cachegen->params().shape;
    if (!(s == m_model.runtime().kvShape(int(m_tokens.size()))))
        throw Error("context " + m_context + ": the stored cache's shape does not fit the model and context");
    if (m_int8 && !(m_int8->params().shape == s)) m_int8.reset();

    // The planner's distortion per level: the profile's measured KL, else the size fallback.
    {
        const CodecParams& p = m_cachegen->params();
        std::vector<double> kl, bpv;
        const double valuesPerToken = double(p.shape.numLayers) * 2 * p.shape.channels();
        for (int l = 1; l <= p.numLevels(); ++l) {
            // A transform file's levels are its transformLevels; a cachegen file's, its levels.
            const size_t li = size_t(l - 1);
            const std::string& mj = p.codec == CodecId::Transform
                                        ? (li < p.profile.transformLevels.size() ? p.profile.transformLevels[li].measuredJson : kNoJson)
                                        : (li < p.profile.levels.size() ? p.profile.levels[li].measuredJson : kNoJson);
            const nlohmann::json j = mj.empty() ? nlohmann::json() : nlohmann::json::parse(mj, nullptr, false);
            if (j.is_object() && j.contains("mean_kl") && j["mean_kl"].is_number()) kl.push_back(j["mean_kl"].get<double>());
            else if (j.is_object() && j.contains("kl") && j["kl"].is_number()) kl.push_back(j["kl"].get<double>());
            else kl.push_back(std::numeric_limits<double>::quiet_NaN());  // not measured: interpolated (planner.h)
            double bytes = 0;
            for (int c = 0; c < p.numChunks(); ++c) bytes += m_cachegen->chunkBytes(c, l);
            bpv.push_back(8.0 * bytes / (valuesPerToken * double(p.shape.numTokens)));
        }
        if (int(m_levelKl.size()) == p.numLevels()) kl = m_levelKl;  // figures for another level set do not apply
        m_distortion = kvscope::levelDistortion(kl, bpv, &m_distortionSource);
    }
    // The decode rate here: chunk 0 at the default level, decoded twice (the first pays one-time costs).
    {
        const CodecParams& p = m_cachegen->params();
        const int level = std::clamp(p.defaultLevel(), 1, p.numLevels());
        Request r;
        r.type = FrameType::ChunkRequest;
        r.codec = m_codec;
        r.context = m_context;
        r.chunk = 0;
        r.level = uint32_t(level);
        try {
            const Reply rep = client.request(r, m_cachegen->chunkBytes(0, level), monoSeconds() + 60);
            if (rep.type == FrameType::Chunk) {
                KvSet scratch(p.shape, DType::F16);
                double best = 1e30;
                for (int k = 0; k < 2; ++k) {
                    const double t0 = monoSeconds();
                    m_cachegen->decodePayloadInto(0, level, rep.payload.data(), rep.payload.size(), scratch);
                    best = std::min(best, monoSeconds() - t0);
                }
                m_decodeSecondsPerToken = best / double(p.chunkLength(0));
            }
        } catch (const std::exception&) {
            m_decodeSecondsPerToken = 0;  // learnt during the first run instead
        }
    }

    // The reference answer, and the prefill rate of the question after the whole context.
    InferenceSession session(m_model.runtime());
    const double l0 = monoSeconds();
    session.loadKv(m_original);
    m_kvLoadSeconds = monoSeconds() - l0;
    std::vector<float> logits;
    session.append(m_question, &logits);  // warm-up: the first forward pays one-time costs
    session.truncate(int(m_tokens.size()));
    const double t0 = monoSeconds();
    session.append(m_question, &logits);
    m_prefillSeconds = monoSeconds() - t0;
    m_tail = TailEstimator{};
    m_tail.add(m_prefillSeconds);
    m_prefillRate = double(m_question.size()) / std::max(1e-6, m_prefillSeconds);
    {
        const double f0 = monoSeconds();
        (void)argmax(logits.data(), logits.size());
        m_firstTokenSeconds = monoSeconds() - f0;
    }
    session.truncate(int(m_tokens.size()));
    const Generation g = generate(session, m_question, options.qualityTokens, SamplingOptions{}, m_model.stopIds());
    m_refTokens = g.tokens;
    m_refText = m_model.tokenizer().decode(g.tokens, true);
    std::fprintf(stderr,
                 "%s: context %s, %d chunks of %d tokens, %s; question prefill %.3f s (%.0f tokens/s), "
                 "decode %.2f ms/chunk, cache load %.3f s; level distortion from %s\n",
                 logPrefix.c_str(), m_context.c_str(), m_cachegen->params().numChunks(),
                 m_cachegen->params().profile.chunkTokens,
                 (std::string(codecName(m_codec)) + (m_int8 ? " + int8" : " only")).c_str(),
                 m_prefillSeconds, m_prefillRate, 1e3 * m_decodeSecondsPerToken * m_cachegen->params().profile.chunkTokens,
                 m_kvLoadSeconds, m_distortionSource.c_str());
}

StreamResult Streamer::run(const StreamOptions& opt, LinkPacer* pacer, double linkOffset)
{
    StreamRun r(*this, opt, pacer, linkOffset);
    return r.run();
}

}  // namespace kvscope
