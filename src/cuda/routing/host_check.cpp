#include "cuda/routing/host_check.hpp"

#include "core/error.hpp"

namespace fp4moe::cuda {

void fail_invalid(const std::string& msg) { throw Error(msg); }

}  // namespace fp4moe::cuda
