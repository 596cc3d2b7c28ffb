// KvLoader: gets a KV cache (from an HDF5 file or the synthetic generator) and its statistics
// without blocking the UI thread, with progress and cancel.
//   stage 1, "read":  readKvH5 (or makeSyntheticKv) on a one-thread pool;
//   stage 2, "stats": computeTensorStats per (layer, kind) with QtConcurrent::mapped on the global
//                     pool, so progress counts tensors and cancel stops between tensors.
// Both stages hand plain values to the UI thread through QFutureWatcher's queued signals. The
// object lives on the UI thread; its signals fire there.
#pragma once

#include "kv/kv_set.h"
#include "kv/kv_stats.h"

#include <QElapsedTimer>
#include <QMetaType>
#include <QObject>
#include <QString>
#include <QThreadPool>

#include <functional>
#include <memory>
#include <vector>

namespace kvscope {

// What the summary dock shows about one loaded cache; plain values, safe to copy across threads.
struct KvSummary {
    QString source;  // absolute file path; empty for a synthetic cache
    QString origin;  // what to show as the source: the path, or how the cache was made
    bool synthetic = false;
    KvShape shape;
    DType dtype = DType::F16;
    QString modelName;
    QString modelFingerprint;
    quint64 kvBytes = 0;     // K and V of every layer, in dtype
    qint64 fileBytes = -1;   // on disk; -1 when not a file
    double readSeconds = 0;  // read (or generate) time
    double statsSeconds = 0;
};

class KvLoader : public QObject {
    Q_OBJECT
public:
    explicit KvLoader(QObject* parent = nullptr);
    ~KvLoader() override;

    // Each call abandons a load in progress (its results are dropped when they arrive).
    void loadFile(const QString& path);
    void loadSynthetic(const SyntheticSpec& spec);
    // A cache already in memory (a capture): only the statistics stage runs. captureSeconds is
    // shown as the read time.
    void loadKv(std::shared_ptr<const KvSet> kv, const QString& origin, double captureSeconds);
    // Writes the cache last loaded (writeKvH5, on the read pool so HDF5 calls never overlap).
    // Emits saved or saveFailed.
    void saveKv(const QString& path);
    // The cache behind the last `loaded` signal; null before one.
    std::shared_ptr<const KvSet> kv() const { return m_kv; }

    bool isRunning() const { return m_running; }
    void setStatsOptions(const StatsOptions& options) { m_options = options; }

public slots:
    // Stops scheduling statistics at once; a file read already under way cannot be interrupted
    // (readKvH5 has no cancel hook) and is dropped when it returns.
    void cancel();

signals:
    // maximum == 0: no measurable progress in this phase (show a busy indicator).
    void phaseChanged(const QString& text, int maximum);
    void progressChanged(int value);
    void loaded(const kvscope::KvSummary& summary, const std::vector<kvscope::TensorStats>& stats);
    void failed(const QString& message);
    void cancelled();
    void saved(const QString& path, double seconds);
    void saveFailed(const QString& message);

private:
    struct ReadOutcome;
    void start(const QString& phaseText, std::function<KvSet()> produce, KvSummary base);
    void startStats(quint64 generation, std::shared_ptr<const KvSet> kv, KvSummary summary);
    void finish();

    // Read stages run one at a time: the HDF5 library may be built without thread safety, and a
    // cancelled read still running must not overlap the next one.
    QThreadPool m_readPool;
    StatsOptions m_options;
    quint64 m_generation = 0;  // bumped per load; results of older generations are dropped
    bool m_running = false;
    std::shared_ptr<const KvSet> m_kv;  // last loaded
    std::function<void()> m_cancelStats;  // cancels the running stats stage, if any
    QElapsedTimer m_statsClock;
};

}  // namespace kvscope

Q_DECLARE_METATYPE(kvscope::KvSummary)
