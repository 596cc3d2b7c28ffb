#include "cli_common.h"

#include <chrono>
#include <cmath>
#include <iostream>

namespace kvscope::cli {

void Output::emit(const json& j, const std::function<void(const json&)>& text) const
{
    if (asJson)
        std::cout << j.dump(2) << std::endl;
    else
        text(j);
}

double nowSeconds()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


}  // namespace kvscope::cli
