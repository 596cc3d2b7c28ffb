// Plot: the QCustomPlot every view creates, with replots taken off the path of whatever asked
// for them. QCustomPlot replots (lays out and draws every layer into its buffers) inside
// resizeEvent and wherever a view calls replot(); a page with four plots shown for the first time,
// or a capture that fills six plots at once, then keeps the GUI thread away from the event loop
// for the sum of all those replots. Here a resize or a data change only marks the plot
// (replotSoon), and one scheduler replots the marked plots one per turn of the event loop, so
// input, timers and progress are handled between two plots. A plot that is hidden when its turn
// comes is replotted when it is shown. flushReplots() replots every marked plot now: before a
// screenshot or anything else that reads the drawn buffers.
#pragma once

#include <qcustomplot.h>

namespace kvscope {

class Plot : public QCustomPlot {
    Q_OBJECT
public:
    explicit Plot(QWidget* parent = nullptr);

    // True while the buffers do not show the plot's current size or data.
    bool isStale() const { return m_stale; }

protected:
    void resizeEvent(QResizeEvent* event) override;
    void showEvent(QShowEvent* event) override;
    void paintEvent(QPaintEvent* event) override;

private:
    friend class ReplotScheduler;
    bool m_stale = true;
};

// Marks plot for a replot on a later turn of the event loop (several requests, one replot).
// A QCustomPlot that is not a Plot is replotted at its turn all the same.
void replotSoon(QCustomPlot* plot);
// Replots every marked plot now, hidden ones included.
void flushReplots();
// Plots marked and not yet replotted.
int pendingReplots();

}  // namespace kvscope
