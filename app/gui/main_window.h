// The kvscope main window: opens a KV cache (file, drag & drop, recent list, or the synthetic
// demo), loads it on workers through KvLoader, and shows its summary in a dock and its statistics
// in the LayerStatsView at the centre. It never computes on the UI thread.
#pragma once

#include "kv_loader.h"

#include <QMainWindow>
#include <QString>
#include <QStringList>

#include <vector>

class QAction;
class QLabel;
class QMenu;
class QMimeData;
class QProgressBar;
class QPushButton;

namespace kvscope {

class LayerStatsView;

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
    void openDemo();
    void cancelLoad();
    void showOpenDialog();
    void showAbout();
    void clearRecentFiles();

signals:
    // The summary and the plots now show a newly loaded cache.
    void dataShown();
    // A load failed; message is the one-line error (also shown in a box when modalErrors is on).
    void errorOccurred(const QString& message);
    void loadCancelled();

protected:
    void closeEvent(QCloseEvent* event) override;
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;

private:
    void createActions();
    void createSummaryDock();
    void createStatusBar();
    void setBusy(bool busy);
    void onPhaseChanged(const QString& text, int maximum);
    void onLoaded(const kvscope::KvSummary& summary, const std::vector<kvscope::TensorStats>& stats);
    void onFailed(const QString& message);
    void showSummary(const KvSummary& summary, const std::vector<TensorStats>& stats);
    void addRecentFile(const QString& path);
    void rebuildRecentMenu();
    static QString kvFileFrom(const QMimeData* mime);

    const bool m_useSettings;
    bool m_modalErrors = true;
    bool m_hasData = false;
    KvSummary m_summary;
    QString m_pendingTitle;  // title to take once the cache being loaded is shown
    QStringList m_recentFiles;

    KvLoader* m_loader = nullptr;
    LayerStatsView* m_statsView = nullptr;
    QWidget* m_summaryWidget = nullptr;
    QMenu* m_recentMenu = nullptr;
    QMenu* m_viewMenu = nullptr;
    QAction* m_cancelAction = nullptr;
    QLabel* m_phaseLabel = nullptr;
    QProgressBar* m_progress = nullptr;
    QPushButton* m_cancelButton = nullptr;
};

}  // namespace kvscope
