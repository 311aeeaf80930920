// A progress bar on stderr for long work, drawn only when stderr is a terminal.
//
//   ProgressBar bar("requests", total);
//   bar.advance();          // from any thread
//   bar.finish();           // final line, then a newline (the destructor does it too)
//
// Redraws at most ten times a second; off (no output at all) when stderr is not a terminal
// or when constructed with enabled = false.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace fp4moe {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled = true);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void advance(int64_t n = 1);
  void finish();
  bool shown() const { return shown_; }

  // The line drawn for done of total after `seconds` (no terminal control characters).
  static std::string render(const std::string& label, int64_t done, int64_t total, double seconds, int width = 30);

 private:
  void draw(bool force);

  std::string label_;
  int64_t total_ = 0;
  int64_t done_ = 0;
  bool shown_ = false;
  bool finished_ = false;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace fp4moe
