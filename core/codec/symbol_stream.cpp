// symbol_stream.h: the 4-state layout (scalar, on rans.h's primitives) and the 32-state layout
// (rans32), whose SIMD paths are the CacheGen v2 row kernels and encoders (codec_detail.h).
#include "codec/symbol_stream.h"

#include "codec/codec_detail.h"
#include "codec/rans.h"
#include "codec/simd_path.h"
#include "common/error.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace kvscope {

// Coded with encPutFast (prob_table.h): the same bytes as rans::encPut.
void encodeSymbolMatrix(const uint8_t* sym, int rows, int cols, const CodingTable* tables, std::vector<uint8_t>& out)
{
    const size_t n = size_t(rows) * size_t(cols);
    if (n == 0) return;
    const rans::FreqDivider& div = rans::freqDivider();
    thread_local std::vector<uint8_t> buf;
    buf.resize(2 * n + 2 + 4 * rans::kRansWays);  // at most 2 bytes a symbol, the flushed states
    uint8_t* const bufEnd = buf.data() + buf.size();
    uint8_t* ptr = bufEnd;
    auto put = [&ptr, &div](uint32_t& x, const CodingTable& t, int s) {
        KVSCOPE_ASSERT(t.freq(s) > 0);
        encPutFast(x, ptr, t, s, div);
    };
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) rans::encInit(&v);
    size_t c = (n - 1) % size_t(cols);
    for (size_t i = n; i-- > 0;) {  // last symbol first: see rans.h
        put(x[i % rans::kRansWays], tables[c], sym[i]);
        c = c == 0 ? size_t(cols) - 1 : c - 1;
    }
    for (int k = rans::kRansWays - 1; k >= 0; --k)  // state 0 last, so the decoder reads it first
        for (int byte = 0; byte < 4; ++byte) *--ptr = uint8_t(x[k] >> (8 * (3 - byte)));
    KVSCOPE_ASSERT(ptr >= buf.data() + 2);
    out.insert(out.end(), ptr, bufEnd);
}

void decodeSymbolMatrix(const uint8_t* data, size_t size, int rows, int cols, const CodingTable* tables, uint8_t* sym,
                        const std::string& where)
{
    const size_t n = size_t(rows) * size_t(cols);
    if (n == 0) {
        if (size != 0) throw Error(where + ": entropy-coded stream is corrupt (bytes for an empty matrix)");
        return;
    }
    rans::RansReader r{data, data + size, false};
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) v = rans::decInit(r);
    size_t c = 0, i = 0;
    // Four symbols (one per state) at a time while the stream has the bytes for them (at most 2
    // per symbol, and rans::decAdvanceAhead reads 2 past what it takes), with no loop or branch
    // on the renormalisation, as entropy_stage.cpp's fast rows. The same bytes and symbols as the
    // loop below, which finishes the matrix and checks the stream's end.
    static_assert(rans::kRansWays == 4, "the fast loop takes one symbol per state");
    const uint8_t* p = r.p;
    auto step = [&](uint32_t& st) {
        const CodingTable& t = tables[c];
        const int s = t.symbolOf(rans::decSlot(st));
        rans::decAdvanceAhead(&st, &p, t.start(s), t.freq(s));
        sym[i++] = uint8_t(s);
        if (++c == size_t(cols)) c = 0;
    };
    while (n - i >= 4 && r.end - p >= 10) {
        step(x[0]);
        step(x[1]);
        step(x[2]);
        step(x[3]);
    }
    r.p = p;
    for (; i < n; ++i) {
        const CodingTable& t = tables[c];
        uint32_t& st = x[i % rans::kRansWays];
        const int s = t.symbolOf(rans::decSlot(st));
        rans::decAdvance(&st, r, t.start(s), t.freq(s));
        sym[i] = uint8_t(s);
        if (++c == size_t(cols)) c = 0;
        if (r.overrun) break;
    }
    bool statesOk = true;
    for (uint32_t v : x) statesOk = statesOk && v == rans::kRansL;
    if (r.overrun || r.p != r.end || !statesOk) throw Error(where + ": entropy-coded stream is corrupt");
}

// ---------------------------------------------------------------------------------------------
// rans32: the matrix as one flat sequence of n = rows * cols symbols, symbol i by state i % 32
// with tables[i % cols]. The SIMD kernels need rows whose length is a multiple of their width
// (16) and one table offset per position of a row, so the sequence is cut into rows of
// P = lcm(cols, 16) symbols: position d of every such row has table d % cols (a row starts at a
// multiple of cols) and state (row * P + d) % 32. The last n % P symbols are a shorter scalar
// row. How the sequence is cut changes neither the stream nor the symbols, only who decodes them.
// Why: a block's coded component count K_u is arbitrary (rarely a multiple of 16), so rows of K_u
// would leave most blocks to the scalar loop (figures: docs/codecs.md "Why the entropy kernels
// look as they do").

namespace {

constexpr int kW32 = rans::w32::kLanes;
constexpr size_t kTableWords = sizeof(CodingTable) / 4;

int w32Period(int cols) { return cols / std::gcd(cols, 16) * 16; }

// Word offsets of the table of each position of a row of P symbols (twice: the encoders read a
// second role's offsets at +P, never used here since no row is an anchor).
const int32_t* periodTableWords(int cols, int P)
{
    thread_local std::vector<int32_t> tw;
    thread_local int twCols = 0, twP = 0;  // what tw holds: a block's streams repeat the same shape
    if (cols == twCols && P == twP) return tw.data();
    tw.resize(2 * size_t(P));
    for (int d = 0; d < P; ++d) tw[size_t(d)] = tw[size_t(P + d)] = int32_t(size_t(d % cols) * kTableWords);
    twCols = cols, twP = P;
    return tw.data();
}

const char kCorrupt[] = ": entropy-coded stream is corrupt";

}  // namespace

void encodeSymbolMatrixW32(const uint8_t* sym, int rows, int cols, const CodingTable* tables, std::vector<uint8_t>& out)
{
    const size_t n = size_t(rows) * size_t(cols);
    if (n == 0) return;
    const int P = w32Period(cols);
    const size_t full = n / size_t(P);
    // One word per symbol at most, the 64 words of the flushed states, and room for the AVX2
    // encoder's 8-word stores below the front.
    thread_local std::vector<uint16_t> buf;
    buf.resize(n + 2 * kW32 + 16);
    uint16_t* const wordsEnd = buf.data() + buf.size();
    uint16_t* w = wordsEnd;
    alignas(64) uint32_t x[kW32];
    for (uint32_t& v : x) v = rans::w32::kL;
    const detail::W32EncFn fast = full > 0 ? detail::w32EncodeKernel(simdPath(), P, false) : nullptr;
    // Last symbol first (rans.h): the short row, then the full rows (SIMD, or the same loop).
    const size_t stop = fast ? full * size_t(P) : 0;
    size_t c = (n - 1) % size_t(cols);
    for (size_t i = n; i-- > stop;) {
        const CodingTable& t = tables[c];
        const int s = sym[i];
        KVSCOPE_ASSERT(t.freq(s) > 0);
        rans::w32::encPut(&x[i % kW32], w, t.start(s), t.freq(s));
        c = c == 0 ? size_t(cols) - 1 : c - 1;
    }
    if (fast) {
        detail::W32EncJob job{reinterpret_cast<const uint32_t*>(tables), periodTableWords(cols, P), sym, int(full), P, 0};
        fast(job, x, w);
    }
    detail::finishStreamV2(x, w, buf, wordsEnd, out);
}

void decodeSymbolMatrixW32(const uint8_t* data, size_t size, int rows, int cols, const CodingTable* tables, uint8_t* sym,
                           const std::string& where)
{
    const size_t n = size_t(rows) * size_t(cols);
    if (n == 0) {
        if (size != 0) throw Error(where + ": entropy-coded stream is corrupt (bytes for an empty matrix)");
        return;
    }
    if (size < rans::w32::kFlushBytes) throw Error(where + kCorrupt);
    detail::W32Stream st;
    for (int j = 0; j < kW32; ++j) st.x[j] = detail::getU32(data + 4 * size_t(j));
    st.p = data + rans::w32::kFlushBytes;
    st.end = data + size;
    st.overrun = false;
    // Rows of lcm(cols, 16) symbols for a SIMD kernel; the scalar rows are cols long (a shorter
    // offset array stays in L1; docs/codecs.md has the figure).
    const int wide = w32Period(cols);
    const detail::W32RowFn fast =
        n >= size_t(wide) ? detail::w32RowKernel(simdPath(), detail::RowOut::Symbols, wide, false) : nullptr;
    const int P = fast ? wide : cols;
    const size_t full = n / size_t(P), rem = n % size_t(P);
    detail::W32Row r{};
    r.tables = reinterpret_cast<const uint32_t*>(tables);
    r.tableWord = periodTableWords(cols, P);
    r.split = nullptr;
    r.D = P;
    const uint8_t* realEnd = st.end;
    const uint8_t* tailBase = nullptr;
    thread_local std::vector<uint8_t> tail;
    size_t row = 0;
    if (fast) {
        // The rows the stream has the kernel's read-ahead for (2 bytes a symbol at most), straight
        // from it, in calls that each take as many rows as the bytes left allow (a stream uses far
        // fewer, so the calls shrink geometrically); the last few rows from a zero-padded copy of
        // the stream's end (a valid stream never takes a padding word).
        while (row < full) {
            const size_t left = size_t(st.end - st.p);
            const size_t direct = left >= 64 ? std::min(full - row, (left - 64) / (2 * size_t(P))) : 0;
            if (direct == 0 || (direct < 4 && direct < full - row)) break;
            r.rows = int(direct);
            r.lane0 = int((row * size_t(P)) % kW32);
            r.out = sym + row * size_t(P);
            fast(st, r);
            row += direct;
        }
        if (row < full) {
            const size_t rest = size_t(st.end - st.p);
            tail.assign(rest + detail::w32RowSlack(P, int(full - row)) + 64, 0);
            if (rest) std::memcpy(tail.data(), st.p, rest);
            tailBase = st.p;
            st.p = tail.data();
            st.end = tail.data() + tail.size();
            r.rows = int(full - row);
            r.lane0 = int((row * size_t(P)) % kW32);
            r.out = sym + row * size_t(P);
            fast(st, r);
            row = full;
        }
    }
    r.rows = 1;
    for (; row < full; ++row) {
        r.lane0 = int((row * size_t(P)) % kW32);
        r.out = sym + row * size_t(P);
        detail::w32RowScalar(st, r, detail::RowOut::Symbols);
    }
    if (rem) {
        r.D = int(rem);
        r.lane0 = int((full * size_t(P)) % kW32);
        r.out = sym + full * size_t(P);
        detail::w32RowScalar(st, r, detail::RowOut::Symbols);
    }
    if (!detail::w32StreamEnded(st, tail.data(), tailBase, realEnd)) throw Error(where + kCorrupt);
}

}  // namespace kvscope
