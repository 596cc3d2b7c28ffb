// The entropy stage of the CacheGen codec: one rANS stream per (kind, layer, head), symbols in
// token-major order, with per-channel (and per-role) coding tables. Two stream layouts: v1 (4
// states, byte renormalisation) and v2 (32 states, 16-bit words; its SIMD row kernels are in
// entropy_simd.cpp, the scalar reference is here). Decoding is fused with dequantization (and
// the anchor/delta reconstruction). The stream formats are in FORMAT.md ("Entropy coding").
#include "codec/codec_detail.h"

#include "codec/rans.h"
#include "codec/simd_path.h"
#include "common/half.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kvscope::detail {

// Symbol counts of a block into flat[(role * C + c) * stride + symbol] (perHead: into
// flat[(role * heads + h) * stride + symbol]), added to what is there; stride is at least the
// larger alphabet of the two roles.
void countBlock(const quant::BlockSpec& b, const uint8_t* sym, int roles, bool perHead, uint32_t* flat, size_t stride)
{
    const int D = b.headDim, C = b.channels();
    if (perHead) {
        if (const CountFn count = countKernel(simdPath(), int(stride))) {
            for (int h = 0; h < b.heads; ++h)
                count(sym + size_t(h) * b.tokens * D, b.tokens, D, b.deltaGroup, roles, int(stride), size_t(b.heads) * stride,
                      flat + size_t(h) * stride);
            return;
        }
        // Eight sub-histograms per role, so that runs of one symbol do not wait on each other's
        // increments of a single counter; added to flat per head.
        constexpr int kSub = 8;
        thread_local std::vector<uint32_t> sub;
        for (int h = 0; h < b.heads; ++h) {
            sub.assign(size_t(2) * kSub * stride, 0);
            for (int t = 0; t < b.tokens; ++t) {
                const int role = (roles == 2 && b.isAnchor(t)) ? 1 : 0;
                const uint8_t* row = sym + (size_t(h) * b.tokens + t) * D;
                uint32_t* r = sub.data() + size_t(role) * kSub * stride;
                int d = 0;
                for (; d + kSub <= D; d += kSub)
                    for (int k = 0; k < kSub; ++k) r[size_t(k) * stride + row[d + k]]++;
                for (; d < D; ++d) r[row[d]]++;
            }
            for (int role = 0; role < roles; ++role) {
                uint32_t* base = flat + (size_t(role) * b.heads + size_t(h)) * stride;
                const uint32_t* r = sub.data() + size_t(role) * kSub * stride;
                for (size_t s = 0; s < stride; ++s)
                    for (int k = 0; k < kSub; ++k) base[s] += r[size_t(k) * stride + s];
            }
        }
        return;
    }
    for (int h = 0; h < b.heads; ++h)
        for (int t = 0; t < b.tokens; ++t) {
            const int role = (roles == 2 && b.isAnchor(t)) ? 1 : 0;
            const uint8_t* row = sym + (size_t(h) * b.tokens + t) * D;
            uint32_t* base = flat + (size_t(role) * C + size_t(h) * D) * stride;
            for (int d = 0; d < D; ++d) base[size_t(d) * stride + row[d]]++;
        }
}

size_t countUnit(const QuantizedBlock& q, int roles, bool perHead, std::vector<uint32_t>& flat)
{
    const size_t stride = size_t(quant::alphabetSize(std::max(q.spec.bins, q.spec.anchorBins)));
    flat.assign(size_t(roles) * size_t(perHead ? q.spec.heads : q.spec.channels()) * stride, 0);
    countBlock(q.spec, q.sym.data(), roles, perHead, flat.data(), stride);
    return stride;
}

// One stream per head: symbols (t, d) in token-major order, symbol i coded by state i % 4.
// Bytes are written backwards into a buffer sized for the worst case (2 bytes per symbol).
void encodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* sym, const UnitTables& tab,
                      std::vector<uint8_t>& out)
{
    const int D = b.headDim;
    KVSCOPE_ASSERT(tab.channelsPerTable == 1);  // v1 files have per-channel tables only
    const size_t n = size_t(b.tokens) * D;
    const uint8_t* s = sym + size_t(h) * n;
    const rans::FreqDivider& div = rans::freqDivider();
    std::vector<uint8_t> buf(2 * n + 2 + 4 * rans::kRansWays);
    uint8_t* const bufEnd = buf.data() + buf.size();
    uint8_t* ptr = bufEnd;
    auto put = [&ptr, &div](uint32_t& x, const CodingTable& ct, int sy) { encPutFast(x, ptr, ct, sy, div); };
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) rans::encInit(&v);
    for (int t = b.tokens - 1; t >= 0; --t) {  // reverse order: see rans.h
        const CodingTable* row = &tab.at(b.isAnchor(t) ? 1 : 0, h * D);
        const uint8_t* st = s + size_t(t) * D;
        if (D % 4 == 0) {
            uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
            for (int d = D - 4; d >= 0; d -= 4) {  // symbol t*D+d+k uses state k
                put(x3, row[d + 3], st[d + 3]);
                put(x2, row[d + 2], st[d + 2]);
                put(x1, row[d + 1], st[d + 1]);
                put(x0, row[d], st[d]);
            }
            x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3;
        } else {
            for (int d = D - 1; d >= 0; --d) put(x[(size_t(t) * D + size_t(d)) % rans::kRansWays], row[d], st[d]);
        }
    }
    for (int k = rans::kRansWays - 1; k >= 0; --k)  // state 0 last, so the decoder reads it first
        for (int byte = 0; byte < 4; ++byte) *--ptr = uint8_t(x[k] >> (8 * (3 - byte)));
    KVSCOPE_ASSERT(ptr >= buf.data() + 2);
    out.insert(out.end(), ptr, bufEnd);
}

// o = (q - m) * scale + base over one row, with one scale per channel (perChannel) or one for all.
void dequantizeRow(const int* __restrict q, int m, const float* __restrict perChannel, float scale,
                   const float* __restrict base, float* __restrict o, int D)
{
    if (perChannel)
        for (int d = 0; d < D; ++d) o[d] = float(q[d] - m) * perChannel[d] + base[d];
    else
        for (int d = 0; d < D; ++d) o[d] = float(q[d] - m) * scale + base[d];
}

// Decodes one head's stream and dequantizes it in the same pass into out (tokens, head_dim):
// the fast path; quant::dequantizeBlock is the reference it must match.
void decodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* data, size_t size, const UnitTables& tab,
                      const uint16_t* scales, float* out, const std::string& where)
{
    const int D = b.headDim, C = b.channels();
    const int maxL = quant::maxLevel(b.bins), maxA = quant::maxLevel(b.anchorBins);
    static_assert(rans::kRansWays == 4, "the unrolled loops below assume 4 ways");
    if (tab.channelsPerTable != 1) throw Error(where + ": version-1 streams need per-channel tables");
    rans::RansReader r{data, data + size, false};
    uint32_t x0 = rans::decInit(r), x1 = rans::decInit(r), x2 = rans::decInit(r), x3 = rans::decInit(r);
    std::vector<float> scale(static_cast<size_t>(D)), zero(static_cast<size_t>(D), 0.0f);
    std::vector<int> q(static_cast<size_t>(D));  // the row's symbols
    const bool perChannel = b.quantizer == Quantizer::PerChannel;
    for (int t = 0; t < b.tokens; ++t) {
        const bool anchor = b.isAnchor(t);
        const CodingTable* row = &tab.at(anchor ? 1 : 0, h * D);
        const int m = anchor ? maxA : maxL;
        if (perChannel) halfToFloatN(scales + (anchor ? C : 0) + h * D, scale.data(), size_t(D));
        const float* base = (b.deltaGroup >= 2 && !anchor) ? out + size_t(t - t % b.deltaGroup) * D : zero.data();
        float* o = out + size_t(t) * D;
        // A symbol renormalises with at most 2 bytes (its state stays >= 2^11 after the update), so
        // with 2 D bytes left a whole row decodes without bounds checks.
        if (D % 4 == 0 && size_t(r.end - r.p) >= 2 * size_t(D) + 2) {
            const uint8_t* p = r.p;
            // Renormalisation without a loop or a branch: the state after an update is >= 2^11, so
            // it takes k = (x < 2^23) + (x < 2^15) bytes, known before any byte is read. That keeps
            // the four states independent: the shared read pointer only adds each k. Reads may
            // look 2 bytes ahead of what they take, hence the "+ 2" above.
            auto advance = [&p](uint32_t& x, const CodingTable& ct, int sy) {
                rans::decAdvanceAhead(&x, &p, ct.start(sy), ct.freq(sy));
            };
            // Symbol i = t * D + d uses state d % 4: four independent chains, kept in registers.
            for (int d = 0; d < D; d += 4) {
                const int s0 = row[d].symbolOf(rans::decSlot(x0));
                const int s1 = row[d + 1].symbolOf(rans::decSlot(x1));
                const int s2 = row[d + 2].symbolOf(rans::decSlot(x2));
                const int s3 = row[d + 3].symbolOf(rans::decSlot(x3));
                advance(x0, row[d], s0);
                advance(x1, row[d + 1], s1);
                advance(x2, row[d + 2], s2);
                advance(x3, row[d + 3], s3);
                q[size_t(d)] = s0;
                q[size_t(d) + 1] = s1;
                q[size_t(d) + 2] = s2;
                q[size_t(d) + 3] = s3;
            }
            r.p = p;
        } else {
            for (int d = 0; d < D; ++d) {
                const size_t i = size_t(t) * D + size_t(d);
                uint32_t& st = i % 4 == 0 ? x0 : i % 4 == 1 ? x1 : i % 4 == 2 ? x2 : x3;
                const CodingTable& ct = row[d];
                const int sy = ct.symbolOf(rans::decSlot(st));
                rans::decAdvance(&st, r, ct.start(sy), ct.freq(sy));
                q[size_t(d)] = sy;
            }
        }
        dequantizeRow(q.data(), m, perChannel ? scale.data() : nullptr, halfToFloat(scales[perChannel ? 0 : t]), base, o, D);
    }
    const uint32_t x[rans::kRansWays] = {x0, x1, x2, x3};
    // A correct stream ends exactly at its last byte with every state back at its initial value.
    bool statesOk = true;
    for (uint32_t v : x) statesOk = statesOk && v == rans::kRansL;
    if (r.overrun || r.p != r.end || !statesOk)
        throw Error(where + ": head " + std::to_string(h) + ": entropy-coded stream is corrupt");
}


// ---------------------------------------------------------------------------------------------
// v2: 32 states, 16-bit renormalisation (rans.h w32)

namespace {

// Exact x / d for every 32-bit x and d in [1, kProbScale] without a divide instruction:
// q = (x * magic) >> shift with magic = ceil(2^(32 + l) / d), l = ceil(log2 d) (Granlund-Montgomery).
struct FreqDivider32 {
    uint64_t magic[rans::kProbScale + 1];
    uint8_t shift[rans::kProbScale + 1];

    FreqDivider32()
    {
        magic[0] = 0;
        shift[0] = 0;
        for (uint32_t d = 1; d <= rans::kProbScale; ++d) {
            uint32_t l = 0;
            while ((1u << l) < d) ++l;
            shift[d] = uint8_t(32 + l);
            magic[d] = uint64_t(((unsigned __int128)1 << (32 + l)) + d - 1) / d;
        }
    }
    uint32_t div(uint32_t x, uint32_t d) const { return uint32_t((unsigned __int128)x * magic[d] >> shift[d]); }
};

const FreqDivider32& freqDivider32()
{
    static const FreqDivider32 table;
    return table;
}

}  // namespace

void finishStreamV2(const uint32_t* x, uint16_t* w, const std::vector<uint16_t>& buf, uint16_t* wordsEnd,
                    std::vector<uint8_t>& out)
{
    for (int k = rans::w32::kLanes - 1; k >= 0; --k) {  // state 0 last, so the decoder reads it first
        *--w = uint16_t(x[k] >> 16);
        *--w = uint16_t(x[k]);
    }
    KVSCOPE_ASSERT(w >= buf.data());
    const size_t words = size_t(wordsEnd - w), at = out.size();
    out.resize(at + 2 * words);
    uint8_t* o = out.data() + at;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    std::memcpy(o, w, 2 * words);
#else
    for (size_t j = 0; j < words; ++j) {  // little-endian words on any host
        o[2 * j] = uint8_t(w[j]);
        o[2 * j + 1] = uint8_t(w[j] >> 8);
    }
#endif
}

// Symbols from last to first, state i % 32, words pushed towards the front of a buffer sized for
// the worst case (one word per symbol) plus the flushed states.
void encodeHeadStreamV2(const quant::BlockSpec& b, int h, const uint8_t* sym, const UnitTables& tab,
                        std::vector<uint8_t>& out)
{
    constexpr int W = rans::w32::kLanes;
    const int D = b.headDim;
    const size_t n = size_t(b.tokens) * D;
    const uint8_t* s = sym + size_t(h) * n;
    const FreqDivider32& div = freqDivider32();
    thread_local std::vector<uint16_t> buf;
    buf.resize(n + 2 * W + 1);
    uint16_t* const wordsEnd = buf.data() + buf.size();
    uint16_t* w = wordsEnd;
    alignas(64) uint32_t x[W];
    for (uint32_t& v : x) v = rans::w32::kL;
    const bool delta = b.deltaGroup >= 2;
    // One table per row of at most 32 symbols (per-head tables at <= 32 bins): sf and 1 / freq
    // looked up by permutes, without a gather or a division (W32EncJob::small).
    const bool small = tab.channelsPerTable == D && quant::alphabetSize(std::max(b.bins, b.anchorBins)) <= 32;
    if (const W32EncFn fast = w32EncodeKernel(simdPath(), D, small)) {
        thread_local std::vector<int32_t> tableWord;
        tableWord.resize(2 * size_t(D));
        for (int role = 0; role < (delta ? 2 : 1); ++role)
            for (int d = 0; d < D; ++d)
                tableWord[size_t(role) * D + d] = int32_t(tab.index(role, h * D + d) * (sizeof(CodingTable) / 4));
        alignas(64) uint32_t smallTables[2][64] = {};
        if (small)
            for (int role = 0; role < (delta ? 2 : 1); ++role) {
                const CodingTable& ct = tab.at(role, h * D);
                const int a = quant::alphabetSize(role ? b.anchorBins : b.bins);
                for (int sy = 0; sy < a; ++sy) {
                    smallTables[role][sy] = ct.sf[sy];
                    const float rcp = 1.0f / float(ct.freq(sy));
                    std::memcpy(&smallTables[role][32 + sy], &rcp, 4);
                }
            }
        W32EncJob job{reinterpret_cast<const uint32_t*>(tab.tables.data()), tableWord.data(), s, b.tokens, D, b.deltaGroup};
        job.small = small ? &smallTables[0][0] : nullptr;
        fast(job, x, w);
        return finishStreamV2(x, w, buf, wordsEnd, out);
    }
    // Emits the word renormalisation needs without a branch: it is stored below w and w moves
    // by 0 or 1 (a word stored but not taken is overwritten by the next one).
    auto put = [&w, &div](uint32_t& st, uint32_t sf) {
        const uint32_t freq = sf >> 16;
        const uint32_t k = uint32_t(uint64_t(st) >= (uint64_t(freq) << 20));
        w[-1] = uint16_t(st);
        w -= k;
        st >>= 16 * k;
        const uint32_t q = div.div(st, freq);
        st = (q << rans::kProbBits) + (st - q * freq) + (sf & 0xffffu);
    };
    size_t i = n;
    for (int t = b.tokens - 1; t >= 0; --t) {  // reverse order: see rans.h
        const int role = b.isAnchor(t) ? 1 : 0;
        const uint8_t* st = s + size_t(t) * D;
        if (D % W == 0) {
            for (int d = D - 1; d >= 0; --d) put(x[d & (W - 1)], tab.at(role, h * D + d).sf[st[d]]);
            i -= size_t(D);
        } else {
            for (int d = D - 1; d >= 0; --d) put(x[--i % W], tab.at(role, h * D + d).sf[st[d]]);
        }
    }
    finishStreamV2(x, w, buf, wordsEnd, out);
}

namespace {

inline uint32_t readWordChecked(W32Stream& s)
{
    if (s.end - s.p < 2) {
        s.overrun = true;
        s.p = s.end;
        return 0;
    }
    const uint32_t v = uint32_t(s.p[0]) | uint32_t(s.p[1]) << 8;
    s.p += 2;
    return v;
}

template <RowOut K>
inline void storeValue(uint8_t* out, int d, float v)
{
    if constexpr (K == RowOut::F32) std::memcpy(out + 4 * size_t(d), &v, 4);
    else {
        const uint16_t h = K == RowOut::F16 ? floatToHalf(v) : floatToBf16(v);
        out[2 * size_t(d)] = uint8_t(h);
        out[2 * size_t(d) + 1] = uint8_t(h >> 8);
    }
}

template <RowOut K>
void rowScalar(W32Stream& s, const W32Row& r)
{
    for (int d = 0; d < r.D; ++d) {
        uint32_t& x = s.x[(r.lane0 + d) & 31];
        const CodingTable& ct = *reinterpret_cast<const CodingTable*>(r.tables + r.tableWord[d]);
        const uint32_t slot = x & (rans::kProbScale - 1);
        const int sy = ct.symbolOf(slot);
        x = rans::w32::decStep(x, ct.start(sy), ct.freq(sy));
        if (x < rans::w32::kL) x = (x << 16) | readWordChecked(s);
        if constexpr (K == RowOut::Symbols) {
            r.out[d] = uint8_t(sy);
        } else {
            const float sc = r.scaleVec ? r.scaleVec[d] : r.scale;
            const float v = float(sy - r.m) * sc + (r.base ? r.base[d] : 0.0f);
            if (r.anchorOut) r.anchorOut[d] = v;
            storeValue<K>(r.out, d, v);
        }
    }
}

}  // namespace

// The plain reference of a v2 row: one symbol at a time, every read bounds-checked.
void w32RowScalar(W32Stream& s, const W32Row& r, RowOut k)
{
    switch (k) {
    case RowOut::F16: return rowScalar<RowOut::F16>(s, r);
    case RowOut::BF16: return rowScalar<RowOut::BF16>(s, r);
    case RowOut::F32: return rowScalar<RowOut::F32>(s, r);
    case RowOut::Symbols: return rowScalar<RowOut::Symbols>(s, r);
    }
}

namespace {

// One v2 stream being decoded row by row: what decodeHeadStreamV2 keeps per head, so that the rows
// of several heads can be interleaved.
struct HeadDecoder {
    W32Stream st;
    std::vector<int32_t> tableWord;    // (2, D): role-major
    alignas(64) uint32_t split[2][176];  // per role, when uniform: the one table's bucket words (W32Row::split)
    std::vector<uint32_t> slots;       // when the kernel takes them: per role, the slot index (W32Row::slots)
    bool uniform = false;
    std::vector<float> scaleVec;       // (2, D)
    std::vector<float> anchor;         // (D)
    std::vector<uint8_t> tail;         // the zero-padded copy of the stream's end
    const uint8_t* realEnd = nullptr;
    const uint8_t* tailBase = nullptr;
    const quant::BlockSpec* b = nullptr;
    const uint16_t* scales = nullptr;
    W32RowFn fast = nullptr;
    RowOut k = RowOut::Symbols;
    size_t slack = 0, elem = 0;
    int h = 0, maxL = 0, maxA = 0;
    bool perChannel = false, delta = false;
    W32Row r;

    void start(const quant::BlockSpec& spec, int head, const uint8_t* data, size_t size, const UnitTables& tab,
               const uint16_t* sc, RowOut kind, uint8_t* out)
    {
        constexpr int W = rans::w32::kLanes;
        b = &spec;
        h = head;
        scales = sc;
        k = kind;
        const int D = spec.headDim, C = spec.channels();
        maxL = quant::maxLevel(spec.bins);
        maxA = quant::maxLevel(spec.anchorBins);
        st.p = data;
        st.end = data + size;
        st.overrun = false;
        if (size >= rans::w32::kFlushBytes) {
            for (int j = 0; j < W; ++j) st.x[j] = getU32(data + 4 * j);
            st.p += rans::w32::kFlushBytes;
        } else {
            for (uint32_t& v : st.x) v = 0;
            st.overrun = true;
            st.p = st.end;
        }
        perChannel = spec.quantizer == Quantizer::PerChannel;
        delta = spec.deltaGroup >= 2;
        tableWord.resize(2 * size_t(D));
        scaleVec.resize(2 * size_t(D));
        anchor.assign(size_t(D), 0.0f);
        constexpr size_t tableWords = sizeof(CodingTable) / 4;
        for (int role = 0; role < (delta ? 2 : 1); ++role)
            for (int d = 0; d < D; ++d)
                tableWord[size_t(role) * D + d] = int32_t(tab.index(role, h * D + d) * tableWords);
        uniform = tab.channelsPerTable == D;  // one table for every channel of a row
        if (uniform)
            for (int role = 0; role < (delta ? 2 : 1); ++role) {
                const CodingTable& t = *reinterpret_cast<const CodingTable*>(
                    reinterpret_cast<const uint32_t*>(tab.tables.data()) + tableWord[size_t(role) * D]);
                for (int b = 0; b < CodingTable::kBuckets; ++b) {
                    split[role][b] = uint32_t(t.bucket[b]);
                    split[role][64 + b] = uint32_t(t.bucket[b] >> 32);
                }
                const int a = quant::alphabetSize(role == 1 ? spec.anchorBins : spec.bins);
                for (int sy = 0; sy < 32; ++sy) split[role][128 + sy] = sy < a ? t.start(sy) : rans::kProbScale;
                split[role][160] = a <= 32 ? 1 : 0;
            }
        if (perChannel) {
            halfToFloatN(sc + h * D, scaleVec.data(), size_t(D));
            if (delta) halfToFloatN(sc + C + h * D, scaleVec.data() + D, size_t(D));
        }
        fast = w32RowKernel(simdPath(), kind, D, uniform);
        // An index is 4096 words, written 8 at a time: cheap next to even an anchor role's rows.
        slots.clear();
        if (fast && uniform && w32RowUsesSlots(simdPath(), D)) {
            slots.resize((delta ? 2 : 1) * size_t(rans::kProbScale));
            for (int role = 0; role < (delta ? 2 : 1); ++role)
                w32SlotIndex(*reinterpret_cast<const CodingTable*>(reinterpret_cast<const uint32_t*>(tab.tables.data()) +
                                                                   tableWord[size_t(role) * D]),
                             quant::alphabetSize(role == 1 ? spec.anchorBins : spec.bins),
                             slots.data() + size_t(role) * rans::kProbScale);
        }
        slack = w32RowSlack(D);
        elem = rowOutBytes(kind);
        realEnd = st.end;
        tailBase = nullptr;
        r.tables = reinterpret_cast<const uint32_t*>(tab.tables.data());
        r.D = D;
        r.out = out;
    }

    void row(int t)
    {
        constexpr int W = rans::w32::kLanes;
        const int D = b->headDim;
        const bool isAnchor = b->isAnchor(t);
        const int role = isAnchor ? 1 : 0;
        uint8_t* out = r.out;
        r.tableWord = tableWord.data() + size_t(role) * D;
        r.split = uniform ? split[role] : nullptr;
        r.slots = slots.empty() ? nullptr : slots.data() + size_t(role) * rans::kProbScale;
        r.lane0 = int((size_t(t) * D) % W);
        r.m = isAnchor ? maxA : maxL;
        r.scaleVec = perChannel ? scaleVec.data() + size_t(role) * D : nullptr;
        r.scale = perChannel ? 0.0f : halfToFloat(scales[t]);
        r.base = delta && !isAnchor ? anchor.data() : nullptr;
        r.anchorOut = delta && isAnchor ? anchor.data() : nullptr;
        r.out = out + size_t(t) * D * elem;
        // Near its end a stream is copied into a zero-padded buffer so the SIMD rows can go on
        // reading ahead; a valid stream never takes a padding word, and p is mapped back after.
        if (fast && !tailBase && size_t(st.end - st.p) < slack) {
            const size_t left = size_t(st.end - st.p);
            tail.assign(left + slack * size_t(b->tokens - t) + 64, 0);
            if (left) std::memcpy(tail.data(), st.p, left);
            tailBase = st.p;
            st.p = tail.data();
            st.end = tail.data() + tail.size();
        }
        if (fast)
            fast(st, r);
        else
            w32RowScalar(st, r, k);
        r.out = out;
    }

    // Rows t..t+n-1, none of them an anchor: one kernel call when the stream has the bytes for
    // all of them ahead, else row by row (which handles a stream's end).
    void rows(int t, int n)
    {
        const int D = b->headDim;
        if (!fast || n < 2 || size_t(st.end - st.p) < w32RowSlack(D, n)) {
            for (int j = 0; j < n; ++j) row(t + j);
            return;
        }
        uint8_t* out = r.out;
        r.tableWord = tableWord.data();
        r.split = uniform ? split[0] : nullptr;
        r.slots = slots.empty() ? nullptr : slots.data();
        r.lane0 = int((size_t(t) * D) % rans::w32::kLanes);
        r.m = maxL;
        r.scaleVec = perChannel ? scaleVec.data() : nullptr;
        r.scale = 0.0f;
        r.rowScales = perChannel ? nullptr : scales + t;
        r.base = delta ? anchor.data() : nullptr;
        r.anchorOut = nullptr;
        r.out = out + size_t(t) * D * elem;
        r.rows = n;
        fast(st, r);
        r.rows = 1;
        r.rowScales = nullptr;
        r.out = out;
    }

    // Tokens from one anchor to the next (the whole block without delta coding).
    static int groupTokens(const quant::BlockSpec& spec) { return spec.deltaGroup >= 2 ? spec.deltaGroup : spec.tokens; }

    // The rows of the group that starts at token t: its anchor row, then the rest in one call.
    void group(int t)
    {
        const int n = std::min(groupTokens(*b), b->tokens - t);
        if (b->isAnchor(t)) {
            row(t);
            rows(t + 1, n - 1);
        } else {
            rows(t, n);
        }
    }

    // Whether the stream ended exactly at its last word with every state back at its initial value.
    bool finish() { return w32StreamEnded(st, tail.data(), tailBase, realEnd); }
};

}  // namespace

void decodeHeadStreamV2(const quant::BlockSpec& b, int h, const uint8_t* data, size_t size, const UnitTables& tab,
                        const uint16_t* scales, RowOut k, uint8_t* out, const std::string& where)
{
    thread_local HeadDecoder dec;
    dec.start(b, h, data, size, tab, scales, k, out);
    for (int t = 0; t < b.tokens; t += HeadDecoder::groupTokens(b)) dec.group(t);
    if (!dec.finish()) throw Error(where + ": head " + std::to_string(h) + ": entropy-coded stream is corrupt");
}

void decodeHeadStreamsV2(const quant::BlockSpec& b, const uint8_t* const* data, const size_t* size, const UnitTables& tab,
                         const uint16_t* scales, RowOut k, uint8_t* const* out, const std::string& where)
{
    thread_local std::vector<HeadDecoder> dec;
    if (dec.size() < size_t(b.heads)) dec.resize(size_t(b.heads));
    for (int h = 0; h < b.heads; ++h) dec[size_t(h)].start(b, h, data[h], size[h], tab, scales, k, out[h]);
    // Delta group by delta group, every head in turn: the heads' state chains are independent, so
    // the CPU overlaps the end of one head's rows with the start of the next head's.
    for (int t = 0; t < b.tokens; t += HeadDecoder::groupTokens(b))
        for (int h = 0; h < b.heads; ++h) dec[size_t(h)].group(t);
    for (int h = 0; h < b.heads; ++h)  // the lowest corrupt head, as when they are decoded one by one
        if (!dec[size_t(h)].finish())
            throw Error(where + ": head " + std::to_string(h) + ": entropy-coded stream is corrupt");
}

}  // namespace kvscope::detail
