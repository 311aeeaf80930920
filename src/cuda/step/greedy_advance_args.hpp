// greedy_advance's arguments (step.hpp): core/greedy_advance.hpp's plain struct (device pointers
// here), so the CPU reference and the kernel read one layout, and the kernel also builds for
// tests/cuda/emu (no CUDA headers).
#pragma once

#include "core/greedy_advance.hpp"

namespace fp4moe::cuda::step {

using cpu::GreedyAdvanceArgs;

}  // namespace fp4moe::cuda::step
