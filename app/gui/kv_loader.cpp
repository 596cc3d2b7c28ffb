#include "kv_loader.h"

#include "background_job.h"
#include "kvio/kv_h5.h"

#include <QFile>
#include <QFileInfo>
#include <QFutureWatcher>
#include <QUnhandledException>
#include <QtConcurrent/QtConcurrentMap>
#include <QtConcurrent/QtConcurrentRun>

#include <exception>
#include <new>

namespace kvscope {

struct KvLoader::ReadOutcome {
    std::shared_ptr<const KvSet> kv;
    QString error;
    double seconds = 0;
};

namespace {

struct StatsJob {
    KvKind kind;
    int layer;
};

}  // namespace

KvLoader::KvLoader(QObject* parent) : QObject(parent)
{
    m_readPool.setMaxThreadCount(1);
}

KvLoader::~KvLoader()
{
    // Stop scheduling statistics nobody will see; m_readPool's destructor then waits for a read in
    // flight, which cannot be interrupted.
    if (m_cancelStats) m_cancelStats();
}

void KvLoader::loadFile(const QString& path)
{
    const QFileInfo info(path);
    KvSummary base;
    base.source = info.absoluteFilePath();
    base.origin = base.source;
    base.fileBytes = info.exists() ? info.size() : -1;
    const std::string nativePath = QFile::encodeName(base.source).toStdString();
    start(
        tr("Reading %1…").arg(info.fileName()), [nativePath] { return readKvH5(nativePath); }, base);
}

void KvLoader::loadSynthetic(const SyntheticSpec& spec)
{
    KvSummary base;
    base.synthetic = true;
    base.origin = tr("synthetic (makeSyntheticKv, seed %1)").arg(spec.seed);
    start(
        tr("Generating a synthetic KV cache…"), [spec] { return makeSyntheticKv(spec); }, base);
}

void KvLoader::loadKv(std::shared_ptr<const KvSet> kv, const QString& origin, double captureSeconds)
{
    if (m_cancelStats) m_cancelStats();
    m_cancelStats = nullptr;
    const quint64 generation = ++m_generation;
    m_running = true;
    KvSummary base;
    base.origin = origin;
    base.shape = kv->shape();
    base.dtype = kv->dtype();
    base.modelName = QString::fromStdString(kv->modelName);
    base.modelFingerprint = QString::fromStdString(kv->modelFingerprint);
    base.kvBytes = quint64(2) * quint64(kv->shape().numLayers) * quint64(kv->tensorBytes());
    base.readSeconds = captureSeconds;
    startStats(generation, std::move(kv), base);
}

void KvLoader::saveKv(const QString& path)
{
    const std::shared_ptr<const KvSet> kv = m_kv;
    if (!kv) {
        emit saveFailed(tr("%1: nothing to save; capture or open a KV cache first").arg(path));
        return;
    }
    const std::string nativePath = QFile::encodeName(path).toStdString();
    auto* watcher = new QFutureWatcher<QString>(this);
    auto clock = std::make_shared<QElapsedTimer>();
    clock->start();
    connect(watcher, &QFutureWatcherBase::finished, this, [this, watcher, path, clock] {
        watcher->deleteLater();
        const QString error = watcher->result();
        if (error.isEmpty())
            emit saved(path, double(clock->nsecsElapsed()) * 1e-9);
        else
            emit saveFailed(error);
    });
    watcher->setFuture(QtConcurrent::run(&m_readPool, [kv, nativePath, path] {
        try {
            writeKvH5(*kv, nativePath);
        } catch (...) {
            return jobErrorMessage(std::current_exception(), path);
        }
        return QString();
    }));
}

void KvLoader::start(const QString& phaseText, std::function<KvSet()> produce, KvSummary base)
{
    if (m_cancelStats) m_cancelStats();
    m_cancelStats = nullptr;
    const quint64 generation = ++m_generation;
    m_running = true;
    emit phaseChanged(phaseText, 0);

    const QString what = base.synthetic ? base.origin : base.source;
    auto* watcher = new QFutureWatcher<ReadOutcome>(this);
    connect(watcher, &QFutureWatcherBase::finished, this, [this, watcher, generation, base]() mutable {
        watcher->deleteLater();
        if (generation != m_generation) return;  // abandoned by cancel() or a newer load
        const ReadOutcome out = watcher->result();
        if (!out.kv) {
            finish();
            emit failed(out.error);
            return;
        }
        const KvSet& kv = *out.kv;
        base.shape = kv.shape();
        base.dtype = kv.dtype();
        base.modelName = QString::fromStdString(kv.modelName);
        base.modelFingerprint = QString::fromStdString(kv.modelFingerprint);
        base.kvBytes = quint64(2) * quint64(kv.shape().numLayers) * quint64(kv.tensorBytes());
        base.readSeconds = out.seconds;
        startStats(generation, out.kv, base);
    });
    watcher->setFuture(QtConcurrent::run(&m_readPool, [produce = std::move(produce), what] {
        ReadOutcome out;
        QElapsedTimer clock;
        clock.start();
        try {
            out.kv = std::make_shared<const KvSet>(produce());
        } catch (...) {
            out.error = jobErrorMessage(std::current_exception(), what);
        }
        out.seconds = double(clock.nsecsElapsed()) * 1e-9;
        return out;
    }));
}

void KvLoader::startStats(quint64 generation, std::shared_ptr<const KvSet> kv, KvSummary summary)
{
    std::vector<StatsJob> jobs;
    for (int layer = 0; layer < kv->shape().numLayers; ++layer) {
        jobs.push_back({KvKind::Key, layer});
        jobs.push_back({KvKind::Value, layer});
    }
    const int total = int(jobs.size());
    emit phaseChanged(tr("Computing statistics of %1 tensors…").arg(total), total);
    emit progressChanged(0);

    auto* watcher = new QFutureWatcher<TensorStats>(this);
    connect(watcher, &QFutureWatcherBase::progressValueChanged, this, [this, generation](int value) {
        if (generation == m_generation) emit progressChanged(value);
    });
    connect(watcher, &QFutureWatcherBase::finished, this, [this, watcher, generation, summary, kv]() mutable {
        watcher->deleteLater();
        if (generation != m_generation || watcher->isCanceled()) return;
        std::vector<TensorStats> stats;
        QString error;
        try {
            const QList<TensorStats> results = watcher->future().results();
            stats.assign(results.begin(), results.end());
        } catch (const QUnhandledException& e) {
            error = jobErrorMessage(e.exception(), summary.origin);
        } catch (...) {
            error = jobErrorMessage(std::current_exception(), summary.origin);
        }
        summary.statsSeconds = double(m_statsClock.nsecsElapsed()) * 1e-9;
        finish();
        if (!error.isEmpty())
            emit failed(error);
        else {
            m_kv = kv;
            emit loaded(summary, stats);
        }
    });

    // Same tensors in the same order as computeAllStats (per layer: keys, then values), but one
    // task per tensor so the UI can show progress and cancel between tensors.
    const StatsOptions options = m_options;
    m_statsClock.start();
    QFuture<TensorStats> future = QtConcurrent::mapped(std::move(jobs), [kv, options](const StatsJob& job) {
        return computeTensorStats(*kv, job.kind, job.layer, options);
    });
    watcher->setFuture(future);
    m_cancelStats = [future]() mutable { future.cancel(); };
}

void KvLoader::cancel()
{
    if (!m_running) return;
    ++m_generation;
    if (m_cancelStats) m_cancelStats();
    finish();
    emit cancelled();
}

void KvLoader::finish()
{
    m_running = false;
    m_cancelStats = nullptr;
}

}  // namespace kvscope
