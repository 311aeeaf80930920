#include "core/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace fp4moe {

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 0)), shown_(enabled && isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {
  if (shown_) draw(true);
}

ProgressBar::~ProgressBar() { finish(); }

std::string ProgressBar::render(const std::string& label, int64_t done, int64_t total, double seconds, int width) {
  const double frac = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 1.0;
  const int filled = int(frac * width);
  std::string bar(size_t(filled), '#');
  bar.resize(size_t(width), '.');
  const double rate = seconds > 0 ? double(done) / seconds : 0.0;
  return fmt::format("{} [{}] {}/{} ({:3.0f}%) {:.1f} s, {:.2f}/s", label, bar, done, total, frac * 100.0, seconds, rate);
}

void ProgressBar::advance(int64_t n) {
  if (!shown_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_ += n;
  draw(false);
}

void ProgressBar::finish() {
  if (!shown_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  draw(true);
  std::fputc('\n', stderr);
  finished_ = true;
}

void ProgressBar::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_draw_ = now;
  const double s = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s\x1b[K", render(label_, done_, total_, s).c_str());
  std::fflush(stderr);
}

}  // namespace fp4moe
