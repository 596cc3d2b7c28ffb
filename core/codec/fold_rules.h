// The transform codec's folded tables (transform.h READ ME FIRST, 7), written once for the CPU
// decoder (codec/transform_chunk.cpp) and the GPU decoder's plan (cuda/transform_plan.h,
// cuda/transform_core.h): a token of importance class c codes with step 2^c Delta, and its
// symbols with the level's table folded for that step, which the decoder derives without side
// information.
#pragma once

#include "common/host_device.h"

#include <stdint.h>

namespace kvscope {
namespace hd {

// M' = ceil(M / 2^c), at least 1: the folded alphabet is 2 M' + 1.
KVS_HD int foldedMax(int M, int c)
{
    const int mult = 1 << c;
    const int f = (M + mult - 1) / mult;
    return f < 1 ? 1 : f;
}

// Symbol s of the alphabet 2 M + 1, folded for step 2^c: q = s - M (|q| < M) goes to
// rint(q / 2^c) with halves away from zero, |q'| >= M' and the escapes (0, 2 M) to the escapes.
KVS_HD int foldedSymbol(int s, int M, int c)
{
    const int mult = 1 << c, Mf = foldedMax(M, c);
    if (s == 0) return 0;
    if (s == 2 * M) return 2 * Mf;
    const int q = s - M;
    const int qf = q >= 0 ? (q + mult / 2) / mult : -((-q + mult / 2) / mult);
    return qf <= -Mf ? 0 : qf >= Mf ? 2 * Mf : qf + Mf;
}

// Adds the table f (2 M + 1 frequencies) folded for step 2^c to acc (2 foldedMax(M, c) + 1
// entries). Sums are preserved, and every folded symbol receives at least one original one.
template <class Count>
KVS_HD void foldFrequencies(const uint16_t* f, int M, int c, Count* acc)
{
    for (int s = 0; s <= 2 * M; ++s) acc[foldedSymbol(s, M, c)] += f[s];
}

}  // namespace hd
}  // namespace kvscope
