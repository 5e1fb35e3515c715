// Sub-command registry of the `atoll` binary. Each module's command file (src/cli/*_cmd.cc)
// registers itself with ATOLL_COMMAND; main() builds the CLI11 app from the registry, parses,
// and runs the one action the chosen sub-command installed. Mains only parse flags and call the
// library: command files hold option structs and a call, never algorithms.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "atoll/core/enum_names.h"

namespace atl::cli {

// An option whose value is one of an enum's spellings (the EnumNames beside the enum, found by
// ADL): parsed here, at the edge, so the command sees only the enum. The help ends with the
// spellings and the default, both from the code: "<help>: a | b | c (default a)".
template <typename E>
CLI::Option* AddEnumOption(CLI::App* app, const std::string& names, E& value, const std::string& help) {
  const auto& spellings = NamesOf(value);
  return app->add_option_function<std::string>(
      names,
      [&value, names](const std::string& s) {
        auto parsed = NamesOf(value).Parse(s);
        if (!parsed.ok()) throw CLI::ValidationError(names, parsed.status().message());
        value = *parsed;
      },
      help + ": " + spellings.Alternatives(" | ", " | ") + " (default " + spellings.Name(value) + ")");
}

// The action a sub-command installs in its callback; its return value is the exit code.
using Action = std::function<int()>;

struct CommandContext {
  Action action;
};

using Registrar = void (*)(CLI::App& app, CommandContext& ctx);

struct CommandEntry {
  int order;  // position in `atoll --help` (lower first)
  Registrar registrar;
};

std::vector<CommandEntry>& CommandRegistry();

// A sub-command's former name, kept working as a CLI11 alias: main() prints a note naming the new
// one when a command line uses the old.
struct RenamedCommand {
  std::string old_name, new_name;
};
std::vector<RenamedCommand>& RenamedCommands();

struct CommandRegistration {
  CommandRegistration(int order, Registrar r) { CommandRegistry().push_back({order, r}); }
};

}  // namespace atl::cli

#define ATOLL_COMMAND_CONCAT_INNER(a, b) a##b
#define ATOLL_COMMAND_CONCAT(a, b) ATOLL_COMMAND_CONCAT_INNER(a, b)
// ATOLL_COMMAND(order, fn): registers fn(CLI::App&, CommandContext&) as a sub-command source.
#define ATOLL_COMMAND(order, fn) \
  static ::atl::cli::CommandRegistration ATOLL_COMMAND_CONCAT(atoll_command_registration_, __LINE__)(order, fn)
