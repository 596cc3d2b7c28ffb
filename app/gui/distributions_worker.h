// DistributionsWorker: answers the DistributionsView's requests (histograms, the token x channel
// map of a layer, the per-channel entropy map at some bins) on JobLanes (background_job.h), for
// the cache set with setKv(). Latest request wins: an answer to a superseded request is dropped,
// so a user scrolling through layers never waits for the layers they skipped.
#pragma once

#include "view_data.h"

#include "kv/kv_set.h"

#include <QObject>
#include <memory>

namespace kvscope {

class JobLane;

class DistributionsWorker : public QObject {
    Q_OBJECT
public:
    static constexpr int kHistogramBins = 120;
    static constexpr int kMaxMapTokens = 1024;  // token map rows; longer caches are strided

    explicit DistributionsWorker(QObject* parent = nullptr);
    ~DistributionsWorker() override;  // waits for the job in flight

    void setKv(std::shared_ptr<const KvSet> kv);
    bool isBusy() const;

public slots:
    void requestSelection(int layer, kvscope::KvKind kind, int channel);
    void requestEntropy(int bins);

signals:
    void histogramReady(const kvscope::HistogramData& data);
    void tokenMapReady(const kvscope::TokenMapData& data);
    void entropyReady(const kvscope::EntropyMap& map);
    void failed(const QString& message);

private:
    JobLane* m_selection;  // histogram + token map of the selection
    JobLane* m_entropy;    // entropy maps
    std::shared_ptr<const KvSet> m_kv;
};

}  // namespace kvscope
