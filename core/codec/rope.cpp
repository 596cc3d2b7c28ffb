// RoPE rotation of key rows (rotate_half layout, angles in double): what rope_undo undoes on the
// encoder side and the decoder re-applies (transform.h READ ME FIRST, 1; declared there). Built with
// -ffp-contract=off like the rest of the transform codec, so that the rotation gives the same bytes
// on every CPU.
#include "codec/transform.h"

#include <cmath>

namespace kvscope {

void ropeTable(int tokens, int headDim, const float* invFreq, int position0, int t0, std::vector<double>& cs)
{
    const int half = headDim / 2;
    cs.resize(size_t(2) * tokens * half);
    for (int t = 0; t < tokens; ++t) {
        const double pos = double(position0) + double(t0) + double(t);
        for (int i = 0; i < half; ++i) {
            const double a = pos * double(invFreq[i]);
            cs[2 * (size_t(t) * half + i)] = std::cos(a);
            cs[2 * (size_t(t) * half + i) + 1] = std::sin(a);
        }
    }
}

void applyRopeTable(float* rows, int tokens, int headDim, const double* cs, bool inverse)
{
    const int half = headDim / 2;
    for (int t = 0; t < tokens; ++t) {
        float* r = rows + size_t(t) * headDim;
        const double* e = cs + 2 * size_t(t) * half;
        for (int i = 0; i < half; ++i) {
            const double c = e[2 * i], s = inverse ? -e[2 * i + 1] : e[2 * i + 1];
            const double x1 = r[i], x2 = r[i + half];
            r[i] = float(x1 * c - x2 * s);
            r[i + half] = float(x2 * c + x1 * s);
        }
    }
}

void applyRope(float* rows, int tokens, int headDim, const float* invFreq, int position0, int t0, bool inverse)
{
    std::vector<double> cs;
    ropeTable(tokens, headDim, invFreq, position0, t0, cs);
    applyRopeTable(rows, tokens, headDim, cs.data(), inverse);
}

}  // namespace kvscope
