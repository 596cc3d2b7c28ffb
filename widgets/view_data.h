// The plain value structs the views draw and the app's sessions fill, in one header without
// QWidget, so the sessions (workers that call core) never include a view. Every struct is safe
// to copy across threads and is declared as a Qt meta-type for queued signals.
#pragma once

#include "kv/kv_compare.h"
#include "eval/layer_sensitivity.h"
#include "kv/kv_stats.h"
#include "kv_metatypes.h"

#include <QMetaType>
#include <QString>
#include <QStringList>

#include <vector>

namespace kvscope {

// ---- Paths on screen -------------------------------------------------------------------------

// A file's path as the views show it, so windows and screenshots never show where this machine
// keeps things: relative to the root set here (the source tree the samples come from) when the
// file is under it, else the file name alone. The full path goes in tooltips and is what is used.
void setShownPathRoot(const QString& root);
QString shownPath(const QString& path);

// ---- Model & context -------------------------------------------------------------------------

// What the Model & context page shows about a model; filled on the worker that opened it.
struct ModelInfo {
    QString name;
    QString path;
    QString format;        // "gguf", "safetensors", "llama2.c"
    QString architecture;  // "LlamaForCausalLM"
    QString modelType;     // "llama", "qwen2"
    int layers = 0;
    int heads = 0;
    int kvHeads = 0;
    int headDim = 0;
    int hiddenSize = 0;
    int intermediateSize = 0;
    int vocabSize = 0;
    int maxPositions = 0;
    quint64 parameters = 0;
    QString weightTypes;  // "Q4_1 x 210, F32 x 61"
    QString tokenizer;    // "byte-level BPE (GGUF, gpt2)"
    bool chat = false;
    QString fingerprint;
    QString runtime;  // "libtorch 1.13.0, 2 threads, float32 compute, float16 KV"
    double loadSeconds = 0;
};

// The tokens a capture of `text` would run (chat template and BOS included), each decoded alone.
struct TokenPieces {
    QString text;               // the context they belong to (stale results are recognised by it)
    std::vector<int> ids;       // (tokens)
    QStringList pieces;         // (tokens) decode({id}); partial UTF-8 shows as U+FFFD
};

// ---- Distributions ---------------------------------------------------------------------------

struct EntropyMap {   // per-channel entropy of every layer of one kind at `bins`
    KvKind kind = KvKind::Key;
    int bins = 0;
    int layers = 0, channels = 0;
    std::vector<double> bits;  // (layers, channels)
};

struct HistogramData {
    KvKind kind = KvKind::Key;
    int layer = 0;
    int channel = -1;  // -1: every channel of the layer
    Histogram histogram;
};

struct TokenMapData {
    KvKind kind = KvKind::Key;
    int layer = 0;
    int tokens = 0, stride = 1, channels = 0;
    std::vector<float> values;  // (tokens, channels)
};

// ---- Codec -----------------------------------------------------------------------------------

struct TrialFigures {  // one level of the edited profile, encoded and decoded once
    int level = 1;
    quint64 bytes = 0;
    double bitsPerValue = 0, ratioVsFp16 = 0, ratioVsInt8 = 0;
    double encodeSeconds = 0, decodeSeconds = 0;
    double rms = 0;
    std::vector<LayerError> layers;
};

struct QualityFigures {
    int level = 1;
    double bitsPerValue = 0;      // of the trial measured
    bool hasContinuation = false; // ΔPPL and KL need one
    double deltaPplPct = 0, kl = 0, tokenAgreement = 1;
    QString originalAnswer, answer;
};

struct RdPoint {  // one row of evaluateCodecs or of the quality suite
    QString codec;   // "cachegen", "transform", "int8", ...
    QString label;   // "level 2", "int8", "transform t=0.03", ...
    double bitsPerValue = 0, deltaPplPct = 0, kl = 0;
    double accuracy = -1;  // multiple-choice accuracy on a quality suite; < 0 when not measured
};

// A codec stage the user can switch on and off (the transform codec's stages); the tuner shows
// whatever list the app hands it.
struct CodecStage {
    QString id;       // stable key, e.g. "transform", "rope_undo", "pca", "sinks"
    QString label;
    QString toolTip;
    bool enabled = true;    // can be toggled now
    bool on = false;
};

// ---- Stream ----------------------------------------------------------------------------------

// Target hardware for the compute parts of TTFT (decode, recompute, the question's prefill, the
// first token). Zero rates: measured on this machine. Otherwise modelled from the rates (transfer
// is always measured on the socket). The app fills the list from core/stream's presets
// (targetPreset, the same as `kvscope-cli stream --target`), so GUI and CLI model one machine.
struct HardwarePreset {
    QString id, label;
    double prefillTokensPerSecond = 0;
    double decodeGBps = 0;
    double weightPassSeconds = -1;  // the least a forward pass takes (one read of the weights); < 0: none
    QString citation;               // where the figures come from
    bool modelled() const { return prefillTokensPerSecond > 0 || decodeGBps > 0; }
};

struct StreamConfig {
    enum Link { Constant = 0, Steps = 1, Trace = 2 } link = Constant;
    // How the policies of a race meet the link:
    //   BackToBack  one after another, each on the schedule from its start (one link, one client);
    //   AtOnce      concurrently, each its own server and link on the same schedule (so each sees
    //               the whole schedule, as back to back, but at the same wall-clock time);
    //   SharedLink  concurrently, every client on one server's link: they compete for it
    //               (max-min fair shares, link.h), as several sessions of one serving node would.
    enum Mode { BackToBack = 0, AtOnce = 1, SharedLink = 2 } mode = BackToBack;
    QString rate = QStringLiteral("50Mbit");   // Constant: a rate; Steps: RATE:SECONDS,...,RATE
    QString tracePath;
    double traceScale = 1.0;
    double rttMs = 0;
    double sloSeconds = 1.0;
    // The policies raced on the same link schedule: adaptive | text | int8 | level:N. One entry is
    // a single run.
    QStringList policies{QStringLiteral("adaptive")};
    QString hardware = QStringLiteral("measured");  // a HardwarePreset id, or "custom"
    double prefillTokensPerSecond = 0, decodeGBps = 0;  // the preset's rates (0 = measured)
    double weightPassSeconds = -1;                       // the preset's weight pass (< 0 = none)
    QString store;  // "" = encode the cache now; else .kvc files "a,b", a folder or redis://HOST:PORT/PREFIX
};

struct StreamChunkPoint {
    int lane = 0;        // index of the policy in the race
    int index = 0;
    int level = 0;       // 0 = text
    bool local = false;  // recomputed after fetching failed
    quint64 bytes = 0;
    double sentS = 0, firstByteS = 0, arrivedS = 0;
    double jobStartS = 0, decodedS = 0;  // 0 until the run finished
};

struct StreamRunResult {
    int run = 0;
    int lane = 0;
    QString policy, link, hardware;
    bool modelled = false;  // compute parts modelled on target hardware
    double sloSeconds = 0, ttftSeconds = 0;
    bool sloMet = false;
    double startS = 0;  // when this run began, seconds since the race began (back to back: after the lanes before)
    static constexpr int kParts = 6;
    // transfer, decode, recompute, KV load, prefill, first token: the names the table, the plots
    // and the race file (its "ttft_parts" keys) use.
    static const char* partName(int part);
    double parts[kParts] = {0, 0, 0, 0, 0, 0};
    std::vector<StreamChunkPoint> chunks;
    quint64 deliveredBytes = 0;
    double capacityBytes = 0;
    double linkSeconds = 0;
    double tokenAgreement = 0;
    // Which TTFT parts were modelled on the target hardware (the others were measured here).
    bool partModelled[kParts] = {false, false, false, false, false, false};
    // Quality of the assembled cache against the original (eval quality module: KL per token and
    // delta PPL on a held-out continuation, or on the question and the reference answer).
    bool hasQuality = false;
    double kl = 0, deltaPplPct = 0;
    QString text, referenceText;
    QStringList log;
};

struct LinkSeries {  // available rate of the link over link time
    std::vector<double> seconds, mbps;
};

// A whole race: what was run, on what, and every policy's result; what Save/Open run keep.
struct RaceRecord {
    StreamConfig config;
    QString cache;  // "978 tokens of SmolLM2-135M-Instruct"
    LinkSeries available;
    QString qualitySource;  // what KL and delta PPL were scored on ("continuation text", ...)
    std::vector<StreamRunResult> results;  // by lane
};

}  // namespace kvscope

Q_DECLARE_METATYPE(kvscope::ModelInfo)
Q_DECLARE_METATYPE(kvscope::TokenPieces)
Q_DECLARE_METATYPE(kvscope::EntropyMap)
Q_DECLARE_METATYPE(kvscope::HistogramData)
Q_DECLARE_METATYPE(kvscope::TokenMapData)
Q_DECLARE_METATYPE(kvscope::TrialFigures)
Q_DECLARE_METATYPE(kvscope::QualityFigures)
Q_DECLARE_METATYPE(kvscope::RdPoint)
Q_DECLARE_METATYPE(kvscope::StreamConfig)
Q_DECLARE_METATYPE(kvscope::StreamChunkPoint)
Q_DECLARE_METATYPE(kvscope::StreamRunResult)
Q_DECLARE_METATYPE(kvscope::LinkSeries)
Q_DECLARE_METATYPE(kvscope::RaceRecord)
