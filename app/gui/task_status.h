// TaskStatus: the window's status bar for every long task (a KV load or save, opening a model, a
// capture, a tuner or stream task): the phase line ("phaseLabel"), a progress bar
// ("loadProgress": steps of a unit, or a busy indicator) and a Cancel button ("cancelButton")
// that, with File ▸ Cancel (Esc), is there only while a task runs.
#pragma once

#include <QObject>
#include <QString>

class QAction;
class QLabel;
class QProgressBar;
class QPushButton;
class QStatusBar;

namespace kvscope {

class TaskStatus : public QObject {
    Q_OBJECT
public:
    explicit TaskStatus(QStatusBar* bar, QObject* parent = nullptr);

    void setCancelAction(QAction* action);  // enabled with the Cancel button
    void setText(const QString& text);
    // A task's phase of `maximum` steps (0: a busy indicator), the bar's text in `format`
    // ("%v / %m tokens"; "" = none), progress back to 0. Shows nothing by itself: see setBusy.
    void setPhase(const QString& text, int maximum, const QString& format);
    // Marks the bar for the next paint only: progress comes from workers through the event loop,
    // and QProgressBar::setValue would repaint every dirty widget of the window with the bar.
    void setProgress(int value);
    void setBusy(bool busy);  // the progress bar and Cancel shown, or hidden

signals:
    void cancelRequested();

private:
    QLabel* m_phase;
    QProgressBar* m_progress;
    QPushButton* m_cancel;
    QAction* m_cancelAction = nullptr;
};

}  // namespace kvscope
