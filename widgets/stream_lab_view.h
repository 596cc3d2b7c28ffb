// StreamLabView: the Stream page, a race of streaming policies on one link schedule.
//   setup       link (StreamLinkEditor: constant rate, typed steps of rate and duration with a
//               drop-and-recover preset, steps drawn with the mouse on the bandwidth plot, or a
//               Mahimahi trace), RTT, SLO, the policies to race (adaptive, text, int8, each fixed
//               level) and how (back to back, at once on a link each, at once on one shared link),
//               target hardware for the compute parts (measured on this machine, core's modelled
//               presets, or custom rates), the store;
//   live plots  StreamRaceFigure: bandwidth, timeline, levels and TTFT, one lane per policy;
//   results     a table of every run (StreamRunsModel) and the answers (original vs the
//               selected run's).
// The race shown can be exported as one figure (exportFigure: PNG, JPEG, SVG or PDF by suffix).
// It only draws and collects settings: the app's StreamSession runs the race on a worker and
// feeds the value structs of view_data.h back, and the app saves and opens races
// (app/gui/race_file.h) and shows an opened one with showRace.
#pragma once

#include "stream_runs_model.h"
#include "view_data.h"

#include <QMetaType>
#include <QString>
#include <QStringList>
#include <QWidget>

#include <vector>

class QComboBox;
class QCustomPlot;
class QDoubleSpinBox;
class QFormLayout;
class QLabel;
class QLineEdit;
class QListWidget;
class QPlainTextEdit;
class QPushButton;
class QTableView;
class QTableWidget;

namespace kvscope {

class StreamLinkEditor;
class StreamRaceFigure;

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
    QCustomPlot* bandwidthPlot() const;
    QCustomPlot* timelinePlot() const;
    QCustomPlot* levelsPlot() const;
    QCustomPlot* ttftPlot() const;
    QTableWidget* scheduleTable() const;
    QListWidget* policyList() const { return m_policies; }
    QComboBox* modeCombo() const { return m_mode; }
    QComboBox* hardwareCombo() const { return m_hardware; }
    QPushButton* drawLinkButton() const;
    int chunksShown() const;       // over every lane of the race shown
    int chunksShown(int lane) const;
    QString ttftText() const;      // the race's TTFT line
    // The race shown (live, finished or opened); results by lane.
    const RaceRecord& race() const { return m_race; }
    int levels() const { return m_levels; }

    // The plots of the race as one figure; the format follows the suffix.
    bool exportFigure(const QString& path, QString* error);

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
    QWidget* createSetup();    // the "Race setup" box
    QFormLayout* createSetupForm();  // its settings
    QWidget* createResults();  // the runs and the answers
    void setRunning(bool running);
    void redrawLive();
    void redrawTtft();
    void updateTtftText();
    void showAnswer(int lane);
    void updateHardwareWidgets();

    RaceRecord m_race;
    std::vector<HardwarePreset> m_presets;
    std::vector<std::vector<StreamChunkPoint>> m_laneChunks;  // live chunks, by lane
    int m_currentLane = -1;
    int m_levels = 3;
    bool m_ready = false;
    bool m_running = false;

    StreamLinkEditor* m_link = nullptr;
    QDoubleSpinBox* m_rtt = nullptr;
    QDoubleSpinBox* m_sloSpin = nullptr;
    QListWidget* m_policies = nullptr;
    QComboBox* m_hardware = nullptr;
    QComboBox* m_mode = nullptr;
    QLabel* m_modelledNote = nullptr;
    QDoubleSpinBox* m_prefillRate = nullptr;
    QDoubleSpinBox* m_decodeRate = nullptr;
    QLineEdit* m_store = nullptr;
    QPushButton* m_start = nullptr;
    QPushButton* m_stop = nullptr;
    QLabel* m_status = nullptr;
    QLabel* m_ttft = nullptr;
    QLabel* m_preview = nullptr;
    StreamRaceFigure* m_figure = nullptr;  // what exportFigure renders
    QPlainTextEdit* m_original = nullptr;
    QPlainTextEdit* m_streamed = nullptr;
    QLabel* m_streamedLabel = nullptr;
    QTableView* m_table = nullptr;
    StreamRunsModel* m_runs = nullptr;
};

}  // namespace kvscope
