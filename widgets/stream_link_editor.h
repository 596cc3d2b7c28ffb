// StreamLinkEditor: the Stream page's link schedule, edited. The link is a constant rate, typed
// steps of rate and duration (with a drop-and-recover preset), or a Mahimahi trace; with Draw on,
// a mouse stroke over the bandwidth plot paints the rate into a grid of kDrawStepSeconds cells
// (shown in the plot's graph 0 as it is drawn) that becomes typed steps on release. It owns the
// widgets of the "Link:" rows of the page's form and the drawing; the page reads the schedule
// back with link(), rate(), tracePath() and traceScale().
#pragma once

#include "view_data.h"

#include <QObject>
#include <QString>

#include <vector>

class QComboBox;
class QCustomPlot;
class QDoubleSpinBox;
class QLineEdit;
class QPushButton;
class QStackedWidget;
class QTableWidget;

namespace kvscope {

class StreamLinkEditor : public QObject {
    Q_OBJECT
public:
    // Seconds per cell of a schedule drawn with the mouse.
    static constexpr double kDrawStepSeconds = 0.05;

    explicit StreamLinkEditor(QObject* parent = nullptr);

    // The widgets for the form: the kind on the "Link:" row, the stack (rate, steps, trace) below.
    QComboBox* kindCombo() const { return m_linkKind; }
    QStackedWidget* stack() const { return m_linkStack; }
    QTableWidget* stepsTable() const { return m_steps; }
    QPushButton* drawButton() const { return m_drawLink; }

    StreamConfig::Link link() const;
    QString rate() const;  // Steps: the steps as "RATE:SECONDS,...,RATE"; else the rate typed
    QString tracePath() const;
    double traceScale() const;
    // The link part of a config (link, rate or steps, trace, scale).
    void setLink(const StreamConfig& config);
    void setTracePath(const QString& path);  // switches the link to the trace

    // Drawing on `plot` (its graph 0 shows the grid). The grid starts from the preview, else from
    // *shown (the schedule the page shows; it must outlive the editor), over twice the SLO.
    void attachPlot(QCustomPlot* plot, const LinkSeries* shown);
    void setPreview(const LinkSeries& available) { m_preview = available; }
    void setSloSeconds(double seconds) { m_sloSeconds = seconds; }
    void setRunning(bool running) { m_running = running; }  // no drawing during a race
    // Draws the rate `mbps` over link time [t0, t1) into the schedule shown (what a mouse drag
    // over the bandwidth plot does) and turns it into typed steps.
    void drawLink(double t0, double t1, double mbps);

signals:
    void edited();  // the schedule changed (typed, chosen or drawn)
    void drawn();   // a drawing became the steps; edited() is not sent for it
    void statusChanged(const QString& text);

private:
    bool eventFilter(QObject* watched, QEvent* event) override;
    void updateLinkWidgets();
    void setDrawing(bool on);
    void applyStepsPreset(const QString& steps);
    QString stepsText() const;
    void setStepsText(const QString& steps);
    void beginDraw();  // the drawing grid from the schedule shown
    void paintDraw(double t0, double t1, double mbps);
    void commitDraw();  // the grid -> typed steps
    void showDrawGrid();

    QComboBox* m_linkKind = nullptr;
    QStackedWidget* m_linkStack = nullptr;
    QLineEdit* m_rate = nullptr;
    QTableWidget* m_steps = nullptr;
    QLineEdit* m_trace = nullptr;
    QDoubleSpinBox* m_traceScale = nullptr;
    QPushButton* m_drawLink = nullptr;
    QCustomPlot* m_plot = nullptr;
    const LinkSeries* m_shown = nullptr;
    LinkSeries m_preview;            // the schedule being edited, sampled by the app
    std::vector<double> m_drawMbps;  // drawing grid, kDrawStepSeconds per cell
    bool m_drawing = false;
    double m_drawLastT = 0;
    double m_sloSeconds = 1.0;
    bool m_running = false;
};

}  // namespace kvscope
