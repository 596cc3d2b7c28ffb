#include "plot_widget.h"

#include <QPainter>
#include <QPointer>
#include <QTimer>

namespace kvscope {

// One per application, on the GUI thread: a queue of plots and a zero-interval timer that takes
// one plot per timeout. A zero timer fires once per turn of the event loop, after the events that
// were waiting, so the loop turns between two replots.
class ReplotScheduler : public QObject {
public:
    static ReplotScheduler& instance()
    {
        static ReplotScheduler* s = new ReplotScheduler;
        return *s;
    }

    void add(QCustomPlot* plot)
    {
        if (auto* p = qobject_cast<Plot*>(plot)) p->m_stale = true;
        for (const QPointer<QCustomPlot>& q : m_queue)
            if (q == plot) return;
        m_queue.append(plot);
        if (!m_timer.isActive()) m_timer.start();
    }

    void flush()
    {
        while (!m_queue.isEmpty()) replot(m_queue.takeFirst(), true);
        m_timer.stop();
    }

    int pending() const
    {
        int n = 0;
        for (const QPointer<QCustomPlot>& q : m_queue) n += q ? 1 : 0;
        return n;
    }

    // Draws the buffers now; the widget is painted with the next paint event. A hidden Plot
    // stays stale and asks again when shown (unless forced).
    static void replot(QCustomPlot* plot, bool force)
    {
        if (!plot) return;
        auto* p = qobject_cast<Plot*>(plot);
        if (p && !force && !p->isVisible()) return;
        plot->replot(QCustomPlot::rpQueuedRefresh);
        if (p) p->m_stale = false;
    }

private:
    ReplotScheduler()
    {
        m_timer.setInterval(0);
        m_timer.setSingleShot(true);
        connect(&m_timer, &QTimer::timeout, this, [this] {
            // Skip plots deleted since they were marked; replot one.
            while (!m_queue.isEmpty()) {
                QPointer<QCustomPlot> next = m_queue.takeFirst();
                if (!next) continue;
                replot(next, false);
                break;
            }
            if (!m_queue.isEmpty()) m_timer.start();
        });
    }

    QList<QPointer<QCustomPlot>> m_queue;
    QTimer m_timer;
};

Plot::Plot(QWidget* parent) : QCustomPlot(parent) {}

void Plot::resizeEvent(QResizeEvent*)
{
    // What QCustomPlot::resizeEvent does, with the replot deferred.
    setViewport(rect());
    replotSoon(this);
}

void Plot::showEvent(QShowEvent* event)
{
    QCustomPlot::showEvent(event);
    if (m_stale) replotSoon(this);
}

void Plot::paintEvent(QPaintEvent* event)
{
    if (!mPaintBuffers.isEmpty() && mPaintBuffers.first()->size() == viewport().size()) {
        QCustomPlot::paintEvent(event);
        return;
    }
    // Buffers of another size (the replot after a resize has not come yet) would show a cropped
    // plot for a moment: the background until the replot comes.
    QPainter painter(this);
    painter.fillRect(rect(), mBackgroundBrush.style() != Qt::NoBrush ? mBackgroundBrush : palette().window());
}

void replotSoon(QCustomPlot* plot)
{
    if (plot) ReplotScheduler::instance().add(plot);
}

void flushReplots() { ReplotScheduler::instance().flush(); }

int pendingReplots() { return ReplotScheduler::instance().pending(); }

}  // namespace kvscope
