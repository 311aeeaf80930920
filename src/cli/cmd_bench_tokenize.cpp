// fp4moe bench tokenize DIR --corpus FILE: encoding speed of a model folder's tokenizer on
// one core, in MB/s of input text.
//
// The corpus is a JSON list of documents (bench/text_tokenize.py writes a mixed-language
// one). Every repetition encodes every document once, in order, on this thread (the word
// cache starts empty: the first repetition is cold, later ones warm); the best repetition
// and the cold one are reported. The FNV-1a hash of all ids lets the caller check that the
// ids equal another implementation's on the same corpus. Speeds are given per CPU second of
// this thread (the dev machines are shared: wall time measures the neighbours) and per
// wall second.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/text_io.hpp"

namespace fp4moe {
namespace {

struct BenchTokenizeArgs {
  std::string dir, corpus;
  int reps = 3;
  bool add_special = false;
};

int run_bench_tokenize(const BenchTokenizeArgs& a) {
  const text::Tokenizer tok = cli::load_tokenizer(a.dir);
  const auto docs_json = cli::parse_input_json(cli::read_input(a.corpus), a.corpus);
  FP4MOE_CHECK(docs_json.is_array(), "{}: the corpus must be a JSON list of strings", a.corpus);
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (const auto& d : docs_json) {
    FP4MOE_CHECK(d.is_string(), "{}: the corpus must be a JSON list of strings", a.corpus);
    docs.push_back(d.get<std::string>());
    bytes += docs.back().size();
  }
  const auto cpu_now = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  std::vector<double> seconds, cpu;
  size_t tokens = 0;
  uint64_t fnv = 0;
  for (int r = 0; r < a.reps; ++r) {
    tokens = 0;
    fnv = 0xcbf29ce484222325ull;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    for (const std::string& d : docs) {
      const std::vector<int32_t> ids = tok.encode(d, a.add_special);
      tokens += ids.size();
      for (int32_t id : ids) fnv = (fnv ^ uint64_t(uint32_t(id))) * 0x100000001b3ull;
    }
    cpu.push_back(cpu_now() - c0);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double best = *std::min_element(seconds.begin(), seconds.end());
  const double best_cpu = *std::min_element(cpu.begin(), cpu.end());
  nlohmann::ordered_json out;
  out["docs"] = docs.size();
  out["bytes"] = bytes;
  out["tokens"] = tokens;
  out["ids_fnv1a"] = fmt::format("{:016x}", fnv);
  out["cold_seconds"] = seconds.front();
  out["best_seconds"] = best;
  out["cold_mb_per_s"] = double(bytes) / seconds.front() / 1e6;
  out["best_mb_per_s"] = double(bytes) / best / 1e6;
  out["cold_cpu_seconds"] = cpu.front();
  out["best_cpu_seconds"] = best_cpu;
  out["cold_mb_per_cpu_s"] = double(bytes) / cpu.front() / 1e6;
  out["best_mb_per_cpu_s"] = double(bytes) / best_cpu / 1e6;
  cli::print_json(out);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchTokenizeArgs>();
  app.add_option("dir", a->dir, "model folder with tokenizer.json")->required();
  app.add_option("--corpus", a->corpus, "JSON list of documents (bench/text_tokenize.py writes one)")->required();
  app.add_option("--reps", a->reps, "repetitions over the corpus (default 3)")->check(CLI::PositiveNumber);
  app.add_flag("--add-special-tokens", a->add_special, "add the post-processor's special tokens");
  run = [a] { return run_bench_tokenize(*a); };
}

const cli::Registrar kRegistrar{"bench tokenize", "Tokenizer encoding speed (MB/s, one core) on a corpus", setup};

}  // namespace
}  // namespace fp4moe
