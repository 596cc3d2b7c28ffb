#include "main_window.h"

#include "codec_tuner_view.h"
#include "distributions_view.h"
#include "distributions_worker.h"
#include "layer_stats_view.h"
#include "library_versions.h"
#include "model_context_view.h"
#include "race_file.h"
#include "stream_lab_view.h"
#include "stream_session.h"
#include "tuner_session.h"
#include "plot_export.h"
#include "plot_style.h"
#include "plot_widget.h"

#include "codec/profile.h"
#include "eval/samples.h"
#include "kvio/kv_h5.h"
#include "kvscope/config.h"
#include "model/model.h"

#include <qcustomplot.h>

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QCloseEvent>
#include <QDir>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QTimer>
#include <QFormLayout>
#include <QGroupBox>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSplitter>
#include <QTabWidget>
#include <QVBoxLayout>
#include <QKeySequence>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollArea>
#include <QSaveFile>
#include <QSettings>
#include <QStatusBar>
#include <QUrl>

namespace kvscope {

namespace {

constexpr int kMaxRecentFiles = 10;

// QProgressBar::setValue repaints the bar at once (meant for loops that block the event loop),
// and that repaint paints every dirty widget of the window with it. Progress here comes from
// workers through the event loop: the bar is only marked for the next paint.
void setProgressLater(QProgressBar* bar, int value)
{
    bar->setUpdatesEnabled(false);
    bar->setValue(value);
    bar->setUpdatesEnabled(true);  // schedules the paint
}

const char* const kSettingsGeometry = "window/geometry";
const char* const kSettingsState = "window/state";
const char* const kSettingsRecent = "recentFiles";
const char* const kSettingsOpenDir = "window/openDir";
const char* const kSettingsModelDir = "window/modelDir";
const char* const kSettingsPage = "layout/page";
const char* const kSettingsTheme = "layout/theme";
const char* const kDemoContext = "long_1k";

// Summary rows: key (for summaryField and object names) and label, in display order.
const struct {
    const char* key;
    const char* label;
} kSummaryRows[] = {
    {"source", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Source")},
    {"model", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Model")},
    {"fingerprint", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Fingerprint")},
    {"layers", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Layers")},
    {"kv_heads", QT_TRANSLATE_NOOP("kvscope::MainWindow", "KV heads")},
    {"head_dim", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Head dim")},
    {"channels", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Channels")},
    {"tokens", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Tokens")},
    {"dtype", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Dtype")},
    {"kv_bytes", QT_TRANSLATE_NOOP("kvscope::MainWindow", "KV size")},
    {"file_bytes", QT_TRANSLATE_NOOP("kvscope::MainWindow", "File size")},
    {"k_locality", QT_TRANSLATE_NOOP("kvscope::MainWindow", "K variance raw/delta")},
    {"v_locality", QT_TRANSLATE_NOOP("kvscope::MainWindow", "V variance raw/delta")},
    {"k_entropy", QT_TRANSLATE_NOOP("kvscope::MainWindow", "K entropy raw→delta")},
    {"v_entropy", QT_TRANSLATE_NOOP("kvscope::MainWindow", "V entropy raw→delta")},
    {"load_time", QT_TRANSLATE_NOOP("kvscope::MainWindow", "Load time")},
};

QString summaryObjectName(const QString& key)
{
    return QStringLiteral("summary_") + key;
}

QString formatBytes(quint64 bytes)
{
    // Both forms: the rounded one to read, the exact one to compare with other tools.
    return QStringLiteral("%1 (%2 bytes)")
        .arg(QLocale::c().formattedDataSize(qint64(bytes)), QString::number(bytes));
}

struct KindSummary {
    double entropyRaw = 0, entropyDelta = 0;  // means over layers
    int layers = 0;
};

KindSummary summarize(const std::vector<TensorStats>& stats, KvKind kind)
{
    KindSummary out;
    for (const TensorStats& s : stats) {
        if (s.kind != kind) continue;
        ++out.layers;
        out.entropyRaw += s.entropyBits;
        out.entropyDelta += s.entropyBitsDelta;
    }
    if (out.layers) {
        out.entropyRaw /= out.layers;
        out.entropyDelta /= out.layers;
    }
    return out;
}

}  // namespace

MainWindow::MainWindow(bool useSettings, QWidget* parent) : QMainWindow(parent), m_useSettings(useSettings)
{
    m_modalErrors = qgetenv("KVSCOPE_NO_MODAL_ERRORS") != "1";
    setWindowTitle(QStringLiteral("kvscope"));
    setAcceptDrops(true);
    // Paths on screen relative to the tree the samples come from (a source tree or the installed
    // share directory), else file names.
    try {
        setShownPathRoot(QFileInfo(QString::fromStdString(samplesDir())).absolutePath());
    } catch (const std::exception&) {
        setShownPathRoot(QString());
    }

    m_loader = new KvLoader(this);
    connect(m_loader, &KvLoader::phaseChanged, this, &MainWindow::onPhaseChanged);
    connect(m_loader, &KvLoader::progressChanged, this, [this](int value) { setProgressLater(m_progress, value); });
    connect(m_loader, &KvLoader::loaded, this, &MainWindow::onLoaded);
    connect(m_loader, &KvLoader::failed, this, &MainWindow::onFailed);
    connect(m_loader, &KvLoader::cancelled, this, [this] {
        setBusy(false);
        m_phaseLabel->setText(m_hasData ? tr("Loading cancelled; still showing the previous cache.")
                                        : tr("Loading cancelled."));
        emit loadCancelled();
    });

    m_session = new ModelSession(this);

    createPages();
    connectSession();
    createStatusBar();
    createActions();

    resize(1280, 800);
    if (m_useSettings) {
        QSettings settings;
        restoreGeometry(settings.value(QLatin1String(kSettingsGeometry)).toByteArray());
        restoreState(settings.value(QLatin1String(kSettingsState)).toByteArray());
        m_recentFiles = settings.value(QLatin1String(kSettingsRecent)).toStringList();
        restoreLayout(settings);
    }
    rebuildRecentMenu();
    setBusy(false);
    m_phaseLabel->setText(
        tr("Open a model and capture a context, open a KV file (Ctrl+O), or try File ▸ Demo."));
}

MainWindow::~MainWindow() = default;

QStringList MainWindow::kvFileSuffixes()
{
    return {QStringLiteral("h5"), QStringLiteral("hdf5")};
}

void MainWindow::createActions()
{
    QMenu* file = menuBar()->addMenu(tr("&File"));
    QAction* open = file->addAction(tr("&Open KV File…"), this, &MainWindow::showOpenDialog);
    open->setShortcut(QKeySequence::Open);
    open->setObjectName(QStringLiteral("openAction"));
    m_recentMenu = file->addMenu(tr("Open &Recent"));
    m_recentMenu->setObjectName(QStringLiteral("recentMenu"));
    m_saveAction = file->addAction(tr("&Save KV As…"), this, &MainWindow::showSaveDialog);
    m_saveAction->setShortcut(QKeySequence::SaveAs);
    m_saveAction->setObjectName(QStringLiteral("saveAction"));
    m_saveAction->setEnabled(false);
    file->addSeparator();
    file->addAction(tr("Open &Model File…"), this, &MainWindow::showOpenModelFileDialog)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_M));
    file->addAction(tr("Open Model &Folder…"), this, &MainWindow::showOpenModelFolderDialog);
    file->addAction(tr("Open Default Mo&del"), this, [this] { openModel(QString()); });
    file->addAction(tr("Open Con&text…"), this, &MainWindow::showOpenContextDialog)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_O));
    m_captureAction = file->addAction(tr("&Capture KV"), this, &MainWindow::captureContext);
    m_captureAction->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_R));
    m_captureAction->setObjectName(QStringLiteral("captureAction"));
    file->addSeparator();
    QAction* demo = file->addAction(tr("&Demo"), this, &MainWindow::openDemo);
    demo->setObjectName(QStringLiteral("demoAction"));
    demo->setToolTip(tr("Open the default model and the long_1k sample, and capture its KV."));
    QAction* synthetic =
        file->addAction(tr("Open S&ynthetic KV"), this, [this] {
            m_synthNote.clear();
            openSynthetic(SyntheticSpec{});
        });
    synthetic->setToolTip(tr("A generated cache with realistic structure; no model involved."));
    file->addSeparator();
    m_cancelAction = file->addAction(tr("&Cancel"), this, &MainWindow::cancelLoad);
    m_cancelAction->setShortcut(Qt::Key_Escape);
    file->addSeparator();
    QAction* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
    quit->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Q));  // QKeySequence::Quit is empty on some desktops
    quit->setMenuRole(QAction::QuitRole);

    m_viewMenu = menuBar()->addMenu(tr("&View"));
    // Ctrl+1..4 go to a page of the workflow.
    for (int i = 0; i < m_pages->count(); ++i) {
        QAction* a = m_viewMenu->addAction(tr("Go to %1").arg(m_pages->tabText(i).replace(QLatin1Char('&'), QStringLiteral("&&"))),
                                           this, [this, i] { showPage(Page(i)); });
        a->setShortcut(QKeySequence(Qt::CTRL | Qt::Key(Qt::Key_1 + i)));
    }
    m_viewMenu->addSeparator();
    QAction* dark = m_viewMenu->addAction(tr("&Dark Theme"));
    dark->setObjectName(QStringLiteral("darkThemeAction"));
    dark->setCheckable(true);
    dark->setChecked(style::theme() == style::Theme::Dark);
    connect(dark, &QAction::toggled, this, [this](bool on) { setDarkTheme(on); });
    m_darkAction = dark;

    QMenu* tools = menuBar()->addMenu(tr("&Tools"));
    tools->addAction(tr("Open Codec &Profile…"), m_tuner, &CodecTunerView::loadProfileRequested)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_P));
    tools->addAction(tr("Save Codec Profile…"), m_tuner, &CodecTunerView::saveProfileRequested);
    tools->addAction(tr("Export &LMCache Configuration…"), m_tuner, &CodecTunerView::exportLmcacheRequested);
    tools->addSeparator();
    tools->addAction(tr("&Evaluate Levels and Baselines"), m_tuner, &CodecTunerView::evaluateRequested)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_E));
    tools->addSeparator();
    tools->addAction(tr("&Start Stream Run"), this, &MainWindow::startStream)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_T));
    tools->addAction(tr("St&op Stream Run"), m_streamSession, &StreamSession::stop)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_T));
    tools->addAction(tr("Save Stream Run…"), this, &MainWindow::showSaveRaceDialog);
    tools->addAction(tr("Open Stream Run…"), this, &MainWindow::showOpenRaceDialog);
    tools->addAction(tr("Export Stream Figure…"), this, &MainWindow::showExportRaceDialog);

    QMenu* help = menuBar()->addMenu(tr("&Help"));
    help->addAction(tr("&About kvscope"), this, &MainWindow::showAbout)->setMenuRole(QAction::AboutRole);
    help->addAction(tr("About &Qt"), qApp, &QApplication::aboutQt)->setMenuRole(QAction::AboutQtRole);
}

QWidget* MainWindow::createSummaryPanel()
{
    m_summaryWidget = new QWidget;
    auto* form = new QFormLayout(m_summaryWidget);
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    for (const auto& row : kSummaryRows) {
        auto* value = new QLabel(QStringLiteral("–"));
        value->setObjectName(summaryObjectName(QLatin1String(row.key)));
        value->setTextInteractionFlags(Qt::TextSelectableByMouse);
        value->setWordWrap(true);
        form->addRow(tr(row.label) + QLatin1Char(':'), value);
    }
    auto* box = new QGroupBox(tr("KV cache"));
    auto* layout = new QVBoxLayout(box);
    auto* scroll = new QScrollArea;
    scroll->setWidget(m_summaryWidget);
    scroll->setWidgetResizable(true);
    scroll->setFrameShape(QFrame::NoFrame);
    layout->addWidget(scroll);
    return box;
}

void MainWindow::createPages()
{
    // The workflow, left to right: each page feeds the next one.
    m_pages = new QTabWidget;
    m_pages->setObjectName(QStringLiteral("pages"));
    m_pages->setDocumentMode(true);
    auto scrolled = [](QWidget* view) {
        // In a scroll area, so a view's minimum size never forces the window wider than the screen.
        auto* scroll = new QScrollArea;
        scroll->setWidget(view);
        scroll->setWidgetResizable(true);
        scroll->setFrameShape(QFrame::NoFrame);
        return scroll;
    };

    createModelPage();
    auto* modelPage = new QSplitter(Qt::Horizontal);
    modelPage->setObjectName(QStringLiteral("modelPageSplitter"));
    modelPage->addWidget(m_contextView);
    modelPage->addWidget(createSummaryPanel());
    modelPage->setStretchFactor(0, 3);
    modelPage->setStretchFactor(1, 2);
    modelPage->setChildrenCollapsible(false);
    m_pages->addTab(modelPage, tr("1 · Model && Context"));

    createDistributionsPage();
    auto* dist = new QTabWidget;
    dist->setObjectName(QStringLiteral("distributionsTabs"));
    dist->addTab(scrolled(m_statsView), tr("Three observations"));
    dist->addTab(scrolled(m_distributions), tr("Explore layers && channels"));
    m_pages->addTab(dist, tr("2 · Distributions"));

    createTunerPage();
    m_pages->addTab(scrolled(m_tuner), tr("3 · Codec"));
    createStreamPage();
    m_pages->addTab(scrolled(m_streamView), tr("4 · Stream"));
    connect(m_pages, &QTabWidget::currentChanged, this, [this](int i) { pageOpened(Page(i)); });

    // The persistent strip: which model and which cache every page is about.
    m_summaryStrip = new QLabel;
    m_summaryStrip->setObjectName(QStringLiteral("summaryStrip"));
    m_summaryStrip->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_summaryStrip->setWordWrap(true);
    m_summaryStrip->setContentsMargins(8, 4, 8, 4);
    updateSummaryStrip();

    auto* central = new QWidget;
    auto* layout = new QVBoxLayout(central);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(0);
    layout->addWidget(m_summaryStrip);
    layout->addWidget(m_pages, 1);
    setCentralWidget(central);
}

void MainWindow::showPage(Page page)
{
    m_pages->setCurrentIndex(int(page));
    if (QWidget* w = m_pages->currentWidget()) w->setFocus();
}

MainWindow::Page MainWindow::currentPage() const
{
    return Page(m_pages->currentIndex());
}

void MainWindow::pageOpened(Page page)
{
    // The Codec page's rate-distortion plot fills itself: levels and baselines are evaluated in
    // the background the first time the page opens for a cache (cancel in the status bar).
    if (page == Page::Codec && m_tunerSession->canMeasureQuality() && !m_tuner->hasRdPoints() &&
        !m_tunerSession->isBusy())
        evaluateRateDistortion();
}

void MainWindow::evaluateRateDistortion()
{
    CodecProfile profile = m_tuner->profile();
    QString note;
    const bool transform = TunerSession::applyStages(m_tuner->stages(), &profile, &note);
    if (!note.isEmpty()) m_tuner->setStatus(note);
    if (m_tuner->qualitySource() == QLatin1String("suite")) {
        const QString path = m_tuner->suitePath();
        if (path.isEmpty()) {
            m_tuner->setStatus(tr("Choose a quality suite file first (Suite: …)."));
            return;
        }
        m_tunerSession->evaluateSuite(profile, transform, path);
        return;
    }
    m_tunerSession->evaluate(profile, transform);
}

QString MainWindow::summaryStripText() const
{
    return m_summaryStrip->text();
}

void MainWindow::updateSummaryStrip()
{
    QStringList parts;
    if (m_session->hasModel()) {
        const ModelInfo& m = m_session->modelInfo();
        parts << tr("<b>Model</b> %1 (%2 layers, %3 KV heads × %4)").arg(m.name.toHtmlEscaped()).arg(m.layers).arg(m.kvHeads).arg(m.headDim);
    } else {
        parts << tr("<b>Model</b> none");
    }
    if (m_hasData) {
        const KvSummary& s = m_summary;
        parts << tr("<b>Cache</b> %1 tokens, %2 layers, %3 (%4)")
                     .arg(s.shape.numTokens)
                     .arg(s.shape.numLayers)
                     .arg(QLocale::c().formattedDataSize(qint64(s.kvBytes)), QString::fromLatin1(dtypeName(s.dtype)));
        parts << tr("<b>Locality</b> K %1×, V %2×").arg(m_localityK, 0, 'f', 2).arg(m_localityV, 0, 'f', 2);
        parts << tr("<b>Profile</b> %n level(s), chunks of %1 tokens", nullptr, int(m_tuner->profile().levels.size()))
                     .arg(m_tuner->profile().chunkTokens);
    } else {
        parts << tr("<b>Cache</b> none: capture a context, open a KV file (Ctrl+O) or File ▸ Demo");
    }
    m_summaryStrip->setText(parts.join(QStringLiteral(" &nbsp;·&nbsp; ")));
}

void MainWindow::saveLayout(QSettings& settings) const
{
    settings.setValue(QLatin1String(kSettingsPage), m_pages->currentIndex());
    for (QSplitter* splitter : findChildren<QSplitter*>())
        if (!splitter->objectName().isEmpty())
            settings.setValue(QStringLiteral("layout/splitters/") + splitter->objectName(), splitter->saveState());
    for (QTabWidget* tabs : findChildren<QTabWidget*>())
        if (!tabs->objectName().isEmpty() && tabs != m_pages)
            settings.setValue(QStringLiteral("layout/tabs/") + tabs->objectName(), tabs->currentIndex());
    settings.setValue(QLatin1String(kSettingsTheme), style::theme() == style::Theme::Dark ? "dark" : "light");
}

void MainWindow::restoreLayout(QSettings& settings)
{
    // Splitters are restored once the window is shown and laid out (showEvent): before that they
    // have no size and would spread the saved sizes anew.
    for (QSplitter* splitter : findChildren<QSplitter*>()) {
        const QVariant v = settings.value(QStringLiteral("layout/splitters/") + splitter->objectName());
        if (v.isValid()) m_pendingSplitters.insert(splitter->objectName(), v.toByteArray());
    }
    for (QTabWidget* tabs : findChildren<QTabWidget*>()) {
        const QVariant v = settings.value(QStringLiteral("layout/tabs/") + tabs->objectName());
        if (v.isValid() && tabs != m_pages) tabs->setCurrentIndex(v.toInt());
    }
    const int page = settings.value(QLatin1String(kSettingsPage), 0).toInt();
    if (page >= 0 && page < m_pages->count()) m_pages->setCurrentIndex(page);
    if (settings.value(QLatin1String(kSettingsTheme)).toString() == QLatin1String("dark")) m_darkAction->setChecked(true);
}

void MainWindow::setDarkTheme(bool on)
{
    style::setTheme(on ? style::Theme::Dark : style::Theme::Light, this);
    if (m_darkAction && m_darkAction->isChecked() != on) m_darkAction->setChecked(on);
}

void MainWindow::createModelPage()
{
    m_contextView = new ModelContextView;
    m_contextView->setObjectName(QStringLiteral("modelContextView"));

    try {
        QStringList ids;
        for (const std::string& id : sampleIds()) ids << QString::fromStdString(id);
        m_contextView->setSampleIds(ids);
    } catch (const std::exception&) {
        m_contextView->setSampleIds({});  // no samples installed: the picker says so
    }
    connect(m_contextView, &ModelContextView::openModelFileRequested, this, &MainWindow::showOpenModelFileDialog);
    connect(m_contextView, &ModelContextView::openModelFolderRequested, this,
            &MainWindow::showOpenModelFolderDialog);
    connect(m_contextView, &ModelContextView::openDefaultModelRequested, this, [this] { openModel(QString()); });
    connect(m_contextView, &ModelContextView::openContextFileRequested, this, &MainWindow::showOpenContextDialog);
    connect(m_contextView, &ModelContextView::sampleRequested, this, &MainWindow::openContext);
    connect(m_contextView, &ModelContextView::contextEdited, m_session, &ModelSession::tokenize);
    connect(m_contextView, &ModelContextView::captureRequested, this, &MainWindow::captureContext);
}

void MainWindow::createDistributionsPage()
{
    m_statsView = new LayerStatsView;
    m_statsView->setObjectName(QStringLiteral("observationsView"));
    m_distributions = new DistributionsView;
    m_distributions->setObjectName(QStringLiteral("distributionsView"));
    m_distWorker = new DistributionsWorker(this);
    connect(m_distributions, &DistributionsView::selectionChanged, m_distWorker, &DistributionsWorker::requestSelection);
    connect(m_distributions, &DistributionsView::entropyRequested, m_distWorker, &DistributionsWorker::requestEntropy);
    connect(m_distWorker, &DistributionsWorker::histogramReady, m_distributions, &DistributionsView::setHistogram);
    connect(m_distWorker, &DistributionsWorker::tokenMapReady, m_distributions, &DistributionsView::setTokenMap);
    connect(m_distWorker, &DistributionsWorker::entropyReady, m_distributions, &DistributionsView::setEntropyMap);
    connect(m_distWorker, &DistributionsWorker::failed, this,
            [this](const QString& message) { m_phaseLabel->setText(tr("Distributions: %1").arg(message)); });
}

void MainWindow::createTunerPage()
{
    m_tuner = new CodecTunerView;
    m_tuner->setObjectName(QStringLiteral("codecTunerView"));
    m_tunerSession = new TunerSession(this);
    TunerSession* ts = m_tunerSession;
    connect(m_tuner, &CodecTunerView::settingsChanged, this, [this] {
        if (!m_tunerSession->hasCache()) return;
        m_tunerSession->requestTrial(m_tuner->profile(), m_tuner->currentLevel());
    });
    connect(ts, &TunerSession::trialReady, m_tuner, &CodecTunerView::setTrial);
    connect(ts, &TunerSession::qualityReady, m_tuner, &CodecTunerView::setQuality);
    connect(ts, &TunerSession::sensitivityReady, m_tuner, &CodecTunerView::setSensitivity);
    connect(ts, &TunerSession::evaluated, this, [this](const std::vector<RdPoint>& points, const QString& source) {
        m_tuner->setRdPoints(points);
        m_tuner->setRdSource(source);
    });
    connect(ts, &TunerSession::tuned, this, [this](const CodecProfile& profile, const QString& summary) {
        m_tuner->setProfile(profile);
        m_tuner->setStatus(summary);
        m_streamView->setLevels(int(profile.levels.size()));
    });
    connect(ts, &TunerSession::phaseChanged, this, &MainWindow::showTask);
    connect(ts, &TunerSession::progressChanged, this, [this](int value) { setProgressLater(m_progress, value); });
    connect(ts, &TunerSession::longTaskDone, this, &MainWindow::endTask);
    connect(ts, &TunerSession::cancelled, this, [this] { endTask(tr("Codec tuner: cancelled.")); });
    connect(ts, &TunerSession::failed, this, [this](const QString& message) {
        m_tuner->setStatus(tr("Error: %1").arg(message));
        endTask(tr("Codec tuner: %1").arg(message));
        emit errorOccurred(message);
    });
    connect(m_tuner, &CodecTunerView::sensitivityRequested, this, [this](int bins) {
        m_sensitivityBins = bins;
        m_tunerSession->measureSensitivity(m_tuner->profile(), bins);
    });
    connect(m_tuner, &CodecTunerView::evaluateRequested, this, &MainWindow::evaluateRateDistortion);
    connect(m_tuner, &CodecTunerView::autoTuneRequested, this, [this] { m_tunerSession->autoTune(m_tuner->profile()); });
    connect(m_tuner, &CodecTunerView::loadProfileRequested, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Open Codec Profile"), QString(),
                                                          tr("Profiles (*.json);;All files (*)"));
        if (!path.isEmpty()) openProfile(path);
    });
    connect(m_tuner, &CodecTunerView::saveProfileRequested, this, [this] {
        const QString path = QFileDialog::getSaveFileName(this, tr("Save Codec Profile"), QStringLiteral("profile.json"),
                                                          tr("Profiles (*.json)"));
        if (!path.isEmpty()) saveProfile(path);
    });
    connect(m_tuner, &CodecTunerView::exportLmcacheRequested, this, [this] {
        const QString path = QFileDialog::getSaveFileName(this, tr("Export LMCache CacheGen configuration"),
                                                          QStringLiteral("cachegen_config.py"), tr("Python (*.py);;Text (*.txt)"));
        if (!path.isEmpty()) exportLmcache(path);
    });
    // Quality from the held-out continuation or a quality suite (core/eval/suite.h); the
    // transform codec's stages (core/codec/transform.h) as toggles.
    m_tuner->setQualitySources({QStringLiteral("continuation"), QStringLiteral("suite")},
                               {tr("held-out continuation and one answer"), tr("quality suite (file below)")}, {});
    try {
        const QString mini = QString::fromStdString(samplesDir()) + QStringLiteral("/suites/mini.json");
        if (QFileInfo::exists(mini)) m_tuner->setSuitePath(mini);
    } catch (const std::exception&) {
        // no samples installed: the user names a suite file
    }
    connect(m_tuner, &CodecTunerView::chooseSuiteRequested, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Open Quality Suite"), m_tuner->suitePath(),
                                                          tr("Suites (*.json);;All files (*)"));
        if (!path.isEmpty()) m_tuner->setSuitePath(path);
    });
    m_tuner->setStages(TunerSession::transformStages(m_tuner->profile(), nullptr));
    connect(m_tuner, &CodecTunerView::stagesChanged, this, [this] {
        // A toggle re-evaluates the points once the user pauses (the trial debounce's delay).
        if (!m_stageTimer) {
            m_stageTimer = new QTimer(this);
            m_stageTimer->setSingleShot(true);
            m_stageTimer->setInterval(CodecTunerView::kDebounceMs);
            connect(m_stageTimer, &QTimer::timeout, this, [this] {
                if (m_tunerSession->canMeasureQuality() && m_tuner->hasRdPoints()) evaluateRateDistortion();
            });
        }
        m_stageTimer->start();
    });
    connect(m_statsView, &LayerStatsView::sensitivityRequested, this, [this](int bins) {
        m_sensitivityBins = bins;
        m_tunerSession->measureSensitivity(m_tuner->profile(), bins);
    });
    connect(ts, &TunerSession::sensitivityReady, this, [this](const std::vector<LayerSensitivity>& s) {
        m_statsView->setSensitivity(s, m_sensitivityBins);
    });
}

void MainWindow::createStreamPage()
{
    m_streamView = new StreamLabView;
    m_streamView->setObjectName(QStringLiteral("streamLabView"));
    m_streamView->setHardwarePresets(StreamSession::hardwarePresets());
    m_streamSession = new StreamSession(this);
    StreamSession* ss = m_streamSession;
    connect(m_streamView, &StreamLabView::startRequested, this, &MainWindow::startStream);
    connect(m_streamView, &StreamLabView::stopRequested, ss, &StreamSession::stop);
    connect(ss, &StreamSession::phaseChanged, this, [this](const QString& text, int maximum) {
        showTask(text, maximum);
        m_streamView->setStatus(text);
    });
    connect(ss, &StreamSession::progressChanged, this, [this](int value) { setProgressLater(m_progress, value); });
    connect(ss, &StreamSession::raceStarted, m_streamView, &StreamLabView::raceStarted);
    connect(ss, &StreamSession::laneStarted, m_streamView, &StreamLabView::laneStarted);
    connect(ss, &StreamSession::chunkArrived, m_streamView, &StreamLabView::addChunk);
    connect(ss, &StreamSession::runFinished, m_streamView, &StreamLabView::runFinished);
    connect(ss, &StreamSession::raceFinished, this, [this](const RaceRecord& race) {
        m_streamView->raceFinished(race);
        QStringList parts;
        for (const StreamRunResult& r : race.results)
            parts << tr("%1 %2 s%3").arg(r.policy).arg(r.ttftSeconds, 0, 'f', 3).arg(r.sloMet ? QString() : tr(" (missed)"));
        endTask(tr("Stream: TTFT %1 (SLO %2 s).").arg(parts.join(QStringLiteral(", "))).arg(race.config.sloSeconds, 0, 'f', 2));
    });
    connect(ss, &StreamSession::failed, this, [this](const QString& message) {
        m_streamView->runEnded(tr("Error: %1").arg(message));
        endTask(tr("Stream: %1").arg(message));
        reportError(tr("Stream"), message);
    });
    connect(ss, &StreamSession::cancelled, this, [this] {
        m_streamView->runEnded(tr("Stopped; the session is ready for another run."));
        endTask(tr("Stream: stopped."));
    });
    connect(m_streamView, &StreamLabView::scheduleEdited, this, [this] {
        // Parsing a schedule and sampling it is cheap: done here, drawn before any race.
        const StreamConfig c = m_streamView->config();
        try {
            m_streamView->setSchedulePreview(StreamSession::availableSeries(c, std::max(2.0 * c.sloSeconds, 1.0)), QString());
        } catch (const std::exception& e) {
            m_streamView->setSchedulePreview({}, QString::fromStdString(e.what()));
        }
    });
    connect(m_streamView, &StreamLabView::saveRunRequested, this, &MainWindow::showSaveRaceDialog);
    connect(m_streamView, &StreamLabView::openRunRequested, this, &MainWindow::showOpenRaceDialog);
    connect(m_streamView, &StreamLabView::exportFigureRequested, this, &MainWindow::showExportRaceDialog);
}

void MainWindow::saveRace(const QString& path)
{
    QString error;
    if (m_streamView->race().results.empty())
        error = tr("%1: nothing to save: race first").arg(path);
    else
        saveRaceFile(path, m_streamView->race(), &error);
    if (!error.isEmpty()) {
        reportError(tr("Could not save the run"), error);
        return;
    }
    m_phaseLabel->setText(tr("Saved the run to %1.").arg(path));
}

void MainWindow::openRace(const QString& path)
{
    QString error;
    RaceRecord race;
    if (!loadRaceFile(path, &race, &error)) {
        reportError(tr("Could not open the run"), error);
        return;
    }
    m_streamView->showRace(race);
    m_streamView->setStatus(tr("Opened %1 (%n run(s)).", nullptr, int(race.results.size())).arg(QFileInfo(path).fileName()));
    showPage(Page::Stream);
    m_phaseLabel->setText(tr("Opened the run %1.").arg(QFileInfo(path).fileName()));
}

void MainWindow::exportRaceFigure(const QString& path)
{
    QString error;
    if (!m_streamView->exportFigure(path, &error)) {
        reportError(tr("Could not export the figure"), error);
        return;
    }
    m_phaseLabel->setText(tr("Exported the stream figure to %1.").arg(path));
}

void MainWindow::showSaveRaceDialog()
{
    const QString path = QFileDialog::getSaveFileName(this, tr("Save Stream Run"), QStringLiteral("stream-run.json"),
                                                      tr("Stream runs (*.json)"));
    if (!path.isEmpty()) saveRace(path);
}

void MainWindow::showOpenRaceDialog()
{
    const QString path =
        QFileDialog::getOpenFileName(this, tr("Open Stream Run"), QString(), tr("Stream runs (*.json);;All files (*)"));
    if (!path.isEmpty()) openRace(path);
}

void MainWindow::showExportRaceDialog()
{
    const QString path = QFileDialog::getSaveFileName(this, tr("Export Stream Figure"), QStringLiteral("stream-race.png"),
                                                      plotImageFilter());
    if (!path.isEmpty()) exportRaceFigure(path);
}


void MainWindow::updateLabSources()
{
    const std::shared_ptr<const KvSet> kv = m_loader->kv();
    const std::shared_ptr<const Model> model = m_session->model();
    SampleContext sample;
    if (!m_captureOrigin.isEmpty()) {
        try {
            for (const std::string& id : sampleIds())
                if (QString::fromStdString(id) == m_captureOrigin) sample = loadSampleContext(id);
        } catch (const std::exception&) {
            // no samples installed: quality without a continuation
        }
    }
    m_tunerSession->setSource(model, kv, sample);
    if (kv) {
        CodecProfile profile = m_tuner->profile();
        if (profile.levels.empty() || profile.numLayers != kv->shape().numLayers)
            profile = defaultProfile(kv->shape().numLayers);
        m_tuner->setProfile(profile);
        m_streamView->setLevels(int(profile.levels.size()));
        // The stages this cache can feed; the user's toggles stay where they can.
        std::vector<CodecStage> stages = TunerSession::transformStages(profile, kv.get());
        for (CodecStage& st : stages)
            for (const CodecStage& old : m_tuner->stages())
                if (old.id == st.id && st.enabled && old.enabled) st.on = old.on;
        m_tuner->setStages(stages);
    }
    m_tuner->setAvailable(bool(kv), m_tunerSession->canMeasureQuality(), m_tunerSession->qualityNote());
    m_tuner->clearRdPoints();  // the points measured the previous cache
    m_statsView->setSensitivity({}, 0);
    m_statsView->setSensitivityAvailable(
        m_tunerSession->canMeasureSensitivity(),
        m_tunerSession->canMeasureSensitivity()
            ? tr("Press Measure: each layer's K, then V, quantized alone and scored against the original (background, "
                 "cancellable).")
        : m_tunerSession->canMeasureQuality()
            ? tr("Needs a held-out continuation to score: capture a sample context (page 1).")
            : tr("Needs the model this cache came from (open it on page 1): %1").arg(m_tunerSession->qualityNote()));
    if (currentPage() == Page::Codec) pageOpened(Page::Codec);
    const bool streamable = kv && model && model->runtime().fingerprint() == kv->modelFingerprint &&
                            int(kv->tokens.size()) == kv->shape().numTokens;
    m_streamSession->setSource(streamable ? model : nullptr, kv, QString::fromStdString(sample.question),
                               QString::fromStdString(sample.continuation));
    m_streamView->setReady(streamable, streamable ? tr("Ready: %1 tokens of %2.")
                                                        .arg(kv->shape().numTokens)
                                                        .arg(QString::fromStdString(kv->modelName))
                                                  : tr("Streaming needs a cache captured with the open model."));
}

void MainWindow::showTask(const QString& text, int maximum)
{
    m_phaseLabel->setText(text);
    m_progress->setRange(0, maximum);
    setProgressLater(m_progress, 0);
    m_progress->setFormat(maximum > 0 ? QStringLiteral("%v / %m") : QString());
    m_progress->setVisible(true);
    m_cancelButton->setVisible(true);
    m_cancelAction->setEnabled(true);
}

void MainWindow::endTask(const QString& text)
{
    m_phaseLabel->setText(text);
    if (isLoading() || m_tunerSession->isBusy() || m_streamSession->isRunning()) return;
    m_progress->setVisible(false);
    m_cancelButton->setVisible(false);
    m_cancelAction->setEnabled(false);
}

void MainWindow::reportError(const QString& title, const QString& message)
{
    m_phaseLabel->setText(tr("Error: %1").arg(message));
    emit errorOccurred(message);
    if (m_modalErrors) showError(title, message);
}

void MainWindow::openProfile(const QString& path)
{
    try {
        const CodecProfile p = loadProfile(QFile::encodeName(path).toStdString());
        const std::shared_ptr<const KvSet> kv = m_loader->kv();
        if (kv && p.numLayers != kv->shape().numLayers)
            throw std::runtime_error(QStringLiteral("%1: the profile is for %2 layers; the open cache has %3")
                                         .arg(path)
                                         .arg(p.numLayers)
                                         .arg(kv->shape().numLayers)
                                         .toStdString());
        m_tuner->setProfile(p);
        m_streamView->setLevels(int(p.levels.size()));
        showPage(Page::Codec);
        m_phaseLabel->setText(tr("Opened the profile %1 (%2 levels).").arg(QFileInfo(path).fileName()).arg(p.levels.size()));
    } catch (const std::exception& e) {
        reportError(tr("Could not open the profile"), QString::fromStdString(e.what()));
    }
}

void MainWindow::saveProfile(const QString& path)
{
    try {
        kvscope::saveProfile(m_tuner->profile(), QFile::encodeName(path).toStdString());
        m_phaseLabel->setText(tr("Saved the profile to %1.").arg(path));
    } catch (const std::exception& e) {
        reportError(tr("Could not save the profile"), QString::fromStdString(e.what()));
    }
}

void MainWindow::exportLmcache(const QString& path)
{
    const CodecProfile p = m_tuner->profile();
    QString text = tr("# LMCache CacheGen configuration, one per level (end_layer exclusive), from kvscope\n");
    for (size_t i = 0; i < p.levels.size(); ++i)
        text += QStringLiteral("# level %1: %2\n%3\n")
                    .arg(i + 1)
                    .arg(QString::fromStdString(p.levels[i].name), QString::fromStdString(lmcacheConfigPython(p.levels[i])));
    QSaveFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Text) || file.write(text.toUtf8()) < 0 || !file.commit()) {
        reportError(tr("Could not export"), tr("%1: %2").arg(path, file.errorString()));
        return;
    }
    QApplication::clipboard()->setText(text);
    m_phaseLabel->setText(tr("Exported %1 levels to %2 (also copied to the clipboard).").arg(p.levels.size()).arg(path));
}

void MainWindow::startStream()
{
    if (!m_streamSession->isReady() || m_streamSession->isRunning()) return;
    m_streamSession->start(m_streamView->config(), m_tuner->profile());
}

QStringList MainWindow::saveScreenshots(const QString& dir)
{
    QStringList written;
    QDir().mkpath(dir);
    auto* distTabs = findChild<QTabWidget*>(QStringLiteral("distributionsTabs"));
    const struct {
        Page page;
        int subTab;  // of the Distributions page; -1 none
        const char* name;
    } shots[] = {{Page::ModelContext, -1, "model-context"},
                 {Page::Distributions, 0, "distributions"},
                 {Page::Distributions, 1, "distributions-explore"},
                 {Page::Codec, -1, "codec"},
                 {Page::Stream, -1, "stream"}};
    const QSize before = size();
    const int pageBefore = m_pages->currentIndex();
    const int subBefore = distTabs ? distTabs->currentIndex() : 0;
    for (const QSize sz : {QSize(1280, 800), QSize(1920, 1080)}) {
        resize(sz);
        for (const auto& shot : shots) {
            m_pages->setCurrentIndex(int(shot.page));
            if (distTabs && shot.subTab >= 0) distTabs->setCurrentIndex(shot.subTab);
            // Let layouts settle, then draw every plot at its new size.
            for (int i = 0; i < 3; ++i) QApplication::processEvents();
            flushReplots();
            for (QCustomPlot* plot : findChildren<QCustomPlot*>()) plot->replot(QCustomPlot::rpImmediateRefresh);
            const QString path =
                QDir(dir).filePath(QStringLiteral("%1-%2x%3.png").arg(QLatin1String(shot.name)).arg(sz.width()).arg(sz.height()));
            if (grab().save(path, "PNG")) written << path;
        }
    }
    resize(before);
    m_pages->setCurrentIndex(pageBefore);
    if (distTabs) distTabs->setCurrentIndex(subBefore);
    return written;
}

void MainWindow::connectSession()
{
    connect(m_session, &ModelSession::phaseChanged, this, [this](const QString& text, int maximum) {
        m_phaseLabel->setText(text);
        m_progress->setRange(0, maximum);
        setProgressLater(m_progress, 0);
        m_progress->setFormat(maximum > 0 ? tr("%v / %m tokens") : QString());
    });
    connect(m_session, &ModelSession::progressChanged, this, [this](int value) { setProgressLater(m_progress, value); });
    connect(m_session, &ModelSession::modelOpened, this, [this](const ModelInfo& info) {
        setBusy(false);
        m_contextView->setModelInfo(info);
        updateSummaryStrip();
        m_session->tokenize(m_contextView->contextText());
        m_phaseLabel->setText(tr("Opened %1 in %2 s.").arg(info.name).arg(info.loadSeconds, 0, 'f', 2));
        emit modelShown();
        if (m_demoPending) {
            m_demoPending = false;
            captureContext();
        }
    });
    connect(m_session, &ModelSession::tokenized, m_contextView, &ModelContextView::setTokens);
    connect(m_session, &ModelSession::tokenizeFailed, this,
            [this](const QString& message) { m_phaseLabel->setText(tr("Tokenizer: %1").arg(message)); });
    connect(m_session, &ModelSession::captured, this, [this](std::shared_ptr<const KvSet> kv, double seconds) {
        const QString origin = tr("captured: %1 tokens of %2 by %3")
                                   .arg(kv->shape().numTokens)
                                   .arg(m_contextView->contextOrigin().isEmpty() ? tr("the edited context")
                                                                                 : m_contextView->contextOrigin(),
                                        m_session->modelInfo().name);
        m_loader->loadKv(std::move(kv), origin, seconds);
    });
    connect(m_session, &ModelSession::failed, this, [this](const QString& message) {
        m_demoPending = false;
        onFailed(message);
    });
    connect(m_session, &ModelSession::cancelled, this, [this] {
        m_demoPending = false;
        setBusy(false);
        m_phaseLabel->setText(m_hasData ? tr("Cancelled; still showing the previous cache.") : tr("Cancelled."));
        emit loadCancelled();
    });
    connect(m_loader, &KvLoader::saved, this, [this](const QString& path, double seconds) {
        setBusy(false);
        m_phaseLabel->setText(tr("Saved %1 (%2) in %3 s.")
                                  .arg(QFileInfo(path).fileName(),
                                       QLocale::c().formattedDataSize(QFileInfo(path).size()))
                                  .arg(seconds, 0, 'f', 2));
        addRecentFile(QFileInfo(path).absoluteFilePath());
        emit kvSaved(path);
    });
    connect(m_loader, &KvLoader::saveFailed, this, [this](const QString& message) {
        setBusy(false);
        m_phaseLabel->setText(tr("Error: %1").arg(message));
        emit errorOccurred(message);
        if (m_modalErrors) showError(tr("Could not save the KV cache"), message);
    });
}

void MainWindow::createStatusBar()
{
    m_phaseLabel = new QLabel;
    m_phaseLabel->setObjectName(QStringLiteral("phaseLabel"));
    statusBar()->addWidget(m_phaseLabel, 1);
    m_progress = new QProgressBar;
    m_progress->setObjectName(QStringLiteral("loadProgress"));
    m_progress->setMaximumWidth(220);
    m_progress->setTextVisible(true);
    statusBar()->addPermanentWidget(m_progress);
    m_cancelButton = new QPushButton(tr("Cancel"));
    m_cancelButton->setObjectName(QStringLiteral("cancelButton"));
    m_cancelButton->setToolTip(tr("Stop loading (Esc)"));
    connect(m_cancelButton, &QPushButton::clicked, this, &MainWindow::cancelLoad);
    statusBar()->addPermanentWidget(m_cancelButton);
}

bool MainWindow::isLoading() const
{
    return m_loader->isRunning() || m_session->isBusy();
}

QString MainWindow::summaryField(const QString& key) const
{
    const auto* label = m_summaryWidget->findChild<QLabel*>(summaryObjectName(key));
    return label ? label->text() : QString();
}

void MainWindow::setBusy(bool busy)
{
    m_progress->setVisible(busy);
    m_cancelButton->setVisible(busy);
    m_cancelAction->setEnabled(busy);
    const bool canCapture = !busy && m_session->hasModel();
    m_captureAction->setEnabled(canCapture);
    m_contextView->setCaptureEnabled(canCapture);
    m_saveAction->setEnabled(!busy && m_loader->kv() != nullptr);
}

void MainWindow::openFile(const QString& path)
{
    if (path.isEmpty()) return;
    const QFileInfo info(path);
    m_pendingTitle = tr("%1 — kvscope").arg(info.fileName());
    m_synthNote.clear();
    m_session->cancel();
    setBusy(true);
    m_loader->loadFile(path);
}

void MainWindow::openSynthetic(const SyntheticSpec& spec)
{
    m_pendingTitle = tr("synthetic KV — kvscope");
    m_session->cancel();
    setBusy(true);
    m_loader->loadSynthetic(spec);
}

void MainWindow::openDemo()
{
    const QString modelPath = QFile::decodeName(QByteArray::fromStdString(defaultModelPath()));
    if (!QFileInfo(modelPath).isFile()) {
        m_synthNote = tr("Demo: the default model is not installed (%1; installer/setup.sh fetches it), so this "
                         "is a synthetic KV cache, not a captured one.")
                          .arg(modelPath);
        openSynthetic(SyntheticSpec{});
        return;
    }
    openContext(QLatin1String(kDemoContext));
    m_demoPending = true;
    if (m_session->hasModel() && m_session->modelInfo().path == modelPath && !isLoading()) {
        m_demoPending = false;
        captureContext();
        return;
    }
    openModel(QString());
}

void MainWindow::openModel(const QString& path, const QString& tokenizerPath)
{
    m_loader->cancel();
    setBusy(true);
    m_session->openModel(path, tokenizerPath);
}

void MainWindow::openContext(const QString& idOrPath)
{
    try {
        const SampleContext sample = loadSampleContext(QFile::encodeName(idOrPath).toStdString());
        const QString origin = QFileInfo::exists(idOrPath) ? QFileInfo(idOrPath).fileName() : idOrPath;
        m_contextView->setContext(QString::fromStdString(sample.text), origin);
    } catch (const std::exception& e) {
        const QString message = QString::fromStdString(e.what());
        m_phaseLabel->setText(tr("Error: %1").arg(message));
        emit errorOccurred(message);
        if (m_modalErrors) showError(tr("Could not open the context"), message);
    }
}

void MainWindow::captureContext()
{
    if (isLoading() || !m_session->hasModel()) return;
    const QString text = m_contextView->contextText();
    if (text.isEmpty()) return;
    const QString origin = m_contextView->contextOrigin();
    m_pendingTitle = tr("%1 on %2 — kvscope")
                         .arg(origin.isEmpty() ? tr("context") : origin, m_session->modelInfo().name);
    m_synthNote.clear();
    m_captureOrigin = origin;
    setBusy(true);
    m_session->capture(text);
}

void MainWindow::saveKv(const QString& path)
{
    if (path.isEmpty() || isLoading()) return;
    setBusy(true);
    m_phaseLabel->setText(tr("Saving %1…").arg(QFileInfo(path).fileName()));
    m_progress->setRange(0, 0);
    m_loader->saveKv(path);
}

void MainWindow::cancelLoad()
{
    m_demoPending = false;
    m_session->cancel();
    m_loader->cancel();
    m_tunerSession->cancel();
    m_streamSession->stop();
}

void MainWindow::showOpenModelFileDialog()
{
    QSettings settings;
    const QString dir = settings.value(QLatin1String(kSettingsModelDir)).toString();
    const QString path = QFileDialog::getOpenFileName(
        this, tr("Open Model"), dir, tr("Models (*.gguf *.bin);;GGUF (*.gguf);;llama2.c checkpoints (*.bin);;All files (*)"));
    if (path.isEmpty()) return;
    if (m_useSettings) settings.setValue(QLatin1String(kSettingsModelDir), QFileInfo(path).absolutePath());
    QString tokenizer;
    if (QFileInfo(path).suffix().toLower() != QLatin1String("gguf")) {
        // A llama2.c checkpoint carries no vocabulary: its tokenizer.bin comes separately.
        tokenizer = QFileDialog::getOpenFileName(this, tr("Tokenizer for %1").arg(QFileInfo(path).fileName()),
                                                 QFileInfo(path).absolutePath(),
                                                 tr("Tokenizers (*.bin *.json *.model);;All files (*)"));
        if (tokenizer.isEmpty()) return;
    }
    openModel(path, tokenizer);
}

void MainWindow::showOpenModelFolderDialog()
{
    QSettings settings;
    const QString dir = QFileDialog::getExistingDirectory(
        this, tr("Open Hugging Face Model Folder"), settings.value(QLatin1String(kSettingsModelDir)).toString());
    if (dir.isEmpty()) return;
    if (m_useSettings) settings.setValue(QLatin1String(kSettingsModelDir), dir);
    openModel(dir);
}

void MainWindow::showOpenContextDialog()
{
    const QString path =
        QFileDialog::getOpenFileName(this, tr("Open Context"), QString(), tr("Text (*.txt);;All files (*)"));
    if (!path.isEmpty()) openContext(path);
}

void MainWindow::showSaveDialog()
{
    QSettings settings;
    QString dir = settings.value(QLatin1String(kSettingsOpenDir)).toString();
    const QString path = QFileDialog::getSaveFileName(this, tr("Save KV Cache"), dir, tr("KV files (*.h5)"));
    if (path.isEmpty()) return;
    saveKv(QFileInfo(path).suffix().isEmpty() ? path + QStringLiteral(".h5") : path);
}

void MainWindow::showError(const QString& title, const QString& message)
{
    // open(), not exec(): a window-modal box that does not spin a nested event loop.
    auto* box = new QMessageBox(QMessageBox::Critical, title, message, QMessageBox::Ok, this);
    box->setObjectName(QStringLiteral("errorBox"));
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
}

void MainWindow::showOpenDialog()
{
    QSettings settings;
    QString dir = settings.value(QLatin1String(kSettingsOpenDir)).toString();
    if (dir.isEmpty() && !m_recentFiles.isEmpty()) dir = QFileInfo(m_recentFiles.first()).absolutePath();
    QStringList patterns;
    for (const QString& suffix : kvFileSuffixes()) patterns << QStringLiteral("*.") + suffix;
    const QString path =
        QFileDialog::getOpenFileName(this, tr("Open KV File"), dir,
                                     tr("KV files (%1);;All files (*)").arg(patterns.join(QLatin1Char(' '))));
    if (path.isEmpty()) return;
    if (m_useSettings) settings.setValue(QLatin1String(kSettingsOpenDir), QFileInfo(path).absolutePath());
    openFile(path);
}

void MainWindow::showAbout()
{
    const QString torch = QString::fromStdString(libtorchBuildVersion());
    const QString runtime = m_session->hasModel() ? tr(" (open model: %1)").arg(m_session->modelInfo().runtime)
                                                  : QString();
    QMessageBox::about(
        this, tr("About kvscope"),
        tr("<h3>kvscope %1</h3>"
           "<p>Inspect and tune KV-cache compression in the style of CacheGen: per-layer and per-channel "
           "statistics of captured KV caches, codec settings, and streaming experiments.</p>"
           "<p>Qt %2 (built with %3)<br>libtorch %4%5<br>HDF5 %6<br>CUDA decode library: %7</p>")
            .arg(QStringLiteral(KVSCOPE_VERSION), QString::fromLatin1(qVersion()), QStringLiteral(QT_VERSION_STR),
                 torch.isEmpty() ? tr("(version unknown)") : torch, runtime,
                 QString::fromStdString(hdf5LibraryVersion()),
                 KVSCOPE_HAVE_CUDA_BUILD ? tr("built") : tr("not built")));
}

void MainWindow::onPhaseChanged(const QString& text, int maximum)
{
    m_phaseLabel->setText(text);
    m_progress->setRange(0, maximum);  // (0, 0) shows a busy indicator
    setProgressLater(m_progress, 0);
    m_progress->setFormat(maximum > 0 ? tr("%v / %m tensors") : QString());
}

void MainWindow::onLoaded(const KvSummary& summary, const std::vector<TensorStats>& stats)
{
    setBusy(false);
    m_summary = summary;
    m_hasData = true;
    m_statsView->setHeadDim(summary.shape.headDim);
    m_statsView->setStats(stats);
    m_distWorker->setKv(m_loader->kv());
    m_distributions->setStats(stats, summary.shape.headDim);
    if (!summary.source.isEmpty() || summary.synthetic) m_captureOrigin.clear();
    updateLabSources();
    showSummary(summary, stats);
    updateSummaryStrip();
    setWindowTitle(m_pendingTitle);
    if (!summary.source.isEmpty()) addRecentFile(summary.source);
    if (summary.synthetic && !m_synthNote.isEmpty())
        m_phaseLabel->setText(m_synthNote);
    else if (summary.source.isEmpty() && !summary.synthetic)
        m_phaseLabel->setText(tr("Captured %1 tokens in %2 s (statistics %3 s).")
                                  .arg(summary.shape.numTokens)
                                  .arg(summary.readSeconds, 0, 'f', 2)
                                  .arg(summary.statsSeconds, 0, 'f', 2));
    else
        m_phaseLabel->setText(
            tr("Loaded %1 in %2 s (read %3 s, statistics %4 s).")
                .arg(summary.synthetic ? tr("synthetic KV") : QFileInfo(summary.source).fileName())
                .arg(summary.readSeconds + summary.statsSeconds, 0, 'f', 2)
                .arg(summary.readSeconds, 0, 'f', 2)
                .arg(summary.statsSeconds, 0, 'f', 2));
    emit dataShown();
}

void MainWindow::onFailed(const QString& message)
{
    setBusy(false);
    m_phaseLabel->setText(tr("Error: %1").arg(message));
    emit errorOccurred(message);
    if (m_modalErrors) showError(tr("kvscope"), message);
}

void MainWindow::showSummary(const KvSummary& s, const std::vector<TensorStats>& stats)
{
    auto set = [this](const char* key, const QString& text) {
        if (auto* label = m_summaryWidget->findChild<QLabel*>(summaryObjectName(QLatin1String(key))))
            label->setText(text.isEmpty() ? QStringLiteral("–") : text);
    };
    set("source", s.origin == s.source ? shownPath(s.source) : s.origin);
    set("model", s.modelName);
    set("fingerprint", s.modelFingerprint);
    set("layers", QString::number(s.shape.numLayers));
    set("kv_heads", QString::number(s.shape.numKvHeads));
    set("head_dim", QString::number(s.shape.headDim));
    set("channels", QString::number(s.shape.channels()));
    set("tokens", QString::number(s.shape.numTokens));
    set("dtype", QString::fromLatin1(dtypeName(s.dtype)));
    set("kv_bytes", formatBytes(s.kvBytes));
    set("file_bytes", s.fileBytes >= 0 ? formatBytes(quint64(s.fileBytes)) : QString());
    const KindSummary k = summarize(stats, KvKind::Key);
    const KindSummary v = summarize(stats, KvKind::Value);
    // core's localityRatio: the CLI's stats prints the same figure.
    m_localityK = localityRatio(stats, KvKind::Key);
    m_localityV = localityRatio(stats, KvKind::Value);
    auto ratio = [this](const KindSummary& ks, double r) {
        return ks.layers && r > 0 ? tr("%1× (variance-weighted over layers)").arg(r, 0, 'f', 2) : QString();
    };
    auto entropy = [this](const KindSummary& ks) {
        return ks.layers
                   ? tr("%1 → %2 bits/value").arg(ks.entropyRaw, 0, 'f', 2).arg(ks.entropyDelta, 0, 'f', 2)
                   : QString();
    };
    set("k_locality", ratio(k, m_localityK));
    set("v_locality", ratio(v, m_localityV));
    set("k_entropy", entropy(k));
    set("v_entropy", entropy(v));
    set("load_time",
        tr("%1 s read + %2 s statistics").arg(s.readSeconds, 0, 'f', 2).arg(s.statsSeconds, 0, 'f', 2));
}

void MainWindow::addRecentFile(const QString& path)
{
    m_recentFiles.removeAll(path);
    m_recentFiles.prepend(path);
    while (m_recentFiles.size() > kMaxRecentFiles) m_recentFiles.removeLast();
    if (m_useSettings) QSettings().setValue(QLatin1String(kSettingsRecent), m_recentFiles);
    rebuildRecentMenu();
}

void MainWindow::clearRecentFiles()
{
    m_recentFiles.clear();
    if (m_useSettings) QSettings().remove(QLatin1String(kSettingsRecent));
    rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu()
{
    m_recentMenu->clear();
    for (int i = 0; i < m_recentFiles.size(); ++i) {
        const QString path = m_recentFiles.at(i);
        // &1..&9 as keyboard accelerators; '&' in names must not become one.
        QString name = QFileInfo(path).fileName().replace(QLatin1Char('&'), QStringLiteral("&&"));
        QAction* action =
            m_recentMenu->addAction(i < 9 ? QStringLiteral("&%1 %2").arg(i + 1).arg(name) : name, this,
                                    [this, path] { openFile(path); });
        action->setToolTip(path);
        action->setStatusTip(path);
    }
    if (!m_recentFiles.isEmpty()) {
        m_recentMenu->addSeparator();
        m_recentMenu->addAction(tr("Clear List"), this, &MainWindow::clearRecentFiles);
    }
    m_recentMenu->setEnabled(!m_recentFiles.isEmpty());
}

void MainWindow::showEvent(QShowEvent* event)
{
    QMainWindow::showEvent(event);
    if (m_pendingSplitters.isEmpty()) return;
    if (auto* c = centralWidget(); c && c->layout()) c->layout()->activate();
    for (QSplitter* splitter : findChildren<QSplitter*>())
        if (m_pendingSplitters.contains(splitter->objectName()))
            splitter->restoreState(m_pendingSplitters.value(splitter->objectName()));
    m_pendingSplitters.clear();
}

void MainWindow::closeEvent(QCloseEvent* event)
{
    m_session->cancel();
    m_loader->cancel();
    m_tunerSession->cancel();
    m_streamSession->stop();
    if (m_useSettings) {
        QSettings settings;
        settings.setValue(QLatin1String(kSettingsGeometry), saveGeometry());
        settings.setValue(QLatin1String(kSettingsState), saveState());
        saveLayout(settings);
    }
    QMainWindow::closeEvent(event);
}

QString MainWindow::droppedPath(const QMimeData* mime)
{
    if (!mime || !mime->hasUrls()) return {};
    for (const QUrl& url : mime->urls()) {
        if (!url.isLocalFile()) continue;
        const QString path = url.toLocalFile();
        const QFileInfo info(path);
        const QString suffix = info.suffix().toLower();
        // KV files, models (GGUF, Hugging Face folders), codec profiles, text contexts, Mahimahi
        // traces and .kvc stores.
        static const QStringList accepted = {QStringLiteral("gguf"), QStringLiteral("json"), QStringLiteral("txt"),
                                             QStringLiteral("down"), QStringLiteral("up"), QStringLiteral("kvc")};
        if (kvFileSuffixes().contains(suffix) || accepted.contains(suffix) ||
            (info.isDir() && QFileInfo::exists(info.filePath() + QStringLiteral("/config.json"))))
            return path;
    }
    return {};
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event)
{
    if (!droppedPath(event->mimeData()).isEmpty()) event->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* event)
{
    const QString path = droppedPath(event->mimeData());
    if (path.isEmpty()) return;
    event->acceptProposedAction();
    const QFileInfo info(path);
    const QString suffix = info.suffix().toLower();
    if (info.isDir() || suffix == QLatin1String("gguf"))
        openModel(path);
    else if (suffix == QLatin1String("json") && isRaceFile(path))
        openRace(path);
    else if (suffix == QLatin1String("json"))
        openProfile(path);
    else if (suffix == QLatin1String("txt"))
        openContext(path);
    else if (suffix == QLatin1String("down") || suffix == QLatin1String("up")) {
        m_streamView->setTracePath(path);
        showPage(Page::Stream);
    } else if (suffix == QLatin1String("kvc")) {
        m_streamView->setStorePath(path);
        showPage(Page::Stream);
    } else
        openFile(path);
}

}  // namespace kvscope
