// ModelContextView: the "Model & context" dock. Shows the open model's architecture, the context
// being edited (typed, pasted, opened from a file or picked among the samples), its token count and
// token boundaries (alternating backgrounds, one per token), and the Capture button.
// It only draws and asks: model loading, tokenization and capture run on the app's workers, which
// hand back the plain ModelInfo / TokenPieces structs below. Text edits are reported after a short
// pause (contextEdited) so the app can re-tokenize in the background without flooding it.
#pragma once

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

// What the dock shows about a model; filled on the worker that opened it.
struct ModelInfo {
    QString name;
    QString path;
    QString format;        // "gguf", "safetensors", "llama2.c"
    QString architecture;  // "LlamaForCausalLM"
    QString modelType;     // "llama", "qwen2"
    int layers = 0;
    int heads = 0;
    int kvHeads = 0;
    int headDim = 0;
    int hiddenSize = 0;
    int intermediateSize = 0;
    int vocabSize = 0;
    int maxPositions = 0;
    quint64 parameters = 0;
    QString weightTypes;  // "Q4_1 x 210, F32 x 61"
    QString tokenizer;    // "byte-level BPE (GGUF, gpt2)"
    bool chat = false;
    QString fingerprint;
    QString runtime;  // "libtorch 1.13.0, 2 threads, float32 compute, float16 KV"
    double loadSeconds = 0;
};

// The tokens a capture of `text` would run (chat template and BOS included), each decoded alone.
struct TokenPieces {
    QString text;               // the context they belong to (stale results are recognised by it)
    std::vector<int> ids;       // (tokens)
    QStringList pieces;         // (tokens) decode({id}); partial UTF-8 shows as U+FFFD
};

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

Q_DECLARE_METATYPE(kvscope::ModelInfo)
Q_DECLARE_METATYPE(kvscope::TokenPieces)
