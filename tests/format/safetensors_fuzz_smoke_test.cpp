// A few thousand random and mutated headers through parse_safetensors_header in the normal
// test build (the real fuzzer is fuzz/safetensors_header_fuzz.cpp, run by tools/fuzz.sh).
// Each input must give success or an fp4moe::Error with a one-line message naming the
// file — never a crash or another exception type; a success must satisfy the invariants.
#include <gtest/gtest.h>

#include <cctype>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "format/safetensors.hpp"

namespace fp4moe {
namespace {

constexpr const char* kTokens[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "{", "}", "[", "]", ":", ",", "\"",
    "\\u0000", "\\n", "-1", "1.5", "1e309", "18446744073709551615", "9223372036854775808", "null", "true",
    "\"F32\"", "\"BF16\"", "\"U8\"", "\"F8_E4M3\"", "\"F8_E8M0\"", "\"BOOL\"", "\"I64\"", "0", "4", "\xff", " "};

// A random valid header and its data size.
std::pair<std::string, uint64_t> valid_header(std::mt19937_64& rng) {
  static const std::pair<const char*, int> kDtypes[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4}, {"F64", 8},
                                                        {"U8", 1},   {"I8", 1},  {"I16", 2}, {"I32", 4},
                                                        {"I64", 8},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
                                                        {"F8_E8M0", 1}, {"BOOL", 1}};
  std::string h = "{";
  if (rng() % 3 == 0) h += "\"__metadata__\":{\"format\":\"pt\"},";
  const int n = int(rng() % 6);
  uint64_t off = 0;
  for (int i = 0; i < n; ++i) {
    const auto& [dt, size] = kDtypes[rng() % 13];
    const int rank = int(rng() % 4);
    uint64_t numel = 1;
    std::string shape = "[";
    for (int r = 0; r < rank; ++r) {
      const uint64_t d = rng() % 5;
      numel *= d;
      shape += (r ? "," : "") + std::to_string(d);
    }
    shape += "]";
    const uint64_t end = off + numel * uint64_t(size);
    h += (i ? "," : "") + fmt::format("\"t{}\":{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}", i, dt,
                                      shape, off, end);
    off = end;
  }
  h += "}";
  return {h, off};
}

void mutate(std::string& s, std::mt19937_64& rng) {
  const int n = 1 + int(rng() % 4);
  for (int i = 0; i < n; ++i) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0: if (!s.empty() && pos < s.size()) s[pos] = char(rng()); break;                    // byte
      case 1: s.insert(pos, kTokens[rng() % std::size(kTokens)]); break;                           // token
      case 2: if (pos < s.size()) s.erase(pos, 1 + rng() % 8); break;                              // delete
      case 3: if (pos < s.size()) s.insert(pos, s.substr(pos, 1 + rng() % 16)); break;             // repeat
      case 4: s.resize(pos); break;                                                                // truncate
      case 5: if (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) s[pos] = char('0' + rng() % 10); break;
    }
  }
}

void check_one(const std::string& text, uint64_t data_size, int* ok, int* rejected) {
  try {
    std::map<std::string, std::string> meta;
    const auto tensors = parse_safetensors_header(text, data_size, &meta, "smoke.safetensors");
    uint64_t cursor = 0;
    for (const TensorInfo& t : tensors) {
      ASSERT_EQ(t.begin, cursor) << text;
      ASSERT_EQ(uint64_t(t.numel()) * dtype_size(t.dtype), t.nbytes()) << text;
      cursor = t.end;
    }
    ASSERT_EQ(cursor, data_size) << text;
    ++*ok;
  } catch (const Error& e) {
    const std::string msg = e.what();
    ASSERT_EQ(msg.find('\n'), std::string::npos) << msg;
    ASSERT_EQ(msg.rfind("smoke.safetensors: ", 0), 0u) << msg;
    ++*rejected;
  }
  // Any other exception type escapes and fails the test.
}

TEST(SafetensorsFuzzSmokeTest, MutatedHeaders) {
  std::mt19937_64 rng(20260);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    auto [h, size] = valid_header(rng);
    if (iter % 4 != 0) mutate(h, rng);
    const uint64_t data_size = rng() % 8 == 0 ? rng() % 64 : size;
    check_one(h, data_size, &ok, &rejected);
    if (HasFatalFailure()) return;
  }
  // Both paths were exercised.
  EXPECT_GT(ok, 1000);
  EXPECT_GT(rejected, 1000);
}

TEST(SafetensorsFuzzSmokeTest, RandomBytes) {
  std::mt19937_64 rng(7);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = char(rng());
    if (iter % 2) s.insert(0, "{");
    check_one(s, rng() % 16, &ok, &rejected);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(rejected, 1900);
}

}  // namespace
}  // namespace fp4moe
