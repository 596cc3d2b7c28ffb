// Reconstruction error between two caches of the same shape (original vs decoded).
#pragma once

#include "kv/kv_set.h"

#include <vector>

namespace kvscope {

struct TensorError {
    double maxAbs = 0;
    double rms = 0;
    double snrDb = 0;  // 10 log10(signal power / error power); +inf when exact
};

struct LayerError {
    int layer = 0;
    TensorError key, value;
};

struct KvError {
    std::vector<LayerError> layers;
    double maxAbs = 0;  // over the whole cache
    double rms = 0;
};

// Throws kvscope::Error when the shapes differ. Parallel over layers.
KvError compareKv(const KvSet& reference, const KvSet& decoded);

}  // namespace kvscope
