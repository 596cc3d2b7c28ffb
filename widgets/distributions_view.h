// DistributionsView: how the values of one KV cache are distributed, for K or V.
//   heat map     layer x channel, coloured by per-channel absmax, std, or the entropy of the
//                quantized symbols at a chosen number of bins (click a cell to select it);
//   histogram    of the selected layer, or of one channel of it;
//   tokens       token x channel values of the selected layer;
//   outliers     the selected layer's outlier channels; clicking one selects its histogram and
//                marks it on the heat map and the token view.
// It only draws. Statistics arrive through setStats(); the entropy map, histograms and token
// maps are computed by a worker that answers the requests this view emits (DistributionsWorker
// in the app), and come back as the value structs of view_data.h.
#pragma once

#include "view_data.h"

#include "kv/kv_stats.h"
#include "kv_metatypes.h"

#include <QMetaType>
#include <QWidget>

#include <vector>

class QComboBox;
class QCPColorMap;
class QCPItemStraightLine;
class QCustomPlot;
class QLabel;
class QListWidget;
class QSpinBox;

namespace kvscope {

class DistributionsView : public QWidget {
    Q_OBJECT
public:
    enum class MapMetric { Absmax = 0, Std = 1, Entropy = 2 };

    explicit DistributionsView(QWidget* parent = nullptr);
    ~DistributionsView() override;

    int selectedLayer() const;     // -1 when empty
    KvKind selectedKind() const;
    int selectedChannel() const;   // -1: the whole layer
    MapMetric mapMetric() const;
    int entropyBins() const;
    bool hasData() const { return !m_stats.empty(); }

    // For the window, the screenshot mode and the tests.
    QCustomPlot* heatmapPlot() const { return m_heatPlot; }
    QCustomPlot* histogramPlot() const { return m_histPlot; }
    QCustomPlot* tokenPlot() const { return m_tokenPlot; }
    QListWidget* outlierList() const { return m_outliers; }
    QComboBox* kindCombo() const { return m_kindCombo; }
    QComboBox* metricCombo() const { return m_metricCombo; }
    QSpinBox* layerSpin() const { return m_layerSpin; }
    QSpinBox* channelSpin() const { return m_channelSpin; }
    // The histogram shown now (empty counts before one arrived).
    const HistogramData& histogram() const { return m_histogram; }

public slots:
    void setStats(const std::vector<kvscope::TensorStats>& stats, int headDim);
    void clear();
    void select(int layer, kvscope::KvKind kind, int channel);
    void setMapMetric(kvscope::DistributionsView::MapMetric metric);
    void setEntropyMap(const kvscope::EntropyMap& map);
    void setHistogram(const kvscope::HistogramData& data);
    void setTokenMap(const kvscope::TokenMapData& data);

signals:
    // The worker should send the histogram and the token map of this selection.
    void selectionChanged(int layer, kvscope::KvKind kind, int channel);
    // The heat map shows entropy at `bins` and needs that map (both kinds).
    void entropyRequested(int bins);

private:
    const TensorStats* find(int layer, KvKind kind) const;
    void setupPlots();
    void onSelectorsChanged();
    void updateHeatmap();
    void updateOutliers();
    void updateMarkers();
    void heatmapClicked(QMouseEvent* event);

    std::vector<TensorStats> m_stats;  // sorted by (layer, kind)
    int m_layers = 0, m_channels = 0, m_headDim = 0;
    EntropyMap m_entropy[2];           // by kind; empty until computed
    HistogramData m_histogram;
    bool m_updating = false;           // programmatic selector changes

    QComboBox* m_kindCombo = nullptr;
    QSpinBox* m_layerSpin = nullptr;
    QSpinBox* m_channelSpin = nullptr;
    QComboBox* m_metricCombo = nullptr;
    QSpinBox* m_binsSpin = nullptr;
    QLabel* m_info = nullptr;
    QCustomPlot* m_heatPlot = nullptr;
    QCPColorMap* m_heatMap = nullptr;
    QCustomPlot* m_histPlot = nullptr;
    QCustomPlot* m_tokenPlot = nullptr;
    QCPColorMap* m_tokenMap = nullptr;
    QCPItemStraightLine* m_heatMarker = nullptr;
    QCPItemStraightLine* m_tokenMarker = nullptr;
    QListWidget* m_outliers = nullptr;
};

}  // namespace kvscope

