// The NVFP4 goldens of tests/model/golden/<case>/ were computed on `fp4moe quantize`'s output,
// which is not committed: this re-runs each quantize command recorded in the case's meta.json
// and requires the same model.safetensors bytes (FNV-1a 64 recorded by
// tools/oracle/make_goldens.py). A failure means quantize changed: the golden_nvfp4*.safetensors
// files no longer describe its output and must be regenerated with make_goldens.py.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_run_helpers.hpp"

namespace fp4moe {
namespace {

using namespace testing_cli;
using json = nlohmann::json;

const fs::path kGolden = fs::path(FP4MOE_SOURCE_DIR) / "tests" / "model" / "golden";

std::string fnv1a64_hex(const std::string& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001B3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

TEST(GoldenQuantize, RecordedCommandsGiveTheSameBytes) {
  int checked = 0;
  for (const auto& c : fs::directory_iterator(kGolden)) {
    if (!fs::exists(c.path() / "meta.json")) continue;
    const json meta = json::parse(slurp(c.path() / "meta.json"));
    // Goldens made elsewhere (glm5-mini-py: tools/train_small/evaluate.py, on a committed
    // checkpoint) record no quantize command; the count below still requires every one of
    // make_goldens.py's cases.
    if (!meta.contains("quantize")) continue;
    for (const auto& [variant, q] : meta["quantize"].items()) {
      SCOPED_TRACE(c.path().filename().string() + " " + variant);
      TempDir t("golden_quantize_" + c.path().filename().string() + "_" + variant);
      // command: ["fp4moe", "quantize", "<case>/model", "OUT", extra...]
      const auto cmd = q.at("command").get<std::vector<std::string>>();
      ASSERT_GE(cmd.size(), 4u);
      ASSERT_EQ(cmd[1], "quantize");
      std::string args = "quantize " + quote((c.path() / "model").string()) + " " + quote((t.path / "out").string());
      for (size_t i = 4; i < cmd.size(); ++i) args += " " + quote(cmd[i]);
      const Result r = run_binary(t.path, args);
      ASSERT_EQ(r.rc, 0) << args << "\n" << r.err;
      EXPECT_EQ(fnv1a64_hex(slurp(t.path / "out" / "model.safetensors")), q.at("model_safetensors_fnv1a64").get<std::string>())
          << "fp4moe " << args << " no longer writes the bytes the NVFP4 goldens were made from: re-run "
          << "tools/oracle/make_goldens.py";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);  // 4 cases x (nvfp4, nvfp4_all)
}

}  // namespace
}  // namespace fp4moe
