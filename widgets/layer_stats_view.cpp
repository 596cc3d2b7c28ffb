#include "layer_stats_view.h"

#include "plot_style.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QToolTip>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// Graph order in the layer plot; tests and CSV rely on it.
enum LayerGraph { KRaw = 0, KDelta = 1, VRaw = 2, VDelta = 3, LayerGraphCount = 4 };


QLabel* titleLabel(const QString& text)
{
    auto* label = new QLabel(text);
    QFont f = label->font();
    f.setBold(true);
    label->setFont(f);
    return label;
}

QLabel* readingLabel(const QString& objectName)
{
    auto* label = new QLabel;
    label->setObjectName(objectName);
    label->setTextInteractionFlags(Qt::TextSelectableByMouse);
    label->setWordWrap(true);
    return label;
}

}  // namespace

QString LayerStatsView::kindLabel(KvKind kind)
{
    return kind == KvKind::Key ? QStringLiteral("keys") : QStringLiteral("values");
}

LayerStatsView::LayerStatsView(QWidget* parent) : QWidget(parent)
{
    // Layer section: metric picker + log toggle above the per-layer plot.
    m_metricCombo = new QComboBox;
    m_metricCombo->setObjectName(QStringLiteral("metricCombo"));
    m_metricCombo->addItem(tr("Variance along tokens: raw vs delta"));
    m_metricCombo->addItem(tr("Entropy of quantized symbols: raw vs delta"));
    m_metricCombo->setToolTip(
        tr("Raw: the values as captured. Delta: each value minus the first (anchor) "
           "token of its group, as CacheGen encodes them."));
    m_logScale = new QCheckBox(tr("Log scale"));
    m_logScale->setObjectName(QStringLiteral("logScale"));
    m_logScale->setChecked(true);
    m_layerInfo = readingLabel(QStringLiteral("layerInfo"));

    m_layerPlot = new kvscope::Plot;
    m_layerPlot->setObjectName(QStringLiteral("layerPlot"));
    setupLayerPlot();

    auto* layerBar = new QHBoxLayout;
    layerBar->addWidget(new QLabel(tr("Per layer:")));
    layerBar->addWidget(m_metricCombo);
    layerBar->addWidget(m_logScale);
    layerBar->addStretch(1);
    auto* layerBox = new QWidget;
    auto* layerLayout = new QVBoxLayout(layerBox);
    layerLayout->setContentsMargins(0, 0, 0, 0);
    layerLayout->addWidget(titleLabel(tr("1 · Token locality: nearby tokens have similar values")));
    layerLayout->addLayout(layerBar);
    layerLayout->addWidget(m_layerPlot, 1);
    layerLayout->addWidget(m_layerInfo);

    // Channel section: layer and kind pickers above the per-channel absmax bars.
    m_layerCombo = new QComboBox;
    m_layerCombo->setObjectName(QStringLiteral("layerCombo"));
    m_layerCombo->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    m_kindCombo = new QComboBox;
    m_kindCombo->setObjectName(QStringLiteral("kindCombo"));
    m_kindCombo->addItem(tr("Keys (K)"), int(KvKind::Key));
    m_kindCombo->addItem(tr("Values (V)"), int(KvKind::Value));
    m_channelInfo = readingLabel(QStringLiteral("channelInfo"));

    m_channelPlot = new kvscope::Plot;
    m_channelPlot->setObjectName(QStringLiteral("channelPlot"));
    setupChannelPlot();

    auto* channelBar = new QHBoxLayout;
    channelBar->addWidget(new QLabel(tr("Per channel absmax of")));
    channelBar->addWidget(m_layerCombo);
    channelBar->addWidget(m_kindCombo);
    channelBar->addStretch(1);
    auto* channelBox = new QWidget;
    auto* channelLayout = new QVBoxLayout(channelBox);
    channelLayout->setContentsMargins(0, 0, 0, 0);
    channelLayout->addWidget(titleLabel(tr("3 · Distributions differ by layer and channel")));
    channelLayout->addLayout(channelBar);
    channelLayout->addWidget(m_channelPlot, 1);
    channelLayout->addWidget(m_channelInfo);

    // Sensitivity section: per layer, the quality cost of quantizing that layer alone.
    m_sensPlot = new kvscope::Plot;
    m_sensPlot->setObjectName(QStringLiteral("sensitivityPlot"));
    setupSensitivityPlot();
    m_sensInfo = readingLabel(QStringLiteral("sensitivityInfo"));
    m_sensInfo->setText(tr("Not measured yet."));
    m_sensBins = new QSpinBox;
    m_sensBins->setObjectName(QStringLiteral("sensitivityBins"));
    m_sensBins->setRange(4, 64);
    m_sensBins->setSingleStep(2);
    m_sensBins->setValue(4);
    m_sensBins->setSuffix(tr(" bins"));
    m_sensBins->setToolTip(tr("Each layer's K (then V) alone is quantized to this many bins, the others kept exact"));
    m_sensButton = new QPushButton(tr("Measure"));
    m_sensButton->setObjectName(QStringLiteral("sensitivityButton"));
    m_sensButton->setEnabled(false);
    connect(m_sensButton, &QPushButton::clicked, this, [this] { emit sensitivityRequested(m_sensBins->value()); });
    auto* sensBar = new QHBoxLayout;
    sensBar->addWidget(new QLabel(tr("Quantize one layer alone to")));
    sensBar->addWidget(m_sensBins);
    sensBar->addWidget(m_sensButton);
    sensBar->addStretch(1);
    auto* sensBox = new QWidget;
    auto* sensLayout = new QVBoxLayout(sensBox);
    sensLayout->setContentsMargins(0, 0, 0, 0);
    sensLayout->addWidget(titleLabel(tr("2 · Layer sensitivity: errors in early layers cost more")));
    sensLayout->addLayout(sensBar);
    sensLayout->addWidget(m_sensPlot, 1);
    sensLayout->addWidget(m_sensInfo);

    auto* top = new QSplitter(Qt::Horizontal);
    top->setObjectName(QStringLiteral("observationsTopSplitter"));
    top->addWidget(layerBox);
    top->addWidget(sensBox);
    top->setChildrenCollapsible(false);
    auto* splitter = new QSplitter(Qt::Vertical);
    splitter->setObjectName(QStringLiteral("statsSplitter"));
    splitter->addWidget(top);
    splitter->addWidget(channelBox);
    splitter->setChildrenCollapsible(false);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->addWidget(splitter);

    connect(m_metricCombo, qOverload<int>(&QComboBox::currentIndexChanged), this,
            [this] { updateLayerPlot(); });
    connect(m_logScale, &QCheckBox::toggled, this, [this] {
        updateLogScale();
        rescaleLayerPlot();
        replotSoon(m_layerPlot);
    });
    auto channelChanged = [this] {
        updateChannelPlot();
        emit channelSelectionChanged(selectedLayer(), selectedKind());
    };
    connect(m_layerCombo, qOverload<int>(&QComboBox::currentIndexChanged), this, channelChanged);
    connect(m_kindCombo, qOverload<int>(&QComboBox::currentIndexChanged), this, channelChanged);

    clear();
}

LayerStatsView::~LayerStatsView() = default;

void LayerStatsView::setupLayerPlot()
{
    QCustomPlot* plot = m_layerPlot;
    plot->setMinimumHeight(180);
    plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    plot->axisRect()->setRangeDrag(Qt::Horizontal);
    plot->axisRect()->setRangeZoom(Qt::Horizontal);
    plot->xAxis->setLabel(tr("layer"));
    QSharedPointer<QCPAxisTickerFixed> ticker(new QCPAxisTickerFixed);
    ticker->setTickStep(1.0);
    ticker->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
    plot->xAxis->setTicker(ticker);

    const struct {
        const char* name;
        QColor color;
        Qt::PenStyle style;
        QCPScatterStyle::ScatterShape shape;
    } graphs[LayerGraphCount] = {
        {"K raw", style::keyColor(), Qt::SolidLine, QCPScatterStyle::ssDisc},
        {"K delta", style::keyColor(), Qt::DashLine, QCPScatterStyle::ssCircle},
        {"V raw", style::valueColor(), Qt::SolidLine, QCPScatterStyle::ssDisc},
        {"V delta", style::valueColor(), Qt::DashLine, QCPScatterStyle::ssCircle},
    };
    for (const auto& g : graphs) {
        QCPGraph* graph = plot->addGraph();
        graph->setName(QString::fromLatin1(g.name));
        graph->setPen(QPen(g.color, 2, g.style));
        graph->setScatterStyle(QCPScatterStyle(g.shape, g.color, g.color, 6));
        graph->setLineStyle(QCPGraph::lsLine);
    }
    style::putLegendAbove(plot);

    // A click (not a drag) on the layer plot picks that layer for the channel plot below.
    plot->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(plot, &QCustomPlot::customContextMenuRequested, this,
            [this](const QPoint& pos) { showContextMenu(Plot::Layers, pos); });
    connect(plot, &QCustomPlot::mousePress, this,
            [plot](QMouseEvent* e) { plot->setProperty("kvscopePressPos", e->pos()); });
    connect(plot, &QCustomPlot::mouseRelease, this, [this, plot](QMouseEvent* e) {
        if (e->button() != Qt::LeftButton || m_layers.empty()) return;
        const QPoint press = plot->property("kvscopePressPos").toPoint();
        if ((e->pos() - press).manhattanLength() > 4) return;
        const int layer = int(std::lround(plot->xAxis->pixelToCoord(e->pos().x())));
        if (std::binary_search(m_layers.begin(), m_layers.end(), layer))
            selectChannels(layer, selectedKind());
    });
    connect(plot, &QCustomPlot::mouseMove, this, [this, plot](QMouseEvent* e) {
        if (m_layers.empty() || e->buttons() != Qt::NoButton) return;
        const int layer = int(std::lround(plot->xAxis->pixelToCoord(e->pos().x())));
        if (!std::binary_search(m_layers.begin(), m_layers.end(), layer)) {
            QToolTip::hideText();
            return;
        }
        QString text = tr("layer %1").arg(layer);
        for (int i = 0; i < plot->graphCount(); ++i) {
            const auto data = plot->graph(i)->data();
            const auto it = data->findBegin(layer, false);
            if (it != data->constEnd() && it->key == layer)
                text += QStringLiteral("\n%1: %2").arg(plot->graph(i)->name()).arg(it->value, 0, 'g', 4);
        }
        QToolTip::showText(e->globalPosition().toPoint(), text, plot);
    });
}

void LayerStatsView::setupChannelPlot()
{
    QCustomPlot* plot = m_channelPlot;
    plot->setMinimumHeight(180);
    plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    plot->axisRect()->setRangeDrag(Qt::Horizontal);
    plot->axisRect()->setRangeZoom(Qt::Horizontal);
    plot->xAxis->setLabel(tr("channel (head × head_dim + d)"));
    plot->yAxis->setLabel(tr("absmax"));

    m_channelBars = new QCPBars(plot->xAxis, plot->yAxis);
    m_channelBars->setName(QStringLiteral("channels"));
    m_channelBars->setWidth(0.9);
    m_channelBars->setPen(Qt::NoPen);
    m_channelBars->setBrush(style::keyColor());  // the selected kind's colour, set per update
    m_outlierBars = new QCPBars(plot->xAxis, plot->yAxis);
    m_outlierBars->setName(QStringLiteral("outliers"));
    m_outlierBars->setWidth(0.9);
    m_outlierBars->setPen(QPen(style::outlierColor(), 1));  // a pen keeps thin outlier bars visible among 1000s
    m_outlierBars->setBrush(style::outlierColor());
    style::putLegendAbove(plot);

    plot->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(plot, &QCustomPlot::customContextMenuRequested, this,
            [this](const QPoint& pos) { showContextMenu(Plot::Channels, pos); });
    connect(plot, &QCustomPlot::mouseMove, this, [this](QMouseEvent* e) { showChannelToolTip(e); });
}

const TensorStats* LayerStatsView::find(int layer, KvKind kind) const
{
    const auto it = std::lower_bound(m_stats.begin(), m_stats.end(), std::make_pair(layer, kind),
                                     [](const TensorStats& s, const std::pair<int, KvKind>& k) {
                                         return std::make_pair(s.layer, s.kind) < k;
                                     });
    return it != m_stats.end() && it->layer == layer && it->kind == kind ? &*it : nullptr;
}

int LayerStatsView::selectedLayer() const
{
    return m_layerCombo->currentIndex() < 0 ? -1 : m_layerCombo->currentData().toInt();
}

KvKind LayerStatsView::selectedKind() const
{
    return m_kindCombo->currentData().toInt() == int(KvKind::Value) ? KvKind::Value : KvKind::Key;
}

LayerStatsView::LayerMetric LayerStatsView::layerMetric() const
{
    return m_metricCombo->currentIndex() == 1 ? LayerMetric::Entropy : LayerMetric::Variance;
}

void LayerStatsView::clear()
{
    setStats({});
}

void LayerStatsView::setStats(const std::vector<TensorStats>& stats)
{
    const int previousLayer = selectedLayer();

    m_stats = stats;
    std::stable_sort(m_stats.begin(), m_stats.end(), [](const TensorStats& a, const TensorStats& b) {
        return std::make_pair(a.layer, a.kind) < std::make_pair(b.layer, b.kind);
    });
    m_layers.clear();
    for (const TensorStats& s : m_stats)
        if (m_layers.empty() || m_layers.back() != s.layer) m_layers.push_back(s.layer);

    {
        // One rebuild, one channel redraw: the combo must not redraw per inserted item.
        const QSignalBlocker block(m_layerCombo);
        m_layerCombo->clear();
        for (int layer : m_layers) m_layerCombo->addItem(tr("layer %1").arg(layer), layer);
        const int keep = m_layerCombo->findData(previousLayer);
        m_layerCombo->setCurrentIndex(keep >= 0 ? keep : (m_layers.empty() ? -1 : 0));
    }
    m_layerCombo->setEnabled(!m_layers.empty());
    m_kindCombo->setEnabled(!m_layers.empty());

    updateLayerPlot();
    updateChannelPlot();
    if (selectedLayer() != previousLayer) emit channelSelectionChanged(selectedLayer(), selectedKind());
}

void LayerStatsView::setHeadDim(int headDim)
{
    m_headDim = std::max(0, headDim);
    updateChannelPlot();
}

void LayerStatsView::selectChannels(int layer, KvKind kind)
{
    const int index = m_layerCombo->findData(layer);
    if (index < 0) return;
    const QSignalBlocker blockKind(m_kindCombo);
    m_kindCombo->setCurrentIndex(m_kindCombo->findData(int(kind)));
    if (m_layerCombo->currentIndex() == index) {
        // Only the kind may have changed; the layer combo would not signal.
        updateChannelPlot();
        emit channelSelectionChanged(layer, kind);
    } else {
        m_layerCombo->setCurrentIndex(index);
    }
}

void LayerStatsView::setLayerMetric(LayerMetric metric)
{
    m_metricCombo->setCurrentIndex(metric == LayerMetric::Entropy ? 1 : 0);
}

void LayerStatsView::updateLayerPlot()
{
    const bool entropy = layerMetric() == LayerMetric::Entropy;
    QVector<double> keys[LayerGraphCount], values[LayerGraphCount];
    double rawSum[2] = {0, 0}, deltaSum[2] = {0, 0};
    int count[2] = {0, 0};
    for (const TensorStats& s : m_stats) {
        const int k = s.kind == KvKind::Key ? 0 : 1;
        const double raw = entropy ? s.entropyBits : s.varianceRaw;
        const double delta = entropy ? s.entropyBitsDelta : s.varianceDelta;
        keys[2 * k].push_back(s.layer);
        values[2 * k].push_back(raw);
        keys[2 * k + 1].push_back(s.layer);
        values[2 * k + 1].push_back(delta);
        rawSum[k] += raw;
        deltaSum[k] += delta;
        ++count[k];
    }
    for (int i = 0; i < LayerGraphCount; ++i) m_layerPlot->graph(i)->setData(keys[i], values[i], true);

    m_layerPlot->yAxis->setLabel(entropy ? tr("entropy (bits/value)")
                                         : tr("variance along tokens"));  // mean over channels: said in the reading
    updateLogScale();
    rescaleLayerPlot();
    replotSoon(m_layerPlot);

    if (m_stats.empty()) {
        m_layerInfo->setText(tr("No statistics: open a KV file (File ▸ Open) or run the synthetic demo."));
    } else if (entropy) {
        QStringList parts;
        const char* kindNames[2] = {"K", "V"};
        for (int k = 0; k < 2; ++k)
            if (count[k] > 0)
                parts << tr("%1 %2 → %3 bits")
                             .arg(QLatin1String(kindNames[k]))
                             .arg(rawSum[k] / count[k], 0, 'f', 2)
                             .arg(deltaSum[k] / count[k], 0, 'f', 2);
        m_layerInfo->setText(tr("Entropy per value, raw → delta (mean over layers): %1").arg(parts.join(QStringLiteral(", "))));
    } else {
        m_layerInfo->setText(localityReading());
    }
}

QString LayerStatsView::localityReading() const
{
    if (m_stats.empty()) return {};
    const double k = localityRatio(m_stats, KvKind::Key);
    const double v = localityRatio(m_stats, KvKind::Value);
    const double all = localityRatio(m_stats);
    auto fmt = [](double r) { return std::isinf(r) ? QStringLiteral("∞") : QString::number(r, 'f', 2); };
    const QString figures = tr("raw/delta variance K %1×, V %2×").arg(fmt(k), fmt(v));
    if (all > 1.05)
        return tr("Reading: deltas against each group's anchor vary %1× less than the raw values (%2): "
                  "delta coding pays off on this cache.")
            .arg(fmt(all), figures);
    if (all < 0.95)
        return tr("Reading: deltas against the anchor vary more than the raw values (%1): token locality is weak "
                  "on this cache, so delta coding does not pay here.")
            .arg(figures);
    return tr("Reading: deltas and raw values vary about as much (%1): delta coding gains little here.").arg(figures);
}

void LayerStatsView::updateLogScale()
{
    // A log axis cannot show zero, and entropies sit in a narrow band where log scale only hurts.
    bool allPositive = true;
    for (int i = 0; i < m_layerPlot->graphCount(); ++i)
        for (const QCPGraphData& d : *m_layerPlot->graph(i)->data())
            if (!(d.value > 0)) allPositive = false;
    const bool possible = layerMetric() == LayerMetric::Variance && allPositive;
    m_logScale->setEnabled(possible);
    const bool log = possible && m_logScale->isChecked();
    QCPAxis* axis = m_layerPlot->yAxis;
    if (log && axis->scaleType() != QCPAxis::stLogarithmic) {
        axis->setScaleType(QCPAxis::stLogarithmic);
        axis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
        axis->setNumberFormat(QStringLiteral("eb"));
        axis->setNumberPrecision(0);
    } else if (!log && axis->scaleType() != QCPAxis::stLinear) {
        axis->setScaleType(QCPAxis::stLinear);
        axis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
        axis->setNumberFormat(QStringLiteral("gbd"));
        axis->setNumberPrecision(6);
    }
}

void LayerStatsView::rescaleLayerPlot()
{
    m_layerPlot->rescaleAxes();
    if (!m_layers.empty())
        m_layerPlot->xAxis->setRange(m_layers.front() - 0.5, m_layers.back() + 0.5);
    else
        m_layerPlot->xAxis->setRange(-0.5, 0.5);
    QCPAxis* axis = m_layerPlot->yAxis;
    const QCPRange y = axis->range();
    if (axis->scaleType() == QCPAxis::stLogarithmic) {
        axis->setRange(y.lower / 1.4, y.upper * 1.4);
    } else {
        // Read from zero, so "how much smaller" is visible.
        axis->setRange(std::min(0.0, y.lower), y.upper > 0 ? y.upper * 1.1 : 1.0);
    }
}

void LayerStatsView::updateChannelPlot()
{
    QCustomPlot* plot = m_channelPlot;
    plot->clearItems();
    const int layer = selectedLayer();
    const KvKind kind = selectedKind();
    const TensorStats* s = layer >= 0 ? find(layer, kind) : nullptr;

    QVector<double> keys, values, outlierKeys, outlierValues;
    if (s) {
        std::vector<char> isOutlier(s->channels.size(), 0);
        for (int c : s->outlierChannels)
            if (c >= 0 && size_t(c) < isOutlier.size()) isOutlier[size_t(c)] = 1;
        for (size_t c = 0; c < s->channels.size(); ++c) {
            (isOutlier[c] ? outlierKeys : keys).push_back(double(c));
            (isOutlier[c] ? outlierValues : values).push_back(double(s->channels[c].absmax));
        }
    }
    m_channelBars->setBrush(style::kindColor(kind));
    m_channelBars->setData(keys, values, true);
    m_outlierBars->setData(outlierKeys, outlierValues, true);

    const int numChannels = s ? int(s->channels.size()) : 0;
    double top = 0;
    for (double v : values) top = std::max(top, v);
    for (double v : outlierValues) top = std::max(top, v);
    plot->xAxis->setRange(-0.5, std::max(numChannels, 1) - 0.5);
    plot->yAxis->setRange(0, top > 0 ? top * 1.08 : 1.0);

    // Head boundaries, when few enough to stay readable.
    if (m_headDim > 0 && numChannels > m_headDim && numChannels / m_headDim <= 64) {
        for (int c = m_headDim; c < numChannels; c += m_headDim) {
            auto* line = new QCPItemStraightLine(plot);
            line->point1->setCoords(c - 0.5, 0);
            line->point2->setCoords(c - 0.5, 1);
            line->setPen(QPen(style::neutralColor(), 1, Qt::DashLine));
        }
    }
    replotSoon(plot);

    if (!s) {
        m_channelInfo->setText(
            layer >= 0 ? tr("No %1 statistics for layer %2.").arg(kindLabel(kind)).arg(layer) : QString());
        return;
    }
    const double med = medianChannelAbsmax(*s);
    QString text = tr("Reading: layer %1 %2: %3 channels, absmax %4 (median channel %5, %6× the median)")
                       .arg(layer)
                       .arg(kindLabel(kind))
                       .arg(numChannels)
                       .arg(double(s->all.absmax), 0, 'g', 4)
                       .arg(med, 0, 'g', 4)
                       .arg(med > 0 ? double(s->all.absmax) / med : 0.0, 0, 'f', 1);
    if (s->outlierChannels.empty()) {
        text += tr("; no channel above 6× the median.");
    } else {
        QStringList list;
        const size_t shown = std::min<size_t>(s->outlierChannels.size(), 8);
        for (size_t i = 0; i < shown; ++i) {
            const int c = s->outlierChannels[i];
            const double v = c >= 0 && c < numChannels ? double(s->channels[size_t(c)].absmax) : 0.0;
            list << QStringLiteral("%1 (%2)").arg(c).arg(v, 0, 'g', 3);
        }
        if (shown < s->outlierChannels.size()) list << tr("… %1 more").arg(s->outlierChannels.size() - shown);
        text += tr("; %n outlier channel(s) above 6× the median, in red: %1", nullptr, int(s->outlierChannels.size()))
                    .arg(list.join(QStringLiteral(", ")));
    }
    m_channelInfo->setText(text);
}

void LayerStatsView::showChannelToolTip(QMouseEvent* event)
{
    const TensorStats* s = find(selectedLayer(), selectedKind());
    if (!s || event->buttons() != Qt::NoButton) return;
    const int c = int(std::lround(m_channelPlot->xAxis->pixelToCoord(event->pos().x())));
    if (c < 0 || size_t(c) >= s->channels.size()) {
        QToolTip::hideText();
        return;
    }
    const ChannelStats& ch = s->channels[size_t(c)];
    QString text = tr("channel %1").arg(c);
    if (m_headDim > 0) text += tr(" (head %1, d %2)").arg(c / m_headDim).arg(c % m_headDim);
    if (std::find(s->outlierChannels.begin(), s->outlierChannels.end(), c) != s->outlierChannels.end())
        text += tr(", outlier");
    text += tr("\nabsmax %1\nmin %2  max %3\nmean %4  std %5")
                .arg(double(ch.absmax), 0, 'g', 4)
                .arg(double(ch.min), 0, 'g', 4)
                .arg(double(ch.max), 0, 'g', 4)
                .arg(double(ch.mean), 0, 'g', 4)
                .arg(double(ch.std), 0, 'g', 4);
    QToolTip::showText(event->globalPosition().toPoint(), text, m_channelPlot);
}

QString LayerStatsView::reading(Observation which) const
{
    switch (which) {
    case Observation::Locality: return m_layerInfo->text();
    case Observation::Sensitivity: return m_sensInfo->text();
    case Observation::Channels: return m_channelInfo->text();
    }
    return {};
}

}  // namespace kvscope
