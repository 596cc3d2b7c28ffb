#include "stream_lab_view.h"

#include "plot_style.h"
#include "stream_link_editor.h"
#include "stream_race_figure.h"

#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QGridLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableView>
#include <QVBoxLayout>

#include <algorithm>

namespace kvscope {

namespace {

QString policyLabel(const QString& policy)
{
    if (policy.startsWith(QLatin1String("level:"))) return QObject::tr("level %1").arg(policy.mid(6));
    if (policy == QLatin1String("text")) return QObject::tr("text (recompute)");
    return policy;
}

}  // namespace

StreamLabView::StreamLabView(QWidget* parent) : QWidget(parent)
{
    m_link = new StreamLinkEditor(this);
    connect(m_link, &StreamLinkEditor::edited, this, &StreamLabView::scheduleEdited);
    connect(m_link, &StreamLinkEditor::statusChanged, this, &StreamLabView::setStatus);
    connect(m_link, &StreamLinkEditor::drawn, this, [this] {
        m_race.results.clear();  // the schedule shown is the one drawn, not a finished race's
        m_laneChunks.clear();
        emit scheduleEdited();
    });
    QWidget* setup = createSetup();
    m_figure = new StreamRaceFigure;
    m_link->attachPlot(m_figure->bandwidthPlot(), &m_race.available);
    QWidget* results = createResults();

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

    updateHardwareWidgets();
    setRunning(false);
    redrawLive();
    redrawTtft();
}

StreamLabView::~StreamLabView() = default;

QFormLayout* StreamLabView::createSetupForm()
{
    m_rtt = new QDoubleSpinBox;
    m_rtt->setObjectName(QStringLiteral("streamRtt"));
    m_rtt->setRange(0, 2000);
    m_rtt->setSuffix(tr(" ms"));
    m_sloSpin = new QDoubleSpinBox;
    m_sloSpin->setObjectName(QStringLiteral("streamSlo"));
    m_sloSpin->setRange(0.01, 600);
    m_sloSpin->setValue(1.0);
    m_sloSpin->setSuffix(tr(" s"));
    connect(m_sloSpin, &QDoubleSpinBox::valueChanged, m_link, &StreamLinkEditor::setSloSeconds);
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

    auto* form = new QFormLayout;
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    form->addRow(tr("Link:"), m_link->kindCombo());
    form->addRow(QString(), m_link->stack());
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
    return form;
}

QWidget* StreamLabView::createSetup()
{
    QFormLayout* form = createSetupForm();
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
    return setup;
}

QWidget* StreamLabView::createResults()
{
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
    return results;
}

QCustomPlot* StreamLabView::bandwidthPlot() const { return m_figure->bandwidthPlot(); }
QCustomPlot* StreamLabView::timelinePlot() const { return m_figure->timelinePlot(); }
QCustomPlot* StreamLabView::levelsPlot() const { return m_figure->levelsPlot(); }
QCustomPlot* StreamLabView::ttftPlot() const { return m_figure->ttftPlot(); }
QTableWidget* StreamLabView::scheduleTable() const { return m_link->stepsTable(); }
QPushButton* StreamLabView::drawLinkButton() const { return m_link->drawButton(); }

void StreamLabView::drawLink(double t0, double t1, double mbps) { m_link->drawLink(t0, t1, mbps); }

bool StreamLabView::exportFigure(const QString& path, QString* error) { return m_figure->exportTo(path, error); }

void StreamLabView::redrawLive() { m_figure->drawLive(m_race, m_laneChunks, m_levels); }

void StreamLabView::redrawTtft() { m_figure->drawTtft(m_race); }

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

StreamConfig StreamLabView::config() const
{
    StreamConfig c;
    c.link = m_link->link();
    c.rate = m_link->rate();
    c.tracePath = m_link->tracePath();
    c.traceScale = m_link->traceScale();
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
    m_link->setLink(c);
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

void StreamLabView::setTracePath(const QString& path) { m_link->setTracePath(path); }

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
    m_link->setRunning(running);
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
    if (error.isEmpty()) m_link->setPreview(available);
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
    if (m_link->drawButton()->isChecked()) m_link->drawButton()->setChecked(false);
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
    m_figure->setTitle(title);
}

}  // namespace kvscope
