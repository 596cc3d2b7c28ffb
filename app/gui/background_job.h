// JobLane: one lane of background work for the GUI's sessions. Each lane runs one job at a time
// on a thread of its own, and the latest request wins: start() asks the job in flight to stop,
// drops a queued one, and discards whatever the superseded job still reports. A job's results,
// progress and errors are delivered on the GUI thread (the lane's thread), errors as one-line
// messages. cancel() takes effect at once for the GUI (cancelled() is emitted, later reports of
// that job are dropped) and stops the worker at its next JobControl check.
//
// A job is a function JobControl& -> std::function<void()>: it runs on the worker and returns
// the closure that delivers its result on the GUI thread (or throws; the lane turns the exception
// into failed(message)). JobControl::post() delivers partial results (live chunks) the same way.
#pragma once

#include <QObject>
#include <QString>
#include <QThreadPool>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>

namespace kvscope {

// One line for an exception caught on a worker: the kvscope::Error or std::exception text, or
// "<what>: not enough memory" / "<what>: unexpected error".
QString jobErrorMessage(std::exception_ptr error, const QString& what);

class JobLane;

class JobControl {
public:
    // True once the job was cancelled or superseded: stop at the next convenient point.
    bool stopped() const;
    // Reports progress (GUI: progressChanged(done), and phaseChanged when total changed) and
    // returns !stopped(), so it fits core's progress callbacks as is.
    bool progress(int done, int total);
    // A new phase; maximum 0 = no measurable progress (busy indicator).
    void phase(const QString& text, int maximum = 0);
    // Runs f on the GUI thread unless the job is stale by then.
    void post(std::function<void()> f) const;

private:
    friend class JobLane;
    JobControl(JobLane* lane, quint64 generation, std::shared_ptr<std::atomic<bool>> stop, QString title);
    JobLane* m_lane;
    quint64 m_generation;
    std::shared_ptr<std::atomic<bool>> m_stop;
    QString m_title;
    int m_total = -1;
};

class JobLane : public QObject {
    Q_OBJECT
public:
    using Work = std::function<std::function<void()>(JobControl&)>;

    // what: names the lane in error messages ("capture", "codec tuner").
    explicit JobLane(const QString& what, QObject* parent = nullptr);
    ~JobLane() override;  // stops the job in flight and waits for it

    // title: the phase shown while the job starts ("" = none).
    void start(const QString& title, Work work);
    bool isBusy() const { return m_busy; }
    // Stops the job in flight; emits cancelled() when one was running. quiet: no signal (a new
    // source replaces the old one and nobody needs to hear about it).
    void cancel(bool quiet = false);
    // Seconds the last delivered job took on the worker.
    double lastSeconds() const { return m_lastSeconds; }

signals:
    void phaseChanged(const QString& text, int maximum);
    void progressChanged(int value);
    void failed(const QString& message);
    void cancelled();
    // After a job's result closure ran on the GUI thread.
    void finished();

private:
    friend class JobControl;
    bool current(quint64 generation) const { return generation == m_generation.load(); }
    void postIfCurrent(quint64 generation, std::function<void()> f);

    QString m_what;
    QThreadPool m_pool;
    std::atomic<quint64> m_generation{0};
    std::shared_ptr<std::atomic<bool>> m_stop;
    bool m_busy = false;
    double m_lastSeconds = 0;
};

}  // namespace kvscope
