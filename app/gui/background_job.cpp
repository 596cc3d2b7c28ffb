#include "background_job.h"

#include <QElapsedTimer>
#include <QMetaObject>

#include <new>
#include <stdexcept>

namespace kvscope {

QString jobErrorMessage(std::exception_ptr error, const QString& what)
{
    try {
        std::rethrow_exception(error);
    } catch (const std::bad_alloc&) {
        return QObject::tr("%1: not enough memory").arg(what);
    } catch (const std::exception& e) {
        return QString::fromStdString(e.what());
    } catch (...) {
        return QObject::tr("%1: unexpected error").arg(what);
    }
}

JobControl::JobControl(JobLane* lane, quint64 generation, std::shared_ptr<std::atomic<bool>> stop, QString title)
    : m_lane(lane), m_generation(generation), m_stop(std::move(stop)), m_title(std::move(title))
{
}

bool JobControl::stopped() const
{
    return *m_stop || !m_lane->current(m_generation);
}

bool JobControl::progress(int done, int total)
{
    if (total != m_total) {
        m_total = total;
        const QString title = m_title;
        m_lane->postIfCurrent(m_generation, [lane = m_lane, title, total] { emit lane->phaseChanged(title, total); });
    }
    m_lane->postIfCurrent(m_generation, [lane = m_lane, done] { emit lane->progressChanged(done); });
    return !stopped();
}

void JobControl::phase(const QString& text, int maximum)
{
    m_title = text;
    m_total = maximum;
    m_lane->postIfCurrent(m_generation, [lane = m_lane, text, maximum] { emit lane->phaseChanged(text, maximum); });
}

void JobControl::post(std::function<void()> f) const
{
    m_lane->postIfCurrent(m_generation, std::move(f));
}

JobLane::JobLane(const QString& what, QObject* parent) : QObject(parent), m_what(what)
{
    setObjectName(what);
    m_pool.setMaxThreadCount(1);
    m_pool.setExpiryTimeout(-1);  // keep the thread: torch and the allocator like a stable worker
}

JobLane::~JobLane()
{
    ++m_generation;
    if (m_stop) *m_stop = true;
    m_pool.clear();
    m_pool.waitForDone();
}

void JobLane::postIfCurrent(quint64 generation, std::function<void()> f)
{
    QMetaObject::invokeMethod(
        this,
        [this, generation, f = std::move(f)] {
            if (current(generation)) f();
        },
        Qt::QueuedConnection);
}

void JobLane::start(const QString& title, Work work)
{
    if (m_stop) *m_stop = true;  // the job in flight stops at its next check
    m_pool.clear();              // a queued, not yet started job is superseded
    m_stop = std::make_shared<std::atomic<bool>>(false);
    const quint64 mine = ++m_generation;
    m_busy = true;
    if (!title.isEmpty()) emit phaseChanged(title, 0);
    const std::shared_ptr<std::atomic<bool>> stop = m_stop;
    m_pool.start([this, mine, stop, title, work = std::move(work)] {
        if (!current(mine)) return;  // superseded before it started
        JobControl control(this, mine, stop, title);
        std::function<void()> deliver;
        QString error;
        QElapsedTimer clock;
        clock.start();
        try {
            deliver = work(control);
        } catch (...) {
            error = jobErrorMessage(std::current_exception(), m_what);
        }
        const double seconds = double(clock.nsecsElapsed()) * 1e-9;
        postIfCurrent(mine, [this, deliver, error, seconds] {
            m_busy = false;
            m_stop.reset();
            m_lastSeconds = seconds;
            if (!error.isEmpty()) {
                emit failed(error);
                return;
            }
            if (deliver) deliver();
            emit finished();
        });
    });
}

void JobLane::cancel(bool quiet)
{
    if (m_stop) *m_stop = true;
    ++m_generation;  // whatever the job still reports is dropped
    m_pool.clear();
    const bool wasBusy = m_busy;
    m_busy = false;
    m_stop.reset();
    if (wasBusy && !quiet) emit cancelled();
}

}  // namespace kvscope
