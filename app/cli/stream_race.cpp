// The race of `kvscope-cli stream` (stream_race.h): a chunk server runs in-process on 127.0.0.1
// (the link shaping lives on its sending side, or in a tc-shaped veth pair with --link kernel)
// and a Streamer against it: every chunk crosses a real TCP socket at the schedule's pace.
// Stores: --store names .kvc files (comma-separated; a cachegen file and, for --policy int8, an
// int8 file of the same context), a folder of them, or redis://HOST:PORT/PREFIX filled by `push`.
// Without --store, the context's KV is encoded with the level-coded codec and int8 into --workdir.
#include "stream_race.h"

#include "cli_codec.h"
#include "cli_stream.h"

#include "codec/container.h"
#include "codec/profile.h"
#include "common/file_io.h"
#include "eval/quality.h"
#include "eval/samples.h"
#include "eval/stream_codec.h"
#include "eval/transform_default.h"
#include "kvio/kv_h5.h"
#include "model/model.h"
#include "transport/kernel_link.h"
#include "transport/protocol.h"
#include "transport/server.h"
#include "transport/store.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sys/stat.h>
#include <unistd.h>

namespace kvscope::cli {

namespace {

// The question asked after a context: --question, else the "question" of the sidecar X.json
// next to X.txt, else a generic one.
std::string questionFor(const std::string& contextPath, const std::string& given)
{
    if (!given.empty()) return given;
    const size_t dot = contextPath.rfind('.');
    const std::string sidecar = (dot == std::string::npos ? contextPath : contextPath.substr(0, dot)) + ".json";
    if (::access(sidecar.c_str(), R_OK) == 0) {
        const json j = json::parse(readSmallFile(sidecar, 1u << 20), nullptr, false);
        if (j.is_object() && j.contains("question") && j["question"].is_string()) return j["question"].get<std::string>();
    }
    return "Summarize the text above in one sentence.";
}

// Encodes kv with the level-coded codec (cachegen or transform; the profile or the default) and
// with int8 into dir; returns "a.kvc,b.kvc".
std::string encodeStore(const KvSet& kv, const std::string& profilePath, const std::string& dir, CodecId codec)
{
    CodecParams p;
    std::vector<LevelTables> calibrated;
    bool fromProfile = false;
    if (codec == CodecId::Transform) {
        // The encode command's path: the profile's calibrated transform model, or one fitted on kv.
        ProfileOptions po;
        po.profilePath = profilePath;
        po.codec = "transform";
        p = po.params(kv);
    } else {
        p.codec = CodecId::CacheGen;
        p.shape = kv.shape();
        p.dtype = kv.dtype();
        p.profile = profilePath.empty() ? defaultProfile(kv.shape().numLayers) : loadProfile(profilePath);
        fromProfile = p.profile.tables == TableMode::Shared && p.profile.hasCalibratedTables();
        if (fromProfile) calibrated = profileTables(p, profilePath);
    }
    const std::string cg = dir + "/context." + codecName(codec) + ".kvc", i8 = dir + "/context.int8.kvc";
    double t0 = nowSeconds();
    writeKvc(kv, p, cg, fromProfile ? &calibrated : nullptr);
    std::fprintf(stderr, "stream: encoded %s (%.1f s)\n", cg.c_str(), nowSeconds() - t0);
    CodecParams q;
    q.codec = CodecId::Int8;
    q.shape = kv.shape();
    q.dtype = kv.dtype();
    q.profile = defaultProfile(kv.shape().numLayers);
    q.profile.chunkTokens = p.profile.chunkTokens;
    q.profile.tables = TableMode::InBand;
    t0 = nowSeconds();
    writeKvc(kv, q, i8);
    std::fprintf(stderr, "stream: encoded %s (%.1f s)\n", i8.c_str(), nowSeconds() - t0);
    return cg + "," + i8;
}

std::vector<std::string> splitList(const std::string& s)
{
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos <= s.size()) {
        const size_t c = s.find(',', pos);
        out.push_back(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
        if (c == std::string::npos) break;
        pos = c + 1;
    }
    return out;
}

// The streamer's options from the command line's (target hardware, timeouts, planner).
StreamOptions streamOptions(const StreamOpts& o)
{
    StreamOptions so;
    so.sloSeconds = o.slo;
    if (o.targetPrefill < 0 || o.targetDecode < 0) throw Error("--target-prefill/--target-decode must be positive");
    if (!o.target.empty()) so.target = targetPreset(o.target);
    if (o.targetPrefill > 0 || o.targetDecode > 0) {
        if (o.target.empty()) so.target.name = "custom";
        else so.target.name += " (rates overridden)";
        if (o.targetPrefill > 0) so.target.prefillTokensPerSecond = o.targetPrefill;
        if (o.targetDecode > 0) so.target.decodeGBps = o.targetDecode;
    }
    so.stallTimeout = o.stallTimeout;
    so.qualityTokens = std::max(1, o.qualityTokens);
    so.window = o.window;
    so.horizon = o.horizon;
    so.plannerMargin = o.plannerMargin;
    so.lastChunkWeight = o.lastChunkWeight;
    so.estimateErrorMargin = o.estimateErrorMargin;
    so.overrunMargin = o.overrunMargin;
    so.keepCache = o.quality == "kl";
    return so;
}


// One `stream` command: what the steps of run() set up for the next are members. The steps, in
// order: openContext (the model, the context and question), setUpLink (the schedule, the server's
// options, the kernel link), loadOriginal (the reference cache), chooseCodec (which level-coded
// encoding, encoded now when there is no --store), startServer (the server and the streamer),
// prepareQuality (the eval module's reference), runPolicies, runOracle, then report.
class StreamRace {
public:
    explicit StreamRace(const StreamOpts& o);
    json run();

private:
    void openContext();
    void setUpLink();
    void loadOriginal();
    void chooseCodec();
    void startServer();
    void prepareQuality();
    const Quality* measureQuality(const StreamResult& res);
    void runOnce(const Policy& p, int r, PolicyRuns& into, bool replay);
    void runPolicies();
    void runOracle();
    void cleanUp();
    json report(const json& results) const;

    const StreamOpts& m_o;
    StreamOptions m_so;
    CodecId m_codec = CodecId::CacheGen;
    std::vector<Policy> m_policies;
    // The context.
    SampleContext m_sample;
    std::unique_ptr<Model> m_model;
    std::vector<int32_t> m_tokens, m_qTokens;
    std::string m_question;
    KvSet m_original;
    // The link.
    LinkSchedule m_given, m_schedule;
    double m_servedKvBytesPerToken = 0, m_kvScale = 1.0;
    ServerOptions m_srv;
    std::unique_ptr<KernelLink> m_kernel;
    std::string m_linkMode = "pacer", m_host = "127.0.0.1";
    std::unique_ptr<LinkPacer> m_shadow;  // kernel mode: the schedule's clock and capacity, not a shaper
    // The store, the server and the streamer.
    std::string m_profilePath, m_codecReason, m_store, m_tmpdir;
    std::shared_ptr<ChunkStore> m_opened;
    std::unique_ptr<ChunkServer> m_server;
    std::unique_ptr<Streamer> m_streamer;
    // Quality of each run's cache through the eval module, once per distinct cache recipe
    // (levels and recomputed chunks fix the cache's bytes).
    std::unique_ptr<QualityReference> m_qref;
    std::map<std::string, Quality> m_qualityMemo;
    std::string m_continuationSource;
    // The runs: every policy's, then the oracle's per run.
    std::vector<PolicyRuns> m_done;
    std::vector<Oracle> m_oracle;
    std::string m_oracleSource;
};

StreamRace::StreamRace(const StreamOpts& o) : m_o(o)
{
    m_so = streamOptions(o);
    if (!o.codec.empty()) parseCodecName(o.codec, &m_codec);
    for (const std::string& p : splitList(o.policies == "all" ? "adaptive,text,int8,level:1,level:2,level:3" : o.policies))
        m_policies.push_back(parsePolicy(p));
}

json StreamRace::run()
{
    openContext();
    setUpLink();
    loadOriginal();
    chooseCodec();
    startServer();
    prepareQuality();
    runPolicies();
    runOracle();
    json results = json::array();
    for (PolicyRuns& pr : m_done) results.push_back(policySummary(pr, m_oracle));
    cleanUp();
    return report(results);
}

// A sample id (long_4k, story, ...) or a UTF-8 text file, and the question asked after it.
void StreamRace::openContext()
{
    m_sample = loadSampleContext(m_o.context);
    m_model = m_o.model.open();
    m_tokens = m_model->contextTokens(m_sample.text);
    m_question = questionFor(m_sample.path, m_o.question);
    m_qTokens = m_model->questionTokens(m_question);
}

void StreamRace::setUpLink()
{
    // A target whose model has a larger KV than the served one: the link runs slower by the
    // ratio, so every chunk takes as long as the target model's chunk would on the given link.
    m_given = m_o.link.schedule();
    m_servedKvBytesPerToken = fp16KvBytesPerToken(m_model->runtime().kvShape(1));
    if (m_o.targetKvBytes < 0) throw Error("--target-kv must be positive (bytes of fp16 KV per token)");
    if (m_o.targetKvBytes > 0) m_so.target.kvBytesPerToken = m_o.targetKvBytes;
    m_kvScale = kvLinkScale(m_so.target, m_servedKvBytesPerToken);
    m_schedule = m_kvScale != 1.0 ? m_given.scaled(m_kvScale) : m_given;
    if (m_kvScale != 1.0)
        std::fprintf(stderr, "stream: target KV %.0f B/token vs served %.0f: link %s carries the served bytes as %s\n",
                     m_so.target.kvBytesPerToken, m_servedKvBytesPerToken, m_given.describe().c_str(),
                     m_schedule.describe().c_str());
    m_srv.link = m_schedule;
    m_srv.rttSeconds = m_o.link.rttMs / 1000.0;
    if (!m_o.faults.empty()) m_srv.faults = parseFaults(m_o.faults);
    // --link kernel: the bytes cross a tc-shaped veth pair; the server's own pacer stays out of the way.
    if (m_o.link.lossPct != 0 && m_o.link.mode != "kernel") throw Error("--loss needs --link kernel");
    if (m_o.link.mode == "kernel") {
        std::string why;
        if (!KernelLink::available(&why)) {
            std::fprintf(stderr, "stream: --link kernel: %s; falling back to the in-process pacer\n", why.c_str());
        } else {
            KernelLink::cleanupOnSignal();
            KernelLinkOptions ko;
            ko.schedule = m_schedule;
            ko.rttSeconds = m_o.link.rttMs / 1000.0;
            ko.lossPercent = m_o.link.lossPct;
            ko.congestion = m_o.link.congestion == "system" ? "" : m_o.link.congestion;
            m_kernel = std::make_unique<KernelLink>(ko);
            m_linkMode = "kernel";
            m_host = m_kernel->serverAddress();
            m_srv.host = m_host;
            m_srv.link = LinkSchedule::constant(125e9);
            m_srv.rttSeconds = m_kernel->kernelDelay() ? 0.0 : m_o.link.rttMs / 1000.0;
            KernelLink* k = m_kernel.get();
            m_srv.listen = [k](const std::string& h, int port) { return k->listen(h, port); };
            std::fprintf(stderr, "stream: %s\n", m_kernel->describe().c_str());
        }
    }
    m_shadow = std::make_unique<LinkPacer>(m_schedule);
}

// The reference cache: the given KV file (captured from this context with this model), else a
// prefill now.
void StreamRace::loadOriginal()
{
    if (!m_o.kv.empty()) {
        m_original = readKvH5(m_o.kv);
        if (m_original.tokens != m_tokens)
            throw inputError(m_o.kv, "tokens", "this KV was not captured from " + m_o.context + " with this model");
    } else {
        std::fprintf(stderr, "stream: prefill of %zu context tokens for the reference cache\n", m_tokens.size());
        InferenceSession s(m_model->runtime());
        s.append(m_tokens, nullptr);
        m_original = s.exportKv();
        m_original.context = m_sample.text;
    }
}

// Which level-coded encoding is streamed, and why (the JSON says both); without --store, the
// context is encoded now.
void StreamRace::chooseCodec()
{
    m_profilePath = m_o.profile;
    const auto log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
    m_store = m_o.store;
    if (!m_o.codec.empty()) {
        m_codecReason = "--codec " + m_o.codec;
        if (m_codec == CodecId::Transform && m_profilePath.empty()) {
            m_profilePath = ensureDefaultTransform(*m_model, log);
            m_codecReason += " with the model's calibrated default ladder";
        }
    } else if (!m_store.empty()) {
        // What the store holds for this context: its transform encoding when it has one.
        m_opened = std::shared_ptr<ChunkStore>(openStore(m_store));
        const std::string key = contextKey(m_model->runtime().fingerprint(), m_tokens) + ":" + codecName(CodecId::Transform);
        const std::vector<std::string> held = m_opened->contents();
        if (std::find(held.begin(), held.end(), key) != held.end()) m_codec = CodecId::Transform;
        m_codecReason = std::string("--store holds a ") + codecName(m_codec) + " encoding of this context";
    } else if (!m_profilePath.empty()) {
        const CodecProfile given = loadProfile(m_profilePath);
        if (given.hasTransform() && !given.transformModel.empty()) m_codec = CodecId::Transform;
        m_codecReason = std::string("--profile ") + (m_codec == CodecId::Transform ? "carries a calibrated transform model"
                                                                                    : "has no calibrated transform model: its cachegen levels");
    } else {
        const StreamCodecChoice c = defaultStreamCodec(*m_model, log);
        m_codec = c.codec;
        m_profilePath = c.profilePath;
        m_codecReason = c.reason;
    }
    std::fprintf(stderr, "stream: streaming %s levels (%s)\n", codecName(m_codec), m_codecReason.c_str());
    if (m_store.empty()) {
        std::string dir = m_o.workdir;
        if (!dir.empty() && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
            throw inputError(dir, "", "cannot create the folder");
        if (dir.empty()) {
            char tmpl[] = "/tmp/kvscope-stream-XXXXXX";
            if (!::mkdtemp(tmpl)) throw Error("cannot create a temporary folder");
            dir = m_tmpdir = tmpl;
        }
        m_store = encodeStore(m_original, m_profilePath, dir, m_codec);
    }
}

void StreamRace::startServer()
{
    m_server = std::make_unique<ChunkServer>(m_opened ? m_opened : std::shared_ptr<ChunkStore>(openStore(m_store)), m_srv);
    m_server->start();
    std::fprintf(stderr, "stream: chunk server on %s:%d, link %s, rtt %g ms, store %s\n", m_host.c_str(), m_server->port(),
                 m_schedule.describe().c_str(), m_o.link.rttMs, m_store.c_str());

    m_streamer = std::make_unique<Streamer>(*m_model, m_host, m_server->port(), m_tokens, m_qTokens, m_original);
    m_streamer->setCodec(m_codec);
    if (!m_profilePath.empty()) {
        // The levels' measured KL (the missing ones are interpolated: planner.h levelDistortion).
        const std::vector<double> kl = measuredLevelKl(loadProfile(m_profilePath), m_codec);
        if (!kl.empty()) m_streamer->setLevelKl(kl);
    }
    m_streamer->prepare(m_so);
}

// --quality kl: the reference the runs' caches are scored against, on the context's continuation
// text when it has one, else on the question and the reference answer.
void StreamRace::prepareQuality()
{
    if (m_o.quality != "kl") return;
    EvalTask task;
    task.context = m_tokens;
    std::string cont = m_o.continuation.empty() ? std::string() : readSmallFile(m_o.continuation, 64u << 20);
    if (cont.empty()) {
        try {
            cont = loadSampleContext(m_o.context).continuation;
        } catch (const std::exception&) {
        }
    }
    if (!cont.empty()) {
        task.continuation = m_model->tokenizer().encode(cont, false);
        if (task.continuation.size() > 256) task.continuation.resize(256);
        m_continuationSource = "continuation text";
    } else {
        task.continuation = m_qTokens;
        task.continuation.insert(task.continuation.end(), m_streamer->referenceTokens().begin(),
                                 m_streamer->referenceTokens().end());
        m_continuationSource = "question + reference answer";
    }
    task.stopIds = m_model->stopIds();
    m_qref = std::make_unique<QualityReference>(m_model->runtime(), task, m_original);
}

const Quality* StreamRace::measureQuality(const StreamResult& res)
{
    if (!m_qref || !res.cache) return nullptr;
    std::string key;
    for (const ChunkEvent& e : res.chunks) key += (e.local ? "L" : "") + std::to_string(e.level) + ",";
    key += res.policy == "int8" ? "int8" : codecName(m_codec);
    auto it = m_qualityMemo.find(key);
    if (it == m_qualityMemo.end()) it = m_qualityMemo.emplace(key, m_qref->measure(*res.cache, false)).first;
    return &it->second;
}

// One run of policy p at run r's link offset, appended to `into`.
void StreamRace::runOnce(const Policy& p, int r, PolicyRuns& into, bool replay)
{
    // A dead server (fault) stays dead for the rest of the command, as it would.
    const double offset = m_schedule.isTrace() ? m_schedule.tracePeriodSeconds() * r / m_o.runs : 0.0;
    m_so.policy = p;
    if (m_kernel) m_kernel->start(offset);
    StreamResult res = m_streamer->run(m_so, m_kernel ? m_shadow.get() : &m_server->pacer(), offset);
    if (m_kernel) m_kernel->stopShaping();
    const Quality* q = measureQuality(res);
    res.cache.reset();
    std::fprintf(stderr, "stream: %-9s %s %d: TTFT %.3f s (%s SLO %.3f s), agreement %.2f%s\n", p.name().c_str(),
                 replay ? "oracle replay" : "run", r + 1, res.ttftSeconds, res.sloMet ? "meets" : "misses", m_o.slo,
                 res.tokenAgreement, q ? (", KL " + std::to_string(q->kl)).c_str() : "");
    json j = resultJson(res);
    j["link_offset_s"] = offset;
    if (q) {
        j["quality"]["kl"] = q->kl;
        j["quality"]["delta_ppl_pct"] = q->deltaPplPct;
    }
    into.runs.push_back(j);
    into.ttfts.push_back(res.ttftSeconds);
    into.kl.push_back(q ? q->kl : -1.0);
    into.met.push_back(res.sloMet);
}

// Every policy's runs first, then the oracle's replays: the replays must not change what the
// policies' runs see (adaptive carries its throughput estimate from one run to the next).
void StreamRace::runPolicies()
{
    m_done.assign(m_policies.size(), PolicyRuns{});
    for (size_t pi = 0; pi < m_policies.size(); ++pi)
        for (int r = 0; r < m_o.runs; ++r) runOnce(m_policies[pi], r, m_done[pi], false);
}

// The oracle: each fixed level on each run's link offset (a policy's own runs where the
// command already made them), the lowest KL among those that met the SLO.
void StreamRace::runOracle()
{
    m_oracleSource = "replay: every fixed level run again at each run's link offset";
    if (!m_qref) m_oracleSource = "none: needs --quality kl";
    else if (!m_o.faults.empty()) m_oracleSource = "none: not with --fault (the replays would meet the faults)";
    else if (m_o.noOracle) m_oracleSource = "none: --no-oracle";
    m_oracle.assign(size_t(m_o.runs), Oracle{});
    if (m_oracleSource.rfind("replay", 0) != 0) return;
    const int levels = m_streamer->cachegen().params().numLevels();
    for (int l = 1; l <= levels; ++l) {
        Policy fixed;
        fixed.kind = Policy::Level;
        fixed.level = l;
        const PolicyRuns* have = nullptr;
        for (size_t pi = 0; pi < m_policies.size(); ++pi)
            if (m_policies[pi].kind == Policy::Level && m_policies[pi].level == l) have = &m_done[pi];
        PolicyRuns replay;
        if (!have) {
            for (int r = 0; r < m_o.runs; ++r) runOnce(fixed, r, replay, true);
            have = &replay;
        }
        for (int r = 0; r < m_o.runs; ++r) {
            const Oracle now = oracleOf({LevelOutcome{m_oracle[size_t(r)].level, true, m_oracle[size_t(r)].kl},
                                         LevelOutcome{l, bool(have->met[size_t(r)]), have->kl[size_t(r)]}});
            m_oracle[size_t(r)] = now;
        }
    }
}

// The server stops; files encoded into a temporary folder go with it.
void StreamRace::cleanUp()
{
    m_server->stop();
    if (!m_tmpdir.empty()) {
        for (const std::string& f : splitList(m_store)) std::remove(f.c_str());
        ::rmdir(m_tmpdir.c_str());
    }
}

json StreamRace::report(const json& results) const
{
    const Streamer& streamer = *m_streamer;
    const StreamOptions& so = m_so;
    // The first policy's first run carries the contract's top-level keys; every policy is in "policies".
    json j = results.front();
    if (results.size() == 1) j.erase("runs");
    j["runs"] = results.front()["runs"];
    j["policies"] = results;
    j["context"] = m_o.context;
    j["context_key"] = streamer.contextName();
    j["num_tokens"] = m_tokens.size();
    j["question"] = m_question;
    j["question_tokens"] = m_qTokens.size();
    j["reference"] = {{"tokens", streamer.referenceTokens()}, {"text", streamer.referenceText()}};
    j["link_schedule"] = m_schedule.describe();
    j["link_schedule_given"] = m_given.describe();
    j["kv_link_scale"] = m_kvScale;
    j["served_kv_bytes_per_token"] = m_servedKvBytesPerToken;
    j["rtt_ms"] = m_o.link.rttMs;
    j["store"] = m_store;
    j["codec"] = codecName(m_codec);
    j["codec_reason"] = m_codecReason;
    j["codec_profile"] = m_profilePath.empty() ? json(nullptr) : json(m_profilePath);
    j["levels"] = streamer.cachegen().params().numLevels();
    j["model"] = m_model->spec().name;
    j["runtime"] = m_model->runtime().describe();
    j["measured_prefill_tokens_per_s"] = streamer.measuredPrefillTokensPerSecond();
    if (so.target.enabled())
        j["target_hardware"] = {{"name", so.target.name},
                                {"prefill_tokens_per_s", so.target.prefillTokensPerSecond},
                                {"decode_GBps", so.target.decodeGBps},
                                {"weight_pass_s", so.target.weightPassSeconds >= 0 ? number(so.target.weightPassSeconds) : json(nullptr)},
                                {"kv_bytes_per_token", so.target.kvBytesPerToken > 0 ? json(so.target.kvBytesPerToken) : json(nullptr)},
                                {"citation", so.target.citation}};
    j["oracle_source"] = m_oracleSource;
    j["link_mode"] = m_linkMode;
    if (m_kernel) {
        j["kernel_link"] = m_kernel->describe();
        j["kernel_congestion"] = m_kernel->congestion();
        j["kernel_counters_loop"] = m_kernel->countersLoop();
        j["kernel_rate_changes"] = m_kernel->rateChanges();
        j["kernel_corrected_ticks"] = m_kernel->correctedTicks();
    }
    j["measured_decode_ms_per_chunk"] = 1e3 * streamer.measuredDecodeSecondsPerToken() * streamer.cachegen().params().profile.chunkTokens;
    j["level_distortion"] = streamer.levelDistortion();
    j["level_distortion_source"] = streamer.distortionSource();
    j["planner"] = {{"margin", so.plannerMargin}, {"last_chunk_weight", so.lastChunkWeight},
                    {"estimate_error_margin", so.estimateErrorMargin}, {"overrun_margin", so.overrunMargin},
                    {"horizon", so.horizon}};
    if (m_qref) j["quality_continuation"] = m_continuationSource;
    return j;
}

}  // namespace

json runStreamRace(const StreamOpts& o)
{
    return StreamRace(o).run();
}

}  // namespace kvscope::cli
