// DistributionsWorker: answers the DistributionsView's requests (histograms, the token x channel
// map of a layer, the per-channel entropy map at some bins) on a worker thread, for the cache set
// with setKv(). Latest request wins: an answer to a superseded request is dropped, so a user
// scrolling through layers never waits for the layers they skipped.
#pragma once

#include "distributions_view.h"

#include "kv/kv_set.h"

#include <QObject>
#include <QThreadPool>

#include <atomic>
#include <memory>

namespace kvscope {

class DistributionsWorker : public QObject {
    Q_OBJECT
public:
    static constexpr int kHistogramBins = 120;
    static constexpr int kMaxMapTokens = 1024;  // token map rows; longer caches are strided

    explicit DistributionsWorker(QObject* parent = nullptr);
    ~DistributionsWorker() override;  // waits for the job in flight

    void setKv(std::shared_ptr<const KvSet> kv);
    bool isBusy() const { return m_pending > 0; }

public slots:
    void requestSelection(int layer, kvscope::KvKind kind, int channel);
    void requestEntropy(int bins);

signals:
    void histogramReady(const kvscope::HistogramData& data);
    void tokenMapReady(const kvscope::TokenMapData& data);
    void entropyReady(const kvscope::EntropyMap& map);
    void failed(const QString& message);

private:
    template <typename Job>
    void post(std::atomic<quint64>* generation, Job job);

    QThreadPool m_pool;
    std::shared_ptr<const KvSet> m_kv;
    std::atomic<quint64> m_selectionGeneration{0}, m_entropyGeneration{0};
    int m_pending = 0;
};

}  // namespace kvscope
