// `atoll report RUN`: report.html with SVG plots from a run folder's metrics (observe/run_report.h).
#include <cstdio>
#include <memory>

#include "atoll/observe/run_report.h"
#include "command.h"

namespace atl::cli {
namespace {

void RegisterReport(CLI::App& app, CommandContext& ctx) {
  auto dir = std::make_shared<std::string>();
  auto* c = app.add_subcommand(
      "report",
      "Write RUN/report.html: the run's numbers and SVG plots (loss vs tokens and vs time with fault\n"
      "markers, tokens trained vs merged, bytes on the wire vs data-parallel, contributors and grace\n"
      "per round) from the metrics files of an `atoll run` or `atoll train` folder. Self-contained:\n"
      "open it in any browser, offline. `atoll run` and `atoll train` write it at their end.");
  c->add_option("run", *dir, "The run folder")->required();
  c->callback([&ctx, dir] {
    ctx.action = [dir] {
      auto r = observe::WriteRunReport(*dir);
      if (!r.ok()) {
        std::fprintf(stderr, "atoll report: error: %s\n", r.status().ToString().c_str());
        return r.status().code() == StatusCode::kInternal ? 1 : 2;
      }
      std::printf("report of the %s in %s: %s (%d figures)\n", r->kind.c_str(), dir->c_str(), r->path.c_str(),
                  r->figures);
      return 0;
    };
  });
}

}  // namespace
}  // namespace atl::cli

ATOLL_COMMAND(30, atl::cli::RegisterReport);
