// Helpers shared by the text/ tests: the golden data folder and file reading.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace fp4moe::text::testing {

inline std::string data_dir() { return std::string(FP4MOE_SOURCE_DIR) + "/tests/text/data"; }

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline nlohmann::ordered_json read_json(const std::string& path) { return nlohmann::ordered_json::parse(read_file(path)); }

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += char(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// The raw input bytes of a golden case ("text", or "bytes_hex" for ill-formed UTF-8).
inline std::string case_input(const nlohmann::ordered_json& c) {
  return c.contains("text") ? c.at("text").get<std::string>() : from_hex(c.at("bytes_hex").get<std::string>());
}

}  // namespace fp4moe::text::testing
