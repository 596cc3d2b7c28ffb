#include "model_session.h"

#include "model/model.h"

#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QMetaObject>

#include <exception>
#include <new>

namespace kvscope {

namespace {

QString messageOf(std::exception_ptr error, const QString& what)
{
    try {
        std::rethrow_exception(error);
    } catch (const std::bad_alloc&) {
        return QObject::tr("%1: not enough memory").arg(what);
    } catch (const std::exception& e) {
        return QString::fromStdString(e.what());
    } catch (...) {
        return QObject::tr("%1: unexpected error").arg(what);
    }
}

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

ModelSession::ModelSession(QObject* parent) : QObject(parent)
{
    m_jobPool.setMaxThreadCount(1);
    m_tokenizePool.setMaxThreadCount(1);
}

ModelSession::~ModelSession()
{
    if (m_stop) *m_stop = true;
    m_tokenizePool.waitForDone();
    m_jobPool.waitForDone();
}

void ModelSession::begin()
{
    if (m_stop) *m_stop = true;  // a job still running from before stops at its next tick
    m_stop = std::make_shared<std::atomic<bool>>(false);
    ++m_generation;
    m_busy = true;
}

void ModelSession::end()
{
    m_busy = false;
    m_stop.reset();
}

void ModelSession::openModel(const QString& path, const QString& tokenizerPath)
{
    begin();
    const quint64 generation = m_generation;
    const QString shown = path.isEmpty() ? tr("the default model") : QFileInfo(path).fileName();
    emit phaseChanged(tr("Loading %1…").arg(shown), 0);
    const std::string modelArg = path.isEmpty() ? std::string() : QFile::encodeName(path).toStdString();
    const std::string tokenizerArg = QFile::encodeName(tokenizerPath).toStdString();

    m_jobPool.start([this, generation, modelArg, tokenizerArg, shown] {
        std::shared_ptr<const Model> model;
        ModelInfo info;
        QString error;
        try {
            RuntimeOptions options;
            options.prefillBlock = kPrefillBlock;
            model = Model::open(modelArg, tokenizerArg, options);
            info = describeModel(*model);
        } catch (...) {
            error = messageOf(std::current_exception(), shown);
        }
        QMetaObject::invokeMethod(
            this,
            [this, generation, model, info, error] {
                if (generation != m_generation) return;
                end();
                if (!model) {
                    emit failed(error);
                    return;
                }
                m_model = model;
                m_info = info;
                ++m_tokenizeGeneration;  // pieces from the previous model are stale
                emit modelOpened(info);
            },
            Qt::QueuedConnection);
    });
}

void ModelSession::tokenize(const QString& text)
{
    if (!m_model) return;
    const quint64 generation = ++m_tokenizeGeneration;
    const std::shared_ptr<const Model> model = m_model;
    m_tokenizePool.start([this, generation, model, text] {
        if (generation != m_tokenizeGeneration) return;  // a newer request is queued behind this one
        TokenPieces out;
        out.text = text;
        QString error;
        try {
            const std::vector<int32_t> ids = model->contextTokens(text.toStdString());
            out.ids.assign(ids.begin(), ids.end());
            out.pieces.reserve(qsizetype(ids.size()));
            for (int32_t id : ids)
                out.pieces.append(QString::fromStdString(model->tokenizer().decode({id}, false)));
        } catch (...) {
            error = messageOf(std::current_exception(), tr("context"));
        }
        QMetaObject::invokeMethod(
            this,
            [this, generation, out, error] {
                if (generation != m_tokenizeGeneration) return;
                if (!error.isEmpty())
                    emit tokenizeFailed(error);
                else
                    emit tokenized(out);
            },
            Qt::QueuedConnection);
    });
}

void ModelSession::capture(const QString& text)
{
    if (!m_model) {
        emit failed(tr("Capture: open a model first."));
        return;
    }
    begin();
    const quint64 generation = m_generation;
    const std::shared_ptr<const Model> model = m_model;
    const std::shared_ptr<std::atomic<bool>> stop = m_stop;
    emit phaseChanged(tr("Tokenizing the context…"), 0);

    m_jobPool.start([this, generation, model, stop, text] {
        std::shared_ptr<const KvSet> kv;
        QString error;
        QElapsedTimer clock;
        clock.start();
        try {
            const std::string utf8 = text.toStdString();
            const std::vector<int32_t> tokens = model->contextTokens(utf8);
            const int total = int(tokens.size());
            QMetaObject::invokeMethod(
                this,
                [this, generation, total] {
                    if (generation == m_generation)
                        emit phaseChanged(tr("Capturing the KV of %1 tokens…").arg(total), total);
                },
                Qt::QueuedConnection);
            InferenceSession session(model->runtime());
            session.append(tokens, nullptr, nullptr, [this, generation, stop](int done, int) {
                QMetaObject::invokeMethod(
                    this,
                    [this, generation, done] {
                        if (generation == m_generation) emit progressChanged(done);
                    },
                    Qt::QueuedConnection);
                return !*stop;
            });
            KvSet out = session.exportKv();
            out.context = utf8;
            kv = std::make_shared<const KvSet>(std::move(out));
        } catch (...) {
            error = messageOf(std::current_exception(), tr("capture"));
        }
        const double seconds = double(clock.nsecsElapsed()) * 1e-9;
        QMetaObject::invokeMethod(
            this,
            [this, generation, kv, error, seconds] {
                if (generation != m_generation) return;  // cancelled or superseded
                end();
                if (!kv)
                    emit failed(error);
                else
                    emit captured(kv, seconds);
            },
            Qt::QueuedConnection);
    });
}

void ModelSession::cancel()
{
    if (!m_busy) return;
    if (m_stop) *m_stop = true;
    ++m_generation;
    end();
    emit cancelled();
}

}  // namespace kvscope
