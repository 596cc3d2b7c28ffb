#include "model_page.h"

#include "model_context_view.h"
#include "model_session.h"

#include "eval/samples.h"

#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QGroupBox>
#include <QLabel>
#include <QLocale>
#include <QScrollArea>
#include <QSettings>
#include <QSplitter>
#include <QVBoxLayout>

#include <exception>

namespace kvscope {

namespace {

const char* const kSettingsModelDir = "window/modelDir";

// Summary rows: key (for summaryField and object names) and label, in display order.
const struct {
    const char* key;
    const char* label;
} kSummaryRows[] = {
    {"source", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Source")},
    {"model", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Model")},
    {"fingerprint", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Fingerprint")},
    {"layers", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Layers")},
    {"kv_heads", QT_TRANSLATE_NOOP("kvscope::ModelPage", "KV heads")},
    {"head_dim", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Head dim")},
    {"channels", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Channels")},
    {"tokens", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Tokens")},
    {"dtype", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Dtype")},
    {"kv_bytes", QT_TRANSLATE_NOOP("kvscope::ModelPage", "KV size")},
    {"file_bytes", QT_TRANSLATE_NOOP("kvscope::ModelPage", "File size")},
    {"k_locality", QT_TRANSLATE_NOOP("kvscope::ModelPage", "K variance raw/delta")},
    {"v_locality", QT_TRANSLATE_NOOP("kvscope::ModelPage", "V variance raw/delta")},
    {"k_entropy", QT_TRANSLATE_NOOP("kvscope::ModelPage", "K entropy raw→delta")},
    {"v_entropy", QT_TRANSLATE_NOOP("kvscope::ModelPage", "V entropy raw→delta")},
    {"load_time", QT_TRANSLATE_NOOP("kvscope::ModelPage", "Load time")},
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

ModelPage::ModelPage(QWidget* dialogParent, bool useSettings, QObject* parent)
    : QObject(parent), m_dialogParent(dialogParent), m_useSettings(useSettings), m_view(new ModelContextView),
      m_session(new ModelSession(this))
{
    m_view->setObjectName(QStringLiteral("modelContextView"));

    try {
        QStringList ids;
        for (const std::string& id : sampleIds()) ids << QString::fromStdString(id);
        m_view->setSampleIds(ids);
    } catch (const std::exception&) {
        m_view->setSampleIds({});  // no samples installed: the picker says so
    }
    connect(m_view, &ModelContextView::openModelFileRequested, this, &ModelPage::showOpenModelFileDialog);
    connect(m_view, &ModelContextView::openModelFolderRequested, this, &ModelPage::showOpenModelFolderDialog);
    connect(m_view, &ModelContextView::openDefaultModelRequested, this, [this] { emit modelRequested(QString(), QString()); });
    connect(m_view, &ModelContextView::openContextFileRequested, this, &ModelPage::showOpenContextDialog);
    connect(m_view, &ModelContextView::sampleRequested, this, &ModelPage::openContext);
    connect(m_view, &ModelContextView::contextEdited, m_session, &ModelSession::tokenize);
    connect(m_view, &ModelContextView::captureRequested, this, &ModelPage::captureRequested);
    m_splitter = new QSplitter(Qt::Horizontal);
    m_splitter->setObjectName(QStringLiteral("modelPageSplitter"));
    m_splitter->addWidget(m_view);
    m_splitter->addWidget(createSummaryPanel());
    m_splitter->setStretchFactor(0, 3);
    m_splitter->setStretchFactor(1, 2);
    m_splitter->setChildrenCollapsible(false);
}

QWidget* ModelPage::createSummaryPanel()
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

QString ModelPage::summaryField(const QString& key) const
{
    const auto* label = m_summaryWidget->findChild<QLabel*>(summaryObjectName(key));
    return label ? label->text() : QString();
}

void ModelPage::showSummary(const KvSummary& s, const std::vector<TensorStats>& stats)
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

void ModelPage::openContext(const QString& idOrPath)
{
    try {
        const SampleContext sample = loadSampleContext(QFile::encodeName(idOrPath).toStdString());
        const QString origin = QFileInfo::exists(idOrPath) ? QFileInfo(idOrPath).fileName() : idOrPath;
        m_view->setContext(QString::fromStdString(sample.text), origin);
    } catch (const std::exception& e) {
        emit errorReported(tr("Could not open the context"), QString::fromStdString(e.what()));
    }
}

void ModelPage::showOpenModelFileDialog()
{
    QSettings settings;
    const QString dir = settings.value(QLatin1String(kSettingsModelDir)).toString();
    const QString path = QFileDialog::getOpenFileName(
        m_dialogParent, tr("Open Model"), dir, tr("Models (*.gguf *.bin);;GGUF (*.gguf);;llama2.c checkpoints (*.bin);;All files (*)"));
    if (path.isEmpty()) return;
    if (m_useSettings) settings.setValue(QLatin1String(kSettingsModelDir), QFileInfo(path).absolutePath());
    QString tokenizer;
    if (QFileInfo(path).suffix().toLower() != QLatin1String("gguf")) {
        // A llama2.c checkpoint carries no vocabulary: its tokenizer.bin comes separately.
        tokenizer = QFileDialog::getOpenFileName(m_dialogParent, tr("Tokenizer for %1").arg(QFileInfo(path).fileName()),
                                                 QFileInfo(path).absolutePath(),
                                                 tr("Tokenizers (*.bin *.json *.model);;All files (*)"));
        if (tokenizer.isEmpty()) return;
    }
    emit modelRequested(path, tokenizer);
}

void ModelPage::showOpenModelFolderDialog()
{
    QSettings settings;
    const QString dir = QFileDialog::getExistingDirectory(
        m_dialogParent, tr("Open Hugging Face Model Folder"), settings.value(QLatin1String(kSettingsModelDir)).toString());
    if (dir.isEmpty()) return;
    if (m_useSettings) settings.setValue(QLatin1String(kSettingsModelDir), dir);
    emit modelRequested(dir, QString());
}

void ModelPage::showOpenContextDialog()
{
    const QString path =
        QFileDialog::getOpenFileName(m_dialogParent, tr("Open Context"), QString(), tr("Text (*.txt);;All files (*)"));
    if (!path.isEmpty()) openContext(path);
}

}  // namespace kvscope
