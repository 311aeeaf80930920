// Input and output helpers shared by the text commands (tokenize, detokenize, chat-template).
#pragma once

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/log.hpp"
#include "text/tokenizer.hpp"

namespace fp4moe::cli {

// All bytes of `path`, or of stdin when path is "-".
inline std::string read_input(const std::string& path) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream f(path, std::ios::binary);
    FP4MOE_CHECK(f, "{}: cannot open", path);
    ss << f.rdbuf();
  }
  return ss.str();
}

inline nlohmann::ordered_json parse_input_json(const std::string& text, const std::string& path) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    FP4MOE_FAIL("{}: not valid JSON: {}", path == "-" ? "stdin" : path, e.what());
  }
}

// Loads the tokenizer of a model folder and says what was loaded on stderr.
inline text::Tokenizer load_tokenizer(const std::string& dir) {
  text::Tokenizer tok = text::Tokenizer::from_dir(dir);
  log_info("{}", tok.summary());
  return tok;
}

inline void print_json(const nlohmann::ordered_json& j) {
  const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace fp4moe::cli
