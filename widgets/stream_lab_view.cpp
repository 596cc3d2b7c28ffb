#include "stream_lab_view.h"

#include "plot_export.h"

#include <qcustomplot.h>

#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSplitter>
#include <QTableView>
#include <QVBoxLayout>

#include <algorithm>

namespace kvscope {

namespace {

const char* const kPartNames[6] = {"transfer", "decode", "recompute", "KV load", "prefill", "first token"};
const QColor kPartColours[6] = {QColor(70, 130, 200), QColor(100, 180, 100), QColor(220, 80, 60),
                                QColor(160, 160, 160), QColor(230, 170, 50), QColor(120, 80, 160)};

QColor levelColour(int level)
{
    static const QColor colours[] = {QColor(215, 50, 40),   // text
                                     QColor(250, 190, 80), QColor(120, 190, 90), QColor(40, 120, 200),
                                     QColor(110, 70, 170)};
    return colours[std::clamp(level, 0, 4)];
}

QCustomPlot* makePlot(const QString& name, const QString& x, const QString& y)
{
    auto* plot = new QCustomPlot;
    plot->setObjectName(name);
    plot->setMinimumSize(260, 160);
    plot->xAxis->setLabel(x);
    plot->yAxis->setLabel(y);
    plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    return plot;
}

QString seconds(double s) { return QString::number(s, 'f', 3); }

}  // namespace

// ---- StreamRunsModel

int StreamRunsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : int(m_runs.size()); }
int StreamRunsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant StreamRunsModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= ColumnCount) return {};
    const StreamRunResult& r = m_runs[size_t(index.row())];
    if (role == Qt::ForegroundRole && index.column() == MetCol) return QColor(r.sloMet ? Qt::darkGreen : Qt::red);
    if (role == Qt::ToolTipRole) return r.log.join(QLatin1Char('\n'));
    if (role != Qt::DisplayRole) return {};
    switch (index.column()) {
    case RunCol: return r.run;
    case PolicyCol: return r.policy;
    case LinkCol: return r.link;
    case SloCol: return seconds(r.sloSeconds);
    case TtftCol: return seconds(r.ttftSeconds);
    case MetCol: return r.sloMet ? tr("yes") : tr("no");
    case TransferCol: return seconds(r.parts[0]);
    case DecodeCol: return seconds(r.parts[1]);
    case RecomputeCol: return seconds(r.parts[2]);
    case PrefillCol: return seconds(r.parts[4]);
    case TextChunksCol: {
        const auto text = std::count_if(r.chunks.begin(), r.chunks.end(), [](const StreamChunkPoint& c) { return c.level == 0; });
        return QStringLiteral("%1 / %2").arg(text).arg(r.chunks.size());
    }
    case AgreementCol: return QString::number(r.tokenAgreement, 'f', 2);
    }
    return {};
}

QVariant StreamRunsModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (role != Qt::DisplayRole || orientation != Qt::Horizontal) return {};
    static const char* const names[ColumnCount] = {"Run", "Policy", "Link", "SLO s", "TTFT s", "SLO met", "Transfer s",
                                                  "Decode s", "Recompute s", "Prefill s", "Text chunks", "Agreement"};
    return section >= 0 && section < ColumnCount ? QVariant(tr(names[section])) : QVariant();
}

void StreamRunsModel::addRun(const StreamRunResult& run)
{
    beginInsertRows(QModelIndex(), rowCount(), rowCount());
    m_runs.push_back(run);
    endInsertRows();
}

// ---- StreamLabView

StreamLabView::StreamLabView(QWidget* parent) : QWidget(parent)
{
    m_linkKind = new QComboBox;
    m_linkKind->setObjectName(QStringLiteral("streamLinkKind"));
    m_linkKind->addItems({tr("constant"), tr("steps"), tr("Mahimahi trace")});
    m_rate = new QLineEdit(QStringLiteral("50Mbit"));
    m_rate->setObjectName(QStringLiteral("streamRate"));
    m_rate->setToolTip(tr("A rate (50Mbit, 800kbit, 1Gbit) or steps RATE:SECONDS,...,RATE (1Gbit:0.5,50Mbit)"));
    m_trace = new QLineEdit;
    m_trace->setObjectName(QStringLiteral("streamTrace"));
    m_trace->setPlaceholderText(tr("trace file (.down)"));
    auto* browse = new QPushButton(tr("…"));
    m_traceScale = new QDoubleSpinBox;
    m_traceScale->setRange(0.01, 1000);
    m_traceScale->setValue(1.0);
    m_traceScale->setPrefix(tr("× "));
    m_rtt = new QDoubleSpinBox;
    m_rtt->setObjectName(QStringLiteral("streamRtt"));
    m_rtt->setRange(0, 5000);
    m_rtt->setSuffix(tr(" ms"));
    m_sloSpin = new QDoubleSpinBox;
    m_sloSpin->setObjectName(QStringLiteral("streamSlo"));
    m_sloSpin->setRange(0.01, 600);
    m_sloSpin->setDecimals(2);
    m_sloSpin->setValue(1.0);
    m_sloSpin->setSuffix(tr(" s"));
    m_policy = new QComboBox;
    m_policy->setObjectName(QStringLiteral("streamPolicy"));
    setLevels(3);
    m_store = new QLineEdit;
    m_store->setObjectName(QStringLiteral("streamStore"));
    m_store->setPlaceholderText(tr("encode the cache now; or a.kvc,b.kvc / folder / redis://127.0.0.1:6379/kv"));
    m_start = new QPushButton(tr("Start"));
    m_start->setObjectName(QStringLiteral("streamStart"));
    m_start->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Return));
    m_stop = new QPushButton(tr("Stop"));
    m_stop->setObjectName(QStringLiteral("streamStop"));
    m_status = new QLabel;
    m_status->setObjectName(QStringLiteral("streamStatus"));
    m_status->setWordWrap(true);
    m_ttft = new QLabel(QStringLiteral("TTFT –"));
    m_ttft->setObjectName(QStringLiteral("streamTtft"));
    QFont big = m_ttft->font();
    big.setPointSizeF(big.pointSizeF() * 1.4);
    big.setBold(true);
    m_ttft->setFont(big);

    auto* traceRow = new QHBoxLayout;
    traceRow->addWidget(m_trace, 1);
    traceRow->addWidget(browse);
    traceRow->addWidget(m_traceScale);
    auto* form = new QFormLayout;
    form->addRow(tr("Link:"), m_linkKind);
    form->addRow(tr("Rate:"), m_rate);
    form->addRow(tr("Trace:"), traceRow);
    form->addRow(tr("RTT:"), m_rtt);
    form->addRow(tr("SLO:"), m_sloSpin);
    form->addRow(tr("Policy:"), m_policy);
    form->addRow(tr("Store:"), m_store);
    auto* buttons = new QHBoxLayout;
    buttons->addWidget(m_start);
    buttons->addWidget(m_stop);
    auto* controls = new QWidget;
    auto* cl = new QVBoxLayout(controls);
    cl->setContentsMargins(0, 0, 0, 0);
    cl->addLayout(form);
    cl->addLayout(buttons);
    cl->addWidget(m_ttft);
    cl->addWidget(m_status);
    cl->addStretch(1);

    m_bandwidthPlot = makePlot(QStringLiteral("bandwidthPlot"), tr("time (s)"), tr("Mbit/s"));
    QCPGraph* available = m_bandwidthPlot->addGraph();
    available->setName(tr("available"));
    available->setPen(QPen(QColor(150, 150, 150), 1.5));
    available->setBrush(QColor(150, 150, 150, 40));
    available->setLineStyle(QCPGraph::lsStepLeft);
    QCPGraph* used = m_bandwidthPlot->addGraph();
    used->setName(tr("used (per chunk)"));
    used->setPen(QPen(QColor(40, 110, 200), 2));
    used->setLineStyle(QCPGraph::lsStepLeft);
    m_bandwidthPlot->legend->setVisible(true);
    m_bandwidthPlot->legend->setFont(QFont(font().family(), 8));
    installPlotMenu(m_bandwidthPlot, QStringLiteral("stream-bandwidth"));

    m_timelinePlot = makePlot(QStringLiteral("timelinePlot"), tr("time (s)"), tr("chunk"));
    // Invisible graph so the CSV export carries the timeline as (arrival, chunk) points.
    QCPGraph* arrivals = m_timelinePlot->addGraph();
    arrivals->setName(tr("arrived"));
    arrivals->setLineStyle(QCPGraph::lsNone);
    arrivals->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, 3));
    m_timelinePlot->yAxis->setRangeReversed(true);
    installPlotMenu(m_timelinePlot, QStringLiteral("stream-timeline"));

    m_ttftPlot = makePlot(QStringLiteral("ttftPlot"), tr("run"), tr("seconds"));
    QCPBars* below = nullptr;
    for (int i = 0; i < 6; ++i) {
        auto* bars = new QCPBars(m_ttftPlot->xAxis, m_ttftPlot->yAxis);
        bars->setName(tr(kPartNames[i]));
        bars->setBrush(kPartColours[i]);
        bars->setPen(Qt::NoPen);
        bars->setWidth(0.6);
        if (below) bars->moveAbove(below);
        below = bars;
    }
    m_ttftPlot->legend->setVisible(true);
    m_ttftPlot->legend->setFont(QFont(font().family(), 7));
    m_ttftPlot->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignLeft);
    installPlotMenu(m_ttftPlot, QStringLiteral("stream-ttft"));

    m_original = new QPlainTextEdit;
    m_original->setObjectName(QStringLiteral("streamOriginalAnswer"));
    m_streamed = new QPlainTextEdit;
    m_streamed->setObjectName(QStringLiteral("streamAnswer"));
    for (QPlainTextEdit* e : {m_original, m_streamed}) {
        e->setReadOnly(true);
        e->setMaximumHeight(80);
    }
    m_runs = new StreamRunsModel(this);
    m_table = new QTableView;
    m_table->setObjectName(QStringLiteral("streamRuns"));
    m_table->setModel(m_runs);
    m_table->verticalHeader()->hide();
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);

    auto* plots = new QWidget;
    auto* grid = new QGridLayout(plots);
    grid->setContentsMargins(0, 0, 0, 0);
    grid->addWidget(m_bandwidthPlot, 0, 0);
    grid->addWidget(m_timelinePlot, 0, 1);
    grid->addWidget(m_ttftPlot, 1, 0);
    auto* answers = new QWidget;
    auto* al = new QVBoxLayout(answers);
    al->setContentsMargins(0, 0, 0, 0);
    al->addWidget(new QLabel(tr("Answer from the original KV")));
    al->addWidget(m_original);
    al->addWidget(new QLabel(tr("Answer from the streamed KV")));
    al->addWidget(m_streamed);
    al->addStretch(1);
    grid->addWidget(answers, 1, 1);

    auto* top = new QSplitter(Qt::Horizontal);
    top->addWidget(controls);
    top->addWidget(plots);
    top->setStretchFactor(1, 3);
    auto* vertical = new QSplitter(Qt::Vertical);
    vertical->addWidget(top);
    vertical->addWidget(m_table);
    vertical->setStretchFactor(0, 4);
    vertical->setStretchFactor(1, 1);
    auto* layout = new QVBoxLayout(this);
    layout->addWidget(vertical);

    connect(browse, &QPushButton::clicked, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Mahimahi trace"), QString(),
                                                          tr("Traces (*.down *.up *.trace *.txt);;All files (*)"));
        if (!path.isEmpty()) setTracePath(path);
    });
    connect(m_start, &QPushButton::clicked, this, &StreamLabView::startRequested);
    connect(m_stop, &QPushButton::clicked, this, &StreamLabView::stopRequested);
    setReady(false, tr("Capture a context with a model open to stream its KV."));
}

StreamLabView::~StreamLabView() = default;

StreamConfig StreamLabView::config() const
{
    StreamConfig c;
    c.link = StreamConfig::Link(m_linkKind->currentIndex());
    c.rate = m_rate->text().trimmed();
    c.tracePath = m_trace->text().trimmed();
    c.traceScale = m_traceScale->value();
    c.rttMs = m_rtt->value();
    c.sloSeconds = m_sloSpin->value();
    c.policies = QStringList{m_policy->currentData().toString()};
    c.store = m_store->text().trimmed();
    return c;
}

void StreamLabView::setConfig(const StreamConfig& c)
{
    m_linkKind->setCurrentIndex(int(c.link));
    m_rate->setText(c.rate);
    m_trace->setText(c.tracePath);
    m_traceScale->setValue(c.traceScale);
    m_rtt->setValue(c.rttMs);
    m_sloSpin->setValue(c.sloSeconds);
    const int i = c.policies.isEmpty() ? -1 : m_policy->findData(c.policies.front());
    if (i >= 0) m_policy->setCurrentIndex(i);
    m_store->setText(c.store);
}

void StreamLabView::setLevels(int levels)
{
    const QString current = m_policy->currentData().toString();
    m_policy->clear();
    m_policy->addItem(tr("adaptive"), QStringLiteral("adaptive"));
    m_policy->addItem(tr("text (recompute)"), QStringLiteral("text"));
    m_policy->addItem(tr("int8"), QStringLiteral("int8"));
    for (int l = 1; l <= levels; ++l) m_policy->addItem(tr("level %1").arg(l), QStringLiteral("level:%1").arg(l));
    const int i = m_policy->findData(current);
    m_policy->setCurrentIndex(std::max(0, i));
}

void StreamLabView::setTracePath(const QString& path)
{
    m_trace->setText(path);
    m_linkKind->setCurrentIndex(StreamConfig::Trace);
}

void StreamLabView::setStorePath(const QString& path) { m_store->setText(path); }

void StreamLabView::setReady(bool ready, const QString& note)
{
    m_ready = ready;
    setRunning(false);
    setStatus(note);
}

void StreamLabView::setRunning(bool running)
{
    m_start->setEnabled(m_ready && !running);
    m_stop->setEnabled(running);
}

void StreamLabView::setStatus(const QString& text) { m_status->setText(text); }

QString StreamLabView::ttftText() const { return m_ttft->text(); }

void StreamLabView::runStarted(const LinkSeries& available)
{
    setRunning(true);
    m_chunks.clear();
    m_usedT.clear();
    m_usedMbps.clear();
    m_slo = config().sloSeconds;
    m_ttft->setText(tr("TTFT … (SLO %1 s)").arg(m_slo, 0, 'f', 2));
    m_bandwidthPlot->graph(0)->setData(QVector<double>(available.seconds.begin(), available.seconds.end()),
                                       QVector<double>(available.mbps.begin(), available.mbps.end()), true);
    m_bandwidthPlot->graph(1)->data()->clear();
    m_bandwidthPlot->rescaleAxes();
    m_bandwidthPlot->yAxis->setRangeLower(0);
    m_bandwidthPlot->replot();
    redrawTimeline({});
}

void StreamLabView::addChunk(const StreamChunkPoint& c)
{
    m_chunks.push_back(c);
    // The rate this chunk got while its bytes flowed (first byte to last), as a step.
    const double span = c.arrivedS - c.firstByteS;
    if (c.bytes > 0 && span > 0) {
        m_usedT.push_back(c.firstByteS);
        m_usedMbps.push_back(double(c.bytes) * 8e-6 / span);
        m_usedT.push_back(c.arrivedS);
        m_usedMbps.push_back(0);
        m_bandwidthPlot->graph(1)->setData(QVector<double>(m_usedT.begin(), m_usedT.end()),
                                           QVector<double>(m_usedMbps.begin(), m_usedMbps.end()), true);
        m_bandwidthPlot->rescaleAxes();
        m_bandwidthPlot->yAxis->setRangeLower(0);
        m_bandwidthPlot->replot();
    }
    redrawTimeline(m_chunks);
}

void StreamLabView::redrawTimeline(const std::vector<StreamChunkPoint>& chunks)
{
    m_timelinePlot->clearItems();
    QVector<double> x, y;
    double end = 0;
    for (const StreamChunkPoint& c : chunks) {
        auto* fetch = new QCPItemRect(m_timelinePlot);
        fetch->topLeft->setCoords(c.sentS, c.index - 0.35);
        fetch->bottomRight->setCoords(std::max(c.arrivedS, c.sentS + 1e-4), c.index + 0.35);
        fetch->setBrush(levelColour(c.level));
        fetch->setPen(Qt::NoPen);
        if (c.decodedS > c.jobStartS) {  // the decode or recompute job, thinner
            auto* job = new QCPItemRect(m_timelinePlot);
            job->topLeft->setCoords(c.jobStartS, c.index - 0.12);
            job->bottomRight->setCoords(c.decodedS, c.index + 0.12);
            job->setBrush(QColor(60, 60, 60));
            job->setPen(Qt::NoPen);
        }
        auto* label = new QCPItemText(m_timelinePlot);
        label->position->setCoords(std::max(c.arrivedS, c.decodedS), c.index);
        label->setPositionAlignment(Qt::AlignLeft | Qt::AlignVCenter);
        label->setFont(QFont(font().family(), 7));
        label->setText(c.level == 0 ? (c.local ? tr(" T (local)") : tr(" T")) : QStringLiteral(" L%1").arg(c.level));
        x << c.arrivedS;
        y << c.index;
        end = std::max({end, c.arrivedS, c.decodedS});
    }
    m_timelinePlot->graph(0)->setData(x, y, true);
    auto* slo = new QCPItemStraightLine(m_timelinePlot);
    slo->setPen(QPen(Qt::red, 1, Qt::DashLine));
    slo->point1->setCoords(m_slo, 0);
    slo->point2->setCoords(m_slo, 1);
    m_timelinePlot->xAxis->setRange(0, std::max(end, m_slo) * 1.15);
    m_timelinePlot->yAxis->setRange(-0.6, std::max<double>(chunks.size(), 1) - 0.4);
    m_timelinePlot->replot();
}

void StreamLabView::redrawTtft()
{
    const auto& runs = m_runs->runs();
    for (int p = 0; p < 6; ++p) {
        auto* bars = static_cast<QCPBars*>(m_ttftPlot->plottable(p));
        QVector<double> x, y;
        for (const StreamRunResult& r : runs) {
            x << r.run;
            y << r.parts[p];
        }
        bars->setData(x, y, true);
    }
    m_ttftPlot->clearItems();
    double top = 0;
    for (const StreamRunResult& r : runs) {
        top = std::max({top, r.ttftSeconds, r.sloSeconds});
        auto* slo = new QCPItemLine(m_ttftPlot);  // each run's SLO over its bar
        slo->setPen(QPen(Qt::red, 2));
        slo->start->setCoords(r.run - 0.45, r.sloSeconds);
        slo->end->setCoords(r.run + 0.45, r.sloSeconds);
    }
    m_ttftPlot->xAxis->setRange(0.4, std::max<double>(runs.size(), 1) + 0.6);
    m_ttftPlot->yAxis->setRange(0, std::max(top, 0.01) * 1.5);  // room for the legend
    m_ttftPlot->replot();
}

void StreamLabView::runFinished(const StreamRunResult& r)
{
    m_chunks = r.chunks;
    redrawTimeline(m_chunks);
    m_runs->addRun(r);
    m_table->scrollToBottom();
    redrawTtft();
    m_ttft->setText(tr("TTFT %1 s (SLO %2 s, %3)")
                        .arg(r.ttftSeconds, 0, 'f', 3)
                        .arg(r.sloSeconds, 0, 'f', 2)
                        .arg(r.sloMet ? tr("met") : tr("missed")));
    m_original->setPlainText(r.referenceText);
    m_streamed->setPlainText(r.text);
    setRunning(false);
    setStatus(tr("Run %1: %2 chunks, %3 of %4 bytes the link could carry, token agreement %5.")
                  .arg(r.run)
                  .arg(r.chunks.size())
                  .arg(r.deliveredBytes)
                  .arg(qint64(r.capacityBytes))
                  .arg(r.tokenAgreement, 0, 'f', 2));
}

void StreamLabView::runEnded(const QString& status)
{
    setRunning(false);
    setStatus(status);
}

}  // namespace kvscope
