// fp4moe: the command-line entry point. Subcommands live in cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <new>
#include <string>

#include "cli/command.hpp"
#include "core/error.hpp"

namespace fp4moe::cli {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace fp4moe::cli

int main(int argc, char** argv) {
  using namespace fp4moe::cli;
  CLI::App app{"fp4moe: an inference engine for FP4 (NVFP4/MXFP4) Mixture-of-Experts models"};
  app.set_version_flag("--version", std::string("fp4moe ") + FP4MOE_VERSION);
  app.require_subcommand(1);

  auto& cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> runs;
  // "bench gemm" registers `gemm` under a `bench` group created on first use.
  std::map<std::string, CLI::App*> groups;
  for (const Command& c : cmds) {
    CLI::App* parent = &app;
    std::string name = c.name;
    if (auto sp = name.find(' '); sp != std::string::npos) {
      std::string group = name.substr(0, sp);
      name = name.substr(sp + 1);
      CLI::App*& g = groups[group];
      if (!g) {
        g = app.add_subcommand(group, group + " subcommands");
        g->require_subcommand(1);
      }
      parent = g;
    }
    CLI::App* sub = parent->add_subcommand(name, c.description);
    c.setup(*sub, runs[sub]);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints usage / --help / the parse error
    return rc == 0 ? 0 : 2;
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed() && run) return run();
    std::fprintf(stderr, "fp4moe: no subcommand given (see --help)\n");
    return 2;
  } catch (const fp4moe::Error& e) {
    std::fprintf(stderr, "fp4moe: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fp4moe: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4moe: internal error: %s\n", e.what());
    return 1;
  }
}
