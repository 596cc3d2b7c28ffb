// StreamLabView: set up a streaming run (link, SLO, policy, store), start and stop it, and watch
//   bandwidth   the link's available rate over time vs the rate each chunk actually got;
//   timeline    one bar per chunk from request to arrival, coloured by level (text chunks in red,
//               marked T), its decode or recompute job after it;
//   TTFT        stacked bar of the time-to-first-token parts per run, against the SLO line;
//   responses   the answer from the streamed KV next to the one from the original KV;
//   runs        a table of every run so far (StreamRunsModel).
// It only draws and collects settings; the app's StreamSession runs the lab on a worker and feeds
// these value structs back.
#pragma once

#include "view_data.h"

#include <QAbstractTableModel>
#include <QMetaType>
#include <QString>
#include <QStringList>
#include <QWidget>

#include <vector>

class QComboBox;
class QCustomPlot;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QPushButton;
class QTableView;

namespace kvscope {

class StreamRunsModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { RunCol, PolicyCol, LinkCol, SloCol, TtftCol, MetCol, TransferCol, DecodeCol, RecomputeCol,
                  PrefillCol, TextChunksCol, AgreementCol, ColumnCount };
    using QAbstractTableModel::QAbstractTableModel;
    int rowCount(const QModelIndex& parent = QModelIndex()) const override;
    int columnCount(const QModelIndex& parent = QModelIndex()) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
    void addRun(const StreamRunResult& run);
    const std::vector<StreamRunResult>& runs() const { return m_runs; }

private:
    std::vector<StreamRunResult> m_runs;
};

class StreamLabView : public QWidget {
    Q_OBJECT
public:
    explicit StreamLabView(QWidget* parent = nullptr);
    ~StreamLabView() override;

    StreamConfig config() const;
    void setConfig(const StreamConfig& config);
    StreamRunsModel* runsModel() const { return m_runs; }
    QPushButton* startButton() const { return m_start; }
    QPushButton* stopButton() const { return m_stop; }
    QCustomPlot* bandwidthPlot() const { return m_bandwidthPlot; }
    QCustomPlot* timelinePlot() const { return m_timelinePlot; }
    QCustomPlot* ttftPlot() const { return m_ttftPlot; }
    int chunksShown() const { return int(m_chunks.size()); }
    QString ttftText() const;  // the TTFT label

public slots:
    void setReady(bool ready, const QString& note);  // a cache (and model) to stream
    void setLevels(int levels);                       // offers level:1..levels
    void setTracePath(const QString& path);           // switches the link to the trace
    void setStorePath(const QString& path);
    void runStarted(const kvscope::LinkSeries& available);
    void addChunk(const kvscope::StreamChunkPoint& chunk);
    void runFinished(const kvscope::StreamRunResult& result);
    void runEnded(const QString& status);  // failed or cancelled
    void setStatus(const QString& text);

signals:
    void startRequested();
    void stopRequested();

private:
    void setRunning(bool running);
    void redrawTimeline(const std::vector<StreamChunkPoint>& chunks);
    void redrawTtft();

    std::vector<StreamChunkPoint> m_chunks;
    std::vector<double> m_usedT, m_usedMbps;
    double m_slo = 1.0;
    bool m_ready = false;

    QComboBox* m_linkKind = nullptr;
    QLineEdit* m_rate = nullptr;
    QLineEdit* m_trace = nullptr;
    QDoubleSpinBox* m_traceScale = nullptr;
    QDoubleSpinBox* m_rtt = nullptr;
    QDoubleSpinBox* m_sloSpin = nullptr;
    QComboBox* m_policy = nullptr;
    QLineEdit* m_store = nullptr;
    QPushButton* m_start = nullptr;
    QPushButton* m_stop = nullptr;
    QLabel* m_status = nullptr;
    QLabel* m_ttft = nullptr;
    QCustomPlot* m_bandwidthPlot = nullptr;
    QCustomPlot* m_timelinePlot = nullptr;
    QCustomPlot* m_ttftPlot = nullptr;
    QPlainTextEdit* m_original = nullptr;
    QPlainTextEdit* m_streamed = nullptr;
    QTableView* m_table = nullptr;
    StreamRunsModel* m_runs = nullptr;
};

}  // namespace kvscope

