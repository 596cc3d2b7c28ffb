#include "model_context_view.h"

#include <QComboBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLocale>
#include <QMenu>
#include <QPalette>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QScrollArea>
#include <QSplitter>
#include <QTabWidget>
#include <QTextBlock>
#include <QTextCharFormat>
#include <QTextCursor>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>

#include <algorithm>

namespace kvscope {

namespace {

const struct {
    const char* key;
    const char* label;
} kModelRows[] = {
    {"name", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Name")},
    {"format", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Format")},
    {"architecture", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Architecture")},
    {"layers", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Layers")},
    {"heads", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Heads")},
    {"kv_heads", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "KV heads")},
    {"head_dim", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Head dim")},
    {"hidden", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Hidden / MLP")},
    {"vocab", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Vocabulary")},
    {"parameters", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Parameters")},
    {"weights", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Weight types")},
    {"tokenizer", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Tokenizer")},
    {"kv_per_token", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "KV per token")},
    {"fingerprint", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Fingerprint")},
    {"runtime", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Runtime")},
    {"path", QT_TRANSLATE_NOOP("kvscope::ModelContextView", "Path")},
};

QString fieldObjectName(const QString& key)
{
    return QStringLiteral("model_") + key;
}

// "134.5 M": parameters at a glance, next to the exact count.
QString shortCount(quint64 n)
{
    if (n >= 1000000000ull) return QStringLiteral("%1 B").arg(double(n) * 1e-9, 0, 'f', 2);
    if (n >= 1000000ull) return QStringLiteral("%1 M").arg(double(n) * 1e-6, 0, 'f', 1);
    if (n >= 1000ull) return QStringLiteral("%1 K").arg(double(n) * 1e-3, 0, 'f', 1);
    return QString::number(n);
}

constexpr int kEditPauseMs = 300;
// Beyond this many tokens the boundaries view shows a prefix: painting is per token on the UI thread.
constexpr int kMaxPaintedTokens = 20000;

}  // namespace

ModelContextView::ModelContextView(QWidget* parent) : QWidget(parent)
{
    // Model: buttons, then the architecture as a form of selectable labels.
    auto* modelBox = new QGroupBox(tr("Model"));
    auto* modelLayout = new QVBoxLayout(modelBox);
    auto* buttons = new QHBoxLayout;
    m_openButton = new QToolButton;
    m_openButton->setObjectName(QStringLiteral("openModelButton"));
    m_openButton->setText(tr("Open Model"));
    m_openButton->setPopupMode(QToolButton::InstantPopup);
    auto* openMenu = new QMenu(m_openButton);
    openMenu->addAction(tr("GGUF or llama2.c File…"), this, &ModelContextView::openModelFileRequested);
    openMenu->addAction(tr("Hugging Face Folder…"), this, &ModelContextView::openModelFolderRequested);
    openMenu->addAction(tr("Default Model (SmolLM2-135M)"), this, &ModelContextView::openDefaultModelRequested);
    m_openButton->setMenu(openMenu);
    buttons->addWidget(m_openButton);
    buttons->addStretch(1);
    modelLayout->addLayout(buttons);

    m_fields = new QWidget;
    auto* form = new QFormLayout(m_fields);
    form->setContentsMargins(0, 0, 0, 0);
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    for (const auto& row : kModelRows) {
        auto* value = new QLabel(QStringLiteral("–"));
        value->setObjectName(fieldObjectName(QLatin1String(row.key)));
        value->setTextInteractionFlags(Qt::TextSelectableByMouse);
        value->setWordWrap(true);
        form->addRow(tr(row.label) + QLatin1Char(':'), value);
    }
    modelLayout->addWidget(m_fields);

    // Context: sample picker and file button, the editor and the token view as tabs, the count.
    auto* contextBox = new QGroupBox(tr("Context"));
    auto* contextLayout = new QVBoxLayout(contextBox);
    auto* pickRow = new QHBoxLayout;
    m_sampleCombo = new QComboBox;
    m_sampleCombo->setObjectName(QStringLiteral("sampleCombo"));
    m_sampleCombo->setToolTip(tr("Sample contexts shipped with kvscope"));
    connect(m_sampleCombo, &QComboBox::activated, this, [this](int index) {
        if (index > 0) emit sampleRequested(m_sampleCombo->itemText(index));
    });
    pickRow->addWidget(m_sampleCombo, 1);
    auto* openContext = new QPushButton(tr("Open…"));
    openContext->setObjectName(QStringLiteral("openContextButton"));
    openContext->setToolTip(tr("Open a UTF-8 text file as the context"));
    connect(openContext, &QPushButton::clicked, this, &ModelContextView::openContextFileRequested);
    pickRow->addWidget(openContext);
    contextLayout->addLayout(pickRow);

    m_editor = new QPlainTextEdit;
    m_editor->setObjectName(QStringLiteral("contextEditor"));
    m_editor->setPlaceholderText(tr("Type or paste a context, or pick a sample above."));
    m_tokenView = new QPlainTextEdit;
    m_tokenView->setObjectName(QStringLiteral("tokenView"));
    m_tokenView->setReadOnly(true);
    m_tokenView->setPlaceholderText(tr("Open a model to see the token boundaries."));
    m_tabs = new QTabWidget;
    m_tabs->addTab(m_editor, tr("Text"));
    m_tabs->addTab(m_tokenView, tr("Tokens"));
    contextLayout->addWidget(m_tabs, 1);

    m_tokenCountLabel = new QLabel;
    m_tokenCountLabel->setObjectName(QStringLiteral("tokenCount"));
    m_tokenAtCursor = new QLabel;
    m_tokenAtCursor->setObjectName(QStringLiteral("tokenAtCursor"));
    m_tokenAtCursor->setTextInteractionFlags(Qt::TextSelectableByMouse);
    contextLayout->addWidget(m_tokenCountLabel);
    contextLayout->addWidget(m_tokenAtCursor);

    m_captureButton = new QPushButton(tr("Capture KV"));
    m_captureButton->setObjectName(QStringLiteral("captureButton"));
    m_captureButton->setToolTip(tr("Run the prefill of this context and show its KV cache (Ctrl+R)"));
    connect(m_captureButton, &QPushButton::clicked, this,
            [this] { emit captureRequested(m_editor->toPlainText()); });
    contextLayout->addWidget(m_captureButton);

    // The user decides how much room the architecture takes from the context.
    auto* splitter = new QSplitter(Qt::Vertical);
    splitter->setChildrenCollapsible(false);
    auto* modelScroll = new QScrollArea;
    modelScroll->setWidget(modelBox);
    modelScroll->setWidgetResizable(true);
    modelScroll->setFrameShape(QFrame::NoFrame);
    splitter->addWidget(modelScroll);
    splitter->addWidget(contextBox);
    splitter->setStretchFactor(0, 2);
    splitter->setStretchFactor(1, 3);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(splitter);

    m_editPause = new QTimer(this);
    m_editPause->setSingleShot(true);
    m_editPause->setInterval(kEditPauseMs);
    connect(m_editPause, &QTimer::timeout, this, [this] { emit contextEdited(m_editor->toPlainText()); });
    connect(m_editor, &QPlainTextEdit::textChanged, this, &ModelContextView::onTextChanged);
    connect(m_tokenView, &QPlainTextEdit::cursorPositionChanged, this, &ModelContextView::showTokenAtCursor);

    setSampleIds({});
    clearModel();
    onTextChanged();
}

ModelContextView::~ModelContextView() = default;

QString ModelContextView::modelField(const QString& key) const
{
    const auto* label = m_fields->findChild<QLabel*>(fieldObjectName(key));
    return label ? label->text() : QString();
}

QString ModelContextView::contextText() const
{
    return m_editor->toPlainText();
}

QString ModelContextView::tokenViewText() const
{
    return m_tokenView->toPlainText();
}

void ModelContextView::setModelInfo(const ModelInfo& m)
{
    const QLocale c = QLocale::c();
    auto set = [this](const char* key, const QString& text) {
        if (auto* label = m_fields->findChild<QLabel*>(fieldObjectName(QLatin1String(key))))
            label->setText(text.isEmpty() ? QStringLiteral("–") : text);
    };
    set("name", m.name);
    set("format", m.format);
    set("architecture", m.modelType.isEmpty() ? m.architecture
                                              : QStringLiteral("%1 (%2)").arg(m.architecture, m.modelType));
    set("layers", QString::number(m.layers));
    set("heads", QString::number(m.heads));
    set("kv_heads", QString::number(m.kvHeads));
    set("head_dim", QString::number(m.headDim));
    set("hidden", QStringLiteral("%1 / %2").arg(m.hiddenSize).arg(m.intermediateSize));
    set("vocab", QString::number(m.vocabSize));
    set("parameters", QStringLiteral("%1 (%2)").arg(c.toString(qulonglong(m.parameters)), shortCount(m.parameters)));
    set("weights", m.weightTypes);
    set("tokenizer", m.chat ? tr("%1, chat template").arg(m.tokenizer) : m.tokenizer);
    // K and V, every layer, fp16.
    const qint64 kvPerToken = qint64(2) * m.layers * m.kvHeads * m.headDim * 2;
    set("kv_per_token", c.formattedDataSize(kvPerToken, 1));
    set("fingerprint", m.fingerprint);
    set("runtime", m.runtime);
    set("path", shownPath(m.path));
    if (auto* label = m_fields->findChild<QLabel*>(fieldObjectName(QLatin1String("path")))) label->setToolTip(m.path);
    m_tokenView->setPlaceholderText(tr("Tokenizing…"));
}

void ModelContextView::clearModel()
{
    for (const auto& row : kModelRows)
        if (auto* label = m_fields->findChild<QLabel*>(fieldObjectName(QLatin1String(row.key))))
            label->setText(QStringLiteral("–"));
    m_tokenCount = -1;
    m_ids.clear();
    m_pieceStarts.clear();
    m_tokenView->clear();
    m_tokenView->setPlaceholderText(tr("Open a model to see the token boundaries."));
}

void ModelContextView::setSampleIds(const QStringList& ids)
{
    m_sampleCombo->clear();
    m_sampleCombo->addItem(ids.isEmpty() ? tr("(no sample contexts found)") : tr("Pick a sample context…"));
    m_sampleCombo->addItems(ids);
    m_sampleCombo->setEnabled(!ids.isEmpty());
}

void ModelContextView::setContext(const QString& text, const QString& origin)
{
    m_settingText = true;
    m_editor->setPlainText(text);
    m_settingText = false;
    m_origin = origin;
    const int sample = m_sampleCombo->findText(origin);
    m_sampleCombo->setCurrentIndex(sample > 0 ? sample : 0);
    onTextChanged();
    m_editPause->stop();
    emit contextEdited(text);
}

void ModelContextView::onTextChanged()
{
    if (m_settingText) return;
    m_tokenCount = -1;
    const int chars = m_editor->document()->characterCount() - 1;
    m_tokenCountLabel->setText(chars > 0 ? tr("%1 characters; tokens: counting…").arg(chars)
                                         : tr("No context yet."));
    m_tokenAtCursor->clear();
    m_captureButton->setEnabled(m_captureEnabled && chars > 0);
    m_editPause->start();
}

void ModelContextView::setTokens(const TokenPieces& t)
{
    if (t.text != m_editor->toPlainText()) return;  // the user typed on since
    m_tokenCount = int(t.ids.size());
    m_ids.assign(t.ids.begin(), t.ids.end());
    m_pieceStarts.clear();

    const int painted = std::min<int>(m_tokenCount, kMaxPaintedTokens);
    m_tokenCountLabel->setText(
        painted < m_tokenCount
            ? tr("%1 tokens (template included); showing the first %2").arg(m_tokenCount).arg(painted)
            : tr("%1 tokens (template included)").arg(m_tokenCount));

    // Alternating backgrounds mark where one token ends and the next begins.
    const QColor base = palette().color(QPalette::Base);
    const bool dark = base.lightness() < 128;
    QTextCharFormat even, odd;
    even.setBackground(dark ? QColor(0x2b, 0x4a, 0x6f) : QColor(0xd6, 0xe6, 0xfa));
    odd.setBackground(dark ? QColor(0x5a, 0x48, 0x22) : QColor(0xfa, 0xe8, 0xc8));
    m_tokenView->setUpdatesEnabled(false);
    m_tokenView->clear();
    QTextCursor cursor(m_tokenView->document());
    cursor.beginEditBlock();
    int offset = 0;
    m_pieceStarts.reserve(size_t(painted));
    for (int i = 0; i < painted; ++i) {
        m_pieceStarts.push_back(offset);
        const QString piece = t.pieces.value(i);
        cursor.insertText(piece, (i % 2) ? odd : even);
        offset = cursor.position();
    }
    cursor.endEditBlock();
    m_tokenView->moveCursor(QTextCursor::Start);
    m_tokenView->setUpdatesEnabled(true);
    m_tokenAtCursor->clear();
}

void ModelContextView::showTokenAtCursor()
{
    if (m_pieceStarts.empty()) return;
    const int pos = m_tokenView->textCursor().position();
    const auto it = std::upper_bound(m_pieceStarts.begin(), m_pieceStarts.end(), pos);
    const int index = int(it - m_pieceStarts.begin()) - 1;
    if (index < 0 || index >= int(m_ids.size())) return;
    m_tokenAtCursor->setText(tr("Token %1 of %2: id %3").arg(index).arg(m_tokenCount).arg(m_ids[size_t(index)]));
}

void ModelContextView::setCaptureEnabled(bool enabled)
{
    m_captureEnabled = enabled;
    m_captureButton->setEnabled(enabled && !m_editor->toPlainText().isEmpty());
}

}  // namespace kvscope
