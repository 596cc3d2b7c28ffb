#include "main_window.h"

#include "codec_page.h"
#include "codec_tuner_view.h"
#include "distributions_page.h"
#include "distributions_view.h"
#include "dropped_files.h"
#include "layer_stats_view.h"
#include "library_versions.h"
#include "model_context_view.h"
#include "model_page.h"
#include "plot_style.h"
#include "recent_files.h"
#include "screenshots.h"
#include "stream_lab_view.h"
#include "stream_page.h"
#include "stream_session.h"
#include "task_status.h"
#include "tuner_session.h"
#include "window_layout.h"

#include "eval/samples.h"
#include "kvio/kv_h5.h"
#include "kvscope/config.h"
#include "model/model.h"

#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QKeySequence>
#include <QLabel>
#include <QLocale>
#include <QMenuBar>
#include <QMessageBox>
#include <QScrollArea>
#include <QSettings>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QVBoxLayout>

namespace kvscope {

namespace {

const char* const kSettingsGeometry = "window/geometry";
const char* const kSettingsState = "window/state";
const char* const kSettingsOpenDir = "window/openDir";
const char* const kDemoContext = "long_1k";

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
    connect(m_loader, &KvLoader::progressChanged, this, [this](int value) { m_status->setProgress(value); });
    connect(m_loader, &KvLoader::loaded, this, &MainWindow::onLoaded);
    connect(m_loader, &KvLoader::failed, this, &MainWindow::onFailed);
    connect(m_loader, &KvLoader::cancelled, this, [this] {
        setBusy(false);
        m_status->setText(m_hasData ? tr("Loading cancelled; still showing the previous cache.")
                                    : tr("Loading cancelled."));
        emit loadCancelled();
    });

    createPages();
    connectSession();
    createStatusBar();
    createActions();

    resize(1280, 800);
    if (m_useSettings) {
        QSettings settings;
        restoreGeometry(settings.value(QLatin1String(kSettingsGeometry)).toByteArray());
        restoreState(settings.value(QLatin1String(kSettingsState)).toByteArray());
        if (m_layout->restore(settings)) m_darkAction->setChecked(true);
    }
    m_recent->restore();
    setBusy(false);
    m_status->setText(
        tr("Open a model and capture a context, open a KV file (Ctrl+O), or try File ▸ Demo."));
}

MainWindow::~MainWindow() = default;

void MainWindow::createActions()
{
    QMenu* file = menuBar()->addMenu(tr("&File"));
    QAction* open = file->addAction(tr("&Open KV File…"), this, &MainWindow::showOpenDialog);
    open->setShortcut(QKeySequence::Open);
    open->setObjectName(QStringLiteral("openAction"));
    QMenu* recentMenu = file->addMenu(tr("Open &Recent"));
    recentMenu->setObjectName(QStringLiteral("recentMenu"));
    m_recent = new RecentFiles(recentMenu, m_useSettings, this);
    connect(m_recent, &RecentFiles::openRequested, this, &MainWindow::openFile);
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
    QAction* cancel = file->addAction(tr("&Cancel"), this, &MainWindow::cancelLoad);
    cancel->setShortcut(Qt::Key_Escape);
    m_status->setCancelAction(cancel);
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
    CodecTunerView* tuner = m_codecPage->view();
    tools->addAction(tr("Open Codec &Profile…"), tuner, &CodecTunerView::loadProfileRequested)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_P));
    tools->addAction(tr("Save Codec Profile…"), tuner, &CodecTunerView::saveProfileRequested);
    tools->addAction(tr("Export &LMCache Configuration…"), tuner, &CodecTunerView::exportLmcacheRequested);
    tools->addSeparator();
    tools->addAction(tr("&Evaluate Levels and Baselines"), tuner, &CodecTunerView::evaluateRequested)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_E));
    tools->addSeparator();
    tools->addAction(tr("&Start Stream Run"), this, &MainWindow::startStream)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_T));
    tools->addAction(tr("St&op Stream Run"), m_streamPage->session(), &StreamSession::stop)
        ->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_T));
    tools->addAction(tr("Save Stream Run…"), this, &MainWindow::showSaveRaceDialog);
    tools->addAction(tr("Open Stream Run…"), this, &MainWindow::showOpenRaceDialog);
    tools->addAction(tr("Export Stream Figure…"), this, &MainWindow::showExportRaceDialog);

    QMenu* help = menuBar()->addMenu(tr("&Help"));
    help->addAction(tr("&About kvscope"), this, &MainWindow::showAbout)->setMenuRole(QAction::AboutRole);
    help->addAction(tr("About &Qt"), qApp, &QApplication::aboutQt)->setMenuRole(QAction::AboutQtRole);
}

void MainWindow::createPages()
{
    // The workflow, left to right: each page feeds the next one.
    m_pages = new QTabWidget;
    m_pages->setObjectName(QStringLiteral("pages"));
    m_pages->setDocumentMode(true);
    m_layout = std::make_unique<WindowLayout>(this, m_pages);
    auto scrolled = [](QWidget* view) {
        // In a scroll area, so a view's minimum size never forces the window wider than the screen.
        auto* scroll = new QScrollArea;
        scroll->setWidget(view);
        scroll->setWidgetResizable(true);
        scroll->setFrameShape(QFrame::NoFrame);
        return scroll;
    };

    m_modelPage = new ModelPage(this, m_useSettings, this);
    m_pages->addTab(m_modelPage->widget(), tr("1 · Model && Context"));
    m_distPage = new DistributionsPage(this);
    auto* dist = new QTabWidget;
    dist->setObjectName(QStringLiteral("distributionsTabs"));
    dist->addTab(scrolled(m_distPage->statsView()), tr("Three observations"));
    dist->addTab(scrolled(m_distPage->explorer()), tr("Explore layers && channels"));
    m_pages->addTab(dist, tr("2 · Distributions"));
    m_codecPage = new CodecPage(this, this);
    m_pages->addTab(scrolled(m_codecPage->view()), tr("3 · Codec"));
    m_streamPage = new StreamPage(this, this);
    m_pages->addTab(scrolled(m_streamPage->view()), tr("4 · Stream"));
    connectPages();
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
    if (page == Page::Codec) m_codecPage->opened();
}

QString MainWindow::summaryStripText() const
{
    return m_summaryStrip->text();
}

void MainWindow::updateSummaryStrip()
{
    QStringList parts;
    const ModelSession* session = m_modelPage->session();
    if (session->hasModel()) {
        const ModelInfo& m = session->modelInfo();
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
        parts << tr("<b>Locality</b> K %1×, V %2×")
                     .arg(m_modelPage->localityK(), 0, 'f', 2)
                     .arg(m_modelPage->localityV(), 0, 'f', 2);
        const CodecProfile profile = m_codecPage->profile();
        parts << tr("<b>Profile</b> %n level(s), chunks of %1 tokens", nullptr, int(profile.levels.size()))
                     .arg(profile.chunkTokens);
    } else {
        parts << tr("<b>Cache</b> none: capture a context, open a KV file (Ctrl+O) or File ▸ Demo");
    }
    m_summaryStrip->setText(parts.join(QStringLiteral(" &nbsp;·&nbsp; ")));
}

void MainWindow::setDarkTheme(bool on)
{
    style::setTheme(on ? style::Theme::Dark : style::Theme::Light, this);
    if (m_darkAction && m_darkAction->isChecked() != on) m_darkAction->setChecked(on);
}

void MainWindow::showTask(const QString& text, int maximum)
{
    m_status->setPhase(text, maximum, maximum > 0 ? QStringLiteral("%v / %m") : QString());
    m_status->setBusy(true);
}

void MainWindow::endTask(const QString& text)
{
    m_status->setText(text);
    const TunerSession* tuner = m_codecPage->session();
    if (isLoading() || tuner->isBusy() || tuner->isCalibrating() || m_streamPage->session()->isRunning()) return;
    m_status->setBusy(false);
}

void MainWindow::reportError(const QString& title, const QString& message)
{
    m_status->setText(tr("Error: %1").arg(message));
    emit errorOccurred(message);
    if (m_modalErrors) showError(title, message);
}

QStringList MainWindow::saveScreenshots(const QString& dir) { return kvscope::saveScreenshots(this, m_pages, dir); }

void MainWindow::connectSession()
{
    ModelSession* session = m_modelPage->session();
    ModelContextView* context = m_modelPage->view();
    connect(session, &ModelSession::phaseChanged, this, [this](const QString& text, int maximum) {
        m_status->setPhase(text, maximum, maximum > 0 ? tr("%v / %m tokens") : QString());
    });
    connect(session, &ModelSession::progressChanged, this, [this](int value) { m_status->setProgress(value); });
    connect(session, &ModelSession::modelOpened, this, [this, session, context](const ModelInfo& info) {
        setBusy(false);
        context->setModelInfo(info);
        updateSummaryStrip();
        session->tokenize(context->contextText());
        m_status->setText(tr("Opened %1 in %2 s.").arg(info.name).arg(info.loadSeconds, 0, 'f', 2));
        emit modelShown();
        if (m_demoPending) {
            m_demoPending = false;
            captureContext();
        }
    });
    connect(session, &ModelSession::tokenized, context, &ModelContextView::setTokens);
    connect(session, &ModelSession::tokenizeFailed, this,
            [this](const QString& message) { m_status->setText(tr("Tokenizer: %1").arg(message)); });
    connect(session, &ModelSession::captured, this, [this, session, context](std::shared_ptr<const KvSet> kv, double seconds) {
        const QString origin = tr("captured: %1 tokens of %2 by %3")
                                   .arg(kv->shape().numTokens)
                                   .arg(context->contextOrigin().isEmpty() ? tr("the edited context")
                                                                           : context->contextOrigin(),
                                        session->modelInfo().name);
        m_loader->loadKv(std::move(kv), origin, seconds);
    });
    connect(session, &ModelSession::failed, this, [this](const QString& message) {
        m_demoPending = false;
        onFailed(message);
    });
    connect(session, &ModelSession::cancelled, this, [this] {
        m_demoPending = false;
        setBusy(false);
        m_status->setText(m_hasData ? tr("Cancelled; still showing the previous cache.") : tr("Cancelled."));
        emit loadCancelled();
    });
    connect(m_loader, &KvLoader::saved, this, [this](const QString& path, double seconds) {
        setBusy(false);
        m_status->setText(tr("Saved %1 (%2) in %3 s.")
                              .arg(QFileInfo(path).fileName(), QLocale::c().formattedDataSize(QFileInfo(path).size()))
                              .arg(seconds, 0, 'f', 2));
        m_recent->add(QFileInfo(path).absoluteFilePath());
        emit kvSaved(path);
    });
    connect(m_loader, &KvLoader::saveFailed, this, [this](const QString& message) {
        setBusy(false);
        m_status->setText(tr("Error: %1").arg(message));
        emit errorOccurred(message);
        if (m_modalErrors) showError(tr("Could not save the KV cache"), message);
    });
}

void MainWindow::createStatusBar()
{
    m_status = new TaskStatus(statusBar(), this);
    connect(m_status, &TaskStatus::cancelRequested, this, &MainWindow::cancelLoad);
}

bool MainWindow::isLoading() const
{
    return m_loader->isRunning() || m_modelPage->session()->isBusy();
}

void MainWindow::setBusy(bool busy)
{
    m_status->setBusy(busy);
    const bool canCapture = !busy && m_modelPage->session()->hasModel();
    m_captureAction->setEnabled(canCapture);
    m_modelPage->view()->setCaptureEnabled(canCapture);
    m_saveAction->setEnabled(!busy && m_loader->kv() != nullptr);
}

void MainWindow::openFile(const QString& path)
{
    if (path.isEmpty()) return;
    const QFileInfo info(path);
    m_pendingTitle = tr("%1 — kvscope").arg(info.fileName());
    m_synthNote.clear();
    m_modelPage->session()->cancel();
    setBusy(true);
    m_loader->loadFile(path);
}

void MainWindow::openSynthetic(const SyntheticSpec& spec)
{
    m_pendingTitle = tr("synthetic KV — kvscope");
    m_modelPage->session()->cancel();
    setBusy(true);
    m_loader->loadSynthetic(spec);
}

void MainWindow::openDemo()
{
    const QString modelPath = QFile::decodeName(QByteArray::fromStdString(defaultModelPath()));
    if (!QFileInfo(modelPath).isFile()) {
        m_synthNote = tr("Demo: the default model is not installed (%1; kvscope-cli fetch-model smollm2 fetches it), so this "
                         "is a synthetic KV cache, not a captured one.")
                          .arg(modelPath);
        openSynthetic(SyntheticSpec{});
        return;
    }
    openContext(QLatin1String(kDemoContext));
    m_demoPending = true;
    const ModelSession* session = m_modelPage->session();
    if (session->hasModel() && session->modelInfo().path == modelPath && !isLoading()) {
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
    m_modelPage->session()->openModel(path, tokenizerPath);
}

void MainWindow::captureContext()
{
    ModelSession* session = m_modelPage->session();
    if (isLoading() || !session->hasModel()) return;
    const QString text = m_modelPage->view()->contextText();
    if (text.isEmpty()) return;
    const QString origin = m_modelPage->view()->contextOrigin();
    m_pendingTitle = tr("%1 on %2 — kvscope").arg(origin.isEmpty() ? tr("context") : origin, session->modelInfo().name);
    m_synthNote.clear();
    m_captureOrigin = origin;
    setBusy(true);
    session->capture(text);
}

void MainWindow::saveKv(const QString& path)
{
    if (path.isEmpty() || isLoading()) return;
    setBusy(true);
    m_status->setPhase(tr("Saving %1…").arg(QFileInfo(path).fileName()), 0, QString());
    m_loader->saveKv(path);
}

void MainWindow::cancelLoad()
{
    m_demoPending = false;
    m_modelPage->session()->cancel();
    m_loader->cancel();
    m_codecPage->session()->cancel();
    m_streamPage->session()->stop();
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
    if (dir.isEmpty() && !m_recent->paths().isEmpty()) dir = QFileInfo(m_recent->paths().first()).absolutePath();
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
    const ModelSession* session = m_modelPage->session();
    const QString runtime = session->hasModel() ? tr(" (open model: %1)").arg(session->modelInfo().runtime) : QString();
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
    m_status->setPhase(text, maximum, maximum > 0 ? tr("%v / %m tensors") : QString());  // 0: a busy indicator
}

void MainWindow::onLoaded(const KvSummary& summary, const std::vector<TensorStats>& stats)
{
    setBusy(false);
    m_summary = summary;
    m_hasData = true;
    m_distPage->setCache(m_loader->kv(), stats, summary.shape.headDim);
    if (!summary.source.isEmpty() || summary.synthetic) m_captureOrigin.clear();
    updateLabSources();
    m_modelPage->showSummary(summary, stats);
    updateSummaryStrip();
    setWindowTitle(m_pendingTitle);
    if (!summary.source.isEmpty()) m_recent->add(summary.source);
    if (summary.synthetic && !m_synthNote.isEmpty())
        m_status->setText(m_synthNote);
    else if (summary.source.isEmpty() && !summary.synthetic)
        m_status->setText(tr("Captured %1 tokens in %2 s (statistics %3 s).")
                              .arg(summary.shape.numTokens)
                              .arg(summary.readSeconds, 0, 'f', 2)
                              .arg(summary.statsSeconds, 0, 'f', 2));
    else
        m_status->setText(
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
    m_status->setText(tr("Error: %1").arg(message));
    emit errorOccurred(message);
    if (m_modalErrors) showError(tr("kvscope"), message);
}

void MainWindow::showEvent(QShowEvent* event)
{
    QMainWindow::showEvent(event);
    m_layout->applySplitters();
}

void MainWindow::closeEvent(QCloseEvent* event)
{
    m_modelPage->session()->cancel();
    m_loader->cancel();
    m_codecPage->session()->cancel();
    m_streamPage->session()->stop();
    if (m_useSettings) {
        QSettings settings;
        settings.setValue(QLatin1String(kSettingsGeometry), saveGeometry());
        settings.setValue(QLatin1String(kSettingsState), saveState());
        m_layout->save(settings);
    }
    QMainWindow::closeEvent(event);
}

void MainWindow::connectPages()
{
    // Every page reports to the status bar the same way (made after the pages).
    auto progress = [this](int value) { m_status->setProgress(value); };
    auto status = [this](const QString& text) { m_status->setText(text); };
    connect(m_modelPage, &ModelPage::modelRequested, this, [this](const QString& path, const QString& tokenizer) {
        openModel(path, tokenizer);
    });
    connect(m_modelPage, &ModelPage::captureRequested, this, &MainWindow::captureContext);
    connect(m_modelPage, &ModelPage::errorReported, this, &MainWindow::reportError);
    connect(m_distPage, &DistributionsPage::statusMessage, this, status);

    CodecPage* codec = m_codecPage;
    connect(codec, &CodecPage::taskStarted, this, &MainWindow::showTask);
    connect(codec, &CodecPage::progressChanged, this, progress);
    connect(codec, &CodecPage::taskEnded, this, &MainWindow::endTask);
    connect(codec, &CodecPage::statusMessage, this, status);
    connect(codec, &CodecPage::errorReported, this, &MainWindow::reportError);
    connect(codec, &CodecPage::failed, this, &MainWindow::errorOccurred);
    connect(codec, &CodecPage::levelsChanged, m_streamPage->view(), &StreamLabView::setLevels);
    connect(codec, &CodecPage::profileOpened, this, [this] { showPage(Page::Codec); });
    // Sensitivity is measured for page 2 by the codec's session.
    connect(m_distPage->statsView(), &LayerStatsView::sensitivityRequested, codec, &CodecPage::measureSensitivity);
    connect(codec->session(), &TunerSession::sensitivityReady, this, [this](const std::vector<LayerSensitivity>& s) {
        m_distPage->statsView()->setSensitivity(s, m_codecPage->sensitivityBins());
    });

    StreamPage* stream = m_streamPage;
    connect(stream->view(), &StreamLabView::startRequested, this, &MainWindow::startStream);
    connect(stream, &StreamPage::taskStarted, this, &MainWindow::showTask);
    connect(stream, &StreamPage::progressChanged, this, progress);
    connect(stream, &StreamPage::taskEnded, this, &MainWindow::endTask);
    connect(stream, &StreamPage::statusMessage, this, status);
    connect(stream, &StreamPage::errorReported, this, &MainWindow::reportError);
    connect(stream, &StreamPage::raceOpened, this, [this] { showPage(Page::Stream); });
}

void MainWindow::updateLabSources()
{
    const std::shared_ptr<const KvSet> kv = m_loader->kv();
    const std::shared_ptr<const Model> model = m_modelPage->session()->model();
    SampleContext sample;
    if (!m_captureOrigin.isEmpty()) {
        try {
            for (const std::string& id : sampleIds())
                if (QString::fromStdString(id) == m_captureOrigin) sample = loadSampleContext(id);
        } catch (const std::exception&) {
            // no samples installed: quality without a continuation
        }
    }
    m_codecPage->setSource(model, kv, sample);
    const TunerSession* tuner = m_codecPage->session();
    m_distPage->resetSensitivity(tuner->canMeasureSensitivity(), tuner->canMeasureQuality(), tuner->qualityNote());
    if (currentPage() == Page::Codec) pageOpened(Page::Codec);
    const bool streamable = kv && model && model->runtime().fingerprint() == kv->modelFingerprint &&
                            int(kv->tokens.size()) == kv->shape().numTokens;
    m_streamPage->session()->setSource(streamable ? model : nullptr, kv, QString::fromStdString(sample.question),
                                       QString::fromStdString(sample.continuation));
    m_streamPage->view()->setReady(streamable, streamable ? tr("Ready: %1 tokens of %2.")
                                                                .arg(kv->shape().numTokens)
                                                                .arg(QString::fromStdString(kv->modelName))
                                                          : tr("Streaming needs a cache captured with the open model."));
}

QStringList MainWindow::kvFileSuffixes() { return kvscope::kvFileSuffixes(); }

void MainWindow::dragEnterEvent(QDragEnterEvent* event)
{
    if (!droppedPath(event->mimeData()).isEmpty()) event->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* event)
{
    const DroppedFile drop = droppedFile(event->mimeData());
    if (drop.kind == DroppedFile::None) return;
    event->acceptProposedAction();
    switch (drop.kind) {
    case DroppedFile::Model: openModel(drop.path); break;
    case DroppedFile::Race: openRace(drop.path); break;
    case DroppedFile::Profile: openProfile(drop.path); break;
    case DroppedFile::Context: openContext(drop.path); break;
    case DroppedFile::Trace:
        m_streamPage->view()->setTracePath(drop.path);
        showPage(Page::Stream);
        break;
    case DroppedFile::Store:
        m_streamPage->view()->setStorePath(drop.path);
        showPage(Page::Stream);
        break;
    case DroppedFile::KvFile: openFile(drop.path); break;
    case DroppedFile::None: break;
    }
}

}  // namespace kvscope
