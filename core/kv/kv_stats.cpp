#include "kv/kv_stats.h"

#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

namespace {

void checkOptions(const StatsOptions& opt)
{
    if (opt.deltaGroup < 1)
        throw Error("statistics: deltaGroup " + std::to_string(opt.deltaGroup) + " must be >= 1");
    if (opt.bins < 4 || opt.bins > 65536)
        throw Error("statistics: bins " + std::to_string(opt.bins) +
                    " is outside [4, 65536] (bins/2 - 1 must be at least 1)");
    if (!(opt.outlierFactor > 0.0f))
        throw Error("statistics: outlierFactor must be positive");
}

void checkLayer(const KvSet& kv, int layer)
{
    if (layer < 0 || layer >= kv.shape().numLayers)
        throw Error("statistics: layer " + std::to_string(layer) + " is outside [0, " +
                    std::to_string(kv.shape().numLayers) + ")");
}

// The whole tensor as floats: (heads, tokens, head_dim).
std::vector<float> loadTensor(const KvSet& kv, KvKind kind, int layer)
{
    const KvShape& sh = kv.shape();
    std::vector<float> x(sh.layerValues());
    const size_t perHead = size_t(sh.numTokens) * size_t(sh.headDim);
    for (int h = 0; h < sh.numKvHeads; ++h)
        kv.readRows(kind, layer, h, 0, sh.numTokens, x.data() + size_t(h) * perHead);
    return x;
}

// CacheGen's symmetric per-token quantizer: q = round(x / scale), scale = absmax / maxLevel, in
// [-maxLevel, maxLevel]. inv = 1 / scale, 0 for an all-zero token (all symbols 0). Ties round to
// even like torch.round and the codec's lrint.
inline int quantizeSymbol(float x, float inv, int maxLevel)
{
    // |x * inv| <= maxLevel (+ rounding), so the conversion cannot overflow; core builds with
    // -fno-math-errno, which makes lrint a single instruction.
    return std::clamp(int(std::lrint(x * inv)), -maxLevel, maxLevel);
}

inline float inverseScale(float absmax, int maxLevel)
{
    return absmax > 0.0f ? float(maxLevel) / absmax : 0.0f;
}

// Empirical entropy in bits of `n` symbols whose counts are in `counts`.
double entropyOf(const std::vector<uint32_t>& counts, const std::vector<int>& used, double n)
{
    double h = 0;
    for (int s : used) {
        const double p = double(counts[size_t(s)]) / n;
        h -= p * std::log2(p);
    }
    return h;
}

// Mean over channels of the per-channel entropy of q (channels, tokens), symbols offset by
// maxLevel into [0, 2 * maxLevel].
double meanChannelEntropy(const std::vector<int16_t>& q, int channels, int tokens, int maxLevel)
{
    std::vector<uint32_t> counts(static_cast<size_t>(2 * maxLevel + 1), 0);
    std::vector<int> used;
    used.reserve(counts.size());
    double sum = 0;
    for (int c = 0; c < channels; ++c) {
        const int16_t* qc = q.data() + size_t(c) * size_t(tokens);
        used.clear();
        for (int t = 0; t < tokens; ++t) {
            const int s = qc[t] + maxLevel;
            if (counts[size_t(s)]++ == 0) used.push_back(s);
        }
        sum += entropyOf(counts, used, double(tokens));
        for (int s : used) counts[size_t(s)] = 0;
    }
    return sum / double(channels);
}

// One tensor as loaded: (heads, tokens, head_dim) floats. Channel c = h * D + d.
struct TensorRows {
    std::vector<float> x;
    int H = 0, T = 0, D = 0, C = 0;

    // Row of head h at token t: head_dim contiguous values, channels h * D .. h * D + D - 1.
    const float* row(int h, int t) const { return x.data() + (size_t(h) * size_t(T) + size_t(t)) * size_t(D); }
};

// Per-channel sums of one tensor: extremes, mean and squared deviations of the values and of
// their deltas to the group anchor.
struct ChannelMoments {
    size_t numDeltas = 0;
    std::vector<float> mn, mx;
    std::vector<double> sum, mean, ssd, dssd;
};

// Per-channel moments in two passes (mean, then squared deviations) for accuracy on channels
// with a large offset, walking rows so the inner loops run over contiguous memory. Deltas are
// x[t] - x[group anchor], anchors excluded.
ChannelMoments channelMoments(const TensorRows& x, int g)
{
    const int H = x.H, T = x.T, D = x.D;
    const size_t nc = size_t(x.C);
    const size_t numDeltas = size_t(T) - (size_t(T) + size_t(g) - 1) / size_t(g);
    std::vector<float> mn(nc, std::numeric_limits<float>::infinity()), mx(nc, -mn[0]);
    std::vector<double> sum(nc, 0.0), dsum(nc, 0.0), ssd(nc, 0.0), dssd(nc, 0.0);
    for (int h = 0; h < H; ++h) {
        const size_t c0 = size_t(h) * size_t(D);
        for (int t = 0; t < T; ++t) {
            const float* r = x.row(h, t);
            const float* a = x.row(h, t - t % g);
            for (int d = 0; d < D; ++d) {
                mn[c0 + d] = std::min(mn[c0 + d], r[d]);
                mx[c0 + d] = std::max(mx[c0 + d], r[d]);
                sum[c0 + d] += r[d];
            }
            if (t % g != 0)
                for (int d = 0; d < D; ++d) dsum[c0 + d] += double(r[d]) - double(a[d]);
        }
    }
    std::vector<double> mean(nc), dmean(nc);
    for (size_t c = 0; c < nc; ++c) {
        mean[c] = sum[c] / T;
        dmean[c] = numDeltas ? dsum[c] / double(numDeltas) : 0.0;
    }
    for (int h = 0; h < H; ++h) {
        const size_t c0 = size_t(h) * size_t(D);
        for (int t = 0; t < T; ++t) {
            const float* r = x.row(h, t);
            const float* a = x.row(h, t - t % g);
            for (int d = 0; d < D; ++d) {
                const double dv = double(r[d]) - mean[c0 + d];
                ssd[c0 + d] += dv * dv;
            }
            if (t % g != 0)
                for (int d = 0; d < D; ++d) {
                    const double dv = double(r[d]) - double(a[d]) - dmean[c0 + d];
                    dssd[c0 + d] += dv * dv;
                }
        }
    }
    return {numDeltas, std::move(mn), std::move(mx), std::move(sum), std::move(mean), std::move(ssd), std::move(dssd)};
}

// The channels' figures and the tensor-wide ones, which combine the channels exactly (between-
// plus within-channel spread).
void momentFigures(const ChannelMoments& m, int T, TensorStats& st)
{
    const size_t nc = st.channels.size();
    const int C = int(nc);
    const size_t numDeltas = m.numDeltas;
    const std::vector<float>&mn = m.mn, &mx = m.mx;
    const std::vector<double>&sum = m.sum, &mean = m.mean, &ssd = m.ssd, &dssd = m.dssd;
    const double n = double(C) * double(T);
    double sumAll = 0;
    float minAll = std::numeric_limits<float>::infinity(), maxAll = -minAll;
    for (size_t c = 0; c < nc; ++c) {
        sumAll += sum[c];
        minAll = std::min(minAll, mn[c]);
        maxAll = std::max(maxAll, mx[c]);
    }
    const double meanAll = sumAll / n;
    double ssdAll = 0, varRawSum = 0, varDeltaSum = 0;
    for (size_t c = 0; c < nc; ++c) {
        ChannelStats& cs = st.channels[c];
        cs.min = mn[c];
        cs.max = mx[c];
        cs.mean = float(mean[c]);
        cs.std = float(std::sqrt(ssd[c] / T));
        cs.absmax = std::max(std::fabs(mn[c]), std::fabs(mx[c]));
        const double dm = mean[c] - meanAll;
        ssdAll += ssd[c] + double(T) * dm * dm;
        varRawSum += ssd[c] / T;
        if (numDeltas) varDeltaSum += dssd[c] / double(numDeltas);
    }
    st.all.min = minAll;
    st.all.max = maxAll;
    st.all.mean = float(meanAll);
    st.all.std = float(std::sqrt(ssdAll / n));
    st.all.absmax = std::max(std::fabs(minAll), std::fabs(maxAll));
    st.varianceRaw = varRawSum / C;
    st.varianceDelta = varDeltaSum / C;
}

// Entropy of the per-token quantizer's symbols, raw and delta-coded. Scales are per token over
// every channel of the tensor, as CacheGen quantizes one (layer, token) at a time. Symbols are
// kept channel-major (channels, tokens) for the per-channel counts; they are produced token by
// token into a small token-major tile that is transposed when full, since storing each symbol
// straight into its channel's row would miss the cache on every store.
void symbolEntropies(const TensorRows& x, int bins, int g, TensorStats& st)
{
    const int H = x.H, T = x.T, D = x.D, C = x.C;
    const size_t nc = size_t(C);
    const int maxLevel = bins / 2 - 1;  // <= 32767, fits int16
    std::vector<int16_t> qRaw(x.x.size()), qDelta(x.x.size());
    const int tile = 64;
    // (tile, stride): rows padded by one cache line so a power-of-two channel count does not
    // map the transpose's column reads onto a couple of L1 sets
    const size_t stride = nc + 32;
    std::vector<int16_t> tileRaw(size_t(tile) * stride), tileDelta(size_t(tile) * stride);
    std::vector<float> anchorRecon(nc);  // reconstructed anchor of the current group
    for (int t = 0; t < T; ++t) {
        const int j = t % tile;
        int16_t* sr = tileRaw.data() + size_t(j) * stride;
        int16_t* sd = tileDelta.data() + size_t(j) * stride;
        float absmax = 0;
        for (int h = 0; h < H; ++h) {
            const float* r = x.row(h, t);
            for (int d = 0; d < D; ++d) absmax = std::max(absmax, std::fabs(r[d]));
        }
        const float inv = inverseScale(absmax, maxLevel);
        const float scale = absmax / float(maxLevel);
        const bool anchor = t % g == 0;
        for (int h = 0; h < H; ++h) {
            const float* r = x.row(h, t);
            const size_t c0 = size_t(h) * size_t(D);
            for (int d = 0; d < D; ++d) sr[c0 + d] = int16_t(quantizeSymbol(r[d], inv, maxLevel));
        }
        if (anchor) {
            for (size_t c = 0; c < nc; ++c) {
                sd[c] = sr[c];
                anchorRecon[c] = float(sr[c]) * scale;
            }
        } else {
            float dAbsmax = 0;
            for (int h = 0; h < H; ++h) {
                const float* r = x.row(h, t);
                const size_t c0 = size_t(h) * size_t(D);
                for (int d = 0; d < D; ++d)
                    dAbsmax = std::max(dAbsmax, std::fabs(r[d] - anchorRecon[c0 + d]));
            }
            const float dInv = inverseScale(dAbsmax, maxLevel);
            for (int h = 0; h < H; ++h) {
                const float* r = x.row(h, t);
                const size_t c0 = size_t(h) * size_t(D);
                for (int d = 0; d < D; ++d)
                    sd[c0 + d] =
                        int16_t(quantizeSymbol(r[d] - anchorRecon[c0 + d], dInv, maxLevel));
            }
        }
        if (j == tile - 1 || t == T - 1) {
            const size_t t0 = size_t(t - j), n = size_t(j) + 1;
            for (size_t c = 0; c < nc; ++c) {
                int16_t* dr = qRaw.data() + c * size_t(T) + t0;
                int16_t* dd = qDelta.data() + c * size_t(T) + t0;
                for (size_t k = 0; k < n; ++k) {
                    dr[k] = tileRaw[k * stride + c];
                    dd[k] = tileDelta[k * stride + c];
                }
            }
        }
    }
    st.entropyBits = meanChannelEntropy(qRaw, C, T, maxLevel);
    st.entropyBitsDelta = meanChannelEntropy(qDelta, C, T, maxLevel);
}

// Outliers against the median channel absmax (mean of the two middle values for an even count).
void findOutliers(float outlierFactor, TensorStats& st)
{
    const int C = int(st.channels.size());
    const size_t nc = size_t(C);
    std::vector<float> absmax(nc);
    for (size_t c = 0; c < nc; ++c) absmax[c] = st.channels[c].absmax;
    const double median = medianChannelAbsmax(st);
    const double threshold = double(outlierFactor) * median;
    for (int c = 0; c < C; ++c)
        if (absmax[size_t(c)] > threshold) st.outlierChannels.push_back(c);
    std::stable_sort(st.outlierChannels.begin(), st.outlierChannels.end(),
                     [&](int a, int b) { return absmax[size_t(a)] > absmax[size_t(b)]; });
}

// The statistics of one tensor in four steps: load, moments, symbol entropies, outliers.
TensorStats computeUnchecked(const KvSet& kv, KvKind kind, int layer, const StatsOptions& opt)
{
    const KvShape& sh = kv.shape();
    TensorRows x;
    x.H = sh.numKvHeads;
    x.T = sh.numTokens;
    x.D = sh.headDim;
    x.C = sh.channels();
    x.x = loadTensor(kv, kind, layer);

    TensorStats st;
    st.kind = kind;
    st.layer = layer;
    st.channels.resize(size_t(x.C));
    momentFigures(channelMoments(x, opt.deltaGroup), x.T, st);
    symbolEntropies(x, opt.bins, opt.deltaGroup, st);
    findOutliers(opt.outlierFactor, st);
    return st;
}

}  // namespace

TensorStats computeTensorStats(const KvSet& kv, KvKind kind, int layer, const StatsOptions& opt)
{
    checkOptions(opt);
    checkLayer(kv, layer);
    return computeUnchecked(kv, kind, layer, opt);
}

std::vector<TensorStats> computeAllStats(const KvSet& kv, const StatsOptions& opt)
{
    checkOptions(opt);
    const int layers = kv.shape().numLayers;
    std::vector<TensorStats> out(2 * size_t(std::max(layers, 0)));
    std::exception_ptr failure;  // an exception must not leave an OpenMP region
#pragma omp parallel for schedule(dynamic, 1)
    for (int l = 0; l < layers; ++l) {
        try {
            out[2 * size_t(l)] = computeUnchecked(kv, KvKind::Key, l, opt);
            out[2 * size_t(l) + 1] = computeUnchecked(kv, KvKind::Value, l, opt);
        } catch (...) {
#pragma omp critical(kvscope_stats_failure)
            if (!failure) failure = std::current_exception();
        }
    }
    if (failure) std::rethrow_exception(failure);
    return out;
}

Histogram computeHistogram(const KvSet& kv, KvKind kind, int layer, int channel, int numBins,
                           double lo, double hi)
{
    checkLayer(kv, layer);
    const KvShape& sh = kv.shape();
    if (channel < -1 || channel >= sh.channels())
        throw Error("histogram: channel " + std::to_string(channel) + " is outside [0, " +
                    std::to_string(sh.channels()) + ") (-1 for the whole tensor)");
    if (numBins < 1 || numBins > (1 << 24))
        throw Error("histogram: numBins " + std::to_string(numBins) + " is outside [1, 2^24]");
    if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi)
        throw Error("histogram: range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "] is not a finite interval");

    // The values to count: the whole tensor, or one channel's column gathered along tokens.
    std::vector<float> x = loadTensor(kv, kind, layer);
    if (channel >= 0) {
        const int h = channel / sh.headDim, d = channel % sh.headDim;
        std::vector<float> col(static_cast<size_t>(sh.numTokens));
        for (int t = 0; t < sh.numTokens; ++t)
            col[size_t(t)] = x[(size_t(h) * size_t(sh.numTokens) + size_t(t)) * size_t(sh.headDim) +
                               size_t(d)];
        x.swap(col);
    }

    Histogram hist;
    if (lo == hi) {
        double mn = std::numeric_limits<double>::infinity(), mx = -mn;
        for (float v : x)
            if (std::isfinite(v)) {
                mn = std::min(mn, double(v));
                mx = std::max(mx, double(v));
            }
        if (!(mn <= mx)) mn = mx = 0;  // no finite value at all
        // a constant tensor still needs a range of non-zero width
        if (mn == mx) {
            mn -= 0.5;
            mx += 0.5;
        }
        lo = mn;
        hi = mx;
    }
    hist.lo = lo;
    hist.hi = hi;
    hist.counts.assign(size_t(numBins), 0);
    const double perUnit = double(numBins) / (hi - lo);
    for (float v : x) {
        if (std::isnan(v)) continue;
        if (v < lo) {
            ++hist.below;
        } else if (v > hi) {
            ++hist.above;
        } else {
            const size_t b = std::min(size_t((double(v) - lo) * perUnit), size_t(numBins) - 1);
            ++hist.counts[b];
        }
    }
    return hist;
}

double medianChannelAbsmax(const TensorStats& t)
{
    const size_t n = t.channels.size();
    if (n == 0) return 0.0;
    std::vector<float> sorted(n);
    for (size_t c = 0; c < n; ++c) sorted[c] = t.channels[c].absmax;
    std::sort(sorted.begin(), sorted.end());
    return n % 2 ? double(sorted[n / 2]) : 0.5 * (double(sorted[n / 2 - 1]) + double(sorted[n / 2]));
}

namespace {

double ratioOf(double raw, double delta)
{
    if (delta > 0) return raw / delta;
    return raw > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

}  // namespace

double localityRatio(const TensorStats& t)
{
    return ratioOf(t.varianceRaw, t.varianceDelta);
}

double localityRatio(const std::vector<TensorStats>& stats)
{
    double raw = 0, delta = 0;
    for (const TensorStats& t : stats) {
        raw += t.varianceRaw;
        delta += t.varianceDelta;
    }
    return ratioOf(raw, delta);
}

double localityRatio(const std::vector<TensorStats>& stats, KvKind kind)
{
    double raw = 0, delta = 0;
    for (const TensorStats& t : stats) {
        if (t.kind != kind) continue;
        raw += t.varianceRaw;
        delta += t.varianceDelta;
    }
    return ratioOf(raw, delta);
}

}  // namespace kvscope
