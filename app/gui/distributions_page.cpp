#include "distributions_page.h"

#include "distributions_view.h"
#include "distributions_worker.h"
#include "layer_stats_view.h"

namespace kvscope {

DistributionsPage::DistributionsPage(QObject* parent)
    : QObject(parent), m_statsView(new LayerStatsView), m_explorer(new DistributionsView),
      m_worker(new DistributionsWorker(this))
{
    m_statsView->setObjectName(QStringLiteral("observationsView"));
    m_explorer->setObjectName(QStringLiteral("distributionsView"));
    connect(m_explorer, &DistributionsView::selectionChanged, m_worker, &DistributionsWorker::requestSelection);
    connect(m_explorer, &DistributionsView::entropyRequested, m_worker, &DistributionsWorker::requestEntropy);
    connect(m_worker, &DistributionsWorker::histogramReady, m_explorer, &DistributionsView::setHistogram);
    connect(m_worker, &DistributionsWorker::tokenMapReady, m_explorer, &DistributionsView::setTokenMap);
    connect(m_worker, &DistributionsWorker::entropyReady, m_explorer, &DistributionsView::setEntropyMap);
    connect(m_worker, &DistributionsWorker::failed, this,
            [this](const QString& message) { emit statusMessage(tr("Distributions: %1").arg(message)); });
}

void DistributionsPage::setCache(std::shared_ptr<const KvSet> kv, const std::vector<TensorStats>& stats, int headDim)
{
    m_statsView->setHeadDim(headDim);
    m_statsView->setStats(stats);
    m_worker->setKv(std::move(kv));
    m_explorer->setStats(stats, headDim);
}

void DistributionsPage::resetSensitivity(bool canMeasure, bool canScore, const QString& qualityNote)
{
    m_statsView->setSensitivity({}, 0);
    m_statsView->setSensitivityAvailable(
        canMeasure,
        canMeasure ? tr("Press Measure: each layer's K, then V, quantized alone and scored against the original "
                        "(background, cancellable).")
        : canScore ? tr("Needs a held-out continuation to score: capture a sample context (page 1).")
                   : tr("Needs the model this cache came from (open it on page 1): %1").arg(qualityNote));
}

}  // namespace kvscope
