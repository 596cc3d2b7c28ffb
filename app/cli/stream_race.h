// `kvscope-cli stream` as a race (cmd_stream.cpp holds the command line): one StreamRace sets up
// the model, the link (shaped in-process or a kernel link), the chunk store and server and the
// streamer; runs every policy on it, then the oracle's replays; and reports them as the JSON of
// docs/streaming.md "What it prints". The link options are shared with `serve`.
#pragma once

#include "cli_common.h"
#include "cli_grammar.h"

#include "stream/streamer.h"
#include "transport/link.h"

#include <string>

namespace kvscope::cli {

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

// The stream command's options: the model, context and link groups and its own.
struct StreamOpts {
    ModelOpts model;
    std::string context, question, profile, store, kv, policies = "adaptive", workdir, faults, target, continuation,
        quality = "kl", codec;  // codec "": the default (eval/stream_codec.h)
    LinkOpts link;
    double slo = 0, targetPrefill = 0, targetDecode = 0, targetKvBytes = 0, stallTimeout = 2.0;
    int runs = 1, qualityTokens = 32, window = 0, horizon = 5;
    double plannerMargin = StreamOptions{}.plannerMargin, lastChunkWeight = StreamOptions{}.lastChunkWeight,
           estimateErrorMargin = StreamOptions{}.estimateErrorMargin, overrunMargin = StreamOptions{}.overrunMargin;
    bool noOracle = false;
};

// Runs the race the options describe and returns its JSON (progress goes to stderr). Throws
// kvscope::Error for bad options or input.
json runStreamRace(const StreamOpts& o);

}  // namespace kvscope::cli
