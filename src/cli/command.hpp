// Subcommand registry of the `fp4moe` binary.
//
// Each cmd_*.cpp defines one subcommand and registers it with a static Registrar:
//
//   static void setup(CLI::App& app, std::function<int()>& run) { ... add options ...
//                                                                 run = [=] { ...; return 0; }; }
//   static fp4moe::cli::Registrar reg{"inspect", "Describe a checkpoint", setup};
//
// A name with a space ("bench gemm") nests under a group subcommand ("bench").
// The run callback returns the exit code; an fp4moe::Error escaping it becomes
// "fp4moe: <message>" on stderr and exit code 1 (usage errors exit 2).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace fp4moe::cli {

using Setup = void (*)(CLI::App& sub, std::function<int()>& run);

struct Command {
  std::string name, description;
  Setup setup;
};

std::vector<Command>& registry();

// The GPU benches' --l2-flush option (cuda/bench's ColdL2Timer, parsed by bench::l2_flush_from).
inline CLI::Option* add_l2_flush_option(CLI::App& app, std::string& value) {
  return app.add_option("--l2-flush", value,
                        "how L2 is emptied before each timed run: write (a memset: L2 left dirty, the timed run "
                        "also pays the write-backs) or read (a read kernel: L2 left clean)")
      ->capture_default_str();
}

struct Registrar {
  Registrar(std::string name, std::string description, Setup setup) {
    registry().push_back({std::move(name), std::move(description), setup});
  }
};

}  // namespace fp4moe::cli
