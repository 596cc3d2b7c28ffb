// The entropy stage of the CacheGen codec: one rANS stream per (kind, layer, head), symbols in
// token-major order over 4 interleaved states, with per-channel (and per-role) coding tables.
// Decoding is fused with dequantization (and the anchor/delta reconstruction) so a row of symbols
// never leaves registers. The stream format is in FORMAT.md ("Entropy coding").
#include "codec/codec_detail.h"

#include "codec/rans.h"
#include "common/half.h"

#include <vector>

namespace kvscope::detail {

// Symbol counts of a block into flat[(role * C + c) * stride + symbol], added to what is there;
// stride is at least the larger alphabet of the two roles.
void countBlock(const quant::BlockSpec& b, const uint8_t* sym, int roles, uint32_t* flat, size_t stride)
{
    const int D = b.headDim, C = b.channels();
    for (int h = 0; h < b.heads; ++h)
        for (int t = 0; t < b.tokens; ++t) {
            const int role = (roles == 2 && b.isAnchor(t)) ? 1 : 0;
            const uint8_t* row = sym + (size_t(h) * b.tokens + t) * D;
            uint32_t* base = flat + (size_t(role) * C + size_t(h) * D) * stride;
            for (int d = 0; d < D; ++d) base[size_t(d) * stride + row[d]]++;
        }
}

// Counts a quantized block's symbols per (role, channel) into flat; returns the stride between tables.
size_t countUnit(const QuantizedBlock& q, int roles, std::vector<uint32_t>& flat)
{
    const size_t stride = size_t(quant::alphabetSize(std::max(q.spec.bins, q.spec.anchorBins)));
    flat.assign(size_t(roles) * q.spec.channels() * stride, 0);
    countBlock(q.spec, q.sym.data(), roles, flat.data(), stride);
    return stride;
}

// One stream per head: symbols (t, d) in token-major order, symbol i coded by state i % 4.
// Bytes are written backwards into a buffer sized for the worst case (2 bytes per symbol).
void encodeHeadStream(const quant::BlockSpec& b, int h, const uint8_t* sym, const UnitTables& tab,
                      std::vector<uint8_t>& out)
{
    const int D = b.headDim, C = b.channels();
    const size_t n = size_t(b.tokens) * D;
    const uint8_t* s = sym + size_t(h) * n;
    const rans::FreqDivider& div = rans::freqDivider();
    std::vector<uint8_t> buf(2 * n + 2 + 4 * rans::kRansWays);
    uint8_t* const bufEnd = buf.data() + buf.size();
    uint8_t* ptr = bufEnd;
    // Emits the 0, 1 or 2 low bytes renormalisation needs without a branch: both bytes are stored
    // below ptr and ptr moves by the count (a byte stored but not taken is overwritten later).
    auto put = [&ptr, &div](uint32_t& x, const CodingTable& ct, int sy) {
        const uint32_t sf = ct.sf[sy], freq = sf >> 16;
        const uint32_t xMax = ((rans::kRansL >> rans::kProbBits) << 8) * freq;  // < 2^31
        const uint32_t k = uint32_t(x >= xMax) + uint32_t(uint64_t(x) >= (uint64_t(xMax) << 8));
        ptr[-1] = uint8_t(x);
        ptr[-2] = uint8_t(x >> 8);
        ptr -= k;
        x >>= 8 * k;
        const uint32_t q = div.div(x, freq);
        x = (q << rans::kProbBits) + (x - q * freq) + (sf & 0xffffu);
    };
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) rans::encInit(&v);
    for (int t = b.tokens - 1; t >= 0; --t) {  // reverse order: see rans.h
        const CodingTable* row = &tab.at(b.isAnchor(t) ? 1 : 0, C, h * D);
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
    rans::RansReader r{data, data + size, false};
    uint32_t x0 = rans::decInit(r), x1 = rans::decInit(r), x2 = rans::decInit(r), x3 = rans::decInit(r);
    std::vector<float> scale(static_cast<size_t>(D)), zero(static_cast<size_t>(D), 0.0f);
    std::vector<int> q(static_cast<size_t>(D));  // the row's symbols
    const bool perChannel = b.quantizer == Quantizer::PerChannel;
    for (int t = 0; t < b.tokens; ++t) {
        const bool anchor = b.isAnchor(t);
        const CodingTable* row = &tab.at(anchor ? 1 : 0, C, h * D);
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
                const uint32_t sf = ct.sf[sy];
                x = (sf >> 16) * (x >> rans::kProbBits) + (x & (rans::kProbScale - 1)) - (sf & 0xffffu);
                const uint32_t k = uint32_t(x < rans::kRansL) + uint32_t(x < (rans::kRansL >> 8));
                const uint32_t two = uint32_t(p[0]) << 8 | p[1];  // the next two bytes, first one high
                const uint32_t bits = 8 * k;                       // 0, 8 or 16: shifts, no branches
                x = (x << bits) | (two >> (16 - bits));
                p += k;
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


}  // namespace kvscope::detail
