#include "model_session.h"

#include "background_job.h"

#include "model/model.h"

#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>

namespace kvscope {

namespace {

ModelInfo describeModel(const Model& model)
{
    const LlamaSpec& spec = model.spec();
    const ModelConfig& c = spec.config;
    ModelInfo m;
    m.name = QString::fromStdString(spec.name);
    m.path = QString::fromStdString(model.path());
    m.format = QString::fromStdString(spec.format);
    m.architecture = QString::fromStdString(c.architecture);
    m.modelType = QString::fromStdString(c.modelType);
    m.layers = c.numLayers;
    m.heads = c.numHeads;
    m.kvHeads = c.numKvHeads;
    m.headDim = c.headDim;
    m.hiddenSize = c.hiddenSize;
    m.intermediateSize = c.intermediateSize;
    m.vocabSize = c.vocabSize;
    m.maxPositions = c.maxPositionEmbeddings;
    m.parameters = spec.parameters;
    m.weightTypes = QString::fromStdString(spec.weightTypes);
    m.tokenizer = QString::fromStdString(model.tokenizer().description());
    m.chat = model.isChat();
    m.fingerprint = QString::fromStdString(model.runtime().fingerprint());
    m.runtime = QString::fromStdString(model.runtime().describe());
    m.loadSeconds = model.loadSeconds();
    return m;
}

}  // namespace

ModelSession::ModelSession(QObject* parent)
    : QObject(parent), m_job(new JobLane(tr("model"), this)), m_tokenize(new JobLane(tr("context"), this))
{
    connect(m_job, &JobLane::phaseChanged, this, &ModelSession::phaseChanged);
    connect(m_job, &JobLane::progressChanged, this, &ModelSession::progressChanged);
    connect(m_job, &JobLane::failed, this, &ModelSession::failed);
    connect(m_job, &JobLane::cancelled, this, &ModelSession::cancelled);
    connect(m_tokenize, &JobLane::failed, this, &ModelSession::tokenizeFailed);
}

ModelSession::~ModelSession()
{
    // The lanes first: their workers hold the model and report to this object.
    delete m_tokenize;
    delete m_job;
}

bool ModelSession::isBusy() const
{
    return m_job->isBusy();
}

void ModelSession::openModel(const QString& path, const QString& tokenizerPath)
{
    const QString shown = path.isEmpty() ? tr("the default model") : QFileInfo(path).fileName();
    const std::string modelArg = path.isEmpty() ? std::string() : QFile::encodeName(path).toStdString();
    const std::string tokenizerArg = QFile::encodeName(tokenizerPath).toStdString();
    m_job->start(tr("Loading %1…").arg(shown), [this, modelArg, tokenizerArg](JobControl&) -> std::function<void()> {
        RuntimeOptions options;
        options.prefillBlock = kPrefillBlock;
        // Captures record each token's attention mass so that the Codec page's Token importance
        // stage can be toggled (one more q.k pass over the keys: a few percent at workbench lengths).
        options.attnMass = true;
        std::shared_ptr<const Model> model = Model::open(modelArg, tokenizerArg, options);
        const ModelInfo info = describeModel(*model);
        return [this, model, info] {
            m_model = model;
            m_info = info;
            m_tokenize->cancel(true);  // pieces from the previous model are stale
            emit modelOpened(info);
        };
    });
}

void ModelSession::tokenize(const QString& text)
{
    if (!m_model) return;
    const std::shared_ptr<const Model> model = m_model;
    m_tokenize->start(QString(), [this, model, text](JobControl& control) -> std::function<void()> {
        TokenPieces out;
        out.text = text;
        const std::vector<int32_t> ids = model->contextTokens(text.toStdString());
        out.ids.assign(ids.begin(), ids.end());
        out.pieces.reserve(qsizetype(ids.size()));
        for (int32_t id : ids) {
            if (control.stopped()) return {};  // a newer text is waiting
            out.pieces.append(QString::fromStdString(model->tokenizer().decode({id}, false)));
        }
        return [this, out] { emit tokenized(out); };
    });
}

void ModelSession::capture(const QString& text)
{
    if (!m_model) {
        emit failed(tr("Capture: open a model first."));
        return;
    }
    const std::shared_ptr<const Model> model = m_model;
    m_job->start(tr("Tokenizing the context…"), [this, model, text](JobControl& control) -> std::function<void()> {
        QElapsedTimer clock;
        clock.start();
        const std::string utf8 = text.toStdString();
        const std::vector<int32_t> tokens = model->contextTokens(utf8);
        const int total = int(tokens.size());
        control.phase(tr("Capturing the KV of %1 tokens…").arg(total), total);
        InferenceSession session(model->runtime());
        session.append(tokens, nullptr, nullptr, [&control, total](int done, int) { return control.progress(done, total); });
        KvSet out = session.exportKv();
        out.context = utf8;
        auto kv = std::make_shared<const KvSet>(std::move(out));
        const double seconds = double(clock.nsecsElapsed()) * 1e-9;
        return [this, kv, seconds] { emit captured(kv, seconds); };
    });
}

void ModelSession::cancel()
{
    m_job->cancel();
}

}  // namespace kvscope
