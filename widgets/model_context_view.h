// ModelContextView: the "Model & context" dock. Shows the open model's architecture, the context
// being edited (typed, pasted, opened from a file or picked among the samples), its token count and
// token boundaries (alternating backgrounds, one per token), and the Capture button.
// It only draws and asks: model loading, tokenization and capture run on the app's workers, which
// hand back the plain ModelInfo / TokenPieces structs of view_data.h. Text edits are reported after a short
// pause (contextEdited) so the app can re-tokenize in the background without flooding it.
#pragma once

#include "view_data.h"

#include <QMetaType>
#include <QString>
#include <QStringList>
#include <QWidget>

#include <vector>

class QComboBox;
class QLabel;
class QPlainTextEdit;
class QPushButton;
class QTabWidget;
class QTimer;
class QToolButton;

namespace kvscope {

class ModelContextView : public QWidget {
    Q_OBJECT
public:
    explicit ModelContextView(QWidget* parent = nullptr);
    ~ModelContextView() override;

    // One model field as shown: name, format, architecture, layers, heads, kv_heads, head_dim,
    // hidden, vocab, parameters, weights, tokenizer, kv_per_token, fingerprint, runtime, path.
    // "–" when no model is open; empty for an unknown key.
    QString modelField(const QString& key) const;
    QString contextText() const;
    QString contextOrigin() const { return m_origin; }
    int tokenCount() const { return m_tokenCount; }  // -1 until the current text is tokenized
    // The text of the token boundaries view (the pieces, concatenated).
    QString tokenViewText() const;
    QPushButton* captureButton() const { return m_captureButton; }
    QComboBox* sampleCombo() const { return m_sampleCombo; }

public slots:
    void setModelInfo(const kvscope::ModelInfo& info);
    void clearModel();
    void setSampleIds(const QStringList& ids);
    // Replaces the text (emits contextEdited at once, without the pause).
    void setContext(const QString& text, const QString& origin);
    // Ignored when pieces.text is no longer the text in the editor.
    void setTokens(const kvscope::TokenPieces& pieces);
    // The app turns capture off while any long task runs or without a model.
    void setCaptureEnabled(bool enabled);

signals:
    void openModelFileRequested();    // GGUF or llama2.c checkpoint
    void openModelFolderRequested();  // Hugging Face folder
    void openDefaultModelRequested();
    void openContextFileRequested();
    void sampleRequested(const QString& id);
    void contextEdited(const QString& text);
    void captureRequested(const QString& text);

private:
    void onTextChanged();
    void showTokenAtCursor();

    QComboBox* m_sampleCombo = nullptr;
    QToolButton* m_openButton = nullptr;
    QPlainTextEdit* m_editor = nullptr;
    QPlainTextEdit* m_tokenView = nullptr;
    QTabWidget* m_tabs = nullptr;
    QLabel* m_tokenCountLabel = nullptr;
    QLabel* m_tokenAtCursor = nullptr;
    QPushButton* m_captureButton = nullptr;
    QTimer* m_editPause = nullptr;
    QWidget* m_fields = nullptr;
    QString m_origin;
    int m_tokenCount = -1;
    bool m_captureEnabled = false;
    bool m_settingText = false;
    std::vector<int> m_ids;
    std::vector<int> m_pieceStarts;  // (tokens) offset of each piece in the token view
};

}  // namespace kvscope

