#include "codec_tuner_view.h"

#include "bins_table_model.h"
#include "plot_export.h"
#include "plot_style.h"
#include "plot_widget.h"
#include "view_data.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <qcustomplot.h>

#include <QCheckBox>
#include <QComboBox>
#include <QStandardItemModel>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QGridLayout>
#include <QLabel>
#include <QLineEdit>
#include <QLocale>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QTableView>
#include <QTimer>
#include <QVBoxLayout>

#include <set>

namespace kvscope {

namespace {

const char* const kFigureKeys[] = {"bits", "bytes", "fp16", "int8", "dppl", "kl", "agreement"};

QSpinBox* spin(const QString& name, int lo, int hi, int step, int value)
{
    auto* s = new QSpinBox;
    s->setObjectName(name);
    s->setRange(lo, hi);
    s->setSingleStep(step);
    s->setValue(value);
    return s;
}

QComboBox* quantizerCombo(const QString& name)
{
    auto* c = new QComboBox;
    c->setObjectName(name);
    c->addItem(QObject::tr("per token (CacheGen)"), int(Quantizer::PerToken));
    c->addItem(QObject::tr("per channel (KIVI)"), int(Quantizer::PerChannel));
    return c;
}

}  // namespace

CodecTunerView::CodecTunerView(QWidget* parent) : QWidget(parent)
{
    m_debounce = new QTimer(this);
    m_debounce->setSingleShot(true);
    m_debounce->setInterval(kDebounceMs);
    connect(m_debounce, &QTimer::timeout, this, &CodecTunerView::settingsChanged);

    QFormLayout* settings = buildSettings();
    QHBoxLayout* group = buildBinsEditor();
    QGridLayout* actions = buildActions();
    addQualityRows(settings);
    auto* left = new QWidget;
    auto* ll = new QVBoxLayout(left);
    ll->setContentsMargins(0, 0, 0, 0);
    ll->addLayout(settings);
    ll->addWidget(m_stageBox);
    ll->addWidget(m_table, 1);
    ll->addLayout(group);
    ll->addLayout(actions);

    QWidget* right = buildResults();

    auto* split = new QSplitter(Qt::Horizontal);
    split->addWidget(left);
    split->addWidget(right);
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 1);
    auto* layout = new QVBoxLayout(this);
    layout->addWidget(split);

    connect(m_model, &BinsTableModel::binsEdited, this, &CodecTunerView::edited);
    for (QSpinBox* s : {m_chunk, m_delta}) connect(s, &QSpinBox::valueChanged, this, &CodecTunerView::edited);
    for (QComboBox* c : {m_keyQuant, m_valueQuant})
        connect(c, &QComboBox::currentIndexChanged, this, &CodecTunerView::edited);
    connect(m_levelCombo, &QComboBox::currentIndexChanged, this, [this](int index) {
        if (m_loading || index < 0) return;
        storeLevel();
        m_level = index;
        showLevel();
        edited();
    });
    setAvailable(false, false, tr("Capture a context or open a KV file to try codec settings on it."));
}

// Settings of the whole profile: the level being edited, chunk size, delta group, quantizers.
QFormLayout* CodecTunerView::buildSettings()
{
    m_levelCombo = new QComboBox;
    m_levelCombo->setObjectName(QStringLiteral("tunerLevel"));
    m_chunk = spin(QStringLiteral("tunerChunk"), 16, 8192, 16, 256);
    m_chunk->setSuffix(tr(" tokens"));
    m_delta = spin(QStringLiteral("tunerDelta"), 0, 256, 1, 10);
    m_delta->setSpecialValueText(tr("off"));
    m_delta->setToolTip(tr("Tokens per anchor group; deltas against the anchor (0 or 1: no delta coding)"));
    m_keyQuant = quantizerCombo(QStringLiteral("tunerKeyQuantizer"));
    m_valueQuant = quantizerCombo(QStringLiteral("tunerValueQuantizer"));
    auto* settings = new QFormLayout;
    settings->addRow(tr("Level:"), m_levelCombo);
    settings->addRow(tr("Chunk size:"), m_chunk);
    settings->addRow(tr("Delta group:"), m_delta);
    settings->addRow(tr("K quantizer:"), m_keyQuant);
    settings->addRow(tr("V quantizer:"), m_valueQuant);

    return settings;
}

// Bins per layer (m_table), with group editing: the row of buttons below the table.
QHBoxLayout* CodecTunerView::buildBinsEditor()
{
    m_model = new BinsTableModel(this);
    m_table = new QTableView;
    m_table->setObjectName(QStringLiteral("binsTable"));
    m_table->setModel(m_model);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_table->verticalHeader()->hide();
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_setBins = spin(QStringLiteral("tunerSetBins"), 4, 256, 2, 16);
    auto* setK = new QPushButton(tr("Set K"));
    auto* setV = new QPushButton(tr("Set V"));
    auto* setBoth = new QPushButton(tr("Set both"));
    setBoth->setObjectName(QStringLiteral("tunerSetBoth"));
    auto* group = new QHBoxLayout;
    group->addWidget(new QLabel(tr("Selected layers:")));
    group->addWidget(m_setBins);
    group->addWidget(setK);
    group->addWidget(setV);
    group->addWidget(setBoth);
    group->addStretch(1);
    connect(setK, &QPushButton::clicked, this, [this] { setBinsOnSelection(true, false, m_setBins->value()); });
    connect(setV, &QPushButton::clicked, this, [this] { setBinsOnSelection(false, true, m_setBins->value()); });
    connect(setBoth, &QPushButton::clicked, this, [this] { setBinsOnSelection(true, true, m_setBins->value()); });
    return group;
}

// Measurements and files.
QGridLayout* CodecTunerView::buildActions()
{
    m_sensBins = spin(QStringLiteral("tunerSensBins"), 4, 256, 2, 8);
    m_sensBins->setPrefix(tr("at "));
    m_sensBins->setSuffix(tr(" bins"));
    m_sensButton = new QPushButton(tr("Measure sensitivity"));
    m_sensButton->setObjectName(QStringLiteral("tunerSensitivity"));
    m_sensButton->setToolTip(tr("Quantize one layer's K or V at a time and score the continuation"));
    m_evalButton = new QPushButton(tr("Evaluate levels && baselines"));
    m_evalButton->setObjectName(QStringLiteral("tunerEvaluate"));
    m_tuneButton = new QPushButton(tr("Auto-tune…"));
    m_tuneButton->setObjectName(QStringLiteral("tunerAutoTune"));
    m_tuneButton->setToolTip(tr("Search bins per layer under ΔPPL budgets of 0.5, 1, 2 and 5 % (one level each)"));
    auto* load = new QPushButton(tr("Load…"));
    auto* save = new QPushButton(tr("Save…"));
    auto* lmcache = new QPushButton(tr("Export LMCache…"));
    connect(m_sensButton, &QPushButton::clicked, this, [this] { emit sensitivityRequested(m_sensBins->value() & ~1); });
    connect(m_evalButton, &QPushButton::clicked, this, &CodecTunerView::evaluateRequested);
    connect(m_tuneButton, &QPushButton::clicked, this, &CodecTunerView::autoTuneRequested);
    connect(load, &QPushButton::clicked, this, &CodecTunerView::loadProfileRequested);
    connect(save, &QPushButton::clicked, this, &CodecTunerView::saveProfileRequested);
    connect(lmcache, &QPushButton::clicked, this, &CodecTunerView::exportLmcacheRequested);
    auto* actions = new QGridLayout;
    actions->addWidget(m_sensButton, 0, 0);
    actions->addWidget(m_sensBins, 0, 1);
    actions->addWidget(m_evalButton, 0, 2);
    actions->addWidget(m_tuneButton, 0, 3);
    actions->addWidget(load, 1, 0);
    actions->addWidget(save, 1, 1);
    actions->addWidget(lmcache, 1, 2);
    return actions;
}

void CodecTunerView::addQualityRows(QFormLayout* settings)
{
    // Hooks for what lands later: where quality comes from (the held-out continuation today, a
    // quality suite once core has one) and the transform codec's stages as toggles.
    m_qualitySource = new QComboBox;
    m_qualitySource->setObjectName(QStringLiteral("tunerQualitySource"));
    m_qualitySource->setToolTip(tr("What ΔPPL, KL and the answers are measured on"));
    connect(m_qualitySource, &QComboBox::currentIndexChanged, this,
            [this] { emit qualitySourceChanged(qualitySource()); });
    settings->addRow(tr("Quality from:"), m_qualitySource);
    m_suitePath = new QLineEdit;
    m_suitePath->setObjectName(QStringLiteral("tunerSuitePath"));
    m_suitePath->setPlaceholderText(tr("suite file (.json), e.g. samples/suites/mini.json"));
    auto* browseSuite = new QPushButton(tr("…"));
    browseSuite->setObjectName(QStringLiteral("tunerSuiteBrowse"));
    browseSuite->setMaximumWidth(32);
    connect(browseSuite, &QPushButton::clicked, this, &CodecTunerView::chooseSuiteRequested);
    m_suiteRow = new QWidget;
    auto* suiteLayout = new QHBoxLayout(m_suiteRow);
    suiteLayout->setContentsMargins(0, 0, 0, 0);
    suiteLayout->addWidget(m_suitePath, 1);
    suiteLayout->addWidget(browseSuite);
    settings->addRow(tr("Suite:"), m_suiteRow);
    m_suiteRow->setEnabled(false);
    connect(m_qualitySource, &QComboBox::currentIndexChanged, this,
            [this] { m_suiteRow->setEnabled(qualitySource() == QLatin1String("suite")); });
    m_useDeltaPpl = false;
    auto* yMetric = new QComboBox;
    yMetric->setObjectName(QStringLiteral("tunerRdMetric"));
    yMetric->addItem(tr("KL (robust on short continuations)"));
    yMetric->addItem(tr("ΔPPL %"));
    connect(yMetric, &QComboBox::currentIndexChanged, this, [this](int i) {
        m_useDeltaPpl = i == 1;
        updateRdPlot();
    });
    settings->addRow(tr("Distortion axis:"), yMetric);
    m_stageBox = new QGroupBox(tr("Codec stages"));
    m_stageBox->setObjectName(QStringLiteral("tunerStages"));
    new QGridLayout(m_stageBox);
    m_stageBox->setVisible(false);
}

// The right side: the edited level's figures, the two answers, the rate-distortion plot.
QWidget* CodecTunerView::buildResults()
{
    m_figures = new QGroupBox(tr("Edited level"));
    auto* figures = new QFormLayout(m_figures);
    const char* const labels[] = {"Bits per value:", "Size:", "Ratio vs fp16:", "Ratio vs int8:", "ΔPPL:", "KL:",
                                  "Token agreement:"};
    for (int i = 0; i < 7; ++i) {
        auto* value = new QLabel(QStringLiteral("–"));
        value->setObjectName(QStringLiteral("figure_") + QLatin1String(kFigureKeys[i]));
        value->setTextInteractionFlags(Qt::TextSelectableByMouse);
        figures->addRow(tr(labels[i]), value);
    }
    m_status = new QLabel;
    m_status->setObjectName(QStringLiteral("tunerStatus"));
    m_status->setWordWrap(true);
    m_originalAnswer = new QPlainTextEdit;
    m_originalAnswer->setObjectName(QStringLiteral("tunerOriginalAnswer"));
    m_answer = new QPlainTextEdit;
    m_answer->setObjectName(QStringLiteral("tunerAnswer"));
    for (QPlainTextEdit* e : {m_originalAnswer, m_answer}) {
        e->setReadOnly(true);
        e->setMaximumHeight(90);
    }
    auto* answers = new QGridLayout;
    answers->addWidget(new QLabel(tr("Answer from the original KV")), 0, 0);
    answers->addWidget(new QLabel(tr("Answer from this level")), 0, 1);
    answers->addWidget(m_originalAnswer, 1, 0);
    answers->addWidget(m_answer, 1, 1);

    m_rdPlot = new Plot;
    m_rdPlot->setObjectName(QStringLiteral("rdPlot"));
    m_rdPlot->setMinimumSize(300, 220);
    m_rdPlot->xAxis->setLabel(tr("bits per value"));
    m_rdPlot->yAxis->setLabel(tr("ΔPPL %"));
    m_rdPlot->legend->setVisible(true);
    m_rdPlot->legend->setFont(QFont(font().family(), 8));
    m_rdPlot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    style::applyPlotStyle(m_rdPlot);
    installPlotMenu(m_rdPlot, QStringLiteral("rate-distortion"), [this] { return rdCsv(); });

    auto* right = new QWidget;
    auto* rl = new QVBoxLayout(right);
    rl->setContentsMargins(0, 0, 0, 0);
    rl->addWidget(m_figures);
    rl->addWidget(m_status);
    rl->addLayout(answers);
    addRdNotes(rl);
    rl->addWidget(m_rdPlot, 1);
    return right;
}

CodecTunerView::~CodecTunerView() = default;

void CodecTunerView::addRdNotes(QVBoxLayout* layout)
{
    // Above the plot: what its points were scored on, and which transform ladder they show.
    m_rdSource = new QLabel;
    m_rdSource->setObjectName(QStringLiteral("tunerRdSource"));
    m_transformNote = new QLabel;
    m_transformNote->setObjectName(QStringLiteral("tunerTransformNote"));
    for (QLabel* note : {m_rdSource, m_transformNote}) {
        note->setWordWrap(true);
        layout->addWidget(note);
    }
}

void CodecTunerView::edited()
{
    if (m_loading) return;
    m_debounce->start();
}

void CodecTunerView::storeLevel()
{
    if (m_level < 0 || m_level >= int(m_profile.levels.size())) return;
    m_profile.levels[size_t(m_level)].keyBins = m_model->keyBins();
    m_profile.levels[size_t(m_level)].valueBins = m_model->valueBins();
}

void CodecTunerView::showLevel()
{
    if (m_level < 0 || m_level >= int(m_profile.levels.size())) return;
    const CodecLevel& l = m_profile.levels[size_t(m_level)];
    m_model->setBins(l.keyBins, l.valueBins);
}

CodecProfile CodecTunerView::profile() const
{
    CodecProfile p = m_profile;
    if (m_level >= 0 && m_level < int(p.levels.size())) {
        p.levels[size_t(m_level)].keyBins = m_model->keyBins();
        p.levels[size_t(m_level)].valueBins = m_model->valueBins();
    }
    p.chunkTokens = m_chunk->value();
    p.deltaGroup = m_delta->value();
    p.keyQuantizer = Quantizer(m_keyQuant->currentData().toInt());
    p.valueQuantizer = Quantizer(m_valueQuant->currentData().toInt());
    return p;
}

int CodecTunerView::currentLevel() const { return m_level + 1; }

void CodecTunerView::setProfile(const CodecProfile& profile)
{
    m_loading = true;
    m_profile = profile;
    m_level = std::clamp(profile.defaultLevel - 1, 0, std::max(0, int(profile.levels.size()) - 1));
    m_levelCombo->clear();
    for (size_t i = 0; i < profile.levels.size(); ++i)
        m_levelCombo->addItem(QStringLiteral("%1: %2").arg(i + 1).arg(QString::fromStdString(profile.levels[i].name)));
    m_levelCombo->setCurrentIndex(m_level);
    m_chunk->setValue(profile.chunkTokens);
    m_delta->setValue(profile.deltaGroup);
    m_keyQuant->setCurrentIndex(profile.keyQuantizer == Quantizer::PerToken ? 0 : 1);
    m_valueQuant->setCurrentIndex(profile.valueQuantizer == Quantizer::PerToken ? 0 : 1);
    showLevel();
    m_hasTrial = m_hasQuality = false;
    m_loading = false;
    edited();
}

void CodecTunerView::setAvailable(bool cache, bool quality, const QString& note)
{
    setEnabled(true);
    m_sensButton->setEnabled(quality);
    m_evalButton->setEnabled(quality);
    if (!cache) clearRdPoints();
    m_tuneButton->setEnabled(quality);
    m_table->setEnabled(cache);
    setStatus(note);
}

void CodecTunerView::setBinsOnSelection(bool keys, bool values, int bins)
{
    std::set<int> rows;
    for (const QModelIndex& i : m_table->selectionModel()->selectedIndexes()) rows.insert(i.row());
    if (rows.empty()) {
        setStatus(tr("Select the layers to change first (click, Shift+click, Ctrl+click in the table)."));
        return;
    }
    if (!m_model->setBinsForLayers(std::vector<int>(rows.begin(), rows.end()), keys, values, bins))
        setStatus(tr("Bins must be an even number from 4 to 256."));
}

QString CodecTunerView::figure(const QString& key) const
{
    const auto* label = m_figures->findChild<QLabel*>(QStringLiteral("figure_") + key);
    return label ? label->text() : QString();
}

void CodecTunerView::setTrial(const TrialFigures& t)
{
    m_trial = t;
    m_hasTrial = true;
    auto set = [this](const char* key, const QString& text) {
        if (auto* l = m_figures->findChild<QLabel*>(QStringLiteral("figure_") + QLatin1String(key))) l->setText(text);
    };
    set("bits", QString::number(t.bitsPerValue, 'f', 3));
    set("bytes", QStringLiteral("%1 (%2 bytes)").arg(QLocale::c().formattedDataSize(qint64(t.bytes))).arg(t.bytes));
    set("fp16", QStringLiteral("%1×").arg(t.ratioVsFp16, 0, 'f', 2));
    set("int8", QStringLiteral("%1×").arg(t.ratioVsInt8, 0, 'f', 2));
    m_figures->setTitle(tr("Level %1 (encode %2 s, decode %3 s, RMS error %4)")
                            .arg(t.level)
                            .arg(t.encodeSeconds, 0, 'f', 2)
                            .arg(t.decodeSeconds, 0, 'f', 2)
                            .arg(t.rms, 0, 'g', 3));
    m_model->setErrors(t.layers);
    updateRdPlot();
}

void CodecTunerView::setQuality(const QualityFigures& q)
{
    m_quality = q;
    m_hasQuality = true;
    auto set = [this](const char* key, const QString& text) {
        if (auto* l = m_figures->findChild<QLabel*>(QStringLiteral("figure_") + QLatin1String(key))) l->setText(text);
    };
    set("dppl", q.hasContinuation ? QStringLiteral("%1 %").arg(q.deltaPplPct, 0, 'f', 3) : tr("no continuation"));
    set("kl", q.hasContinuation ? QString::number(q.kl, 'g', 4) : tr("no continuation"));
    set("agreement", QString::number(q.tokenAgreement, 'f', 3));
    m_originalAnswer->setPlainText(q.originalAnswer);
    m_answer->setPlainText(q.answer);
    updateRdPlot();
}

void CodecTunerView::setSensitivity(const std::vector<LayerSensitivity>& sensitivity)
{
    m_model->setSensitivity(sensitivity);
}

void CodecTunerView::setRdPoints(const std::vector<RdPoint>& points)
{
    m_rd = points;
    updateRdPlot();
}

void CodecTunerView::setStatus(const QString& text) { m_status->setText(text); }

void CodecTunerView::updateRdPlot()
{
    // Rebuilt each time: one graph per baseline and per level, so each keeps its own colour
    // (baselines fixed, levels on the sequential scale) and the CSV names every series.
    m_rdPlot->clearItems();
    m_rdPlot->clearGraphs();
    const bool kl = !m_useDeltaPpl;
    // KL is never negative and spans orders of magnitude (int8 near 1e-4, coarse levels near 1):
    // a log axis keeps every point apart. Lossless points (KL 0) sit on the axis floor, labelled
    // so; the plot's CSV has the exact values.
    double floorY = 0;
    if (kl) {
        double minPositive = std::numeric_limits<double>::infinity();
        for (const RdPoint& p : m_rd)
            if (p.kl > 0) minPositive = std::min(minPositive, p.kl);
        if (m_hasQuality && m_quality.hasContinuation && m_quality.kl > 0) minPositive = std::min(minPositive, m_quality.kl);
        floorY = std::isfinite(minPositive) ? minPositive / 4 : 1e-4;
    }
    auto yOf = [kl, floorY](double dppl, double klv) { return kl ? std::max(klv, floorY) : dppl; };
    auto labelOf = [kl](const RdPoint& p) { return kl && p.kl <= 0 ? tr("%1: KL 0").arg(p.label) : p.label; };
    m_rdPlot->yAxis->setScaleType(kl ? QCPAxis::stLogarithmic : QCPAxis::stLinear);
    if (kl)
        m_rdPlot->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>::create());
    else
        m_rdPlot->yAxis->setTicker(QSharedPointer<QCPAxisTicker>::create());
    m_rdPlot->yAxis->setLabel(kl ? tr("KL vs the original cache (log)") : tr("ΔPPL %"));
    // Labels right of their point, except in the right fifth of the plot (they would leave it).
    double xMax = 0;
    for (const RdPoint& p : m_rd) xMax = std::max(xMax, p.bitsPerValue);
    auto label = [this, xMax](double x, double y, const QString& text) {
        auto* t = new QCPItemText(m_rdPlot);
        t->position->setCoords(x, y);
        const bool right = x > 0.8 * xMax;
        t->setPositionAlignment((right ? Qt::AlignRight : Qt::AlignLeft) | Qt::AlignBottom);
        t->setText(right ? text + QStringLiteral(" ") : QStringLiteral(" ") + text);
        t->setColor(m_rdPlot->xAxis->tickLabelColor());
        t->setFont(QFont(font().family(), 7));
    };
    QVector<double> lx, ly;
    std::vector<const RdPoint*> levels;
    for (const RdPoint& p : m_rd)
        if (p.codec == QLatin1String("cachegen")) levels.push_back(&p);
    if (!levels.empty()) {
        QCPGraph* line = m_rdPlot->addGraph();
        line->setName(tr("profile levels"));
        line->setPen(QPen(style::neutralColor(), 1.2));
        for (const RdPoint* p : levels) {
            lx << p->bitsPerValue;
            ly << yOf(p->deltaPplPct, p->kl);
        }
        line->setData(lx, ly, true);
        line->removeFromLegend();
    }
    for (size_t i = 0; i < levels.size(); ++i) {
        const RdPoint& p = *levels[i];
        const QColor c = style::levelColor(int(i) + 1, int(levels.size()));
        QCPGraph* g = m_rdPlot->addGraph();
        g->setName(p.label);
        g->setLineStyle(QCPGraph::lsNone);
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, c, c, 9));
        g->setData({p.bitsPerValue}, {yOf(p.deltaPplPct, p.kl)});
        label(p.bitsPerValue, yOf(p.deltaPplPct, p.kl), labelOf(p));
    }
    // The transform codec's levels: one family, one colour, a line through its levels.
    QVector<double> tx, ty;
    for (const RdPoint& p : m_rd)
        if (p.codec == QLatin1String("transform")) {
            tx << p.bitsPerValue;
            ty << yOf(p.deltaPplPct, p.kl);
        }
    if (!tx.isEmpty()) {
        const QColor c = style::transformColor();
        QCPGraph* g = m_rdPlot->addGraph();
        g->setName(tr("transform levels"));
        g->setPen(QPen(c, 1.4));
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssTriangle, c, c, 9));
        g->setData(tx, ty);
        for (const RdPoint& p : m_rd)
            if (p.codec == QLatin1String("transform")) label(p.bitsPerValue, yOf(p.deltaPplPct, p.kl), p.label);
    }
    // Lossless baselines share the log axis's floor: one label names them all.
    QStringList lossless;
    double losslessX = std::numeric_limits<double>::infinity();
    for (const RdPoint& p : m_rd) {
        if (p.codec == QLatin1String("cachegen") || p.codec == QLatin1String("transform")) continue;
        const QColor c = style::baselineColor(p.codec);
        QCPGraph* g = m_rdPlot->addGraph();
        g->setName(p.label);
        g->setLineStyle(QCPGraph::lsNone);
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssSquare, c, c, 8));
        g->setData({p.bitsPerValue}, {yOf(p.deltaPplPct, p.kl)});
        if (kl && p.kl <= 0) {
            lossless << p.label;
            losslessX = std::min(losslessX, p.bitsPerValue);
        } else {
            label(p.bitsPerValue, yOf(p.deltaPplPct, p.kl), labelOf(p));
        }
    }
    if (!lossless.isEmpty()) label(losslessX, floorY, tr("%1: KL 0").arg(lossless.join(QStringLiteral(", "))));
    QCPGraph* edited = m_rdPlot->addGraph();
    edited->setName(tr("edited level"));
    edited->setLineStyle(QCPGraph::lsNone);
    edited->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssStar, style::accentColor(), style::accentColor(), 16));
    if (m_hasQuality && m_quality.hasContinuation)
        edited->setData({m_quality.bitsPerValue}, {yOf(m_quality.deltaPplPct, m_quality.kl)});
    m_rdPlot->rescaleAxes();
    m_rdPlot->xAxis->scaleRange(1.15);
    if (kl) {
        // A factor of room below the floor and above the top (for the labels).
        const QCPRange r = m_rdPlot->yAxis->range();
        m_rdPlot->yAxis->setRange(floorY / 2, std::max(r.upper, floorY * 10) * 4);
    } else {
        m_rdPlot->yAxis->scaleRange(1.2);
        if (m_rdPlot->yAxis->range().lower > 0) m_rdPlot->yAxis->setRangeLower(0);
    }
    replotSoon(m_rdPlot);
}

QString CodecTunerView::rdCsv() const
{
    QString out = QStringLiteral("codec,label,bits_per_value,delta_ppl_pct,kl\n");
    for (const RdPoint& p : m_rd)
        out += QStringLiteral("%1,%2,%3,%4,%5\n")
                   .arg(p.codec, QString(p.label).replace(QLatin1Char(','), QLatin1Char(' ')))
                   .arg(p.bitsPerValue, 0, 'g', 8)
                   .arg(p.deltaPplPct, 0, 'g', 8)
                   .arg(p.kl, 0, 'g', 8);
    return out;
}

void CodecTunerView::clearRdPoints()
{
    m_rd.clear();
    setRdSource(QString());
    m_transformNote->clear();
    updateRdPlot();
}

QString CodecTunerView::transformNote() const { return m_transformNote->text(); }

void CodecTunerView::setTransformNote(const QString& note) { m_transformNote->setText(note); }

void CodecTunerView::setRdSource(const QString& source)
{
    m_rdSourceText = source;
    if (source.isEmpty()) {
        m_rdSource->clear();
        return;
    }
    QString text = source == QLatin1String("continuation") ? tr("Points scored on the held-out continuation.")
                                                           : tr("Points scored on the %1.").arg(source);
    QStringList acc;
    for (const RdPoint& p : m_rd)
        if (p.accuracy >= 0) acc << QStringLiteral("%1 %2").arg(p.label).arg(p.accuracy, 0, 'f', 2);
    if (!acc.isEmpty()) text += tr(" Multiple-choice accuracy: %1.").arg(acc.join(QStringLiteral(", ")));
    m_rdSource->setText(text);
}

QString CodecTunerView::suitePath() const
{
    // The field shows shownPath(m_suiteFile) until the user types another path.
    const QString text = m_suitePath->text().trimmed();
    return !m_suiteFile.isEmpty() && text == shownPath(m_suiteFile) ? m_suiteFile : text;
}

void CodecTunerView::setSuitePath(const QString& path)
{
    m_suiteFile = path;
    m_suitePath->setText(shownPath(path));
    m_suitePath->setToolTip(path);
}

void CodecTunerView::setQualitySource(const QString& id)
{
    const int i = m_qualitySource->findData(id);
    if (i >= 0) m_qualitySource->setCurrentIndex(i);
}

void CodecTunerView::setStageOn(const QString& id, bool on)
{
    if (auto* box = m_stageBox->findChild<QCheckBox*>(QStringLiteral("stage_") + id)) box->setChecked(on);
}

void CodecTunerView::setQualitySources(const QStringList& ids, const QStringList& labels, const QStringList& disabled)
{
    const QString current = qualitySource();
    m_qualitySource->blockSignals(true);
    m_qualitySource->clear();
    for (int i = 0; i < ids.size(); ++i) {
        m_qualitySource->addItem(i < labels.size() ? labels[i] : ids[i], ids[i]);
        if (disabled.contains(ids[i]))
            if (auto* model = qobject_cast<QStandardItemModel*>(m_qualitySource->model()))
                model->item(i)->setEnabled(false);
    }
    const int i = m_qualitySource->findData(current);
    m_qualitySource->setCurrentIndex(std::max(0, i));
    m_qualitySource->blockSignals(false);
}

QString CodecTunerView::qualitySource() const
{
    return m_qualitySource->currentData().toString();
}

void CodecTunerView::setStages(const std::vector<CodecStage>& stages)
{
    m_stages = stages;
    auto* layout = static_cast<QGridLayout*>(m_stageBox->layout());
    while (QLayoutItem* item = layout->takeAt(0)) {
        delete item->widget();
        delete item;
    }
    for (size_t i = 0; i < m_stages.size(); ++i) {
        const CodecStage& st = m_stages[i];
        auto* box = new QCheckBox(st.label);
        box->setObjectName(QStringLiteral("stage_") + st.id);
        box->setChecked(st.on);
        box->setEnabled(st.enabled);
        box->setToolTip(st.toolTip);
        connect(box, &QCheckBox::toggled, this, [this, i](bool on) {
            m_stages[i].on = on;
            emit stagesChanged();
            edited();
        });
        layout->addWidget(box, int(i) / 3, int(i) % 3);
    }
    m_stageBox->setVisible(!m_stages.empty());
}

}  // namespace kvscope
