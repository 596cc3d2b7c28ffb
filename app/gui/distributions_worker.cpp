#include "distributions_worker.h"

#include "background_job.h"

#include "kv/kv_maps.h"


namespace kvscope {

DistributionsWorker::DistributionsWorker(QObject* parent)
    : QObject(parent), m_selection(new JobLane(tr("distributions"), this)), m_entropy(new JobLane(tr("entropy map"), this))
{
    for (JobLane* lane : {m_selection, m_entropy}) connect(lane, &JobLane::failed, this, &DistributionsWorker::failed);
}

DistributionsWorker::~DistributionsWorker()
{
    delete m_selection;
    delete m_entropy;
}

bool DistributionsWorker::isBusy() const
{
    return m_selection->isBusy() || m_entropy->isBusy();
}

void DistributionsWorker::setKv(std::shared_ptr<const KvSet> kv)
{
    m_selection->cancel(true);
    m_entropy->cancel(true);
    m_kv = std::move(kv);
}

void DistributionsWorker::requestSelection(int layer, KvKind kind, int channel)
{
    if (!m_kv) return;
    m_selection->start(QString(), [this, kv = m_kv, layer, kind, channel](JobControl&) -> std::function<void()> {
        HistogramData h;
        h.kind = kind;
        h.layer = layer;
        h.channel = channel;
        h.histogram = computeHistogram(*kv, kind, layer, channel, kHistogramBins);
        const TokenChannelValues v = tokenChannelValues(*kv, kind, layer, kMaxMapTokens);
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
    if (!m_kv) return;
    m_entropy->start(QString(), [this, kv = m_kv, bins](JobControl& control) -> std::function<void()> {
        EntropyMap maps[2];
        const KvShape& sh = kv->shape();
        for (KvKind kind : {KvKind::Key, KvKind::Value}) {
            EntropyMap& m = maps[int(kind)];
            m.kind = kind;
            m.bins = bins;
            m.layers = sh.numLayers;
            m.channels = sh.channels();
            m.bits.reserve(size_t(sh.numLayers) * size_t(sh.channels()));
            for (int l = 0; l < sh.numLayers; ++l) {
                if (control.stopped()) return {};
                const std::vector<double> e = channelEntropies(*kv, kind, l, bins);
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
