// `stream`, `serve` and `push`: the streaming lab from the command line (core/stream).
//
// stream runs a chunk server in-process on 127.0.0.1 (the link shaping lives on its sending side)
// and a Streamer against it: every chunk crosses a real TCP socket at the schedule's pace.
// Stores: --store names .kvc files (comma-separated; a cachegen file and, for --policy int8, an
// int8 file of the same context), a folder of them, or redis://HOST:PORT/PREFIX filled by `push`.
// Without --store, the context's KV is encoded with cachegen and int8 into --workdir.
#include "cli_codec.h"
#include "cli_stream.h"
#include "cli_grammar.h"
#include "cli_common.h"

#include "codec/container.h"
#include "codec/profile.h"
#include "eval/stream_codec.h"
#include "eval/transform_default.h"
#include "transport/protocol.h"
#include "common/file_io.h"
#include "kvio/kv_h5.h"
#include "model/model.h"
#include "eval/quality.h"
#include "eval/samples.h"
#include "transport/kernel_link.h"
#include "transport/server.h"
#include "transport/store.h"
#include "stream/streamer.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace kvscope::cli {

namespace {

// The link group, shared by stream and serve.
struct LinkOpts {
    std::string bandwidth, trace, mode = "pacer", congestion = "cubic";
    double traceScale = 1.0, rttMs = 0, lossPct = 0;

    bool required = false;
    void add(CLI::App* sub, bool mustShape)
    {
        required = mustShape;
        auto* bw = sub->add_option("--bandwidth", bandwidth,
                                   "link rate: 50Mbit, 1Gbit, 800kbit; or steps RATE:SECONDS,...,RATE (1Gbit:0.5,50Mbit)");
        auto* tr = sub->add_option("--trace", trace, "Mahimahi trace to replay (1500 bytes per opportunity; loops)");
        bw->excludes(tr)->group(kLinkGroup);
        tr->group(kLinkGroup);
        sub->add_option("--trace-scale", traceScale, "multiply the trace's capacity by X")->capture_default_str()->group(kLinkGroup);
        sub->add_option("--rtt", rttMs, "round-trip time in ms (each reply waits one RTT)")->capture_default_str()->group(kLinkGroup);
        sub->add_option("--link", mode,
                        "pacer: shaped in-process on the sending side; kernel: a veth pair in a network namespace "
                        "shaped by tc (needs root or CAP_NET_ADMIN; falls back to pacer)")
            ->check(CLI::IsMember({"pacer", "kernel"}))
            ->capture_default_str()->group(kLinkGroup);
        sub->add_option("--loss", lossPct, "random loss in percent on the reply direction (--link kernel only)")
            ->capture_default_str()->group(kLinkGroup);
        sub->add_option("--congestion", congestion,
                        "--link kernel: TCP congestion control in the link's namespace (cubic, reno, bbr; 'system' keeps "
                        "the system default)")
            ->capture_default_str()->group(kLinkGroup);
    }
    LinkSchedule schedule() const
    {
        if (required && trace.empty() && bandwidth.empty()) throw Error("give --bandwidth RATE or --trace FILE");
        if (!trace.empty()) return LinkSchedule::loadTrace(trace, traceScale);
        if (!bandwidth.empty()) return LinkSchedule::parse(bandwidth);
        return LinkSchedule::constant(125e9);
    }
};

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

std::atomic<bool> g_interrupted{false};

// The stream command's options: the model, context and link groups and its own.
struct StreamOpts {
    ModelOpts model;
    std::string context, question, profile, store, kv, policies = "adaptive", workdir, faults, target, continuation,
        quality = "kl", codec;  // codec "": the default (eval/stream_codec.h)
    LinkOpts link;
    double slo = 0, targetPrefill = 0, targetDecode = 0, targetKvBytes = 0, stallTimeout = 2.0;
    int runs = 1, qualityTokens = 32, window = 0, horizon = 5;
    double plannerMargin = StreamOptions{}.plannerMargin, lastChunkWeight = StreamOptions{}.lastChunkWeight,
           estimateErrorMargin = StreamOptions{}.estimateErrorMargin;
    bool noOracle = false;
};

void addStreamOptions(CLI::App* sub, StreamOpts& o)
{
    addDeprecated(sub, "--kv", sub->add_option("kv", o.kv, "the context's original KV (HDF5) for quality; default: prefill it now"),
                  "the positional KV file");
    o.model.add(sub, false);
    addContextOption(sub, o.context, true);
    addQuestionOption(sub, o.question);
    addContinuationOption(sub, o.continuation);
    sub->add_option("--profile", o.profile,
                    "codec profile: the cachegen encoding when --store is absent, and the levels' measured KL for the "
                    "adaptive planner")
        ->group(kCodecGroup);
    sub->add_option("--codec", o.codec,
                    "the level-coded encoding that adaptive, text and level:N stream: cachegen or transform (codec 6; "
                    "with --profile, its calibrated transform model). Default: transform with the model's calibrated "
                    "ladder where the model has one of its own, else cachegen; a --profile with a calibrated transform "
                    "model, transform; a --store, what it holds for the context")
        ->check(CLI::IsMember({"cachegen", "transform"}))
        ->group(kCodecGroup);
    o.link.add(sub, true);
    sub->add_option("--slo", o.slo, "TTFT target in seconds")->required()->check(CLI::PositiveNumber);
    sub->add_option("--policy", o.policies, "adaptive, text, int8, level:N; comma-separated to compare, or 'all'")
        ->capture_default_str();
    sub->add_option("--store", o.store, ".kvc file(s) a,b / a folder / redis://HOST:PORT/PREFIX (default: encode now)");
    sub->add_option("--runs", o.runs, "runs per policy (trace replays start at evenly spread offsets)")
        ->capture_default_str()->check(CLI::Range(1, 1000));
    sub->add_option("--target", o.target, "model target hardware: a100-7b or h100-8b (published figures, cited in core/transport/target.cpp)")
        ->check(CLI::IsMember(targetPresetNames()));
    sub->add_option("--target-prefill", o.targetPrefill, "model a machine that prefills this many tokens/s (overrides --target's)");
    sub->add_option("--target-decode", o.targetDecode, "model a machine that decodes KV at this many GB/s of fp16 (overrides --target's)");
    sub->add_option("--target-kv", o.targetKvBytes,
                    "fp16 KV bytes per token of the target's model (overrides --target's; the link is slowed by the "
                    "served model's size over this, so transfers take the target's time)");
    sub->add_option("--window", o.window, "requests in flight at most (0 = the bandwidth-delay product, automatic)")
        ->capture_default_str()->check(CLI::Range(0, 16));
    sub->add_option("--horizon", o.horizon, "adaptive planner look-ahead in chunks")->capture_default_str()->check(CLI::Range(1, 8));
    sub->add_option("--planner-margin", o.plannerMargin,
                    "adaptive: plans must meet (1 - this) x the SLO, the room left for throughput estimate error")
        ->capture_default_str()->check(CLI::Range(0.0, 0.9));
    sub->add_option("--last-chunk-weight", o.lastChunkWeight,
                    "adaptive: the context's last chunk's distortion counts this many times another chunk's")
        ->capture_default_str()->check(CLI::Range(0.0, 100.0));
    sub->add_option("--estimate-error-margin", o.estimateErrorMargin,
                    "adaptive: the throughput estimate is discounted by 1 + the recent prediction error, counted as at most this")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    sub->add_option("--quality", o.quality, "kl: KL and delta PPL of every run's cache (eval quality module); agreement: answers only")
        ->check(CLI::IsMember({"kl", "agreement"}))->capture_default_str();
    sub->add_option("--fault", o.faults, "server faults: die:N, corrupt:N, stall:N (N = chunk reply from 0)");
    sub->add_flag("--no-oracle", o.noOracle,
                  "skip the oracle replays (every fixed level again on each run's link); oracle_level, oracle_kl and regret_kl are then null");
    sub->add_option("--stall-timeout", o.stallTimeout, "seconds without a byte before a fetch counts as stalled")
        ->capture_default_str();
    sub->add_option("--quality-tokens", o.qualityTokens, "greedy tokens compared with the original")->capture_default_str();
    sub->add_option("--workdir", o.workdir, "where to write the encodings when --store is absent (default: a temporary folder)");
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
    so.keepCache = o.quality == "kl";
    return so;
}

}  // namespace

void addStreamCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("stream", "Stream a context's KV cache over a shaped link and measure TTFT");
    auto o = std::make_shared<StreamOpts>();
    addStreamOptions(sub, *o);
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli stream --context long_4k --bandwidth 1Gbit:0.3,50Mbit --slo 4 --policy all --threads 1");
    sub->callback([o, &out] {
        StreamOptions so = streamOptions(*o);
        CodecId codec = CodecId::CacheGen;
        if (!o->codec.empty()) parseCodecName(o->codec, &codec);
        std::vector<Policy> policies;
        for (const std::string& p : splitList(o->policies == "all" ? "adaptive,text,int8,level:1,level:2,level:3" : o->policies))
            policies.push_back(parsePolicy(p));
        // A sample id (long_4k, story, ...) or a UTF-8 text file.
        const SampleContext sample = loadSampleContext(o->context);
        const std::string& text = sample.text;
        const std::unique_ptr<Model> m = o->model.open();
        const std::vector<int32_t> tokens = m->contextTokens(text);
        const std::string question = questionFor(sample.path, o->question);
        const std::vector<int32_t> qTokens = m->questionTokens(question);

        // A target whose model has a larger KV than the served one: the link runs slower by the
        // ratio, so every chunk takes as long as the target model's chunk would on the given link.
        const LinkSchedule given = o->link.schedule();
        const double servedKvBytesPerToken = fp16KvBytesPerToken(m->runtime().kvShape(1));
        if (o->targetKvBytes < 0) throw Error("--target-kv must be positive (bytes of fp16 KV per token)");
        if (o->targetKvBytes > 0) so.target.kvBytesPerToken = o->targetKvBytes;
        const double kvScale = kvLinkScale(so.target, servedKvBytesPerToken);
        const LinkSchedule schedule = kvScale != 1.0 ? given.scaled(kvScale) : given;
        if (kvScale != 1.0)
            std::fprintf(stderr, "stream: target KV %.0f B/token vs served %.0f: link %s carries the served bytes as %s\n",
                         so.target.kvBytesPerToken, servedKvBytesPerToken, given.describe().c_str(),
                         schedule.describe().c_str());
        ServerOptions srv;
        srv.link = schedule;
        srv.rttSeconds = o->link.rttMs / 1000.0;
        if (!o->faults.empty()) srv.faults = parseFaults(o->faults);
        // --link kernel: the bytes cross a tc-shaped veth pair; the server's own pacer stays out of the way.
        std::unique_ptr<KernelLink> kernel;
        std::string linkMode = "pacer", host = "127.0.0.1";
        if (o->link.lossPct != 0 && o->link.mode != "kernel") throw Error("--loss needs --link kernel");
        if (o->link.mode == "kernel") {
            std::string why;
            if (!KernelLink::available(&why)) {
                std::fprintf(stderr, "stream: --link kernel: %s; falling back to the in-process pacer\n", why.c_str());
            } else {
                KernelLink::cleanupOnSignal();
                KernelLinkOptions ko;
                ko.schedule = schedule;
                ko.rttSeconds = o->link.rttMs / 1000.0;
                ko.lossPercent = o->link.lossPct;
                ko.congestion = o->link.congestion == "system" ? "" : o->link.congestion;
                kernel = std::make_unique<KernelLink>(ko);
                linkMode = "kernel";
                host = kernel->serverAddress();
                srv.host = host;
                srv.link = LinkSchedule::constant(125e9);
                srv.rttSeconds = kernel->kernelDelay() ? 0.0 : o->link.rttMs / 1000.0;
                KernelLink* k = kernel.get();
                srv.listen = [k](const std::string& h, int port) { return k->listen(h, port); };
                std::fprintf(stderr, "stream: %s\n", kernel->describe().c_str());
            }
        }
        LinkPacer shadow(schedule);  // kernel mode: the schedule's clock and capacity, not a shaper


        KvSet original;
        if (!o->kv.empty()) {
            original = readKvH5(o->kv);
            if (original.tokens != tokens)
                throw inputError(o->kv, "tokens", "this KV was not captured from " + o->context + " with this model");
        } else {
            std::fprintf(stderr, "stream: prefill of %zu context tokens for the reference cache\n", tokens.size());
            InferenceSession s(m->runtime());
            s.append(tokens, nullptr);
            original = s.exportKv();
            original.context = text;
        }

        // Which level-coded encoding is streamed, and why (the JSON says both).
        std::string profilePath = o->profile, codecReason;
        const auto log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
        std::string store = o->store, tmpdir;
        std::shared_ptr<ChunkStore> opened;
        if (!o->codec.empty()) {
            codecReason = "--codec " + o->codec;
            if (codec == CodecId::Transform && profilePath.empty()) {
                profilePath = ensureDefaultTransform(*m, log);
                codecReason += " with the model's calibrated default ladder";
            }
        } else if (!store.empty()) {
            // What the store holds for this context: its transform encoding when it has one.
            opened = std::shared_ptr<ChunkStore>(openStore(store));
            const std::string key = contextKey(m->runtime().fingerprint(), tokens) + ":" + codecName(CodecId::Transform);
            const std::vector<std::string> held = opened->contents();
            if (std::find(held.begin(), held.end(), key) != held.end()) codec = CodecId::Transform;
            codecReason = std::string("--store holds a ") + codecName(codec) + " encoding of this context";
        } else if (!profilePath.empty()) {
            const CodecProfile given = loadProfile(profilePath);
            if (given.hasTransform() && !given.transformModel.empty()) codec = CodecId::Transform;
            codecReason = std::string("--profile ") + (codec == CodecId::Transform ? "carries a calibrated transform model"
                                                                                    : "has no calibrated transform model: its cachegen levels");
        } else {
            const StreamCodecChoice c = defaultStreamCodec(*m, log);
            codec = c.codec;
            profilePath = c.profilePath;
            codecReason = c.reason;
        }
        std::fprintf(stderr, "stream: streaming %s levels (%s)\n", codecName(codec), codecReason.c_str());
        if (store.empty()) {
            std::string dir = o->workdir;
            if (!dir.empty() && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
                throw inputError(dir, "", "cannot create the folder");
            if (dir.empty()) {
                char tmpl[] = "/tmp/kvscope-stream-XXXXXX";
                if (!::mkdtemp(tmpl)) throw Error("cannot create a temporary folder");
                dir = tmpdir = tmpl;
            }
            store = encodeStore(original, profilePath, dir, codec);
        }
        auto server = std::make_unique<ChunkServer>(opened ? opened : std::shared_ptr<ChunkStore>(openStore(store)), srv);
        server->start();
        std::fprintf(stderr, "stream: chunk server on %s:%d, link %s, rtt %g ms, store %s\n", host.c_str(), server->port(),
                     schedule.describe().c_str(), o->link.rttMs, store.c_str());

        Streamer streamer(*m, host, server->port(), tokens, qTokens, original);
        streamer.setCodec(codec);
        if (!profilePath.empty()) {
            // The levels' measured KL (the missing ones are interpolated: planner.h levelDistortion).
            const std::vector<double> kl = measuredLevelKl(loadProfile(profilePath), codec);
            if (!kl.empty()) streamer.setLevelKl(kl);
        }
        streamer.prepare(so);

        // Quality of each run's cache through the eval module, once per distinct cache recipe
        // (levels and recomputed chunks fix the cache's bytes).
        std::unique_ptr<QualityReference> qref;
        std::map<std::string, Quality> qualityMemo;
        std::string continuationSource;
        if (o->quality == "kl") {
            EvalTask task;
            task.context = tokens;
            std::string cont = o->continuation.empty() ? std::string() : readSmallFile(o->continuation, 64u << 20);
            if (cont.empty()) {
                try {
                    cont = loadSampleContext(o->context).continuation;
                } catch (const std::exception&) {
                }
            }
            if (!cont.empty()) {
                task.continuation = m->tokenizer().encode(cont, false);
                if (task.continuation.size() > 256) task.continuation.resize(256);
                continuationSource = "continuation text";
            } else {
                task.continuation = qTokens;
                task.continuation.insert(task.continuation.end(), streamer.referenceTokens().begin(),
                                         streamer.referenceTokens().end());
                continuationSource = "question + reference answer";
            }
            task.stopIds = m->stopIds();
            qref = std::make_unique<QualityReference>(m->runtime(), task, original);
        }
        auto measureQuality = [&](const StreamResult& res) -> const Quality* {
            if (!qref || !res.cache) return nullptr;
            std::string key;
            for (const ChunkEvent& e : res.chunks) key += (e.local ? "L" : "") + std::to_string(e.level) + ",";
            key += res.policy == "int8" ? "int8" : codecName(codec);
            auto it = qualityMemo.find(key);
            if (it == qualityMemo.end()) it = qualityMemo.emplace(key, qref->measure(*res.cache, false)).first;
            return &it->second;
        };
        // Every policy's runs first, then the oracle's replays: the replays must not change what the
        // policies' runs see (adaptive carries its throughput estimate from one run to the next).
        std::vector<PolicyRuns> done(policies.size());
        auto runOnce = [&](const Policy& p, int r, PolicyRuns& into, bool replay) {
            // A dead server (fault) stays dead for the rest of the command, as it would.
            const double offset = schedule.isTrace() ? schedule.tracePeriodSeconds() * r / o->runs : 0.0;
            so.policy = p;
            if (kernel) kernel->start(offset);
            StreamResult res = streamer.run(so, kernel ? &shadow : &server->pacer(), offset);
            if (kernel) kernel->stopShaping();
            const Quality* q = measureQuality(res);
            res.cache.reset();
            std::fprintf(stderr, "stream: %-9s %s %d: TTFT %.3f s (%s SLO %.3f s), agreement %.2f%s\n", p.name().c_str(),
                         replay ? "oracle replay" : "run", r + 1, res.ttftSeconds, res.sloMet ? "meets" : "misses", o->slo,
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
        };
        for (size_t pi = 0; pi < policies.size(); ++pi)
            for (int r = 0; r < o->runs; ++r) runOnce(policies[pi], r, done[pi], false);

        // The oracle: each fixed level on each run's link offset (a policy's own runs where the
        // command already made them), the lowest KL among those that met the SLO.
        std::string oracleSource = "replay: every fixed level run again at each run's link offset";
        if (!qref) oracleSource = "none: needs --quality kl";
        else if (!o->faults.empty()) oracleSource = "none: not with --fault (the replays would meet the faults)";
        else if (o->noOracle) oracleSource = "none: --no-oracle";
        std::vector<Oracle> oracle(size_t(o->runs));
        if (oracleSource.rfind("replay", 0) == 0) {
            const int levels = streamer.cachegen().params().numLevels();
            for (int l = 1; l <= levels; ++l) {
                Policy fixed;
                fixed.kind = Policy::Level;
                fixed.level = l;
                const PolicyRuns* have = nullptr;
                for (size_t pi = 0; pi < policies.size(); ++pi)
                    if (policies[pi].kind == Policy::Level && policies[pi].level == l) have = &done[pi];
                PolicyRuns replay;
                if (!have) {
                    for (int r = 0; r < o->runs; ++r) runOnce(fixed, r, replay, true);
                    have = &replay;
                }
                for (int r = 0; r < o->runs; ++r) {
                    const Oracle now = oracleOf({LevelOutcome{oracle[size_t(r)].level, true, oracle[size_t(r)].kl},
                                                 LevelOutcome{l, bool(have->met[size_t(r)]), have->kl[size_t(r)]}});
                    oracle[size_t(r)] = now;
                }
            }
        }

        json results = json::array();
        for (PolicyRuns& pr : done) results.push_back(policySummary(pr, oracle));
        server->stop();
        if (!tmpdir.empty()) {
            for (const std::string& f : splitList(store)) std::remove(f.c_str());
            ::rmdir(tmpdir.c_str());
        }
        // The first policy's first run carries the contract's top-level keys; every policy is in "policies".
        json j = results.front();
        if (results.size() == 1) j.erase("runs");
        j["runs"] = results.front()["runs"];
        j["policies"] = results;
        j["context"] = o->context;
        j["context_key"] = streamer.contextName();
        j["num_tokens"] = tokens.size();
        j["question"] = question;
        j["question_tokens"] = qTokens.size();
        j["reference"] = {{"tokens", streamer.referenceTokens()}, {"text", streamer.referenceText()}};
        j["link_schedule"] = schedule.describe();
        j["link_schedule_given"] = given.describe();
        j["kv_link_scale"] = kvScale;
        j["served_kv_bytes_per_token"] = servedKvBytesPerToken;
        j["rtt_ms"] = o->link.rttMs;
        j["store"] = store;
        j["codec"] = codecName(codec);
        j["codec_reason"] = codecReason;
        j["codec_profile"] = profilePath.empty() ? json(nullptr) : json(profilePath);
        j["levels"] = streamer.cachegen().params().numLevels();
        j["model"] = m->spec().name;
        j["runtime"] = m->runtime().describe();
        j["measured_prefill_tokens_per_s"] = streamer.measuredPrefillTokensPerSecond();
        if (so.target.enabled())
            j["target_hardware"] = {{"name", so.target.name},
                                    {"prefill_tokens_per_s", so.target.prefillTokensPerSecond},
                                    {"decode_GBps", so.target.decodeGBps},
                                    {"weight_pass_s", so.target.weightPassSeconds >= 0 ? number(so.target.weightPassSeconds) : json(nullptr)},
                                    {"kv_bytes_per_token", so.target.kvBytesPerToken > 0 ? json(so.target.kvBytesPerToken) : json(nullptr)},
                                    {"citation", so.target.citation}};
        j["oracle_source"] = oracleSource;
        j["link_mode"] = linkMode;
        if (kernel) {
            j["kernel_link"] = kernel->describe();
            j["kernel_congestion"] = kernel->congestion();
            j["kernel_counters_loop"] = kernel->countersLoop();
            j["kernel_rate_changes"] = kernel->rateChanges();
            j["kernel_corrected_ticks"] = kernel->correctedTicks();
        }
        j["measured_decode_ms_per_chunk"] = 1e3 * streamer.measuredDecodeSecondsPerToken() * streamer.cachegen().params().profile.chunkTokens;
        j["level_distortion"] = streamer.levelDistortion();
        j["level_distortion_source"] = streamer.distortionSource();
        j["planner"] = {{"margin", so.plannerMargin}, {"last_chunk_weight", so.lastChunkWeight},
                        {"estimate_error_margin", so.estimateErrorMargin}, {"horizon", so.horizon}};
        if (qref) j["quality_continuation"] = continuationSource;
        out.emit(j, [](const json& j) {
            std::printf("%-10s %9s %9s %9s %9s %9s %6s %9s %10s %8s\n", "policy", "ttft_s", "transfer", "decode",
                        "recompute", "prefill", "slo", "agreement", "mean_kl", "util");
            for (const json& p : j["policies"]) {
                const json& t = p["ttft_parts"];
                std::printf("%-10s %9.3f %9.3f %9.3f %9.3f %9.3f %6.2f %9.2f %10.5f %8.3f\n",
                            p["policy"].get<std::string>().c_str(), p["ttft_median_s"].get<double>(),
                            t["transfer"]["seconds"].get<double>(), t["decode"]["seconds"].get<double>(),
                            t["recompute"]["seconds"].get<double>(), t["prefill"]["seconds"].get<double>(),
                            p["slo_hit_rate"].get<double>(), p["mean_token_agreement"].get<double>(),
                            p["mean_kl"].is_number() ? p["mean_kl"].get<double>() : -1.0,
                            p["mean_utilisation"].is_number() ? p["mean_utilisation"].get<double>() : -1.0);
            }
        });
    });
}

void addServeCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("serve", "Serve KV chunks from a store over TCP, through a shaped link");
    struct Opts {
        std::string store, host = "127.0.0.1", faults;
        int port = 0, maxConnections = ServerOptions{}.maxConnections;
        double seconds = 0, idleTimeout = ServerOptions{}.idleTimeout, frameTimeout = ServerOptions{}.frameTimeout;
        LinkOpts link;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--store", o->store, ".kvc file(s) a,b / a folder / redis://HOST:PORT/PREFIX")->required();
    sub->add_option("--host", o->host, "address to bind")->capture_default_str();
    sub->add_option("--port", o->port, "port (0 = any free port, printed on stderr)")->capture_default_str();
    o->link.add(sub, false);
    sub->add_option("--idle-timeout", o->idleTimeout, "seconds before a silent peer is dropped")->capture_default_str();
    sub->add_option("--frame-timeout", o->frameTimeout,
                    "seconds a request frame may take from its first byte to its last (slow peers are dropped)")
        ->capture_default_str()->check(CLI::PositiveNumber);
    sub->add_option("--max-connections", o->maxConnections,
                    "open connections at most; when full, a newcomer replaces the longest-idle connection owed nothing")
        ->capture_default_str()->check(CLI::Range(1, 100000));
    sub->add_option("--fault", o->faults, "die:N, corrupt:N, stall:N (N = chunk reply from 0)");
    sub->add_option("--seconds", o->seconds, "stop after this long (0 = until SIGINT/SIGTERM)")->capture_default_str();
    addJsonFlag(sub, out, "print one JSON object when the server stops");
    setExample(sub, "kvscope-cli serve --store kv.kvc --bandwidth 100Mbit");
    sub->callback([o, &out] {
        ServerOptions srv;
        srv.host = o->host;
        srv.port = o->port;
        srv.link = o->link.schedule();
        srv.rttSeconds = o->link.rttMs / 1000.0;
        srv.idleTimeout = o->idleTimeout;
        srv.frameTimeout = o->frameTimeout;
        srv.maxConnections = o->maxConnections;
        if (!o->faults.empty()) srv.faults = parseFaults(o->faults);
        std::shared_ptr<ChunkStore> store(openStore(o->store));
        ChunkServer server(store, srv);
        server.start();
        std::fprintf(stderr, "serve: listening on %s:%d, link %s, store %s\n", o->host.c_str(), server.port(),
                     srv.link.describe().c_str(), store->describe().c_str());
        for (const std::string& c : store->contents()) std::fprintf(stderr, "serve:   %s\n", c.c_str());
        std::signal(SIGINT, [](int) { g_interrupted = true; });
        std::signal(SIGTERM, [](int) { g_interrupted = true; });
        const double t0 = nowSeconds();
        while (!g_interrupted && !server.dead() && (o->seconds <= 0 || nowSeconds() - t0 < o->seconds))
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        server.stop();
        const ServerStats s = server.stats();
        const json j = {{"port", server.port()},
                        {"connections", s.connections},
                        {"requests", s.requests},
                        {"error_frames", s.errorFrames},
                        {"chunk_replies", s.chunkReplies},
                        {"bytes_sent", s.bytesSent},
                        {"evicted", s.evicted},
                        {"refused", s.refused},
                        {"frame_timeouts", s.frameTimeouts},
                        {"idle_timeouts", s.idleTimeouts}};
        out.emit(j, [](const json& j) { std::printf("%s\n", j.dump().c_str()); });
    });
}

void addPushCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("push", "Load a .kvc into Redis: one key per (context, chunk, level) plus a skeleton key");
    struct Opts {
        std::vector<std::string> files;
        std::string to;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("kvc", o->files, "containers (.kvc)")->required();
    sub->add_option("--to", o->to, "redis://HOST:PORT/PREFIX")->required();
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli push kv.kvc --to redis://127.0.0.1:6379/kv");
    sub->callback([o, &out] {
        json pushed = json::array();
        for (const std::string& f : o->files) {
            const auto r = KvcReader::openFile(f);
            const PushReport rep = pushKvcToRedis(*r, o->to);
            pushed.push_back({{"file", f}, {"context", rep.context}, {"codec", rep.codec}, {"keys", rep.keys},
                              {"bytes", rep.bytes}, {"push_s", rep.seconds}});
        }
        out.emit({{"url", o->to}, {"pushed", pushed}}, [](const json& j) {
            for (const json& p : j["pushed"])
                std::printf("%s -> %s: context %s (%s), %d keys, %llu bytes\n", p["file"].get<std::string>().c_str(),
                            j["url"].get<std::string>().c_str(), p["context"].get<std::string>().c_str(),
                            p["codec"].get<std::string>().c_str(), p["keys"].get<int>(),
                            (unsigned long long)p["bytes"].get<uint64_t>());
        });
    });
}

}  // namespace kvscope::cli
