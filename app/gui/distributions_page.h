// DistributionsPage: the Distributions page's controller. It owns the views of the page's two
// tabs, CacheGen's three observations (LayerStatsView) and the layer/channel explorer (DistributionsView), and the
// worker that computes the explorer's histograms, token maps and entropy maps for the cache shown.
// Sensitivity is measured by the codec page's session; the window passes it through.
#pragma once

#include "kv/kv_set.h"
#include "kv/kv_stats.h"

#include <QObject>
#include <QString>

#include <memory>
#include <vector>

namespace kvscope {

class DistributionsView;
class DistributionsWorker;
class LayerStatsView;

class DistributionsPage : public QObject {
    Q_OBJECT
public:
    explicit DistributionsPage(QObject* parent = nullptr);

    LayerStatsView* statsView() const { return m_statsView; }
    DistributionsView* explorer() const { return m_explorer; }
    DistributionsWorker* worker() const { return m_worker; }

    // A newly loaded cache and its statistics.
    void setCache(std::shared_ptr<const KvSet> kv, const std::vector<TensorStats>& stats, int headDim);
    // Clears the sensitivity shown and says whether and why it can be measured.
    void resetSensitivity(bool canMeasure, bool canScore, const QString& qualityNote);

signals:
    void statusMessage(const QString& text);

private:
    LayerStatsView* m_statsView;
    DistributionsView* m_explorer;
    DistributionsWorker* m_worker;
};

}  // namespace kvscope
