#include "syncer_start.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"

namespace atl::runtime {

int SyncerFail(const Status& st, int code) {
  std::fprintf(stderr, "atoll syncer: error: %s\n", st.ToString().c_str());
  return code;
}

namespace {

// Removes what a killed syncer left half-written, in the state folder and the run folder (a model
// write is as large as the model).
void RemoveStaleFiles(syncer::DurableState& durable, const std::string& out) {
  std::vector<std::string> stale = durable.RemoveStaleTempFiles();
  if (auto files =
          RemoveStaleTempFiles(out, {"global.safetensors", "syncer-summary.json", "config.json", "status-url"});
      files.ok()) {
    for (const auto& f : *files) stale.push_back(out + "/" + f);
  }
  for (const std::string& f : stale)
    std::printf("syncer: removed %s (a write a killed syncer left unfinished)\n", f.c_str());
}

// Restores a saved state into the core, or writes the initial one.
int ResumeOrSave(OpenedCore& out, bool rebuild, bool run_began) {
  auto contents = out.durable->Inspect();  // a damaged or foreign folder is refused, never overwritten
  if (!contents.ok()) return SyncerFail(contents.status(), 2);
  out.resumed = *contents == syncer::DurableState::Contents::kSaved;
  if (out.resumed && rebuild) {
    return SyncerFail(FailedPreconditionError(
                          "--rebuild is for a syncer whose state was lost, but " + out.durable->dir() +
                          " holds a committed state: a rebuild would discard it (start without --rebuild to resume "
                          "from it, or move it away first)"),
                      2);
  }
  out.rebuild = rebuild || (run_began && !out.resumed);
  if (!out.resumed) {
    if (Status st = out.durable->SaveAll(*out.core); !st.ok())
      return SyncerFail(st.WithContext("writing the initial state"), 1);
    return 0;
  }
  if (Status st = out.durable->Restore(*out.core, RealClock::Default().Now()); !st.ok()) {
    const char* hint =
        st.code() == StatusCode::kFailedPrecondition ? " (point --state at a fresh folder to start over)" : "";
    return SyncerFail(Status(st.code(), st.message() + hint).WithContext("resuming from " + out.durable->dir()), 2);
  }
  std::printf("syncer: resumed from %s: %lld committed rounds, fragment versions %s\n", out.durable->dir().c_str(),
              static_cast<long long>(out.core->rounds_closed()), nlohmann::json(out.core->versions()).dump().c_str());
  PrintStateWarnings(out);
  return 0;
}

}  // namespace

std::string StateDirOf(const SyncerProcessOptions& opt) {
  if (!opt.state_dir.empty()) return opt.state_dir;
  return (opt.out_dir.empty() ? std::string(".") : opt.out_dir) + "/state";
}

int OpenCore(const RunConfig& c, const SyncerProcessOptions& opt, const ModelHost& model,
             const diloco::FragmentPlan& plan, syncer::SyncerOptions options, OpenedCore& out, bool run_began) {
  std::vector<std::vector<float>> initial(plan.fragments.size());
  for (const auto& f : plan.fragments) {
    if (!options.shard.owns(f.index)) continue;  // another shard's: not needed here
    auto& values = initial[static_cast<size_t>(f.index)];
    values.resize(static_cast<size_t>(f.numel));
    if (Status st = model.Initial(f, values); !st.ok()) return SyncerFail(st.WithContext("initial values"), 2);
  }
  auto core = syncer::SyncerCore::Create(std::move(options), plan, std::move(initial));
  if (!core.ok()) return SyncerFail(core.status(), 2);
  out.core = std::move(*core);
  const std::string out_dir = opt.out_dir.empty() ? "." : opt.out_dir;
  out.durable = std::make_unique<syncer::DurableState>(StateDirOf(opt));
  RemoveStaleFiles(*out.durable, out_dir);
  return ResumeOrSave(out, opt.rebuild, run_began);
}

void PrintStateWarnings(OpenedCore& opened) {
  const auto& warnings = opened.durable->warnings();
  for (; opened.warnings_printed < warnings.size(); ++opened.warnings_printed) {
    std::fprintf(stderr, "syncer: warning: %s\n", warnings[opened.warnings_printed].c_str());
  }
}

StatusOr<std::optional<double>> StartEvaluation(const ModelHost& model, OpenedCore& opened, int batches) {
  if (model.evaluator() == nullptr) {
    std::printf("syncer: no evaluation: %s\n", model.no_evaluation().c_str());
    return std::optional<double>();
  }
  std::optional<double> loss = opened.resumed ? opened.durable->SavedStartEval() : std::nullopt;
  PrintStateWarnings(opened);  // a damaged file is evaluated again, not a blocked restart
  if (!loss) {
    ATOLL_ASSIGN_OR_RETURN(auto e, model.evaluator()->Evaluate(batches));
    loss = e.loss;
    (void)opened.durable->SaveStartEval(e.loss);
  }
  std::printf("syncer: eval loss of the initial global model %.4f\n", *loss);
  std::fflush(stdout);
  return loss;
}

syncer::DdpStep MakeDdpStep(const ModelHost& model, const diloco::FragmentPlan& plan) {
  return [&model, &plan](std::span<const float> mean, std::span<float> theta) -> Status {
    model::Trainer& ev = *model.evaluator();
    const diloco::Fragment& frag = plan.fragments[0];
    const auto grads = model::GradientViews(ev), params = model::ParameterViews(ev);
    exchange::ScatterFragment(frag, mean, grads);
    exchange::ScatterFragment(frag, theta, params);
    ATOLL_RETURN_IF_ERROR(ev.ApplyGradients(model::StepStats{}).status());
    exchange::GatherFragment(frag, params, theta);
    return Status::Ok();
  };
}

StatusOr<transport::ServerOptions> ServerOptionsOf(const SyncerProcessOptions& opt, const RunConfig& c) {
  transport::ServerOptions so;
  so.address = opt.listen;
  so.token = c.token;
  if (!opt.secret_file.empty()) {
    ATOLL_ASSIGN_OR_RETURN(so.secret, ReadSecretFile(opt.secret_file));
  }
  so.limits = MakeServerLimits(c);
  so.allowed_learners = c.allowed_learners;
  so.tls.enabled = !opt.tls.cert.empty();
  so.tls.cert_file = opt.tls.cert;
  so.tls.key_file = opt.tls.key;
  so.tls.client_ca_file = opt.tls.client_ca;
  if (!so.tls.client_ca_file.empty() && !so.tls.enabled) {
    return InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS runs over TLS");
  }
  if (IsLoopbackAddress(so.address)) return so;
  if (so.token.empty() && so.secret.empty()) {
    return FailedPreconditionError("refusing to listen on " + so.address +
                                   " without credentials: give --secret-file (per-learner) or --token");
  }
  if (!so.tls.enabled) {
    std::fprintf(stderr,
                 "syncer: WARNING: listening on %s without TLS: tokens and model values travel in plaintext "
                 "(--tls-cert/--tls-key)\n",
                 so.address.c_str());
  }
  return so;
}

Status WriteRunConfigOnce(const std::string& out_dir, const RunConfig& c) {
  const std::string path = out_dir + "/config.json";
  if (FileExists(path)) return Status::Ok();
  return WriteFileOwnerOnly(path, ToJson(c).dump(2));
}

void RaiseDescriptorLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &r);
  }
}

}  // namespace atl::runtime
