// StreamLabView: the Stream page, a race of streaming policies on one link schedule.
//   setup       link (constant rate, typed steps of rate and duration with a drop-and-recover
//               preset, steps drawn with the mouse on the bandwidth plot, or a Mahimahi trace),
//               RTT, SLO, the policies to race (adaptive, text, int8, each fixed level) and how
//               (back to back, at once on a link each, at once on one shared link), target
//               hardware for the compute parts (measured on this machine, core's modelled
//               presets, or custom rates), the store;
//   live plots  side by side, one lane per policy, in its policy colour:
//               bandwidth  the link's available rate vs the rate each lane's chunks got;
//               timeline   per lane, one bar per chunk from request to arrival coloured by level
//                          (the sequential level scale; text in the text colour), its decode or
//                          recompute job after it, the SLO as a line;
//               levels     the level each lane chose per chunk;
//               TTFT       one bar per lane stacked by part, against the SLO, with the answer's
//                          token agreement and the cache's KL and ΔPPL on top;
//   results     a table of every run and the answers (original vs the selected run's).
// A race can be exported as one figure (exportFigure: PNG, JPEG, SVG or PDF by suffix). It only
// draws and collects settings: the app's StreamSession runs the race on a worker and feeds the
// value structs of view_data.h back, and the app saves and opens races (app/gui/race_file.h) and
// shows an opened one with showRace.
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
class QListWidget;
class QPlainTextEdit;
class QPushButton;
class QStackedWidget;
class QTableView;
class QTableWidget;

namespace kvscope {

class StreamRunsModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { RunCol, PolicyCol, LinkCol, SloCol, TtftCol, MetCol, TransferCol, DecodeCol, RecomputeCol,
                  PrefillCol, TextChunksCol, AgreementCol, KlCol, DeltaPplCol, HardwareCol, ModelledCol, ColumnCount };
    using QAbstractTableModel::QAbstractTableModel;
    int rowCount(const QModelIndex& parent = QModelIndex()) const override;
    int columnCount(const QModelIndex& parent = QModelIndex()) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
    void addRun(const StreamRunResult& run);
    void clear();
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
    QCustomPlot* levelsPlot() const { return m_levelsPlot; }
    QCustomPlot* ttftPlot() const { return m_ttftPlot; }
    QTableWidget* scheduleTable() const { return m_steps; }
    QListWidget* policyList() const { return m_policies; }
    QComboBox* modeCombo() const { return m_mode; }
    QComboBox* hardwareCombo() const { return m_hardware; }
    QPushButton* drawLinkButton() const { return m_drawLink; }
    int chunksShown() const;       // over every lane of the race shown
    int chunksShown(int lane) const;
    QString ttftText() const;      // the race's TTFT line
    // The race shown (live, finished or opened); results by lane.
    const RaceRecord& race() const { return m_race; }
    int levels() const { return m_levels; }

    // The plots of the race as one figure; the format follows the suffix.
    bool exportFigure(const QString& path, QString* error);

    // Seconds per cell of a schedule drawn with the mouse.
    static constexpr double kDrawStepSeconds = 0.05;
    // Draws the rate `mbps` over link time [t0, t1) into the schedule shown (what a mouse drag
    // over the bandwidth plot does) and turns it into typed steps.
    void drawLink(double t0, double t1, double mbps);

public slots:
    void setReady(bool ready, const QString& note);  // a cache (and model) to stream
    // The target-hardware presets (the app's, from core); "measured" should come first.
    void setHardwarePresets(const std::vector<kvscope::HardwarePreset>& presets);
    void setLevels(int levels);                       // offers level:1..levels
    void setTracePath(const QString& path);           // switches the link to the trace
    void setStorePath(const QString& path);
    // The available rate of the schedule being edited, drawn before any run (from the app).
    void setSchedulePreview(const kvscope::LinkSeries& available, const QString& error);
    void raceStarted(const QStringList& policies, const kvscope::LinkSeries& available);
    void laneStarted(int lane);
    void addChunk(const kvscope::StreamChunkPoint& chunk);
    void runFinished(const kvscope::StreamRunResult& result);
    void raceFinished(const kvscope::RaceRecord& race);
    void runEnded(const QString& status);  // failed or cancelled
    void setStatus(const QString& text);
    // Shows a race as it was (a reopened run).
    void showRace(const kvscope::RaceRecord& race);

signals:
    void startRequested();
    void stopRequested();
    void saveRunRequested();
    void openRunRequested();
    void exportFigureRequested();
    // The link settings changed: the app answers with setSchedulePreview.
    void scheduleEdited();

private:
    void setRunning(bool running);
    void redrawLive();
    void redrawTtft();
    void updateTtftText();
    void showAnswer(int lane);
    void applyStepsPreset(const QString& steps);
    QString stepsText() const;
    void setStepsText(const QString& steps);
    void updateLinkWidgets();
    void updateHardwareWidgets();
    bool eventFilter(QObject* watched, QEvent* event) override;
    void beginDraw();                      // the drawing grid from the schedule shown
    void paintDraw(double t0, double t1, double mbps);
    void commitDraw();                     // the grid -> typed steps
    void showDrawGrid();

    RaceRecord m_race;
    std::vector<HardwarePreset> m_presets;
    LinkSeries m_previewSeries;      // the schedule being edited, sampled by the app
    std::vector<double> m_drawMbps;  // drawing grid, kDrawStepSeconds per cell
    bool m_drawing = false;
    double m_drawLastT = 0;
    std::vector<std::vector<StreamChunkPoint>> m_laneChunks;  // live chunks, by lane
    int m_currentLane = -1;
    int m_levels = 3;
    bool m_ready = false;
    bool m_running = false;

    QComboBox* m_linkKind = nullptr;
    QStackedWidget* m_linkStack = nullptr;
    QLineEdit* m_rate = nullptr;
    QTableWidget* m_steps = nullptr;
    QLineEdit* m_trace = nullptr;
    QDoubleSpinBox* m_traceScale = nullptr;
    QDoubleSpinBox* m_rtt = nullptr;
    QDoubleSpinBox* m_sloSpin = nullptr;
    QListWidget* m_policies = nullptr;
    QComboBox* m_hardware = nullptr;
    QComboBox* m_mode = nullptr;
    QPushButton* m_drawLink = nullptr;
    QLabel* m_modelledNote = nullptr;
    QDoubleSpinBox* m_prefillRate = nullptr;
    QDoubleSpinBox* m_decodeRate = nullptr;
    QLineEdit* m_store = nullptr;
    QPushButton* m_start = nullptr;
    QPushButton* m_stop = nullptr;
    QLabel* m_status = nullptr;
    QLabel* m_ttft = nullptr;
    QLabel* m_preview = nullptr;
    QWidget* m_figure = nullptr;  // what exportFigure renders
    QLabel* m_figureTitle = nullptr;
    QCustomPlot* m_bandwidthPlot = nullptr;
    QCustomPlot* m_timelinePlot = nullptr;
    QCustomPlot* m_levelsPlot = nullptr;
    QCustomPlot* m_ttftPlot = nullptr;
    QPlainTextEdit* m_original = nullptr;
    QPlainTextEdit* m_streamed = nullptr;
    QLabel* m_streamedLabel = nullptr;
    QTableView* m_table = nullptr;
    StreamRunsModel* m_runs = nullptr;
};

}  // namespace kvscope
