#include "stream_race_figure.h"

#include "plot_export.h"
#include "plot_style.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QFileInfo>
#include <QGridLayout>
#include <QImageWriter>
#include <QLabel>
#include <QPainter>
#include <QPdfWriter>
#ifdef KVSCOPE_HAVE_QT_SVG
#include <QSvgGenerator>
#endif

#include <algorithm>

namespace kvscope {

namespace {

QCustomPlot* makePlot(const QString& name, const QString& x, const QString& y)
{
    auto* plot = new Plot;
    plot->setObjectName(name);
    plot->setMinimumSize(280, 170);
    plot->xAxis->setLabel(x);
    plot->yAxis->setLabel(y);
    plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    style::applyPlotStyle(plot);
    return plot;
}

}  // namespace

StreamRaceFigure::StreamRaceFigure(QWidget* parent) : QWidget(parent)
{
    setObjectName(QStringLiteral("streamFigure"));
    m_bandwidthPlot = makePlot(QStringLiteral("bandwidthPlot"), tr("time (s)"), tr("Mbit/s"));
    QCPGraph* available = m_bandwidthPlot->addGraph();
    available->setName(tr("available"));
    available->setPen(QPen(style::neutralColor(), 1.5));
    available->setBrush(QColor(150, 150, 150, 50));
    available->setLineStyle(QCPGraph::lsStepLeft);
    style::putLegendAbove(m_bandwidthPlot, 3);
    installPlotMenu(m_bandwidthPlot, QStringLiteral("stream-bandwidth"));
    m_timelinePlot = makePlot(QStringLiteral("timelinePlot"), tr("time (s)"), QString());
    installPlotMenu(m_timelinePlot, QStringLiteral("stream-timeline"));
    m_levelsPlot = makePlot(QStringLiteral("levelsPlot"), tr("chunk"), tr("level (0 = text)"));
    style::putLegendAbove(m_levelsPlot, 4);
    installPlotMenu(m_levelsPlot, QStringLiteral("stream-levels"));
    m_ttftPlot = makePlot(QStringLiteral("ttftPlot"), QString(), tr("TTFT (s)"));
    for (int i = 0; i < StreamRunResult::kParts; ++i) {
        auto* bars = new QCPBars(m_ttftPlot->xAxis, m_ttftPlot->yAxis);
        bars->setName(tr(StreamRunResult::partName(i)));
        bars->setBrush(style::partColor(i));
        bars->setPen(Qt::NoPen);
        bars->setWidth(0.6);
        if (i > 0) bars->moveAbove(static_cast<QCPBars*>(m_ttftPlot->plottable(i - 1)));
    }
    style::putLegendAbove(m_ttftPlot, 3);
    installPlotMenu(m_ttftPlot, QStringLiteral("stream-ttft"));

    auto* fig = new QGridLayout(this);
    fig->setContentsMargins(0, 0, 0, 0);
    m_title = new QLabel;
    m_title->setObjectName(QStringLiteral("streamFigureTitle"));
    m_title->setWordWrap(true);
    fig->addWidget(m_title, 0, 0, 1, 2);
    fig->addWidget(m_timelinePlot, 1, 0);
    fig->addWidget(m_ttftPlot, 1, 1);
    fig->addWidget(m_bandwidthPlot, 2, 0);
    fig->addWidget(m_levelsPlot, 2, 1);
    fig->setColumnStretch(0, 3);
    fig->setColumnStretch(1, 2);
    fig->setRowStretch(1, 3);
    fig->setRowStretch(2, 2);
}

void StreamRaceFigure::setTitle(const QString& html) { m_title->setText(html); }

void StreamRaceFigure::drawLive(const RaceRecord& race, const LaneChunks& chunks, int levels)
{
    // One time axis for the timeline and the bandwidth: the SLO, every arrival and job, every TTFT.
    double tMax = race.config.sloSeconds;
    int maxChunks = 1;
    for (const auto& lane : chunks) {
        maxChunks = std::max(maxChunks, int(lane.size()));
        for (const StreamChunkPoint& c : lane) tMax = std::max({tMax, c.arrivedS, c.decodedS});
    }
    for (int r = 0; r < int(race.results.size()); ++r) tMax = std::max(tMax, race.results[size_t(r)].ttftSeconds);
    drawTimeline(race, chunks, levels, tMax, maxChunks);
    drawBandwidth(race, chunks, levels, tMax);
    drawLevels(race, chunks, levels, maxChunks);
}

void StreamRaceFigure::drawTimeline(const RaceRecord& race, const LaneChunks& chunks, int levels, double tMax, int maxChunks)
{
    const QStringList& policies = race.config.policies;
    const int lanes = int(chunks.size());
    // Lane blocks from top to bottom, one row per chunk.
    m_timelinePlot->clearItems();
    const double rowH = 1.0 / double(maxChunks + 1);
    QSharedPointer<QCPAxisTickerText> laneTicks(new QCPAxisTickerText);
    for (int lane = 0; lane < lanes; ++lane) {
        const double base = lanes - 1 - lane;  // first policy on top
        const QString policy = lane < policies.size() ? policies[lane] : QString();
        laneTicks->addTick(base + 0.5, policy);
        for (const StreamChunkPoint& c : chunks[size_t(lane)]) {
            const double y0 = base + 0.05 + c.index * rowH, y1 = y0 + rowH * 0.8;
            auto* fetch = new QCPItemRect(m_timelinePlot);
            fetch->topLeft->setCoords(c.sentS, y1);
            fetch->bottomRight->setCoords(std::max(c.arrivedS, c.sentS + 1e-4), y0);
            // int8 chunks in the int8 baseline colour; cachegen levels on the level scale.
            const QColor colour = policy == QLatin1String("int8") && c.level > 0 ? style::baselineColor(policy)
                                                                                  : style::levelColor(c.level, levels);
            fetch->setBrush(colour);
            fetch->setPen(Qt::NoPen);
            if (c.decodedS > c.jobStartS && c.jobStartS > 0) {
                auto* job = new QCPItemRect(m_timelinePlot);
                job->topLeft->setCoords(c.jobStartS, y0 + (y1 - y0) * 0.7);
                job->bottomRight->setCoords(c.decodedS, y0 + (y1 - y0) * 0.3);
                job->setBrush(style::neutralColor());
                job->setPen(Qt::NoPen);
            }
        }
        if (lane > 0) {
            auto* sep = new QCPItemStraightLine(m_timelinePlot);
            sep->point1->setCoords(0, base + 1);
            sep->point2->setCoords(1, base + 1);
            sep->setPen(QPen(style::neutralColor(), 0.8, Qt::DotLine));
        }
    }
    auto* slo = new QCPItemStraightLine(m_timelinePlot);
    slo->point1->setCoords(race.config.sloSeconds, 0);
    slo->point2->setCoords(race.config.sloSeconds, 1);
    slo->setPen(QPen(style::sloColor(), 1.2, Qt::DashLine));
    auto* sloText = new QCPItemText(m_timelinePlot);
    sloText->position->setType(QCPItemPosition::ptPlotCoords);
    sloText->position->setCoords(race.config.sloSeconds, std::max(1, lanes));
    sloText->setPositionAlignment(Qt::AlignLeft | Qt::AlignTop);
    sloText->setText(tr(" SLO"));
    sloText->setColor(style::sloColor());
    m_timelinePlot->yAxis->setTicker(laneTicks);
    m_timelinePlot->yAxis->setRange(0, std::max(1, lanes));
    m_timelinePlot->xAxis->setRange(0, tMax * 1.05);
    replotSoon(m_timelinePlot);
}

void StreamRaceFigure::drawBandwidth(const RaceRecord& race, const LaneChunks& chunks, int levels, double tMax)
{
    const QStringList& policies = race.config.policies;
    const int lanes = int(chunks.size());
    // Available vs what each lane's chunks got.
    while (m_bandwidthPlot->graphCount() > 1) m_bandwidthPlot->removeGraph(m_bandwidthPlot->graphCount() - 1);
    m_bandwidthPlot->graph(0)->setData(QVector<double>(race.available.seconds.begin(), race.available.seconds.end()),
                                       QVector<double>(race.available.mbps.begin(), race.available.mbps.end()), true);
    double top = 1;
    for (double v : race.available.mbps) top = std::max(top, v);
    for (int lane = 0; lane < lanes; ++lane) {
        QCPGraph* g = m_bandwidthPlot->addGraph();
        const QString policy = lane < policies.size() ? policies[lane] : QString();
        g->setName(tr("%1 used").arg(policy));
        g->setPen(QPen(style::policyColor(policy, levels), 1.8));
        g->setLineStyle(QCPGraph::lsStepLeft);
        QVector<double> t, r;
        for (const StreamChunkPoint& c : chunks[size_t(lane)]) {
            const double dt = c.arrivedS - c.sentS;
            if (c.bytes == 0 || dt <= 0) continue;
            const double mbps = double(c.bytes) * 8e-6 / dt;
            t << c.sentS << c.arrivedS;
            r << mbps << 0.0;
            top = std::max(top, mbps);
        }
        g->setData(t, r, true);
    }
    m_bandwidthPlot->xAxis->setRange(0, tMax * 1.05);
    m_bandwidthPlot->yAxis->setRange(0, top * 1.15);
    replotSoon(m_bandwidthPlot);
}

void StreamRaceFigure::drawLevels(const RaceRecord& race, const LaneChunks& chunks, int levels, int maxChunks)
{
    const QStringList& policies = race.config.policies;
    const int lanes = int(chunks.size());
    m_levelsPlot->clearGraphs();
    for (int lane = 0; lane < lanes; ++lane) {
        QCPGraph* g = m_levelsPlot->addGraph();
        const QString policy = lane < policies.size() ? policies[lane] : QString();
        g->setName(policy);
        const QColor c = style::policyColor(policy, levels);
        g->setPen(QPen(c, 1.6));
        g->setLineStyle(QCPGraph::lsStepCenter);
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, c, c, 5));
        QVector<double> x, y;
        // Lanes side by side: a small offset so equal levels do not hide each other.
        const double offset = lanes > 1 ? (lane - (lanes - 1) / 2.0) * 0.06 : 0.0;
        for (const StreamChunkPoint& ch : chunks[size_t(lane)]) {
            x << ch.index;
            y << ch.level + offset;
        }
        g->setData(x, y, true);
    }
    QSharedPointer<QCPAxisTickerText> levelTicks(new QCPAxisTickerText);
    levelTicks->addTick(0, tr("text"));
    for (int l = 1; l <= levels; ++l) levelTicks->addTick(l, QString::number(l));
    m_levelsPlot->yAxis->setTicker(levelTicks);
    m_levelsPlot->yAxis->setRange(-0.5, levels + 0.5);
    m_levelsPlot->xAxis->setRange(-0.5, maxChunks - 0.5);
    replotSoon(m_levelsPlot);
}

void StreamRaceFigure::drawTtft(const RaceRecord& race)
{
    const QStringList& policies = race.config.policies;
    const int lanes = int(policies.size());
    m_ttftPlot->clearItems();
    double top = race.config.sloSeconds;
    for (int p = 0; p < StreamRunResult::kParts; ++p) {
        QVector<double> x, y;
        for (const StreamRunResult& r : race.results) {
            if (r.policy.isEmpty()) continue;
            x << r.lane;
            y << r.parts[p];
        }
        static_cast<QCPBars*>(m_ttftPlot->plottable(p))->setData(x, y, true);
    }
    QSharedPointer<QCPAxisTickerText> ticks(new QCPAxisTickerText);
    for (int lane = 0; lane < lanes; ++lane) ticks->addTick(lane, policies[lane]);
    for (const StreamRunResult& r : race.results) {
        if (r.policy.isEmpty()) continue;
        top = std::max(top, r.ttftSeconds);
        auto* label = new QCPItemText(m_ttftPlot);
        label->position->setCoords(r.lane, r.ttftSeconds);
        label->setPositionAlignment(Qt::AlignHCenter | Qt::AlignBottom);
        QString text = tr("%1 s\nagree %2").arg(r.ttftSeconds, 0, 'f', 2).arg(r.tokenAgreement, 0, 'f', 2);
        if (r.hasQuality) text += tr("\nKL %1\nΔPPL %2 %").arg(r.kl, 0, 'g', 2).arg(r.deltaPplPct, 0, 'f', 2);
        label->setText(text);
        label->setColor(m_ttftPlot->xAxis->tickLabelColor());
        label->setFont(QFont(font().family(), 7));
    }
    auto* slo = new QCPItemStraightLine(m_ttftPlot);
    slo->point1->setCoords(0, race.config.sloSeconds);
    slo->point2->setCoords(1, race.config.sloSeconds);
    slo->setPen(QPen(style::sloColor(), 1.5, Qt::DashLine));
    m_ttftPlot->xAxis->setTicker(ticks);
    m_ttftPlot->xAxis->setRange(-0.6, std::max(1, lanes) - 0.4);
    m_ttftPlot->yAxis->setRange(0, top * 1.4);  // room for the labels above the bars
    replotSoon(m_ttftPlot);
}

bool StreamRaceFigure::exportTo(const QString& path, QString* error)
{
    const QString suffix = QFileInfo(path).suffix().toLower();
    if (!plotImageSuffixes().contains(suffix)) {
        if (error) *error = tr("%1: unknown image type '%2' (use %3)").arg(path, suffix, plotImageSuffixes().join(QStringLiteral(", ")));
        return false;
    }
    // Render at a readable size even when the page is hidden or small.
    const QSize before = size();
    const QSize shown = isVisible() ? before.expandedTo(QSize(1000, 600)) : QSize(1200, 720);
    if (!isVisible() || shown != before) {
        resize(shown);
        layout()->activate();
    }
    for (QCustomPlot* plot : findChildren<QCustomPlot*>()) plot->replot(QCustomPlot::rpImmediateRefresh);
    bool ok = false;
    QString why;
    if (suffix == QLatin1String("pdf")) {
        QPdfWriter pdf(path);
        pdf.setPageSize(QPageSize(QSizeF(shown) * 0.75, QPageSize::Point));
        pdf.setPageMargins(QMarginsF(0, 0, 0, 0));
        pdf.setResolution(96);
        QPainter painter;
        if (painter.begin(&pdf)) {
            render(&painter, QPoint(), QRegion(), QWidget::DrawChildren);
            ok = painter.end();
        }
        why = tr("cannot write the PDF");
#ifdef KVSCOPE_HAVE_QT_SVG
    } else if (suffix == QLatin1String("svg")) {
        QSvgGenerator svg;
        svg.setFileName(path);
        svg.setSize(shown);
        svg.setViewBox(QRect(QPoint(), shown));
        svg.setTitle(tr("kvscope stream race"));
        QPainter painter;
        if (painter.begin(&svg)) {
            render(&painter, QPoint(), QRegion(), QWidget::DrawChildren);
            ok = painter.end();
        }
        ok = ok && QFileInfo(path).size() > 0;
        why = tr("cannot write the SVG");
#endif
    } else {
        QImage image(shown * 2, QImage::Format_ARGB32);
        image.setDevicePixelRatio(2);
        image.fill(palette().color(QPalette::Window));
        QPainter painter(&image);
        render(&painter, QPoint(), QRegion(), QWidget::DrawChildren);
        painter.end();
        QImageWriter writer(path);
        ok = writer.write(image);
        why = writer.errorString();
    }
    if (size() != before) resize(before);
    if (!ok && error) *error = QStringLiteral("%1: %2").arg(path, why);
    return ok;
}

}  // namespace kvscope
