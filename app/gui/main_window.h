// The kvscope main window: the workflow as four pages (tabs), Model & Context -> Distributions ->
// Codec -> Stream, under a persistent strip that names the model and the cache every page is
// about. Each page is a controller that owns its view and session (ModelPage, DistributionsPage,
// CodecPage, StreamPage); the window assembles them, owns the cache being loaded (KvLoader: a KV
// file, a capture or a synthetic cache, its statistics computed on workers) and hands it to the
// pages, and keeps the menus, the status bar (TaskStatus: phase, progress and a Cancel button for
// every long task), the recent files (RecentFiles), what a drop opens (dropped_files.h) and the
// saved layout (WindowLayout: geometry, page, splitters, theme). It never computes on the UI
// thread.
#pragma once

#include "codec_page.h"
#include "distributions_page.h"
#include "kv_loader.h"
#include "model_page.h"
#include "model_session.h"
#include "recent_files.h"
#include "stream_page.h"

#include <QMainWindow>
#include <QString>
#include <QStringList>

#include <memory>
#include <vector>

class QAction;
class QLabel;
class QMenu;
class QTabWidget;

namespace kvscope {

class CodecTunerView;
class DistributionsView;
class DistributionsWorker;
class LayerStatsView;
class ModelContextView;
class StreamLabView;
class StreamSession;
class TaskStatus;
class TunerSession;
class WindowLayout;

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

    KvLoader* loader() const { return m_loader; }
    // The pages (page 1 to 4) and their parts.
    ModelPage* modelPage() const { return m_modelPage; }
    DistributionsPage* distributionsPage() const { return m_distPage; }
    CodecPage* codecPage() const { return m_codecPage; }
    StreamPage* streamPage() const { return m_streamPage; }
    ModelSession* session() const { return m_modelPage->session(); }
    ModelContextView* contextView() const { return m_modelPage->view(); }
    LayerStatsView* statsView() const { return m_distPage->statsView(); }
    DistributionsView* distributionsView() const { return m_distPage->explorer(); }
    DistributionsWorker* distributionsWorker() const { return m_distPage->worker(); }
    CodecTunerView* tunerView() const { return m_codecPage->view(); }
    TunerSession* tunerSession() const { return m_codecPage->session(); }
    StreamLabView* streamView() const { return m_streamPage->view(); }
    StreamSession* streamSession() const { return m_streamPage->session(); }
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
    QString summaryField(const QString& key) const { return m_modelPage->summaryField(key); }
    QStringList recentFiles() const { return m_recent->paths(); }

    bool modalErrors() const { return m_modalErrors; }
    void setModalErrors(bool on) { m_modalErrors = on; }

    static QStringList kvFileSuffixes();  // what drag & drop and the open dialog offer (dropped_files.h)

public slots:
    void openFile(const QString& path);
    void openSynthetic(const kvscope::SyntheticSpec& spec);
    // The default model and the long_1k sample, captured; a synthetic cache (and a status-bar note
    // saying why) when the default model is not installed.
    void openDemo();
    // path "" = the default model; tokenizerPath is needed for llama2.c checkpoints.
    void openModel(const QString& path, const QString& tokenizerPath = QString());
    // A sample id ("long_1k") or a UTF-8 text file. Errors go to errorOccurred.
    void openContext(const QString& idOrPath) { m_modelPage->openContext(idOrPath); }
    void captureContext();
    // A codec profile (JSON) into the codec tuner; errors go to errorOccurred.
    void openProfile(const QString& path) { m_codecPage->openProfile(path); }
    void saveProfile(const QString& path) { m_codecPage->saveProfile(path); }
    // LMCache's CacheGenConfig text of every level of the tuner's profile.
    void exportLmcache(const QString& path) { m_codecPage->exportLmcache(path); }
    // Starts a stream lab run with the view's settings and the tuner's profile.
    void startStream() { m_streamPage->start(m_codecPage->profile(), m_codecPage->streamTransform()); }
    // The Codec page's rate-distortion points: levels, baselines and (when its stage is on) the
    // transform codec with the stages switched on, scored on the chosen quality source (the
    // held-out continuation, or the quality suite file named on the page). In the background;
    // a new request supersedes the one in flight.
    void evaluateRateDistortion() { m_codecPage->evaluateRateDistortion(); }
    // Renders the window with each view in front, plus each view alone, as PNG files into dir.
    // @return the files written.
    QStringList saveScreenshots(const QString& dir);
    void showPage(kvscope::MainWindow::Page page);
    void setDarkTheme(bool on);
    // A stream race: save (JSON), open, export as a figure (PNG/JPEG/SVG/PDF by suffix).
    void saveRace(const QString& path) { m_streamPage->saveRace(path); }
    void openRace(const QString& path) { m_streamPage->openRace(path); }
    void exportRaceFigure(const QString& path) { m_streamPage->exportFigure(path); }
    void showSaveRaceDialog() { m_streamPage->showSaveDialog(); }
    void showOpenRaceDialog() { m_streamPage->showOpenDialog(); }
    void showExportRaceDialog() { m_streamPage->showExportDialog(); }
    void saveKv(const QString& path);
    void cancelLoad();
    void showOpenDialog();
    void showOpenModelFileDialog() { m_modelPage->showOpenModelFileDialog(); }
    void showOpenModelFolderDialog() { m_modelPage->showOpenModelFolderDialog(); }
    void showOpenContextDialog() { m_modelPage->showOpenContextDialog(); }
    void showSaveDialog();
    void showAbout();
    void clearRecentFiles() { m_recent->clear(); }

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
    void connectPages();
    void pageOpened(Page page);
    void updateSummaryStrip();
    // What the pages work on: the cache shown, the model and the sample it came from.
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

    const bool m_useSettings;
    bool m_modalErrors = true;
    bool m_hasData = false;
    KvSummary m_summary;
    QString m_pendingTitle;  // title to take once the cache being loaded is shown
    QString m_synthNote;     // why a synthetic cache is shown instead of the demo capture
    bool m_demoPending = false;  // capture as soon as the default model is open
    QString m_captureOrigin;  // the context (sample id or file name) of the capture being shown

    KvLoader* m_loader = nullptr;
    ModelPage* m_modelPage = nullptr;
    DistributionsPage* m_distPage = nullptr;
    CodecPage* m_codecPage = nullptr;
    StreamPage* m_streamPage = nullptr;
    RecentFiles* m_recent = nullptr;
    TaskStatus* m_status = nullptr;
    std::unique_ptr<WindowLayout> m_layout;
    QAction* m_captureAction = nullptr;
    QAction* m_saveAction = nullptr;
    QAction* m_darkAction = nullptr;
    QMenu* m_viewMenu = nullptr;
    QLabel* m_summaryStrip = nullptr;
    QTabWidget* m_pages = nullptr;
};

}  // namespace kvscope
