#include "distributions_view.h"

#include "plot_export.h"
#include "plot_style.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QComboBox>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QListWidget>
#include <QSpinBox>
#include <QSplitter>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

const char* kindLetter(KvKind k) { return k == KvKind::Key ? "K" : "V"; }

QCustomPlot* makePlot(const QString& objectName, const QString& title)
{
    auto* plot = new Plot;
    plot->setObjectName(objectName);
    plot->setMinimumSize(260, 180);
    plot->plotLayout()->insertRow(0);
    auto* text = new QCPTextElement(plot, title, QFont(plot->font().family(), 9, QFont::Bold));
    text->setObjectName(QStringLiteral("title"));
    plot->plotLayout()->addElement(0, 0, text);
    plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    style::applyPlotStyle(plot);
    return plot;
}

void setTitle(QCustomPlot* plot, const QString& title)
{
    if (auto* t = qobject_cast<QCPTextElement*>(plot->plotLayout()->element(0, 0))) t->setText(title);
}

QCPColorMap* makeColorMap(QCustomPlot* plot, const QString& name)
{
    auto* map = new QCPColorMap(plot->xAxis, plot->yAxis);
    map->setName(name);
    map->setInterpolate(false);
    auto* scale = new QCPColorScale(plot);
    plot->plotLayout()->addElement(1, 1, scale);
    scale->setBarWidth(10);
    map->setColorScale(scale);
    map->setGradient(style::sequentialGradient());  // after setColorScale, which adopts the scale's gradient
    auto* group = new QCPMarginGroup(plot);
    plot->axisRect()->setMarginGroup(QCP::msBottom | QCP::msTop, group);
    scale->setMarginGroup(QCP::msBottom | QCP::msTop, group);
    return map;
}

QCPItemStraightLine* makeMarker(QCustomPlot* plot)
{
    auto* line = new QCPItemStraightLine(plot);
    line->setPen(QPen(style::accentColor(), 1.5, Qt::DashLine));
    line->setVisible(false);
    return line;
}

}  // namespace

DistributionsView::DistributionsView(QWidget* parent) : QWidget(parent)
{
    m_kindCombo = new QComboBox;
    m_kindCombo->setObjectName(QStringLiteral("distKind"));
    m_kindCombo->addItem(tr("Keys (K)"), int(KvKind::Key));
    m_kindCombo->addItem(tr("Values (V)"), int(KvKind::Value));
    m_layerSpin = new QSpinBox;
    m_layerSpin->setObjectName(QStringLiteral("distLayer"));
    m_channelSpin = new QSpinBox;
    m_channelSpin->setObjectName(QStringLiteral("distChannel"));
    m_channelSpin->setMinimum(-1);
    m_channelSpin->setSpecialValueText(tr("all channels"));
    m_metricCombo = new QComboBox;
    m_metricCombo->setObjectName(QStringLiteral("distMetric"));
    m_metricCombo->addItem(tr("absmax"));
    m_metricCombo->addItem(tr("std"));
    m_metricCombo->addItem(tr("entropy"));
    m_binsSpin = new QSpinBox;
    m_binsSpin->setObjectName(QStringLiteral("distBins"));
    m_binsSpin->setRange(4, 256);
    m_binsSpin->setSingleStep(2);
    m_binsSpin->setValue(32);
    m_binsSpin->setSuffix(tr(" bins"));
    m_binsSpin->setToolTip(tr("Entropy of CacheGen's per-token symbols at this many bins"));
    m_info = new QLabel;
    m_info->setObjectName(QStringLiteral("distInfo"));

    auto* bar = new QHBoxLayout;
    bar->addWidget(new QLabel(tr("Kind:")));
    bar->addWidget(m_kindCombo);
    bar->addWidget(new QLabel(tr("Layer:")));
    bar->addWidget(m_layerSpin);
    bar->addWidget(new QLabel(tr("Channel:")));
    bar->addWidget(m_channelSpin);
    bar->addSpacing(12);
    bar->addWidget(new QLabel(tr("Heat map:")));
    bar->addWidget(m_metricCombo);
    bar->addWidget(m_binsSpin);
    bar->addWidget(m_info, 1);

    setupPlots();
    m_outliers = new QListWidget;
    m_outliers->setObjectName(QStringLiteral("outlierList"));
    m_outliers->setToolTip(tr("Channels whose absmax exceeds 6x the median channel's; click to select"));
    auto* outlierBox = new QWidget;
    auto* outlierLayout = new QVBoxLayout(outlierBox);
    outlierLayout->setContentsMargins(0, 0, 0, 0);
    outlierLayout->addWidget(new QLabel(tr("Outlier channels")));
    outlierLayout->addWidget(m_outliers);

    auto* grid = new QWidget;
    auto* gl = new QGridLayout(grid);
    gl->setContentsMargins(0, 0, 0, 0);
    gl->addWidget(m_heatPlot, 0, 0);
    gl->addWidget(m_histPlot, 0, 1);
    gl->addWidget(m_tokenPlot, 1, 0, 1, 2);
    auto* split = new QSplitter(Qt::Horizontal);
    split->addWidget(grid);
    split->addWidget(outlierBox);
    split->setStretchFactor(0, 5);
    split->setStretchFactor(1, 1);

    auto* layout = new QVBoxLayout(this);
    layout->addLayout(bar);
    layout->addWidget(split, 1);

    connect(m_kindCombo, &QComboBox::currentIndexChanged, this, [this] { onSelectorsChanged(); });
    connect(m_layerSpin, &QSpinBox::valueChanged, this, [this] { onSelectorsChanged(); });
    connect(m_channelSpin, &QSpinBox::valueChanged, this, [this] { onSelectorsChanged(); });
    connect(m_metricCombo, &QComboBox::currentIndexChanged, this, [this] {
        m_binsSpin->setEnabled(mapMetric() == MapMetric::Entropy);
        if (mapMetric() == MapMetric::Entropy && hasData() && m_entropy[int(selectedKind())].bins != entropyBins())
            emit entropyRequested(entropyBins());
        updateHeatmap();
    });
    connect(m_binsSpin, &QSpinBox::valueChanged, this, [this](int bins) {
        if (bins % 2) return;  // the spin steps by two; typed odd values wait for the next edit
        if (mapMetric() == MapMetric::Entropy && hasData()) emit entropyRequested(bins);
    });
    connect(m_outliers, &QListWidget::itemClicked, this, [this](QListWidgetItem* item) {
        select(selectedLayer(), selectedKind(), item->data(Qt::UserRole).toInt());
    });
    m_binsSpin->setEnabled(false);
    clear();
}

DistributionsView::~DistributionsView() = default;

void DistributionsView::setupPlots()
{
    m_heatPlot = makePlot(QStringLiteral("heatmapPlot"), tr("layer x channel"));
    m_heatPlot->xAxis->setLabel(tr("channel"));
    m_heatPlot->yAxis->setLabel(tr("layer"));
    m_heatMap = makeColorMap(m_heatPlot, tr("heat map"));
    m_heatMarker = makeMarker(m_heatPlot);
    installPlotMenu(m_heatPlot, QStringLiteral("kv-heatmap"));
    connect(m_heatPlot, &QCustomPlot::mouseRelease, this, &DistributionsView::heatmapClicked);

    m_histPlot = makePlot(QStringLiteral("histogramPlot"), tr("histogram"));
    m_histPlot->xAxis->setLabel(tr("value"));
    m_histPlot->yAxis->setLabel(tr("count"));
    auto* bars = new QCPBars(m_histPlot->xAxis, m_histPlot->yAxis);
    bars->setName(tr("histogram"));
    bars->setPen(Qt::NoPen);
    bars->setBrush(style::keyColor());
    installPlotMenu(m_histPlot, QStringLiteral("kv-histogram"));

    m_tokenPlot = makePlot(QStringLiteral("tokenPlot"), tr("token x channel"));
    m_tokenPlot->xAxis->setLabel(tr("channel"));
    m_tokenPlot->yAxis->setLabel(tr("token"));
    m_tokenMap = makeColorMap(m_tokenPlot, tr("values"));
    m_tokenMap->setGradient(style::divergingGradient());
    m_tokenMarker = makeMarker(m_tokenPlot);
    installPlotMenu(m_tokenPlot, QStringLiteral("kv-tokens"));
}

const TensorStats* DistributionsView::find(int layer, KvKind kind) const
{
    for (const TensorStats& s : m_stats)
        if (s.layer == layer && s.kind == kind) return &s;
    return nullptr;
}

int DistributionsView::selectedLayer() const { return hasData() ? m_layerSpin->value() : -1; }
KvKind DistributionsView::selectedKind() const
{
    return m_kindCombo->currentData().toInt() == int(KvKind::Value) ? KvKind::Value : KvKind::Key;
}
int DistributionsView::selectedChannel() const { return m_channelSpin->value(); }
DistributionsView::MapMetric DistributionsView::mapMetric() const { return MapMetric(m_metricCombo->currentIndex()); }
int DistributionsView::entropyBins() const { return m_binsSpin->value() & ~1; }

void DistributionsView::clear()
{
    m_stats.clear();
    m_layers = m_channels = 0;
    m_entropy[0] = m_entropy[1] = EntropyMap{};
    m_histogram = HistogramData{};
    m_updating = true;
    m_layerSpin->setRange(0, 0);
    m_channelSpin->setRange(-1, -1);
    m_updating = false;
    m_heatMap->data()->clear();
    m_tokenMap->data()->clear();
    static_cast<QCPBars*>(m_histPlot->plottable(0))->data()->clear();
    m_outliers->clear();
    m_heatMarker->setVisible(false);
    m_tokenMarker->setVisible(false);
    m_info->setText(tr("No KV cache yet: capture a context or open a KV file."));
    for (QCustomPlot* p : {m_heatPlot, m_histPlot, m_tokenPlot}) replotSoon(p);
}

void DistributionsView::setStats(const std::vector<TensorStats>& stats, int headDim)
{
    clear();
    if (stats.empty()) return;
    m_stats = stats;
    std::sort(m_stats.begin(), m_stats.end(), [](const TensorStats& a, const TensorStats& b) {
        return std::make_pair(a.layer, a.kind) < std::make_pair(b.layer, b.kind);
    });
    m_layers = m_stats.back().layer + 1;
    m_channels = int(m_stats.front().channels.size());
    m_headDim = headDim;
    m_updating = true;
    m_layerSpin->setRange(0, m_layers - 1);
    m_channelSpin->setRange(-1, m_channels - 1);
    m_updating = false;
    m_info->setText(tr("%1 layers x %2 channels").arg(m_layers).arg(m_channels));
    updateHeatmap();
    if (mapMetric() == MapMetric::Entropy) emit entropyRequested(entropyBins());
    onSelectorsChanged();
}

void DistributionsView::select(int layer, KvKind kind, int channel)
{
    if (!hasData()) return;
    m_updating = true;
    m_kindCombo->setCurrentIndex(kind == KvKind::Key ? 0 : 1);
    m_layerSpin->setValue(std::clamp(layer, 0, m_layers - 1));
    m_channelSpin->setValue(std::clamp(channel, -1, m_channels - 1));
    m_updating = false;
    onSelectorsChanged();
}

void DistributionsView::setMapMetric(MapMetric metric) { m_metricCombo->setCurrentIndex(int(metric)); }

void DistributionsView::onSelectorsChanged()
{
    if (m_updating || !hasData()) return;
    updateHeatmap();  // the kind may have changed
    updateOutliers();
    updateMarkers();
    emit selectionChanged(selectedLayer(), selectedKind(), selectedChannel());
}

void DistributionsView::updateHeatmap()
{
    QCPColorMapData* data = m_heatMap->data();
    const KvKind kind = selectedKind();
    const MapMetric metric = mapMetric();
    const EntropyMap& entropy = m_entropy[int(kind)];
    const bool ready = hasData() && (metric != MapMetric::Entropy || entropy.bins == entropyBins());
    if (!ready) {
        data->clear();
        setTitle(m_heatPlot, hasData() ? tr("%1 entropy at %2 bins: computing…").arg(kindLetter(kind)).arg(entropyBins())
                                       : tr("layer x channel"));
        replotSoon(m_heatPlot);
        return;
    }
    data->setSize(m_channels, m_layers);
    data->setRange(QCPRange(0, m_channels - 1), QCPRange(0, m_layers - 1));
    for (int l = 0; l < m_layers; ++l) {
        const TensorStats* s = find(l, kind);
        for (int c = 0; c < m_channels; ++c) {
            double v = std::nan("");
            if (metric == MapMetric::Entropy)
                v = entropy.bits[size_t(l) * size_t(m_channels) + size_t(c)];
            else if (s && c < int(s->channels.size()))
                v = metric == MapMetric::Absmax ? s->channels[size_t(c)].absmax : s->channels[size_t(c)].std;
            data->setCell(c, l, v);
        }
    }
    m_heatMap->setName(QStringLiteral("%1 %2").arg(kindLetter(kind), m_metricCombo->currentText()));
    m_heatMap->rescaleDataRange(true);
    setTitle(m_heatPlot, metric == MapMetric::Entropy
                             ? tr("%1 entropy (bits/value) at %2 bins, layer x channel").arg(kindLetter(kind)).arg(entropy.bins)
                             : tr("%1 %2 per channel, layer x channel").arg(kindLetter(kind), m_metricCombo->currentText()));
    m_heatPlot->rescaleAxes();
    m_heatPlot->xAxis->setRange(-0.5, m_channels - 0.5);
    m_heatPlot->yAxis->setRange(-0.5, m_layers - 0.5);
    replotSoon(m_heatPlot);
}

void DistributionsView::updateOutliers()
{
    m_outliers->clear();
    const TensorStats* s = find(selectedLayer(), selectedKind());
    if (!s) return;
    const double median = medianChannelAbsmax(*s);
    for (int c : s->outlierChannels) {
        const ChannelStats& cs = s->channels[size_t(c)];
        QString text = tr("channel %1").arg(c);
        if (m_headDim > 0) text += tr(" (head %1, d %2)").arg(c / m_headDim).arg(c % m_headDim);
        text += tr(": absmax %1").arg(cs.absmax, 0, 'g', 4);
        if (median > 0) text += tr(", %1x median").arg(cs.absmax / median, 0, 'f', 1);
        auto* item = new QListWidgetItem(text, m_outliers);
        item->setData(Qt::UserRole, c);
        if (c == selectedChannel()) item->setSelected(true);
    }
    if (s->outlierChannels.empty()) {
        auto* item = new QListWidgetItem(tr("none in %1 of layer %2").arg(kindLetter(selectedKind())).arg(selectedLayer()),
                                         m_outliers);
        item->setFlags(Qt::NoItemFlags);
    }
}

void DistributionsView::updateMarkers()
{
    const int c = selectedChannel();
    for (auto [plot, line] : {std::make_pair(m_heatPlot, m_heatMarker), std::make_pair(m_tokenPlot, m_tokenMarker)}) {
        line->setVisible(c >= 0);
        line->point1->setCoords(c, 0);
        line->point2->setCoords(c, 1);
        replotSoon(plot);
    }
}

void DistributionsView::setEntropyMap(const EntropyMap& map)
{
    if (!hasData() || map.layers != m_layers || map.channels != m_channels) return;
    m_entropy[int(map.kind)] = map;
    if (mapMetric() == MapMetric::Entropy) updateHeatmap();
}

void DistributionsView::setHistogram(const HistogramData& data)
{
    if (!hasData() || data.layer != selectedLayer() || data.kind != selectedKind() || data.channel != selectedChannel())
        return;  // an answer to an older selection
    m_histogram = data;
    const Histogram& h = data.histogram;
    const int n = int(h.counts.size());
    const double width = n > 0 ? (h.hi - h.lo) / n : 1.0;
    QVector<double> x(n), y(n);
    for (int i = 0; i < n; ++i) {
        x[i] = h.lo + (i + 0.5) * width;
        y[i] = double(h.counts[size_t(i)]);
    }
    auto* bars = static_cast<QCPBars*>(m_histPlot->plottable(0));
    bars->setBrush(style::kindColor(data.kind));
    bars->setWidth(width);
    bars->setData(x, y, true);
    bars->setName(data.channel < 0 ? tr("%1 layer %2").arg(kindLetter(data.kind)).arg(data.layer)
                                   : tr("%1 layer %2 channel %3").arg(kindLetter(data.kind)).arg(data.layer).arg(data.channel));
    setTitle(m_histPlot, tr("histogram: %1").arg(bars->name()));
    m_histPlot->rescaleAxes();
    m_histPlot->yAxis->setRangeLower(0);
    replotSoon(m_histPlot);
}

void DistributionsView::setTokenMap(const TokenMapData& d)
{
    if (!hasData() || d.layer != selectedLayer() || d.kind != selectedKind()) return;
    QCPColorMapData* data = m_tokenMap->data();
    data->setSize(d.channels, d.tokens);
    data->setRange(QCPRange(0, d.channels - 1), QCPRange(0, double(d.tokens - 1) * d.stride));
    float absmax = 0;
    for (int t = 0; t < d.tokens; ++t)
        for (int c = 0; c < d.channels; ++c) {
            const float v = d.values[size_t(t) * size_t(d.channels) + size_t(c)];
            data->setCell(c, t, v);
            absmax = std::max(absmax, std::fabs(v));
        }
    // Symmetric range so zero sits in the gradient's middle.
    m_tokenMap->setDataRange(QCPRange(-std::max(absmax, 1e-6f), std::max(absmax, 1e-6f)));
    m_tokenMap->setName(tr("%1 layer %2").arg(kindLetter(d.kind)).arg(d.layer));
    setTitle(m_tokenPlot, d.stride > 1 ? tr("%1 layer %2, token x channel (every %3th token)")
                                             .arg(kindLetter(d.kind)).arg(d.layer).arg(d.stride)
                                       : tr("%1 layer %2, token x channel").arg(kindLetter(d.kind)).arg(d.layer));
    m_tokenPlot->xAxis->setRange(-0.5, d.channels - 0.5);
    m_tokenPlot->yAxis->setRange(-0.5, double(d.tokens) * d.stride - 0.5);
    replotSoon(m_tokenPlot);
}

void DistributionsView::heatmapClicked(QMouseEvent* event)
{
    if (!hasData() || event->button() != Qt::LeftButton) return;
    const int c = int(std::lround(m_heatPlot->xAxis->pixelToCoord(event->pos().x())));
    const int l = int(std::lround(m_heatPlot->yAxis->pixelToCoord(event->pos().y())));
    if (c < 0 || c >= m_channels || l < 0 || l >= m_layers) return;
    select(l, selectedKind(), c);
}

}  // namespace kvscope
