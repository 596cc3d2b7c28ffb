#include "view_data.h"

#include <QCoreApplication>

namespace kvscope {

std::vector<HardwarePreset> hardwarePresets()
{
    // Modelled rates are round figures for a 100M-1B parameter model, not measurements: they move
    // the compute parts of TTFT off this CPU so the transfer policies can be compared on their own.
    auto tr = [](const char* s) { return QCoreApplication::translate("kvscope::HardwarePreset", s); };
    return {
        {QStringLiteral("measured"), tr("This machine (measured)"), 0, 0},
        {QStringLiteral("laptop-gpu"), tr("Laptop GPU (modelled: prefill 5k tok/s, decode 10 GB/s)"), 5000, 10},
        {QStringLiteral("server-gpu"), tr("Server GPU (modelled: prefill 50k tok/s, decode 100 GB/s)"), 50000, 100},
    };
}

}  // namespace kvscope
