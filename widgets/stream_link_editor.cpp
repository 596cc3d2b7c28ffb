#include "stream_link_editor.h"

#include "plot_widget.h"

#include <qcustomplot.h>

#include <QComboBox>
#include <QDoubleSpinBox>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLineEdit>
#include <QMouseEvent>
#include <QPushButton>
#include <QSignalBlocker>
#include <QStackedWidget>
#include <QTableWidget>

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// A schedule that drops and recovers: what adaptive streaming is for.
const char* const kDropAndRecover = "40Mbit:0.3,4Mbit:0.4,40Mbit";

// Drawn rates to two significant figures, at least 0.1 Mbit/s: steps a user would type (and equal
// cells compare equal, so runs merge into one step).
double roundRate(double mbps)
{
    mbps = std::max(0.1, mbps);
    const double scale = std::pow(10.0, std::floor(std::log10(mbps)) - 1);
    return std::round(mbps / scale) * scale;
}

}  // namespace

StreamLinkEditor::StreamLinkEditor(QObject* parent) : QObject(parent)
{
    m_linkKind = new QComboBox;
    m_linkKind->setObjectName(QStringLiteral("streamLinkKind"));
    m_linkKind->addItems({tr("constant"), tr("steps (drop and recovery)"), tr("Mahimahi trace")});
    m_rate = new QLineEdit(QStringLiteral("50Mbit"));
    m_rate->setObjectName(QStringLiteral("streamRate"));
    m_rate->setToolTip(tr("A rate: 50Mbit, 2.5MB (bytes/s), 800kbit"));
    m_steps = new QTableWidget(0, 2);
    m_steps->setObjectName(QStringLiteral("streamSteps"));
    m_steps->setHorizontalHeaderLabels({tr("rate"), tr("for s (empty: rest)")});
    m_steps->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
    m_steps->verticalHeader()->setVisible(false);
    m_steps->setMaximumHeight(120);
    auto* addStep = new QPushButton(tr("+"));
    addStep->setToolTip(tr("Add a step"));
    auto* removeStep = new QPushButton(tr("−"));
    removeStep->setToolTip(tr("Remove the selected step"));
    auto* dropPreset = new QPushButton(tr("Drop && recover"));
    dropPreset->setObjectName(QStringLiteral("streamDropPreset"));
    dropPreset->setToolTip(tr("40 Mbit/s, a drop to 4 Mbit/s at 0.3 s for 0.4 s, then 40 Mbit/s again"));
    for (QPushButton* b : {addStep, removeStep}) b->setMaximumWidth(32);
    m_drawLink = new QPushButton(tr("Draw"));
    m_drawLink->setObjectName(QStringLiteral("streamDrawLink"));
    m_drawLink->setCheckable(true);
    m_drawLink->setToolTip(tr("Draw the link's rate with the mouse on the bandwidth plot (drag left to right; "
                              "a drop and its recovery in one stroke); the drawing becomes the steps above"));
    connect(addStep, &QPushButton::clicked, this, [this] {
        const int row = m_steps->rowCount();
        m_steps->insertRow(row);
        m_steps->setItem(row, 0, new QTableWidgetItem(QStringLiteral("10Mbit")));
        m_steps->setItem(row, 1, new QTableWidgetItem(QString()));
        if (row > 0 && m_steps->item(row - 1, 1) && m_steps->item(row - 1, 1)->text().isEmpty())
            m_steps->item(row - 1, 1)->setText(QStringLiteral("0.5"));
    });
    connect(removeStep, &QPushButton::clicked, this, [this] {
        const int row = m_steps->currentRow() >= 0 ? m_steps->currentRow() : m_steps->rowCount() - 1;
        if (row >= 0 && m_steps->rowCount() > 1) m_steps->removeRow(row);
        emit edited();
    });
    connect(dropPreset, &QPushButton::clicked, this, [this] { applyStepsPreset(QLatin1String(kDropAndRecover)); });
    connect(m_steps, &QTableWidget::itemChanged, this, [this] { emit edited(); });
    auto* stepsBox = new QWidget;
    auto* sl = new QGridLayout(stepsBox);
    sl->setContentsMargins(0, 0, 0, 0);
    sl->addWidget(m_steps, 0, 0, 1, 4);
    sl->addWidget(addStep, 1, 0);
    sl->addWidget(removeStep, 1, 1);
    sl->addWidget(dropPreset, 1, 2);
    sl->addWidget(m_drawLink, 1, 3);
    m_trace = new QLineEdit;
    m_trace->setObjectName(QStringLiteral("streamTrace"));
    m_trace->setPlaceholderText(tr("trace file (.down)"));
    m_traceScale = new QDoubleSpinBox;
    m_traceScale->setObjectName(QStringLiteral("streamTraceScale"));
    m_traceScale->setRange(0.01, 100);
    m_traceScale->setValue(1.0);
    m_traceScale->setPrefix(QStringLiteral("× "));
    auto* traceBox = new QWidget;
    auto* tl = new QHBoxLayout(traceBox);
    tl->setContentsMargins(0, 0, 0, 0);
    tl->addWidget(m_trace, 1);
    tl->addWidget(m_traceScale);
    m_linkStack = new QStackedWidget;
    m_linkStack->addWidget(m_rate);
    m_linkStack->addWidget(stepsBox);
    m_linkStack->addWidget(traceBox);
    connect(m_linkKind, &QComboBox::currentIndexChanged, this, [this] {
        updateLinkWidgets();
        emit edited();
    });
    connect(m_rate, &QLineEdit::editingFinished, this, &StreamLinkEditor::edited);
    connect(m_trace, &QLineEdit::editingFinished, this, &StreamLinkEditor::edited);
    connect(m_traceScale, &QDoubleSpinBox::valueChanged, this, &StreamLinkEditor::edited);
    setStepsText(QLatin1String(kDropAndRecover));
    updateLinkWidgets();
}

void StreamLinkEditor::attachPlot(QCustomPlot* plot, const LinkSeries* shown)
{
    m_plot = plot;
    m_shown = shown;
    m_plot->installEventFilter(this);
    connect(m_drawLink, &QPushButton::toggled, this, &StreamLinkEditor::setDrawing);
}

void StreamLinkEditor::setDrawing(bool on)
{
    // Drawing and dragging the view would fight over the same mouse moves.
    m_plot->setInteraction(QCP::iRangeDrag, !on);
    m_plot->setInteraction(QCP::iRangeZoom, !on);
    m_plot->setCursor(on ? Qt::CrossCursor : Qt::ArrowCursor);
    if (!on) return;
    // Show the schedule being edited, scaled to its own rates, so a stroke lands where it is aimed.
    beginDraw();
    showDrawGrid();
    double top = 1;
    for (double v : m_drawMbps) top = std::max(top, v);
    m_plot->xAxis->setRange(0, std::max(2.0 * m_sloSeconds, 1.0));
    m_plot->yAxis->setRange(0, top * 1.3);
    replotSoon(m_plot);
    emit statusChanged(tr("Drag over the bandwidth plot to draw the link's rate; release to use it."));
}

void StreamLinkEditor::updateLinkWidgets()
{
    m_linkStack->setCurrentIndex(m_linkKind->currentIndex());
}

StreamConfig::Link StreamLinkEditor::link() const { return StreamConfig::Link(m_linkKind->currentIndex()); }

QString StreamLinkEditor::rate() const { return link() == StreamConfig::Steps ? stepsText() : m_rate->text().trimmed(); }

QString StreamLinkEditor::tracePath() const { return m_trace->text().trimmed(); }

double StreamLinkEditor::traceScale() const { return m_traceScale->value(); }

void StreamLinkEditor::setLink(const StreamConfig& c)
{
    m_linkKind->setCurrentIndex(int(c.link));
    if (c.link == StreamConfig::Steps)
        setStepsText(c.rate);
    else
        m_rate->setText(c.rate);
    m_trace->setText(c.tracePath);
    m_traceScale->setValue(c.traceScale);
    updateLinkWidgets();
}

void StreamLinkEditor::setTracePath(const QString& path)
{
    m_trace->setText(path);
    m_linkKind->setCurrentIndex(StreamConfig::Trace);
}

void StreamLinkEditor::applyStepsPreset(const QString& steps)
{
    setStepsText(steps);
    emit edited();
}

bool StreamLinkEditor::eventFilter(QObject* watched, QEvent* event)
{
    if (!m_plot || watched != m_plot || !m_drawLink->isChecked() || m_running) return QObject::eventFilter(watched, event);
    const QEvent::Type type = event->type();
    if (type != QEvent::MouseButtonPress && type != QEvent::MouseMove && type != QEvent::MouseButtonRelease)
        return QObject::eventFilter(watched, event);
    auto* me = static_cast<QMouseEvent*>(event);
    const QPointF pos = me->position();
    const double t = std::max(0.0, m_plot->xAxis->pixelToCoord(pos.x()));
    const double mbps = m_plot->yAxis->pixelToCoord(pos.y());
    if (type == QEvent::MouseButtonPress && me->button() == Qt::LeftButton) {
        beginDraw();
        m_drawing = true;
        m_drawLastT = t;
        paintDraw(t, t + kDrawStepSeconds, mbps);
        showDrawGrid();
        return true;
    }
    if (!m_drawing) return QObject::eventFilter(watched, event);
    if (type == QEvent::MouseMove) {
        paintDraw(std::min(m_drawLastT, t), std::max(m_drawLastT, t) + kDrawStepSeconds, mbps);
        m_drawLastT = t;
        showDrawGrid();
        return true;
    }
    m_drawing = false;  // release
    commitDraw();
    return true;
}

void StreamLinkEditor::beginDraw()
{
    // The grid covers what the plots show before a race (twice the SLO, at least 1 s), from the
    // schedule's sampled rate; the rate after the grid is the schedule's last sampled one.
    const double horizon = std::max(2.0 * m_sloSeconds, 1.0);
    const int cells = std::max(1, int(std::ceil(horizon / kDrawStepSeconds - 1e-9)));
    m_drawMbps.assign(size_t(cells), 40.0);
    const LinkSeries& a = m_preview.seconds.empty() && m_shown ? *m_shown : m_preview;
    if (!a.seconds.empty()) {
        size_t k = 0;
        for (int i = 0; i < cells; ++i) {
            const double mid = (i + 0.5) * kDrawStepSeconds;
            while (k + 1 < a.seconds.size() && a.seconds[k + 1] <= mid) ++k;
            m_drawMbps[size_t(i)] = roundRate(a.mbps[k]);
        }
    }
}

void StreamLinkEditor::paintDraw(double t0, double t1, double mbps)
{
    mbps = roundRate(mbps);
    const int first = std::max(0, int(std::floor(t0 / kDrawStepSeconds + 1e-9)));
    const int last = int(std::ceil(t1 / kDrawStepSeconds - 1e-9));  // exclusive
    if (last > int(m_drawMbps.size())) m_drawMbps.resize(size_t(last), m_drawMbps.empty() ? mbps : m_drawMbps.back());
    for (int i = first; i < last; ++i) m_drawMbps[size_t(i)] = mbps;
}

void StreamLinkEditor::showDrawGrid()
{
    QVector<double> t, r;
    for (size_t i = 0; i < m_drawMbps.size(); ++i) {
        t << double(i) * kDrawStepSeconds;
        r << m_drawMbps[i];
    }
    if (!m_drawMbps.empty()) {
        t << double(m_drawMbps.size()) * kDrawStepSeconds;
        r << m_drawMbps.back();
    }
    m_plot->graph(0)->setData(t, r, true);
    replotSoon(m_plot);
}

void StreamLinkEditor::commitDraw()
{
    if (m_drawMbps.empty()) return;
    // Runs of equal cells become steps; the last run holds forever.
    QStringList parts;
    size_t i = 0;
    while (i < m_drawMbps.size()) {
        size_t j = i;
        while (j < m_drawMbps.size() && m_drawMbps[j] == m_drawMbps[i]) ++j;
        const QString rate = QString::number(m_drawMbps[i], 'g', 3) + QStringLiteral("Mbit");
        parts << (j == m_drawMbps.size() ? rate : rate + QLatin1Char(':') + QString::number(double(j - i) * kDrawStepSeconds, 'g', 4));
        i = j;
    }
    {
        const QSignalBlocker block(m_linkKind);
        m_linkKind->setCurrentIndex(StreamConfig::Steps);
    }
    updateLinkWidgets();
    setStepsText(parts.join(QLatin1Char(',')));
    emit drawn();
}

void StreamLinkEditor::drawLink(double t0, double t1, double mbps)
{
    beginDraw();
    paintDraw(t0, t1, mbps);
    commitDraw();
}

QString StreamLinkEditor::stepsText() const
{
    QStringList parts;
    for (int r = 0; r < m_steps->rowCount(); ++r) {
        const QString rate = m_steps->item(r, 0) ? m_steps->item(r, 0)->text().trimmed() : QString();
        const QString dur = m_steps->item(r, 1) ? m_steps->item(r, 1)->text().trimmed() : QString();
        if (rate.isEmpty()) continue;
        parts << (dur.isEmpty() || r == m_steps->rowCount() - 1 ? rate : rate + QLatin1Char(':') + dur);
    }
    return parts.join(QLatin1Char(','));
}

void StreamLinkEditor::setStepsText(const QString& steps)
{
    m_steps->blockSignals(true);
    m_steps->setRowCount(0);
    for (const QString& part : steps.split(QLatin1Char(','), Qt::SkipEmptyParts)) {
        const int row = m_steps->rowCount();
        m_steps->insertRow(row);
        const int colon = part.indexOf(QLatin1Char(':'));
        m_steps->setItem(row, 0, new QTableWidgetItem(colon < 0 ? part.trimmed() : part.left(colon).trimmed()));
        m_steps->setItem(row, 1, new QTableWidgetItem(colon < 0 ? QString() : part.mid(colon + 1).trimmed()));
    }
    m_steps->blockSignals(false);
}

}  // namespace kvscope
