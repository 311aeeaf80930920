#include "core/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace fp4moe {
namespace {

LogLevel level_from_env() {
  const char* s = std::getenv("FP4MOE_LOG_LEVEL");
  if (!s) return LogLevel::Info;
  std::string v(s);
  if (v == "debug") return LogLevel::Debug;
  if (v == "warn") return LogLevel::Warn;
  if (v == "error") return LogLevel::Error;
  if (v == "off") return LogLevel::Off;
  return LogLevel::Info;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_ref().store(level); }

void log_write(LogLevel level, std::string_view msg) {
  static std::mutex mu;
  static constexpr const char* kTag[] = {"debug", "info", "warn", "error", ""};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "fp4moe %s: %.*s\n", kTag[int(level)], int(msg.size()), msg.data());
}

}  // namespace fp4moe
