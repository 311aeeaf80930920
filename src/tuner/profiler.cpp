#include "tuner/profiler.hpp"

#include "core/error.hpp"

#ifndef FP4MOE_HAVE_CUDA

namespace fp4moe::tuner {
bool profiler_available() { return false; }
ProblemResult profile_problem(const std::string&, const GemmProblem&, const ArchInfo&, const ProfileOptions&) {
  FP4MOE_FAIL("this fp4moe was built without CUDA: the profiler is not available (use --dry-run)");
}
}  // namespace fp4moe::tuner

#else

namespace fp4moe::tuner {
bool profiler_available() { return have_device(); }
ProblemResult profile_problem(const std::string&, const GemmProblem&, const ArchInfo&, const ProfileOptions&) {
  FP4MOE_FAIL("profiler: not written yet");
}
}  // namespace fp4moe::tuner

#endif
