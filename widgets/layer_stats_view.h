// LayerStatsView: CacheGen's three observations about a KV cache as ready views, each with a
// one-line reading under it:
//   1 token locality:   per layer, variance along tokens of the raw values vs of the deltas
//                       against each group's anchor token, or the entropy of the quantized
//                       symbols, K and V (the reading uses core's localityRatio);
//   2 layer sensitivity: per layer, the quality cost (KL, or RMS error without a continuation) of
//                       quantizing that layer alone to a few bins (measured by the app's worker
//                       when asked: sensitivityRequested);
//   3 distributions:    per channel absmax of one layer and kind (picked with two combo boxes),
//                       outlier channels in red (against core's medianChannelAbsmax).
// It only draws: the stats arrive as a plain vector through setStats(), computed on a worker.
// Right-click a plot to copy its data as CSV or to save it as PNG, JPG, SVG or PDF (plot_export.h).
// layer_stats_view.cpp builds the page and draws observations 1 and 3, layer_stats_sensitivity.cpp
// observation 2, layer_stats_export.cpp the CSV, image export and context menu.
#pragma once

#include "eval/layer_sensitivity.h"
#include "kv/kv_stats.h"
#include "kv_metatypes.h"

#include <QMetaType>
#include <QString>
#include <QWidget>

#include <vector>

class QCustomPlot;
class QCPBars;
class QCheckBox;
class QComboBox;
class QLabel;
class QPushButton;
class QSpinBox;
class QMouseEvent;
class QPoint;

namespace kvscope {

class LayerStatsView : public QWidget {
    Q_OBJECT
public:
    enum class Plot { Layers, Channels };
    enum class LayerMetric { Variance, Entropy };
    enum class Observation { Locality, Sensitivity, Channels };

    explicit LayerStatsView(QWidget* parent = nullptr);
    ~LayerStatsView() override;

    // The plots and pickers, for the window that embeds the view and for tests that read the
    // drawn data back. Layer plot graphs, in order: "K raw", "K delta", "V raw", "V delta".
    // Channel plot bars, in order: "channels" (non-outliers), "outliers".
    QCustomPlot* layerPlot() const { return m_layerPlot; }
    QCustomPlot* channelPlot() const { return m_channelPlot; }
    QCustomPlot* sensitivityPlot() const { return m_sensPlot; }
    QPushButton* sensitivityButton() const { return m_sensButton; }
    // The one-line reading under an observation's plot.
    QString reading(Observation which) const;
    QString localityReading() const;
    const std::vector<LayerSensitivity>& sensitivity() const { return m_sensitivity; }
    QComboBox* layerCombo() const { return m_layerCombo; }
    QComboBox* kindCombo() const { return m_kindCombo; }
    QComboBox* metricCombo() const { return m_metricCombo; }

    const std::vector<TensorStats>& stats() const { return m_stats; }
    int selectedLayer() const;  // -1 when empty
    KvKind selectedKind() const;
    LayerMetric layerMetric() const;

    // Data behind each plot as CSV ("\n" line ends, header first, numbers in shortest round-trip
    // form). Layers: one row per layer, every metric of K and V (empty where a kind is missing).
    // Channels: one row per channel of the selected layer and kind.
    QString layersCsv() const;
    QString channelsCsv() const;

    // Saves one plot through savePlot() of plot_export.h; the format follows the suffix.
    // @return false (and errorString() says why) for an unknown suffix or a failed write.
    bool savePlot(Plot which, const QString& path);
    QString errorString() const { return m_error; }

public slots:
    // Replaces everything shown. Order does not matter; entries are matched by (layer, kind).
    // Keeps the selected layer and kind when the new stats have them.
    void setStats(const std::vector<kvscope::TensorStats>& stats);
    void clear();
    // With the head size known, the channel plot marks head boundaries and tooltips name (head, d).
    void setHeadDim(int headDim);
    void selectChannels(int layer, kvscope::KvKind kind);
    void setLayerMetric(kvscope::LayerStatsView::LayerMetric metric);
    void copyCsv(kvscope::LayerStatsView::Plot which);
    // Per-layer sensitivity measured at `bins` (empty: not measured).
    void setSensitivity(const std::vector<kvscope::LayerSensitivity>& sensitivity, int bins);
    // Whether the Measure button works (a model and a continuation); note says why not.
    void setSensitivityAvailable(bool available, const QString& note);
    void setSensitivityNote(const QString& note);

signals:
    void channelSelectionChanged(int layer, kvscope::KvKind kind);
    void sensitivityRequested(int bins);

private:
    static QString kindLabel(KvKind kind);  // "keys" or "values"
    const TensorStats* find(int layer, KvKind kind) const;
    void setupLayerPlot();
    void setupChannelPlot();
    void setupSensitivityPlot();
    void updateLayerPlot();
    void updateChannelPlot();
    void updateLogScale();
    void rescaleLayerPlot();
    void showContextMenu(Plot which, const QPoint& pos);
    void showChannelToolTip(QMouseEvent* event);
    void exportWithDialog(Plot which);

    std::vector<TensorStats> m_stats;  // sorted by (layer, kind)
    std::vector<int> m_layers;         // distinct layers present, ascending
    int m_headDim = 0;
    QString m_error;

    QCustomPlot* m_layerPlot = nullptr;
    QCustomPlot* m_channelPlot = nullptr;
    QCustomPlot* m_sensPlot = nullptr;
    QLabel* m_sensInfo = nullptr;
    QSpinBox* m_sensBins = nullptr;
    QPushButton* m_sensButton = nullptr;
    std::vector<LayerSensitivity> m_sensitivity;
    int m_sensitivityBins = 0;
    QCPBars* m_channelBars = nullptr;
    QCPBars* m_outlierBars = nullptr;
    QComboBox* m_metricCombo = nullptr;
    QCheckBox* m_logScale = nullptr;
    QComboBox* m_layerCombo = nullptr;
    QComboBox* m_kindCombo = nullptr;
    QLabel* m_layerInfo = nullptr;
    QLabel* m_channelInfo = nullptr;
};

}  // namespace kvscope

