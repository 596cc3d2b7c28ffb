#include "distributions_worker.h"

#include "kv/kv_maps.h"

#include <QMetaObject>

#include <exception>

namespace kvscope {

DistributionsWorker::DistributionsWorker(QObject* parent) : QObject(parent)
{
    m_pool.setMaxThreadCount(1);
}

DistributionsWorker::~DistributionsWorker()
{
    ++m_selectionGeneration;
    ++m_entropyGeneration;
    m_pool.clear();
    m_pool.waitForDone();
}

void DistributionsWorker::setKv(std::shared_ptr<const KvSet> kv)
{
    ++m_selectionGeneration;
    ++m_entropyGeneration;
    m_kv = std::move(kv);
}

// Runs job(kv) -> std::function<void()> on the pool; the returned closure is delivered on the UI
// thread unless *generation moved on meanwhile (checked before and after the work).
template <typename Job>
void DistributionsWorker::post(std::atomic<quint64>* generation, Job job)
{
    if (!m_kv) return;
    const quint64 mine = ++*generation;
    const std::shared_ptr<const KvSet> kv = m_kv;
    ++m_pending;
    m_pool.start([this, generation, mine, kv, job] {
        std::function<void()> deliver;
        QString error;
        if (*generation == mine) {
            try {
                deliver = job(*kv);
            } catch (const std::exception& e) {
                error = QString::fromStdString(e.what());
            }
        }
        QMetaObject::invokeMethod(
            this,
            [this, generation, mine, deliver, error] {
                --m_pending;
                if (*generation != mine) return;
                if (!error.isEmpty())
                    emit failed(error);
                else if (deliver)
                    deliver();
            },
            Qt::QueuedConnection);
    });
}

void DistributionsWorker::requestSelection(int layer, KvKind kind, int channel)
{
    post(&m_selectionGeneration, [this, layer, kind, channel](const KvSet& kv) -> std::function<void()> {
        HistogramData h;
        h.kind = kind;
        h.layer = layer;
        h.channel = channel;
        h.histogram = computeHistogram(kv, kind, layer, channel, kHistogramBins);
        const TokenChannelValues v = tokenChannelValues(kv, kind, layer, kMaxMapTokens);
        TokenMapData t;
        t.kind = kind;
        t.layer = layer;
        t.tokens = v.tokens;
        t.stride = v.stride;
        t.channels = v.channels;
        t.values = v.values;
        return [this, h, t] {
            emit histogramReady(h);
            emit tokenMapReady(t);
        };
    });
}

void DistributionsWorker::requestEntropy(int bins)
{
    post(&m_entropyGeneration, [this, bins](const KvSet& kv) -> std::function<void()> {
        EntropyMap maps[2];
        const KvShape& sh = kv.shape();
        for (KvKind kind : {KvKind::Key, KvKind::Value}) {
            EntropyMap& m = maps[int(kind)];
            m.kind = kind;
            m.bins = bins;
            m.layers = sh.numLayers;
            m.channels = sh.channels();
            m.bits.reserve(size_t(sh.numLayers) * size_t(sh.channels()));
            for (int l = 0; l < sh.numLayers; ++l) {
                const std::vector<double> e = channelEntropies(kv, kind, l, bins);
                m.bits.insert(m.bits.end(), e.begin(), e.end());
            }
        }
        return [this, k = maps[0], v = maps[1]] {
            emit entropyReady(k);
            emit entropyReady(v);
        };
    });
}

}  // namespace kvscope
