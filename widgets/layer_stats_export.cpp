// The layer statistics page's data and images: both plots as CSV (to the clipboard), as image
// files, and the context menu that offers them.
#include "layer_stats_view.h"

#include "plot_export.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QApplication>
#include <QClipboard>
#include <QCursor>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QMenu>
#include <QSettings>
#include <QToolTip>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace kvscope {

namespace {

// Shortest text that reads back to the same number, so copied CSV loses nothing.
template <typename T>
QString csvNumber(T v)
{
    if (std::isnan(v)) return QStringLiteral("nan");
    if (std::isinf(v)) return v > 0 ? QStringLiteral("inf") : QStringLiteral("-inf");
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    return QString::fromLatin1(buf, int(res.ptr - buf));
}

}  // namespace

QString LayerStatsView::layersCsv() const
{
    QString csv = QStringLiteral(
        "layer,k_variance_raw,k_variance_delta,v_variance_raw,v_variance_delta,"
        "k_entropy_bits,k_entropy_bits_delta,v_entropy_bits,v_entropy_bits_delta,"
        "k_outlier_channels,v_outlier_channels\n");
    for (int layer : m_layers) {
        const TensorStats* k = find(layer, KvKind::Key);
        const TensorStats* v = find(layer, KvKind::Value);
        auto field = [](const TensorStats* s, auto member) { return s ? csvNumber(s->*member) : QString(); };
        QStringList row;
        row << QString::number(layer) << field(k, &TensorStats::varianceRaw)
            << field(k, &TensorStats::varianceDelta) << field(v, &TensorStats::varianceRaw)
            << field(v, &TensorStats::varianceDelta) << field(k, &TensorStats::entropyBits)
            << field(k, &TensorStats::entropyBitsDelta) << field(v, &TensorStats::entropyBits)
            << field(v, &TensorStats::entropyBitsDelta)
            << (k ? QString::number(k->outlierChannels.size()) : QString())
            << (v ? QString::number(v->outlierChannels.size()) : QString());
        csv += row.join(QLatin1Char(',')) + QLatin1Char('\n');
    }
    return csv;
}

QString LayerStatsView::channelsCsv() const
{
    QString csv = QStringLiteral("channel,min,max,mean,std,absmax,outlier\n");
    const TensorStats* s = find(selectedLayer(), selectedKind());
    if (!s) return csv;
    for (size_t c = 0; c < s->channels.size(); ++c) {
        const ChannelStats& ch = s->channels[c];
        const bool outlier = std::find(s->outlierChannels.begin(), s->outlierChannels.end(), int(c)) !=
                             s->outlierChannels.end();
        csv += QStringList{QString::number(c),
                           csvNumber(ch.min),
                           csvNumber(ch.max),
                           csvNumber(ch.mean),
                           csvNumber(ch.std),
                           csvNumber(ch.absmax),
                           outlier ? QStringLiteral("1") : QStringLiteral("0")}
                   .join(QLatin1Char(','));
        csv += QLatin1Char('\n');
    }
    return csv;
}

void LayerStatsView::copyCsv(Plot which)
{
    QApplication::clipboard()->setText(which == Plot::Layers ? layersCsv() : channelsCsv());
}

bool LayerStatsView::savePlot(Plot which, const QString& path)
{
    return kvscope::savePlot(which == Plot::Layers ? m_layerPlot : m_channelPlot, path, &m_error);
}

void LayerStatsView::exportWithDialog(Plot which)
{
    QSettings settings;
    const QString dir = settings.value(QStringLiteral("export/lastDir")).toString();
    const QString base =
        which == Plot::Layers
            ? QStringLiteral("kv-layers")
            : QStringLiteral("kv-layer%1-%2").arg(selectedLayer()).arg(kindLabel(selectedKind()));
    const QString path =
        QFileDialog::getSaveFileName(this, tr("Save plot"), QDir(dir).filePath(base + QStringLiteral(".png")),
                                     plotImageFilter());
    if (path.isEmpty()) return;
    settings.setValue(QStringLiteral("export/lastDir"), QFileInfo(path).absolutePath());
    if (!savePlot(which, path)) QToolTip::showText(QCursor::pos(), m_error, this);
}

void LayerStatsView::showContextMenu(Plot which, const QPoint& pos)
{
    QCustomPlot* plot = which == Plot::Layers ? m_layerPlot : m_channelPlot;
    // popup(), not exec(): the menu must not spin a nested event loop under the plot's feet.
    auto* menu = new QMenu(this);
    menu->setAttribute(Qt::WA_DeleteOnClose);
    QAction* copy = menu->addAction(tr("Copy data as CSV"), this, [this, which] { copyCsv(which); });
    copy->setObjectName(QStringLiteral("copyCsv"));
    copy->setEnabled(!m_stats.empty());
    QAction* save = menu->addAction(tr("Save image as…"), this, [this, which] { exportWithDialog(which); });
    save->setObjectName(QStringLiteral("saveImage"));
    menu->addSeparator();
    menu->addAction(tr("Reset zoom"), this, [this, which] {
        if (which == Plot::Layers)
            updateLayerPlot();
        else
            updateChannelPlot();
    });
    menu->popup(plot->mapToGlobal(pos));
}

}  // namespace kvscope
