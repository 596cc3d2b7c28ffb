// `stream`, `serve` and `push`: the streaming lab from the command line (core/stream).
//
// stream's options are here and its race over policies in stream_race.cpp (how the server, the
// link and the streamer are set up). serve runs a chunk server from a store through a shaped link;
// push loads .kvc files into Redis for it.
#include "stream_race.h"
#include "cli_grammar.h"
#include "cli_common.h"

#include "codec/container.h"
#include "stream/streamer.h"
#include "transport/server.h"
#include "transport/store.h"
#include "transport/target.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

namespace kvscope::cli {

namespace {

std::atomic<bool> g_interrupted{false};

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
                    "adaptive: the throughput estimate is discounted by 1 + the recent over-prediction error (fading with age), counted as at most this")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    sub->add_option("--overrun-margin", o.overrunMargin,
                    "adaptive: when no plan meets the SLO, the best quality among plans whose time left is within this fraction of the fastest's")
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

}  // namespace

void addStreamCommand(CLI::App& app, Output& out)
{
    auto* sub = app.add_subcommand("stream", "Stream a context's KV cache over a shaped link and measure TTFT");
    auto o = std::make_shared<StreamOpts>();
    addStreamOptions(sub, *o);
    addJsonFlag(sub, out);
    setExample(sub, "kvscope-cli stream --context long_4k --bandwidth 1Gbit:0.3,50Mbit --slo 4 --policy all --threads 1");
    sub->callback([o, &out] {
        out.emit(runStreamRace(*o), [](const json& j) {
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
