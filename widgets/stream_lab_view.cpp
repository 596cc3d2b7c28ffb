#include "stream_lab_view.h"

#include "plot_export.h"
#include "plot_style.h"
#include "plot_widget.h"

#include <qcustomplot.h>

#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileInfo>
#include <QFormLayout>
#include <QGridLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QImageWriter>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMouseEvent>
#include <QSignalBlocker>
#include <QPainter>
#include <QPdfWriter>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableView>
#include <QTableWidget>
#include <QVBoxLayout>
#ifdef KVSCOPE_HAVE_QT_SVG
#include <QSvgGenerator>
#endif

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// A schedule that drops and recovers: what adaptive streaming is for.
const char* const kDropAndRecover = "40Mbit:0.3,4Mbit:0.4,40Mbit";

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

QString seconds(double s) { return QString::number(s, 'f', 3); }

QString policyLabel(const QString& policy)
{
    if (policy.startsWith(QLatin1String("level:"))) return QObject::tr("level %1").arg(policy.mid(6));
    if (policy == QLatin1String("text")) return QObject::tr("text (recompute)");
    return policy;
}

// ---- StreamRunsModel

int StreamRunsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : int(m_runs.size()); }
int StreamRunsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant StreamRunsModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= ColumnCount) return {};
    const StreamRunResult& r = m_runs[size_t(index.row())];
    if (role == Qt::ForegroundRole && index.column() == MetCol) return QColor(r.sloMet ? Qt::darkGreen : Qt::red);
    if (role == Qt::DecorationRole && index.column() == PolicyCol) return style::policyColor(r.policy, 8);
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
    case KlCol: return r.hasQuality ? QString::number(r.kl, 'g', 3) : QStringLiteral("–");
    case DeltaPplCol: return r.hasQuality ? QString::number(r.deltaPplPct, 'f', 2) : QStringLiteral("–");
    case HardwareCol: return r.hardware;
    case ModelledCol: {
        QStringList parts;
        for (int i = 0; i < StreamRunResult::kParts; ++i)
            if (r.partModelled[i]) parts << QLatin1String(StreamRunResult::partName(i));
        return parts.isEmpty() ? tr("none") : parts.join(QStringLiteral(", "));
    }
    }
    return {};
}

QVariant StreamRunsModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (role != Qt::DisplayRole || orientation != Qt::Horizontal) return {};
    static const char* const names[ColumnCount] = {"Run",       "Policy",    "Link",        "SLO s",     "TTFT s",
                                                  "SLO met",   "Transfer s", "Decode s",   "Recompute s", "Prefill s",
                                                  "Text chunks", "Agreement", "KL",          "ΔPPL %",
                                                  "Compute",     "Modelled parts"};
    return section >= 0 && section < ColumnCount ? QVariant(tr(names[section])) : QVariant();
}

void StreamRunsModel::addRun(const StreamRunResult& run)
{
    beginInsertRows(QModelIndex(), rowCount(), rowCount());
    m_runs.push_back(run);
    endInsertRows();
}

void StreamRunsModel::clear()
{
    if (m_runs.empty()) return;
    beginResetModel();
    m_runs.clear();
    endResetModel();
}

// ---- StreamLabView

StreamLabView::StreamLabView(QWidget* parent) : QWidget(parent)
{
    // Link: a rate, typed steps, or a trace.
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
        emit scheduleEdited();
    });
    connect(dropPreset, &QPushButton::clicked, this, [this] { applyStepsPreset(QLatin1String(kDropAndRecover)); });
    connect(m_steps, &QTableWidget::itemChanged, this, [this] { emit scheduleEdited(); });
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
        emit scheduleEdited();
    });
    connect(m_rate, &QLineEdit::editingFinished, this, &StreamLabView::scheduleEdited);
    connect(m_trace, &QLineEdit::editingFinished, this, &StreamLabView::scheduleEdited);
    connect(m_traceScale, &QDoubleSpinBox::valueChanged, this, &StreamLabView::scheduleEdited);

    m_rtt = new QDoubleSpinBox;
    m_rtt->setObjectName(QStringLiteral("streamRtt"));
    m_rtt->setRange(0, 2000);
    m_rtt->setSuffix(tr(" ms"));
    m_sloSpin = new QDoubleSpinBox;
    m_sloSpin->setObjectName(QStringLiteral("streamSlo"));
    m_sloSpin->setRange(0.01, 600);
    m_sloSpin->setValue(1.0);
    m_sloSpin->setSuffix(tr(" s"));
    connect(m_sloSpin, &QDoubleSpinBox::valueChanged, this, &StreamLabView::scheduleEdited);

    m_policies = new QListWidget;
    m_policies->setObjectName(QStringLiteral("streamPolicies"));
    m_policies->setMaximumHeight(110);
    m_policies->setToolTip(tr("The policies raced on the same link schedule"));
    setLevels(3);
    m_mode = new QComboBox;
    m_mode->setObjectName(QStringLiteral("streamMode"));
    m_mode->addItem(tr("back to back"), int(StreamConfig::BackToBack));
    m_mode->addItem(tr("at once, a link each"), int(StreamConfig::AtOnce));
    m_mode->addItem(tr("at once, one shared link"), int(StreamConfig::SharedLink));
    m_mode->setToolTip(tr("Back to back: one policy after the other, each on the schedule from its start. At once: "
                          "concurrently, each on its own link with the same schedule. Shared link: concurrently, "
                          "competing for one link (fair shares). Running at once, measured compute parts share "
                          "this machine's cores: model them on target hardware to compare transfers alone."));

    m_hardware = new QComboBox;
    m_hardware->setObjectName(QStringLiteral("streamHardware"));
    setHardwarePresets({{QStringLiteral("measured"), tr("This machine (measured)"), 0, 0, -1, QString()}});
    m_hardware->setToolTip(tr("Decode, recompute and the question's prefill: measured on this CPU, or modelled "
                              "from rates (the transfer is always measured on the socket)"));
    m_prefillRate = new QDoubleSpinBox;
    m_prefillRate->setObjectName(QStringLiteral("streamPrefillRate"));
    m_prefillRate->setRange(1, 1e7);
    m_prefillRate->setDecimals(0);
    m_prefillRate->setValue(5000);
    m_prefillRate->setSuffix(tr(" tok/s"));
    m_decodeRate = new QDoubleSpinBox;
    m_decodeRate->setObjectName(QStringLiteral("streamDecodeRate"));
    m_decodeRate->setRange(0.01, 1e4);
    m_decodeRate->setValue(10);
    m_decodeRate->setSuffix(tr(" GB/s"));
    auto* rates = new QHBoxLayout;
    rates->addWidget(m_prefillRate);
    rates->addWidget(m_decodeRate);
    connect(m_hardware, &QComboBox::currentIndexChanged, this, [this] { updateHardwareWidgets(); });

    m_store = new QLineEdit;
    m_store->setObjectName(QStringLiteral("streamStore"));
    m_store->setPlaceholderText(tr("encode the cache now; or a.kvc,b.kvc / folder / redis://"));

    m_start = new QPushButton(tr("Race"));
    m_start->setObjectName(QStringLiteral("streamStart"));
    m_start->setToolTip(tr("Run every checked policy on the link (Ctrl+T)"));
    m_stop = new QPushButton(tr("Stop"));
    m_stop->setObjectName(QStringLiteral("streamStop"));
    connect(m_start, &QPushButton::clicked, this, &StreamLabView::startRequested);
    connect(m_stop, &QPushButton::clicked, this, &StreamLabView::stopRequested);
    auto* saveRun = new QPushButton(tr("Save run…"));
    saveRun->setObjectName(QStringLiteral("streamSaveRun"));
    auto* openRun = new QPushButton(tr("Open run…"));
    openRun->setObjectName(QStringLiteral("streamOpenRun"));
    auto* exportFig = new QPushButton(tr("Export figure…"));
    exportFig->setObjectName(QStringLiteral("streamExportFigure"));
    connect(saveRun, &QPushButton::clicked, this, &StreamLabView::saveRunRequested);
    connect(openRun, &QPushButton::clicked, this, &StreamLabView::openRunRequested);
    connect(exportFig, &QPushButton::clicked, this, &StreamLabView::exportFigureRequested);

    auto* form = new QFormLayout;
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    form->addRow(tr("Link:"), m_linkKind);
    form->addRow(QString(), m_linkStack);
    form->addRow(tr("RTT / SLO:"), [this] {
        auto* w = new QWidget;
        auto* l = new QHBoxLayout(w);
        l->setContentsMargins(0, 0, 0, 0);
        l->addWidget(m_rtt);
        l->addWidget(m_sloSpin);
        return w;
    }());
    form->addRow(tr("Policies:"), m_policies);
    form->addRow(tr("Race:"), m_mode);
    form->addRow(tr("Compute:"), m_hardware);
    form->addRow(QString(), rates);
    form->addRow(tr("Store:"), m_store);
    auto* buttons = new QGridLayout;
    buttons->addWidget(m_start, 0, 0);
    buttons->addWidget(m_stop, 0, 1);
    buttons->addWidget(saveRun, 1, 0);
    buttons->addWidget(openRun, 1, 1);
    buttons->addWidget(exportFig, 2, 0, 1, 2);
    m_preview = new QLabel;
    m_preview->setObjectName(QStringLiteral("streamPreview"));
    m_preview->setWordWrap(true);
    m_ttft = new QLabel(tr("TTFT –"));
    m_ttft->setObjectName(QStringLiteral("streamTtft"));
    m_ttft->setWordWrap(true);
    QFont big = m_ttft->font();
    big.setBold(true);
    m_ttft->setFont(big);
    m_modelledNote = new QLabel;
    m_modelledNote->setObjectName(QStringLiteral("streamModelledNote"));
    m_modelledNote->setWordWrap(true);
    m_status = new QLabel;
    m_status->setObjectName(QStringLiteral("streamStatus"));
    m_status->setWordWrap(true);

    auto* setup = new QGroupBox(tr("Race setup"));
    auto* left = new QVBoxLayout(setup);
    left->addLayout(form);
    left->addLayout(buttons);
    left->addWidget(m_preview);
    left->addWidget(m_ttft);
    left->addWidget(m_modelledNote);
    left->addWidget(m_status);
    left->addStretch(1);
    setup->setMinimumWidth(300);
    setup->setMaximumWidth(380);

    // The figure: four plots, side by side, one lane per policy.
    m_bandwidthPlot = makePlot(QStringLiteral("bandwidthPlot"), tr("time (s)"), tr("Mbit/s"));
    {
        QCPGraph* available = m_bandwidthPlot->addGraph();
        available->setName(tr("available"));
        available->setPen(QPen(style::neutralColor(), 1.5));
        available->setBrush(QColor(150, 150, 150, 50));
        available->setLineStyle(QCPGraph::lsStepLeft);
        style::putLegendAbove(m_bandwidthPlot, 3);
    }
    installPlotMenu(m_bandwidthPlot, QStringLiteral("stream-bandwidth"));
    m_bandwidthPlot->installEventFilter(this);
    connect(m_drawLink, &QPushButton::toggled, this, [this](bool on) {
        // Drawing and dragging the view would fight over the same mouse moves.
        m_bandwidthPlot->setInteraction(QCP::iRangeDrag, !on);
        m_bandwidthPlot->setInteraction(QCP::iRangeZoom, !on);
        m_bandwidthPlot->setCursor(on ? Qt::CrossCursor : Qt::ArrowCursor);
        if (on) {
            // Show the schedule being edited, scaled to its own rates, so a stroke lands where it is aimed.
            beginDraw();
            showDrawGrid();
            double top = 1;
            for (double v : m_drawMbps) top = std::max(top, v);
            m_bandwidthPlot->xAxis->setRange(0, std::max(2.0 * m_sloSpin->value(), 1.0));
            m_bandwidthPlot->yAxis->setRange(0, top * 1.3);
            replotSoon(m_bandwidthPlot);
            setStatus(tr("Drag over the bandwidth plot to draw the link's rate; release to use it."));
        }
    });
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

    m_figure = new QWidget;
    m_figure->setObjectName(QStringLiteral("streamFigure"));
    auto* fig = new QGridLayout(m_figure);
    fig->setContentsMargins(0, 0, 0, 0);
    m_figureTitle = new QLabel;
    m_figureTitle->setObjectName(QStringLiteral("streamFigureTitle"));
    m_figureTitle->setWordWrap(true);
    fig->addWidget(m_figureTitle, 0, 0, 1, 2);
    fig->addWidget(m_timelinePlot, 1, 0);
    fig->addWidget(m_ttftPlot, 1, 1);
    fig->addWidget(m_bandwidthPlot, 2, 0);
    fig->addWidget(m_levelsPlot, 2, 1);
    fig->setColumnStretch(0, 3);
    fig->setColumnStretch(1, 2);
    fig->setRowStretch(1, 3);
    fig->setRowStretch(2, 2);

    // Results: the runs and the answers.
    m_runs = new StreamRunsModel(this);
    m_table = new QTableView;
    m_table->setObjectName(QStringLiteral("streamRuns"));
    m_table->setModel(m_runs);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->verticalHeader()->setVisible(false);
    connect(m_table, &QTableView::clicked, this, [this](const QModelIndex& i) {
        const StreamRunResult& r = m_runs->runs()[size_t(i.row())];
        m_original->setPlainText(r.referenceText);
        m_streamed->setPlainText(r.text);
        m_streamedLabel->setText(tr("Answer from the streamed KV (run %1, %2)").arg(r.run).arg(r.policy));
    });
    m_original = new QPlainTextEdit;
    m_original->setObjectName(QStringLiteral("streamOriginalAnswer"));
    m_streamed = new QPlainTextEdit;
    m_streamed->setObjectName(QStringLiteral("streamStreamedAnswer"));
    for (QPlainTextEdit* e : {m_original, m_streamed}) e->setReadOnly(true);
    m_streamedLabel = new QLabel(tr("Answer from the streamed KV"));
    auto* answers = new QWidget;
    auto* al = new QGridLayout(answers);
    al->setContentsMargins(0, 0, 0, 0);
    al->addWidget(new QLabel(tr("Answer from the original KV")), 0, 0);
    al->addWidget(m_streamedLabel, 0, 1);
    al->addWidget(m_original, 1, 0);
    al->addWidget(m_streamed, 1, 1);
    auto* results = new QSplitter(Qt::Horizontal);
    results->setObjectName(QStringLiteral("streamResultsSplitter"));
    results->addWidget(m_table);
    results->addWidget(answers);
    results->setStretchFactor(0, 3);
    results->setStretchFactor(1, 2);

    auto* right = new QSplitter(Qt::Vertical);
    right->setObjectName(QStringLiteral("streamRightSplitter"));
    right->addWidget(m_figure);
    right->addWidget(results);
    right->setStretchFactor(0, 4);
    right->setStretchFactor(1, 1);
    right->setChildrenCollapsible(false);

    auto* layout = new QHBoxLayout(this);
    layout->addWidget(setup);
    layout->addWidget(right, 1);

    applyStepsPreset(QLatin1String(kDropAndRecover));
    updateLinkWidgets();
    updateHardwareWidgets();
    setRunning(false);
    redrawLive();
    redrawTtft();
}

StreamLabView::~StreamLabView() = default;

void StreamLabView::updateLinkWidgets()
{
    m_linkStack->setCurrentIndex(m_linkKind->currentIndex());
}

void StreamLabView::setHardwarePresets(const std::vector<HardwarePreset>& presets)
{
    const QString current = m_hardware->currentData().toString();
    m_presets = presets;
    const QSignalBlocker block(m_hardware);
    m_hardware->clear();
    for (const HardwarePreset& p : m_presets) {
        m_hardware->addItem(p.label, p.id);
        if (!p.citation.isEmpty()) m_hardware->setItemData(m_hardware->count() - 1, p.citation, Qt::ToolTipRole);
    }
    m_hardware->addItem(tr("Custom (modelled)"), QStringLiteral("custom"));
    const int i = m_hardware->findData(current);
    m_hardware->setCurrentIndex(i >= 0 ? i : 0);
    updateHardwareWidgets();
}

void StreamLabView::updateHardwareWidgets()
{
    if (!m_prefillRate) return;  // during construction
    const QString id = m_hardware->currentData().toString();
    for (const HardwarePreset& p : m_presets)
        if (p.id == id && p.modelled()) {
            m_prefillRate->setValue(p.prefillTokensPerSecond);
            m_decodeRate->setValue(p.decodeGBps);
        }
    const bool custom = id == QLatin1String("custom");
    const bool measured = id == QLatin1String("measured");
    m_prefillRate->setEnabled(custom);
    m_decodeRate->setEnabled(custom);
    m_prefillRate->setVisible(!measured);
    m_decodeRate->setVisible(!measured);
}

QString StreamLabView::stepsText() const
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

void StreamLabView::setStepsText(const QString& steps)
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

void StreamLabView::applyStepsPreset(const QString& steps)
{
    setStepsText(steps);
    emit scheduleEdited();
}

StreamConfig StreamLabView::config() const
{
    StreamConfig c;
    c.link = StreamConfig::Link(m_linkKind->currentIndex());
    c.rate = c.link == StreamConfig::Steps ? stepsText() : m_rate->text().trimmed();
    c.tracePath = m_trace->text().trimmed();
    c.traceScale = m_traceScale->value();
    c.rttMs = m_rtt->value();
    c.sloSeconds = m_sloSpin->value();
    c.policies.clear();
    for (int i = 0; i < m_policies->count(); ++i)
        if (m_policies->item(i)->checkState() == Qt::Checked) c.policies << m_policies->item(i)->data(Qt::UserRole).toString();
    c.mode = StreamConfig::Mode(m_mode->currentData().toInt());
    c.hardware = m_hardware->currentData().toString();
    if (c.hardware != QLatin1String("measured")) {
        c.prefillTokensPerSecond = m_prefillRate->value();
        c.decodeGBps = m_decodeRate->value();
        for (const HardwarePreset& p : m_presets)
            if (p.id == c.hardware) c.weightPassSeconds = p.weightPassSeconds;
    }
    c.store = m_store->text().trimmed();
    return c;
}

void StreamLabView::setConfig(const StreamConfig& c)
{
    m_linkKind->setCurrentIndex(int(c.link));
    if (c.link == StreamConfig::Steps)
        setStepsText(c.rate);
    else
        m_rate->setText(c.rate);
    m_trace->setText(c.tracePath);
    m_traceScale->setValue(c.traceScale);
    m_rtt->setValue(c.rttMs);
    m_sloSpin->setValue(c.sloSeconds);
    m_mode->setCurrentIndex(std::max(0, m_mode->findData(int(c.mode))));
    for (int i = 0; i < m_policies->count(); ++i) {
        QListWidgetItem* item = m_policies->item(i);
        item->setCheckState(c.policies.contains(item->data(Qt::UserRole).toString()) ? Qt::Checked : Qt::Unchecked);
    }
    int hw = m_hardware->findData(c.hardware);
    if (hw < 0) hw = c.prefillTokensPerSecond > 0 || c.decodeGBps > 0 ? m_hardware->findData(QStringLiteral("custom")) : 0;
    m_hardware->setCurrentIndex(hw);
    if (c.prefillTokensPerSecond > 0) m_prefillRate->setValue(c.prefillTokensPerSecond);
    if (c.decodeGBps > 0) m_decodeRate->setValue(c.decodeGBps);
    m_store->setText(c.store);
    updateLinkWidgets();
    emit scheduleEdited();
}

void StreamLabView::setLevels(int levels)
{
    m_levels = std::max(1, levels);
    QStringList checked;
    for (int i = 0; i < m_policies->count(); ++i)
        if (m_policies->item(i)->checkState() == Qt::Checked) checked << m_policies->item(i)->data(Qt::UserRole).toString();
    if (m_policies->count() == 0) checked = {QStringLiteral("adaptive"), QStringLiteral("text"), QStringLiteral("int8")};
    m_policies->clear();
    QStringList ids{QStringLiteral("adaptive"), QStringLiteral("text"), QStringLiteral("int8")};
    for (int l = 1; l <= m_levels; ++l) ids << QStringLiteral("level:%1").arg(l);
    for (const QString& id : ids) {
        auto* item = new QListWidgetItem(policyLabel(id), m_policies);
        item->setData(Qt::UserRole, id);
        item->setData(Qt::DecorationRole, style::policyColor(id, m_levels));
        item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsUserCheckable);
        item->setCheckState(checked.contains(id) ? Qt::Checked : Qt::Unchecked);
    }
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
    m_running = running;
    m_start->setEnabled(m_ready && !running);
    m_stop->setEnabled(running);
}

void StreamLabView::setStatus(const QString& text) { m_status->setText(text); }

QString StreamLabView::ttftText() const { return m_ttft->text(); }

int StreamLabView::chunksShown() const
{
    int n = 0;
    for (const auto& lane : m_laneChunks) n += int(lane.size());
    return n;
}

int StreamLabView::chunksShown(int lane) const
{
    return lane >= 0 && lane < int(m_laneChunks.size()) ? int(m_laneChunks[size_t(lane)].size()) : 0;
}

void StreamLabView::setSchedulePreview(const LinkSeries& available, const QString& error)
{
    if (m_running) return;  // the race's own schedule stays on screen
    if (error.isEmpty()) m_previewSeries = available;
    if (!error.isEmpty()) {
        m_preview->setText(tr("Link: %1").arg(error));
        return;
    }
    double lo = 1e300, hi = 0;
    for (double v : available.mbps) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    m_preview->setText(available.mbps.empty() ? QString()
                                              : tr("Link: %1 to %2 Mbit/s over the first %3 s (drawn in the bandwidth plot).")
                                                    .arg(lo, 0, 'g', 3)
                                                    .arg(hi, 0, 'g', 3)
                                                    .arg(available.seconds.empty() ? 0.0 : available.seconds.back(), 0, 'f', 1));
    if (m_race.results.empty() && m_laneChunks.empty()) {
        m_race.available = available;
        redrawLive();
    }
}

void StreamLabView::raceStarted(const QStringList& policies, const LinkSeries& available)
{
    if (m_drawLink->isChecked()) m_drawLink->setChecked(false);
    setRunning(true);
    m_race = RaceRecord{};
    m_race.config = config();
    m_race.config.policies = policies;
    m_race.available = available;
    m_laneChunks.assign(size_t(policies.size()), {});
    m_currentLane = 0;
    m_runs->clear();
    m_original->clear();
    m_streamed->clear();
    updateTtftText();
    redrawLive();
    redrawTtft();
}

void StreamLabView::laneStarted(int lane)
{
    m_currentLane = lane;
    updateTtftText();
}

void StreamLabView::addChunk(const StreamChunkPoint& chunk)
{
    if (chunk.lane < 0 || chunk.lane >= int(m_laneChunks.size())) return;
    m_laneChunks[size_t(chunk.lane)].push_back(chunk);
    redrawLive();
}

void StreamLabView::runFinished(const StreamRunResult& r)
{
    if (r.lane < 0 || r.lane >= int(m_laneChunks.size())) return;
    m_laneChunks[size_t(r.lane)] = r.chunks;  // with their decode jobs now
    if (int(m_race.results.size()) <= r.lane) m_race.results.resize(size_t(r.lane) + 1);
    m_race.results[size_t(r.lane)] = r;
    m_runs->addRun(r);
    showAnswer(r.lane);
    updateTtftText();
    redrawLive();
    redrawTtft();
}

void StreamLabView::raceFinished(const RaceRecord& race)
{
    const StreamConfig shown = m_race.config;
    m_race = race;
    m_race.config.link = shown.link;  // the view's own link widgets stay as they were
    if (shown.link == StreamConfig::Steps) m_race.config.rate = shown.rate;
    setRunning(false);
    m_currentLane = -1;
    setStatus(tr("Race done: %n policy(ies) on the same link schedule; click a run for its answer.", nullptr,
                 int(race.results.size())));
    updateTtftText();
    redrawLive();
    redrawTtft();
}

void StreamLabView::runEnded(const QString& status)
{
    setRunning(false);
    m_currentLane = -1;
    setStatus(status);
    updateTtftText();
}

void StreamLabView::showRace(const RaceRecord& race)
{
    m_race = race;
    m_laneChunks.clear();
    for (const StreamRunResult& r : race.results) m_laneChunks.push_back(r.chunks);
    m_runs->clear();
    for (const StreamRunResult& r : race.results) m_runs->addRun(r);
    if (!race.results.empty()) showAnswer(0);
    m_currentLane = -1;
    setConfig(race.config);
    updateTtftText();
    redrawLive();
    redrawTtft();
}

void StreamLabView::showAnswer(int lane)
{
    if (lane < 0 || lane >= int(m_race.results.size())) return;
    const StreamRunResult& r = m_race.results[size_t(lane)];
    m_original->setPlainText(r.referenceText);
    m_streamed->setPlainText(r.text);
    m_streamedLabel->setText(tr("Answer from the streamed KV (%1)").arg(r.policy));
}

void StreamLabView::updateTtftText()
{
    const QStringList& policies = m_race.config.policies;
    QStringList parts;
    for (int lane = 0; lane < policies.size(); ++lane) {
        if (lane < int(m_race.results.size()) && !m_race.results[size_t(lane)].policy.isEmpty()) {
            const StreamRunResult& r = m_race.results[size_t(lane)];
            parts << tr("%1 %2 s %3").arg(r.policy).arg(r.ttftSeconds, 0, 'f', 3).arg(r.sloMet ? QStringLiteral("✓") : QStringLiteral("✗"));
        } else if (lane == m_currentLane || (m_running && m_race.config.mode != StreamConfig::BackToBack)) {
            parts << tr("%1 …").arg(policies[lane]);
        }
    }
    // Which parts were modelled (the same for every run of a race).
    QStringList modelled;
    for (const StreamRunResult& r : m_race.results) {
        if (r.policy.isEmpty()) continue;
        for (int i = 0; i < StreamRunResult::kParts; ++i)
            if (r.partModelled[i] && !modelled.contains(tr(StreamRunResult::partName(i)))) modelled << tr(StreamRunResult::partName(i));
    }
    QString note;
    if (!m_race.results.empty()) {
        note = modelled.isEmpty() ? tr("Every TTFT part measured on this machine.")
                                  : tr("Modelled on the target: %1; measured: the rest (transfer always).")
                                        .arg(modelled.join(QStringLiteral(", ")));
        bool quality = false;
        for (const StreamRunResult& r : m_race.results) quality = quality || r.hasQuality;
        if (quality && !m_race.qualitySource.isEmpty()) note += tr(" KL and ΔPPL on the %1.").arg(m_race.qualitySource);
    }
    m_modelledNote->setText(note);
    m_ttft->setText(parts.isEmpty() ? tr("TTFT –")
                                    : tr("TTFT %1 (SLO %2 s)").arg(parts.join(QStringLiteral(" · "))).arg(m_race.config.sloSeconds, 0, 'f', 2));
    QString title = tr("<b>Stream race</b>");
    if (!m_race.cache.isEmpty()) title += tr(" on %1").arg(m_race.cache.toHtmlEscaped());
    if (!m_race.results.empty())
        title += tr(" · link %1 · SLO %2 s · compute %3")
                     .arg(m_race.results.front().link.toHtmlEscaped())
                     .arg(m_race.config.sloSeconds, 0, 'f', 2)
                     .arg(m_race.results.front().hardware.toHtmlEscaped());
    if (!m_modelledNote->text().isEmpty()) title += QStringLiteral("<br><small>%1</small>").arg(m_modelledNote->text().toHtmlEscaped());
    m_figureTitle->setText(title);
}

void StreamLabView::redrawLive()
{
    const QStringList& policies = m_race.config.policies;
    const int lanes = int(m_laneChunks.size());
    double tMax = m_race.config.sloSeconds;

    // Timeline: lane blocks from top to bottom, one row per chunk.
    m_timelinePlot->clearItems();
    int maxChunks = 1;
    for (const auto& lane : m_laneChunks) {
        maxChunks = std::max(maxChunks, int(lane.size()));
        for (const StreamChunkPoint& c : lane) tMax = std::max({tMax, c.arrivedS, c.decodedS});
    }
    for (int r = 0; r < int(m_race.results.size()); ++r) tMax = std::max(tMax, m_race.results[size_t(r)].ttftSeconds);
    const double rowH = 1.0 / double(maxChunks + 1);
    QSharedPointer<QCPAxisTickerText> laneTicks(new QCPAxisTickerText);
    for (int lane = 0; lane < lanes; ++lane) {
        const double base = lanes - 1 - lane;  // first policy on top
        const QString policy = lane < policies.size() ? policies[lane] : QString();
        laneTicks->addTick(base + 0.5, policy);
        for (const StreamChunkPoint& c : m_laneChunks[size_t(lane)]) {
            const double y0 = base + 0.05 + c.index * rowH, y1 = y0 + rowH * 0.8;
            auto* fetch = new QCPItemRect(m_timelinePlot);
            fetch->topLeft->setCoords(c.sentS, y1);
            fetch->bottomRight->setCoords(std::max(c.arrivedS, c.sentS + 1e-4), y0);
            // int8 chunks in the int8 baseline colour; cachegen levels on the level scale.
            const QColor colour = policy == QLatin1String("int8") && c.level > 0 ? style::baselineColor(policy)
                                                                                  : style::levelColor(c.level, m_levels);
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
    slo->point1->setCoords(m_race.config.sloSeconds, 0);
    slo->point2->setCoords(m_race.config.sloSeconds, 1);
    slo->setPen(QPen(style::sloColor(), 1.2, Qt::DashLine));
    auto* sloText = new QCPItemText(m_timelinePlot);
    sloText->position->setType(QCPItemPosition::ptPlotCoords);
    sloText->position->setCoords(m_race.config.sloSeconds, std::max(1, lanes));
    sloText->setPositionAlignment(Qt::AlignLeft | Qt::AlignTop);
    sloText->setText(tr(" SLO"));
    sloText->setColor(style::sloColor());
    m_timelinePlot->yAxis->setTicker(laneTicks);
    m_timelinePlot->yAxis->setRange(0, std::max(1, lanes));
    m_timelinePlot->xAxis->setRange(0, tMax * 1.05);
    replotSoon(m_timelinePlot);

    // Bandwidth: available vs what each lane's chunks got.
    while (m_bandwidthPlot->graphCount() > 1) m_bandwidthPlot->removeGraph(m_bandwidthPlot->graphCount() - 1);
    m_bandwidthPlot->graph(0)->setData(QVector<double>(m_race.available.seconds.begin(), m_race.available.seconds.end()),
                                       QVector<double>(m_race.available.mbps.begin(), m_race.available.mbps.end()), true);
    double top = 1;
    for (double v : m_race.available.mbps) top = std::max(top, v);
    for (int lane = 0; lane < lanes; ++lane) {
        QCPGraph* g = m_bandwidthPlot->addGraph();
        const QString policy = lane < policies.size() ? policies[lane] : QString();
        g->setName(tr("%1 used").arg(policy));
        g->setPen(QPen(style::policyColor(policy, m_levels), 1.8));
        g->setLineStyle(QCPGraph::lsStepLeft);
        QVector<double> t, r;
        for (const StreamChunkPoint& c : m_laneChunks[size_t(lane)]) {
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

    // Levels chosen per chunk.
    m_levelsPlot->clearGraphs();
    for (int lane = 0; lane < lanes; ++lane) {
        QCPGraph* g = m_levelsPlot->addGraph();
        const QString policy = lane < policies.size() ? policies[lane] : QString();
        g->setName(policy);
        const QColor c = style::policyColor(policy, m_levels);
        g->setPen(QPen(c, 1.6));
        g->setLineStyle(QCPGraph::lsStepCenter);
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, c, c, 5));
        QVector<double> x, y;
        // Lanes side by side: a small offset so equal levels do not hide each other.
        const double offset = lanes > 1 ? (lane - (lanes - 1) / 2.0) * 0.06 : 0.0;
        for (const StreamChunkPoint& ch : m_laneChunks[size_t(lane)]) {
            x << ch.index;
            y << ch.level + offset;
        }
        g->setData(x, y, true);
    }
    QSharedPointer<QCPAxisTickerText> levelTicks(new QCPAxisTickerText);
    levelTicks->addTick(0, tr("text"));
    for (int l = 1; l <= m_levels; ++l) levelTicks->addTick(l, QString::number(l));
    m_levelsPlot->yAxis->setTicker(levelTicks);
    m_levelsPlot->yAxis->setRange(-0.5, m_levels + 0.5);
    m_levelsPlot->xAxis->setRange(-0.5, maxChunks - 0.5);
    replotSoon(m_levelsPlot);
}

void StreamLabView::redrawTtft()
{
    const QStringList& policies = m_race.config.policies;
    const int lanes = int(policies.size());
    m_ttftPlot->clearItems();
    double top = m_race.config.sloSeconds;
    for (int p = 0; p < StreamRunResult::kParts; ++p) {
        QVector<double> x, y;
        for (const StreamRunResult& r : m_race.results) {
            if (r.policy.isEmpty()) continue;
            x << r.lane;
            y << r.parts[p];
        }
        static_cast<QCPBars*>(m_ttftPlot->plottable(p))->setData(x, y, true);
    }
    QSharedPointer<QCPAxisTickerText> ticks(new QCPAxisTickerText);
    for (int lane = 0; lane < lanes; ++lane) ticks->addTick(lane, policies[lane]);
    for (const StreamRunResult& r : m_race.results) {
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
    slo->point1->setCoords(0, m_race.config.sloSeconds);
    slo->point2->setCoords(1, m_race.config.sloSeconds);
    slo->setPen(QPen(style::sloColor(), 1.5, Qt::DashLine));
    m_ttftPlot->xAxis->setTicker(ticks);
    m_ttftPlot->xAxis->setRange(-0.6, std::max(1, lanes) - 0.4);
    m_ttftPlot->yAxis->setRange(0, top * 1.4);  // room for the labels above the bars
    replotSoon(m_ttftPlot);
}

bool StreamLabView::exportFigure(const QString& path, QString* error)
{
    const QString suffix = QFileInfo(path).suffix().toLower();
    if (!plotImageSuffixes().contains(suffix)) {
        if (error) *error = tr("%1: unknown image type '%2' (use %3)").arg(path, suffix, plotImageSuffixes().join(QStringLiteral(", ")));
        return false;
    }
    // Render at a readable size even when the page is hidden or small.
    const QSize before = m_figure->size();
    const QSize size = m_figure->isVisible() ? before.expandedTo(QSize(1000, 600)) : QSize(1200, 720);
    if (!m_figure->isVisible() || size != before) {
        m_figure->resize(size);
        m_figure->layout()->activate();
    }
    for (QCustomPlot* plot : m_figure->findChildren<QCustomPlot*>()) plot->replot(QCustomPlot::rpImmediateRefresh);
    bool ok = false;
    QString why;
    if (suffix == QLatin1String("pdf")) {
        QPdfWriter pdf(path);
        pdf.setPageSize(QPageSize(QSizeF(size) * 0.75, QPageSize::Point));
        pdf.setPageMargins(QMarginsF(0, 0, 0, 0));
        pdf.setResolution(96);
        QPainter painter;
        if (painter.begin(&pdf)) {
            m_figure->render(&painter, QPoint(), QRegion(), QWidget::DrawChildren);
            ok = painter.end();
        }
        why = tr("cannot write the PDF");
#ifdef KVSCOPE_HAVE_QT_SVG
    } else if (suffix == QLatin1String("svg")) {
        QSvgGenerator svg;
        svg.setFileName(path);
        svg.setSize(size);
        svg.setViewBox(QRect(QPoint(), size));
        svg.setTitle(tr("kvscope stream race"));
        QPainter painter;
        if (painter.begin(&svg)) {
            m_figure->render(&painter, QPoint(), QRegion(), QWidget::DrawChildren);
            ok = painter.end();
        }
        ok = ok && QFileInfo(path).size() > 0;
        why = tr("cannot write the SVG");
#endif
    } else {
        QImage image(size * 2, QImage::Format_ARGB32);
        image.setDevicePixelRatio(2);
        image.fill(palette().color(QPalette::Window));
        QPainter painter(&image);
        m_figure->render(&painter, QPoint(), QRegion(), QWidget::DrawChildren);
        painter.end();
        QImageWriter writer(path);
        ok = writer.write(image);
        why = writer.errorString();
    }
    if (m_figure->size() != before) m_figure->resize(before);
    if (!ok && error) *error = QStringLiteral("%1: %2").arg(path, why);
    return ok;
}

// ---- Drawing the link

namespace {

// Drawn rates to two significant figures, at least 0.1 Mbit/s: steps a user would type (and equal
// cells compare equal, so runs merge into one step).
double roundRate(double mbps)
{
    mbps = std::max(0.1, mbps);
    const double scale = std::pow(10.0, std::floor(std::log10(mbps)) - 1);
    return std::round(mbps / scale) * scale;
}

}  // namespace

bool StreamLabView::eventFilter(QObject* watched, QEvent* event)
{
    if (watched != m_bandwidthPlot || !m_drawLink->isChecked() || m_running) return QWidget::eventFilter(watched, event);
    const QEvent::Type type = event->type();
    if (type != QEvent::MouseButtonPress && type != QEvent::MouseMove && type != QEvent::MouseButtonRelease)
        return QWidget::eventFilter(watched, event);
    auto* me = static_cast<QMouseEvent*>(event);
    const QPointF pos = me->position();
    const double t = std::max(0.0, m_bandwidthPlot->xAxis->pixelToCoord(pos.x()));
    const double mbps = m_bandwidthPlot->yAxis->pixelToCoord(pos.y());
    if (type == QEvent::MouseButtonPress && me->button() == Qt::LeftButton) {
        beginDraw();
        m_drawing = true;
        m_drawLastT = t;
        paintDraw(t, t + kDrawStepSeconds, mbps);
        showDrawGrid();
        return true;
    }
    if (!m_drawing) return QWidget::eventFilter(watched, event);
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

void StreamLabView::beginDraw()
{
    // The grid covers what the plots show before a race (twice the SLO, at least 1 s), from the
    // schedule's sampled rate; the rate after the grid is the schedule's last sampled one.
    const double horizon = std::max(2.0 * m_sloSpin->value(), 1.0);
    const int cells = std::max(1, int(std::ceil(horizon / kDrawStepSeconds - 1e-9)));
    m_drawMbps.assign(size_t(cells), 40.0);
    const LinkSeries& a = m_previewSeries.seconds.empty() ? m_race.available : m_previewSeries;
    if (!a.seconds.empty()) {
        size_t k = 0;
        for (int i = 0; i < cells; ++i) {
            const double mid = (i + 0.5) * kDrawStepSeconds;
            while (k + 1 < a.seconds.size() && a.seconds[k + 1] <= mid) ++k;
            m_drawMbps[size_t(i)] = roundRate(a.mbps[k]);
        }
    }
}


void StreamLabView::paintDraw(double t0, double t1, double mbps)
{
    mbps = roundRate(mbps);
    const int first = std::max(0, int(std::floor(t0 / kDrawStepSeconds + 1e-9)));
    const int last = int(std::ceil(t1 / kDrawStepSeconds - 1e-9));  // exclusive
    if (last > int(m_drawMbps.size())) m_drawMbps.resize(size_t(last), m_drawMbps.empty() ? mbps : m_drawMbps.back());
    for (int i = first; i < last; ++i) m_drawMbps[size_t(i)] = mbps;
}

void StreamLabView::showDrawGrid()
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
    m_bandwidthPlot->graph(0)->setData(t, r, true);
    replotSoon(m_bandwidthPlot);
}

void StreamLabView::commitDraw()
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
    m_race.results.clear();  // the schedule shown is the one drawn, not a finished race's
    m_laneChunks.clear();
    emit scheduleEdited();
}

void StreamLabView::drawLink(double t0, double t1, double mbps)
{
    beginDraw();
    paintDraw(t0, t1, mbps);
    commitDraw();
}

}  // namespace kvscope
