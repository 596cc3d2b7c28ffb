// The layer statistics page's second observation: per-layer sensitivity (one layer quantized
// alone, its KL against the original cache) as bars, and the reading drawn from them.
#include "layer_stats_view.h"

#include "plot_export.h"
#include "plot_style.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QLabel>
#include <QPushButton>

#include <algorithm>

namespace kvscope {

void LayerStatsView::setupSensitivityPlot()
{
    QCustomPlot* plot = m_sensPlot;
    plot->setMinimumHeight(180);
    plot->xAxis->setLabel(tr("layer quantized alone"));
    plot->yAxis->setLabel(tr("KL vs the original cache"));
    QSharedPointer<QCPAxisTickerFixed> ticker(new QCPAxisTickerFixed);
    ticker->setTickStep(1.0);
    ticker->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
    plot->xAxis->setTicker(ticker);
    auto* group = new QCPBarsGroup(plot);
    for (KvKind kind : {KvKind::Key, KvKind::Value}) {
        auto* bars = new QCPBars(plot->xAxis, plot->yAxis);
        bars->setName(kind == KvKind::Key ? QStringLiteral("K") : QStringLiteral("V"));
        bars->setBrush(style::kindColor(kind));
        bars->setPen(Qt::NoPen);
        bars->setWidth(0.4);
        bars->setBarsGroup(group);
    }
    style::putLegendAbove(plot);
    installPlotMenu(plot, QStringLiteral("layer-sensitivity"));
}

void LayerStatsView::setSensitivityAvailable(bool available, const QString& note)
{
    m_sensButton->setEnabled(available);
    if (!note.isEmpty()) setSensitivityNote(note);
}

void LayerStatsView::setSensitivityNote(const QString& note)
{
    m_sensInfo->setText(note);
}

void LayerStatsView::setSensitivity(const std::vector<LayerSensitivity>& sensitivity, int bins)
{
    m_sensitivity = sensitivity;
    m_sensitivityBins = bins;
    bool anyKl = false;
    for (const LayerSensitivity& s : sensitivity) anyKl = anyKl || s.keyKl > 0 || s.valueKl > 0;
    // Without a held-out continuation there is no KL: the reconstruction error stands in.
    auto metric = [anyKl](const LayerSensitivity& s, KvKind kind) {
        if (anyKl) return kind == KvKind::Key ? s.keyKl : s.valueKl;
        return kind == KvKind::Key ? s.keyRms : s.valueRms;
    };
    m_sensPlot->yAxis->setLabel(anyKl ? tr("KL vs the original cache") : tr("RMS error of the layer"));
    double top = 0;
    for (int k = 0; k < 2; ++k) {
        QVector<double> x, y;
        for (const LayerSensitivity& s : sensitivity) {
            x << s.layer;
            y << metric(s, KvKind(k));
            top = std::max(top, y.back());
        }
        static_cast<QCPBars*>(m_sensPlot->plottable(k))->setData(x, y, true);
    }
    m_sensPlot->xAxis->setRange(-0.6, std::max<int>(1, int(sensitivity.size())) - 0.4);
    m_sensPlot->yAxis->setRange(0, top > 0 ? top * 1.1 : 1.0);
    replotSoon(m_sensPlot);
    if (sensitivity.empty()) {
        setSensitivityNote(tr("Not measured yet."));
        return;
    }
    // Reading: the first third of the layers against the last third.
    const size_t n = sensitivity.size();
    const size_t third = std::max<size_t>(1, n / 3);
    double early = 0, late = 0;
    for (size_t i = 0; i < third; ++i) early += metric(sensitivity[i], KvKind::Key) + metric(sensitivity[i], KvKind::Value);
    for (size_t i = n - third; i < n; ++i) late += metric(sensitivity[i], KvKind::Key) + metric(sensitivity[i], KvKind::Value);
    const QString what = anyKl ? tr("KL") : tr("RMS error");
    QString reading;
    if (late > 0 && early > 1.2 * late)
        reading = tr("Reading: at %1 bins the first %2 layer(s) cost %3× the %4 of the last %2: early layers are "
                     "more sensitive, so they deserve more bins.")
                      .arg(bins).arg(third).arg(early / late, 0, 'f', 1).arg(what);
    else if (early > 0 && late > 1.2 * early)
        reading = tr("Reading: at %1 bins the last %2 layer(s) cost %3× the %4 of the first %2: on this cache the "
                     "deep layers are the sensitive ones.")
                      .arg(bins).arg(third).arg(late / early, 0, 'f', 1).arg(what);
    else
        reading = tr("Reading: at %1 bins early and late layers cost about the same %2 (first %3 vs last %3: %4 vs "
                     "%5): no layer-wise gradient on this cache.")
                      .arg(bins).arg(what).arg(third).arg(early, 0, 'g', 3).arg(late, 0, 'g', 3);
    setSensitivityNote(reading);
}

}  // namespace kvscope
