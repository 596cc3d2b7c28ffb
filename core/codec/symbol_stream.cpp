// Scalar reference implementation of symbol_stream.h on rans.h's primitives.
#include "codec/symbol_stream.h"

#include "codec/rans.h"
#include "common/error.h"

namespace kvscope {

void encodeSymbolMatrix(const uint8_t* sym, int rows, int cols, const CodingTable* tables, std::vector<uint8_t>& out)
{
    const size_t n = size_t(rows) * size_t(cols);
    if (n == 0) return;
    rans::RansWriter w;
    w.reserve(n + 4 * rans::kRansWays + 16);
    uint32_t x[rans::kRansWays];
    for (uint32_t& v : x) rans::encInit(&v);
    for (size_t i = n; i-- > 0;) {  // last symbol first: see rans.h
        const CodingTable& t = tables[i % size_t(cols)];
        const int s = sym[i];
        KVSCOPE_ASSERT(t.freq(s) > 0);
        rans::encPut(&x[i % rans::kRansWays], w, t.start(s), t.freq(s));
    }
    for (int k = rans::kRansWays - 1; k >= 0; --k) rans::encFlush(x[k], w);
    w.finishInto(out);
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
    size_t c = 0;
    for (size_t i = 0; i < n; ++i) {
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

}  // namespace kvscope
