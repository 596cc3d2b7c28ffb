// The kvscope main window: the workflow as four pages (tabs), Model & Context -> Distributions ->
// Codec -> Stream, under a persistent strip that names the model and the cache every page is
// about. Page 1 opens a model and a context (ModelSession) and captures the context's KV, or a KV
// file is opened (file, drag & drop, recent list); the cache's statistics are computed on workers
// through KvLoader; page 2 shows CacheGen's three observations and an explorer; page 3 the codec
// tuner (its rate-distortion plot evaluated in the background when the page opens); page 4 the
// stream race. It never computes on the UI thread: the status bar shows the phase, progress and
// a Cancel button for every long task. Geometry, page, splitters and theme are saved (QSettings).
#pragma once

#include "kv_loader.h"
#include "model_session.h"

#include <QByteArray>
#include <QHash>
#include <QMainWindow>
#include <QString>
#include <QStringList>

#include <vector>

class QAction;
class QSettings;
class QTimer;
class QTabWidget;
class QLabel;
class QMenu;
class QMimeData;
class QProgressBar;
class QPushButton;

namespace kvscope {

class CodecTunerView;
class DistributionsView;
class DistributionsWorker;
class StreamLabView;
class StreamSession;
class TunerSession;
class LayerStatsView;
class ModelContextView;

class MainWindow : public QMainWindow {
    Q_OBJECT
    // Off: errors only go to errorOccurred() and the status bar (tests, --screenshot runs).
    // Default on, unless the environment sets KVSCOPE_NO_MODAL_ERRORS=1.
    Q_PROPERTY(bool modalErrors READ modalErrors WRITE setModalErrors)
public:
    // useSettings false: neither restore nor save geometry, dock layout and recent files
    // (reproducible screenshots).
    explicit MainWindow(bool useSettings = true, QWidget* parent = nullptr);
    ~MainWindow() override;

    LayerStatsView* statsView() const { return m_statsView; }
    KvLoader* loader() const { return m_loader; }
    ModelSession* session() const { return m_session; }
    ModelContextView* contextView() const { return m_contextView; }
    DistributionsView* distributionsView() const { return m_distributions; }
    DistributionsWorker* distributionsWorker() const { return m_distWorker; }
    CodecTunerView* tunerView() const { return m_tuner; }
    TunerSession* tunerSession() const { return m_tunerSession; }
    StreamLabView* streamView() const { return m_streamView; }
    StreamSession* streamSession() const { return m_streamSession; }
    enum class Page { ModelContext = 0, Distributions = 1, Codec = 2, Stream = 3 };
    Page currentPage() const;
    QTabWidget* pages() const { return m_pages; }
    QString summaryStripText() const;
    // A model, capture, KV read or statistics job is running.
    bool isLoading() const;
    bool hasData() const { return m_hasData; }
    const KvSummary& summary() const { return m_summary; }
    // Text shown in the summary dock for one field: source, model, fingerprint, layers, kv_heads,
    // head_dim, channels, tokens, dtype, kv_bytes, file_bytes, k_locality, v_locality, k_entropy,
    // v_entropy, load_time. Empty for an unknown key.
    QString summaryField(const QString& key) const;
    QStringList recentFiles() const { return m_recentFiles; }

    bool modalErrors() const { return m_modalErrors; }
    void setModalErrors(bool on) { m_modalErrors = on; }

    static QStringList kvFileSuffixes();  // what drag & drop and the open dialog offer

public slots:
    void openFile(const QString& path);
    void openSynthetic(const kvscope::SyntheticSpec& spec);
    // The default model and the long_1k sample, captured; a synthetic cache (and a status-bar note
    // saying why) when the default model is not installed.
    void openDemo();
    // path "" = the default model; tokenizerPath is needed for llama2.c checkpoints.
    void openModel(const QString& path, const QString& tokenizerPath = QString());
    // A sample id ("long_1k") or a UTF-8 text file. Errors go to errorOccurred.
    void openContext(const QString& idOrPath);
    void captureContext();
    // A codec profile (JSON) into the codec tuner; errors go to errorOccurred.
    void openProfile(const QString& path);
    void saveProfile(const QString& path);
    // LMCache's CacheGenConfig text of every level of the tuner's profile.
    void exportLmcache(const QString& path);
    // Starts a stream lab run with the view's settings and the tuner's profile.
    void startStream();
    // The Codec page's rate-distortion points: levels, baselines and (when its stage is on) the
    // transform codec with the stages switched on, scored on the chosen quality source (the
    // held-out continuation, or the quality suite file named on the page). In the background;
    // a new request supersedes the one in flight.
    void evaluateRateDistortion();
    // Renders the window with each view in front, plus each view alone, as PNG files into dir.
    // @return the files written.
    QStringList saveScreenshots(const QString& dir);
    void showPage(kvscope::MainWindow::Page page);
    void setDarkTheme(bool on);
    // A stream race: save (JSON), open, export as a figure (PNG/JPEG/SVG/PDF by suffix).
    void saveRace(const QString& path);
    void openRace(const QString& path);
    void exportRaceFigure(const QString& path);
    void showSaveRaceDialog();
    void showOpenRaceDialog();
    void showExportRaceDialog();
    void saveKv(const QString& path);
    void cancelLoad();
    void showOpenDialog();
    void showOpenModelFileDialog();
    void showOpenModelFolderDialog();
    void showOpenContextDialog();
    void showSaveDialog();
    void showAbout();
    void clearRecentFiles();

signals:
    // The summary and the plots now show a newly loaded cache.
    void dataShown();
    // A load failed; message is the one-line error (also shown in a box when modalErrors is on).
    void errorOccurred(const QString& message);
    void loadCancelled();
    // The Model & context dock now shows a newly opened model.
    void modelShown();
    void kvSaved(const QString& path);

protected:
    void closeEvent(QCloseEvent* event) override;
    void showEvent(QShowEvent* event) override;
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;

private:
    void createActions();
    void createPages();
    QWidget* createSummaryPanel();
    void createModelPage();
    void createDistributionsPage();
    void createTunerPage();
    void createStreamPage();
    void pageOpened(Page page);
    void updateSummaryStrip();
    void saveLayout(QSettings& settings) const;
    void restoreLayout(QSettings& settings);
    void updateLabSources();
    // Status bar for the tuner's and the stream lab's tasks.
    void showTask(const QString& text, int maximum);
    void endTask(const QString& text);
    void reportError(const QString& title, const QString& message);
    void connectSession();
    void showError(const QString& title, const QString& message);
    void createStatusBar();
    void setBusy(bool busy);
    void onPhaseChanged(const QString& text, int maximum);
    void onLoaded(const kvscope::KvSummary& summary, const std::vector<kvscope::TensorStats>& stats);
    void onFailed(const QString& message);
    void showSummary(const KvSummary& summary, const std::vector<TensorStats>& stats);
    void addRecentFile(const QString& path);
    void rebuildRecentMenu();
    // The first dropped path kvscope can open: a KV file, a GGUF model, a model folder.
    static QString droppedPath(const QMimeData* mime);

    const bool m_useSettings;
    bool m_modalErrors = true;
    bool m_hasData = false;
    KvSummary m_summary;
    QString m_pendingTitle;  // title to take once the cache being loaded is shown
    QString m_synthNote;     // why a synthetic cache is shown instead of the demo capture
    bool m_demoPending = false;  // capture as soon as the default model is open
    QStringList m_recentFiles;

    KvLoader* m_loader = nullptr;
    ModelSession* m_session = nullptr;
    ModelContextView* m_contextView = nullptr;
    QAction* m_captureAction = nullptr;
    QAction* m_saveAction = nullptr;
    LayerStatsView* m_statsView = nullptr;
    DistributionsView* m_distributions = nullptr;
    DistributionsWorker* m_distWorker = nullptr;
    CodecTunerView* m_tuner = nullptr;
    TunerSession* m_tunerSession = nullptr;
    StreamLabView* m_streamView = nullptr;
    StreamSession* m_streamSession = nullptr;
    QString m_captureOrigin;  // the context (sample id or file name) of the capture being shown
    QWidget* m_summaryWidget = nullptr;
    QLabel* m_summaryStrip = nullptr;
    QTabWidget* m_pages = nullptr;
    QAction* m_darkAction = nullptr;
    double m_localityK = 0, m_localityV = 0;
    int m_sensitivityBins = 4;
    QHash<QString, QByteArray> m_pendingSplitters;  // saved splitter states, applied on first show
    QMenu* m_recentMenu = nullptr;
    QMenu* m_viewMenu = nullptr;
    QAction* m_cancelAction = nullptr;
    QLabel* m_phaseLabel = nullptr;
    QProgressBar* m_progress = nullptr;
    QPushButton* m_cancelButton = nullptr;
    QTimer* m_stageTimer = nullptr;  // re-evaluates after stage toggles
};

}  // namespace kvscope
