// The result of measureLayerSensitivity (eval/sensitivity.h) as a plain struct with no includes,
// so views can show it without seeing the model runtime that eval/ scores with.
#pragma once

namespace kvscope {

// How much quantizing one layer's keys or values alone hurts the continuation, in the terms of
// eval/quality.h: ΔPPL in percent and mean KL(original || candidate) in nats.
struct LayerSensitivity {
    int layer = 0;
    double keyDeltaPplPct = 0.0, valueDeltaPplPct = 0.0;
    double keyKl = 0.0, valueKl = 0.0;
    double keyRms = 0.0, valueRms = 0.0;  // reconstruction RMS error of that tensor
};

}  // namespace kvscope
