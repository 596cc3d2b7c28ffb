// ModelPage: the Model & Context page's controller. It owns the model and context view
// (ModelContextView) with its session (ModelSession: open a model, tokenize, capture on a
// worker), and the "KV cache" panel that summarises the cache shown (shape, sizes, locality and
// entropy of K and V). Opening a model and capturing go through the window, which owns the cache
// being loaded: the page asks for them with signals.
#pragma once

#include "kv_loader.h"

#include <QObject>
#include <QString>

#include <vector>

class QSplitter;
class QWidget;

namespace kvscope {

class ModelContextView;
class ModelSession;

class ModelPage : public QObject {
    Q_OBJECT
public:
    // dialogParent: the window the file dialogs belong to; useSettings false: the dialogs do not
    // remember their folder.
    ModelPage(QWidget* dialogParent, bool useSettings, QObject* parent = nullptr);

    QSplitter* widget() const { return m_splitter; }  // the view | the summary panel
    ModelContextView* view() const { return m_view; }
    ModelSession* session() const { return m_session; }

    // A sample id ("long_1k") or a UTF-8 text file into the view; errors go to errorReported.
    void openContext(const QString& idOrPath);
    void showSummary(const KvSummary& summary, const std::vector<TensorStats>& stats);
    QString summaryField(const QString& key) const;  // see MainWindow::summaryField
    double localityK() const { return m_localityK; }
    double localityV() const { return m_localityV; }

    void showOpenModelFileDialog();
    void showOpenModelFolderDialog();
    void showOpenContextDialog();

signals:
    // path "" = the default model; tokenizerPath for llama2.c checkpoints.
    void modelRequested(const QString& path, const QString& tokenizerPath);
    void captureRequested();
    void errorReported(const QString& title, const QString& message);

private:
    QWidget* createSummaryPanel();

    QWidget* m_dialogParent;
    const bool m_useSettings;
    ModelContextView* m_view;
    ModelSession* m_session;
    QWidget* m_summaryWidget = nullptr;
    QSplitter* m_splitter = nullptr;
    double m_localityK = 0, m_localityV = 0;
};

}  // namespace kvscope
