// The `atoll` binary: parses flags and dispatches to a sub-command registered by a module's
// command file (see command.h). No algorithm lives here.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "atoll/core/platform.h"
#include "command.h"

namespace atl::cli {
std::vector<CommandEntry>& CommandRegistry() {
  static std::vector<CommandEntry> registry;
  return registry;
}
std::vector<RenamedCommand>& RenamedCommands() {
  static std::vector<RenamedCommand> renamed;
  return renamed;
}
}  // namespace atl::cli

int main(int argc, char** argv) {
  // Before anything can load OpenBLAS: choose its core type from the CPU flags (never override).
  atl::EnsureBlasEnvironmentOrReexec(argc, argv);
  atl::KeepFreedMemory();  // training steps reuse their pages instead of faulting in new ones

  CLI::App app{
      "atoll — Decoupled DiLoCo: train language models across islands of compute.\n"
      "Learners train on their own clocks and exchange parameter fragments with a central\n"
      "syncer; failures stay local. See README.md and docs/ for more."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "atoll 0.1.0");
  atl::cli::CommandContext ctx;
  auto entries = atl::cli::CommandRegistry();
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  for (const auto& e : entries) e.registrar(app, ctx);

  for (const auto& r : atl::cli::RenamedCommands()) {
    if (argc > 1 && r.old_name == argv[1]) {
      std::fprintf(stderr, "atoll: note: `atoll %s` is now `atoll %s` (the old name is deprecated)\n",
                   r.old_name.c_str(), r.new_name.c_str());
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!ctx.action) {
    std::fprintf(stderr, "atoll: the chosen command has nothing to run (internal error)\n");
    return 2;
  }
  try {
    return ctx.action();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atoll: error: %s\n", e.what());
    return 1;
  }
}
