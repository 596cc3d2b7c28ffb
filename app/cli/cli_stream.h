// The JSON of `kvscope-cli stream`: one run's object (the contract's per-run keys) and a policy's
// summary over its runs, the oracle's keys included (docs/streaming.md "What it prints").
#pragma once

#include "cli_common.h"

#include "stream/policy.h"
#include "stream/streamer.h"

#include <algorithm>
#include <map>
#include <vector>

namespace kvscope::cli {

inline json resultJson(const StreamResult& r)
{
    auto part = [](const TtftPart& p) { return json{{"seconds", p.seconds}, {"source", p.modelled ? "modelled" : "measured"}}; };
    json chunks = json::array();
    for (const ChunkEvent& e : r.chunks) {
        json c = {{"index", e.index},
                  {"bytes", e.bytes},
                  {"sent_s", e.sentS},
                  {"first_byte_s", e.firstByteS},
                  {"arrived_s", e.arrivedS},
                  {"job_start_s", e.jobStartS},
                  {"decoded_s", e.decodedS},
                  {"job_s", e.jobSeconds},
                  {"attempts", e.attempts},
                  {"source", e.local ? "local" : e.level == 0 ? "tokens" : "link"}};
        if (e.throughputEstimate > 0) {
            c["throughput_estimate_Bps"] = e.throughputEstimate;
            c["predicted_ttft_s"] = e.predictedTtftS;
        }
        if (e.level == 0) c["level"] = "text";
        else c["level"] = e.level;
        if (!e.note.empty()) c["note"] = e.note;
        chunks.push_back(c);
    }
    return json{
        {"policy", r.policy},
        {"ttft_s", r.ttftSeconds},
        {"slo_s", r.sloSeconds},
        {"slo_met", r.sloMet},
        {"ttft_parts",
         {{"transfer", part(r.transfer)},
          {"decode", part(r.decode)},
          {"recompute", part(r.recompute)},
          {"kv_load", part(r.kvLoad)},
          {"prefill", part(r.prefill)},
          {"first_token", part(r.firstToken)}}},
        {"busy_s", {{"decode", r.decodeBusySeconds}, {"recompute", r.recomputeBusySeconds}}},
        {"planner_tail_s", r.plannedTailSeconds},
        {"chunks", chunks},
        {"link",
         {{"delivered_bytes", r.deliveredBytes},
          {"capacity_bytes", r.capacityBytes},
          {"seconds", r.linkSeconds},
          {"utilisation", r.capacityBytes > 0 ? number(double(r.deliveredBytes) / r.capacityBytes) : json(nullptr)},
          {"backlogged_capacity_bytes", r.backloggedCapacityBytes},
          {"pacer_idle_lost_bytes", r.idleLostBytes},
          {"pacer_busy_lost_bytes", r.busyLostBytes},
          {"pacer_busy_capacity_bytes", r.busyCapacityBytes},
          // While backlogged: inside the pacer's busy periods only (a reply queued or being sent),
          // so a plan's own idle stretches (text recompute, no request due) do not count.
          {"busy_utilisation", r.busyCapacityBytes > 0 ? number(1.0 - r.busyLostBytes / r.busyCapacityBytes) : json(nullptr)},
          {"backlogged_utilisation", r.backloggedCapacityBytes > 0
                                         ? number(double(r.backloggedDeliveredBytes) / r.backloggedCapacityBytes)
                                         : json(nullptr)}}},
        {"quality",
         {{"token_agreement", r.tokenAgreement},
          {"first_token_match", r.firstTokenMatch},
          {"tokens", r.tokens},
          {"text", r.text}}},
        {"log", r.log},
    };
}

// One policy's runs, in run order (one per link offset).
struct PolicyRuns {
    json runs = json::array();
    std::vector<double> ttfts, kl;  // kl < 0: not measured
    std::vector<bool> met;
};

// Annotates every run with its oracle (oracle[r]: the best fixed level on run r's link) and
// returns the policy's summary: the first run's keys, then the means over the runs.
inline json policySummary(PolicyRuns& pr, const std::vector<Oracle>& oracle)
{
    const int runs = int(pr.runs.size());
    int met = 0, measured = 0, utilRuns = 0, busyUtilRuns = 0, oracleRuns = 0, regretRuns = 0;
    double agreementSum = 0, klSum = 0, pplSum = 0, utilSum = 0, busyUtilSum = 0, oracleKlSum = 0, regretSum = 0;
    std::map<int, int> oracleLevels;
    json oracleList = json::array();
    for (int r = 0; r < runs; ++r) {
        json& j = pr.runs[size_t(r)];
        met += pr.met[size_t(r)];
        agreementSum += j["quality"]["token_agreement"].get<double>();
        if (pr.kl[size_t(r)] >= 0) {
            klSum += pr.kl[size_t(r)];
            pplSum += j["quality"]["delta_ppl_pct"].get<double>();
            ++measured;
        }
        const json& link = j["link"];
        if (link["utilisation"].is_number()) {
            utilSum += link["utilisation"].get<double>();
            ++utilRuns;
        }
        if (link["busy_utilisation"].is_number()) {
            busyUtilSum += link["busy_utilisation"].get<double>();
            ++busyUtilRuns;
        }
        const Oracle& orc = oracle[size_t(r)];
        j["oracle_level"] = orc.level > 0 ? json(orc.level) : json(nullptr);
        j["oracle_kl"] = orc.level > 0 ? number(orc.kl) : json(nullptr);
        j["regret_kl"] = orc.level > 0 && pr.kl[size_t(r)] >= 0 ? number(pr.kl[size_t(r)] - orc.kl) : json(nullptr);
        oracleList.push_back(j["oracle_level"]);
        if (orc.level > 0) {
            ++oracleRuns;
            oracleKlSum += orc.kl;
            ++oracleLevels[orc.level];
            if (pr.kl[size_t(r)] >= 0) {
                regretSum += pr.kl[size_t(r)] - orc.kl;
                ++regretRuns;
            }
        }
    }
    std::vector<double> sorted = pr.ttfts;
    std::sort(sorted.begin(), sorted.end());
    json summary = pr.runs.front();
    summary["runs"] = pr.runs;
    summary["ttft_median_s"] = sorted[sorted.size() / 2];
    summary["slo_hit_rate"] = double(met) / double(runs);
    summary["mean_token_agreement"] = agreementSum / double(runs);
    summary["mean_kl"] = measured ? number(klSum / measured) : json(nullptr);
    summary["mean_delta_ppl_pct"] = measured ? number(pplSum / measured) : json(nullptr);
    summary["mean_utilisation"] = utilRuns ? number(utilSum / utilRuns) : json(nullptr);
    summary["mean_busy_utilisation"] = busyUtilRuns ? number(busyUtilSum / busyUtilRuns) : json(nullptr);
    summary["ttft_mean_s"] = [&] {
        double t = 0;
        for (double x : pr.ttfts) t += x;
        return t / double(pr.ttfts.size());
    }();
    // Over the runs where some fixed level met the SLO: the oracle's mean KL, the policy's
    // mean regret against it, and the level the oracle chose most often.
    int modeLevel = 0, modeCount = 0;
    for (const auto& [level, count] : oracleLevels)
        if (count > modeCount) modeLevel = level, modeCount = count;
    summary["oracle_level"] = modeLevel > 0 ? json(modeLevel) : json(nullptr);
    summary["oracle_levels"] = oracleList;
    summary["oracle_kl"] = oracleRuns ? number(oracleKlSum / oracleRuns) : json(nullptr);
    summary["regret_kl"] = regretRuns ? number(regretSum / regretRuns) : json(nullptr);
    summary["oracle_runs"] = oracleRuns;
    return summary;
}

}  // namespace kvscope::cli
