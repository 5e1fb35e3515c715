// The C API (include/atoll/c_api.h) over LearnerAgent and the gRPC client: open, step, close
// and the settings. Every entry point validates its arguments before touching state and turns a
// Status into a code + thread-local message; no C++ exception crosses the boundary.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/diloco/mode.h"
#include "c_api_internal.h"

atoll_learner::~atoll_learner() {
  agent.reset();  // its threads stop before the client they call goes
  if (state_lock_fd >= 0) ::close(state_lock_fd);
}

namespace atl::capi {
namespace {
thread_local std::string last_error;
}  // namespace

atoll_status Report(const Status& st) {
  if (st.ok()) {
    last_error.clear();
    return ATOLL_OK;
  }
  last_error = st.message();
  switch (st.code()) {
    case StatusCode::kInvalidArgument: return ATOLL_INVALID_ARGUMENT;
    case StatusCode::kDeadlineExceeded: return ATOLL_DEADLINE_EXCEEDED;
    case StatusCode::kNotFound: return ATOLL_NOT_FOUND;
    case StatusCode::kAlreadyExists: return ATOLL_ALREADY_EXISTS;
    case StatusCode::kPermissionDenied: return ATOLL_PERMISSION_DENIED;
    case StatusCode::kResourceExhausted: return ATOLL_RESOURCE_EXHAUSTED;
    case StatusCode::kFailedPrecondition: return ATOLL_FAILED_PRECONDITION;
    case StatusCode::kInternal: return ATOLL_INTERNAL;
    case StatusCode::kUnavailable: return ATOLL_UNAVAILABLE;
    case StatusCode::kUnauthenticated: return ATOLL_UNAUTHENTICATED;
    default: last_error = st.ToString(); return ATOLL_OTHER;
  }
}

atoll_learner_settings SettingsOf(const atoll_learner_settings* given) {
  atoll_learner_settings s;
  atoll_learner_settings_init(&s);
  if (given != nullptr) {
    const size_t n = std::min(given->struct_size, sizeof(s));
    std::memcpy(&s, given, n);  // the fields an older caller knows; the defaults after them
    s.struct_size = sizeof(s);
  }
  return s;
}

const char* LastError() { return last_error.c_str(); }

}  // namespace atl::capi

namespace {

using atl::Status;
using atl::StatusCode;
using atl::StatusOr;
using atl::capi::Report;

using atl::capi::Str;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// This learner's tensor list, for a refused join (the syncer only knows a hash of it).
std::string DescribeTensors(const std::vector<atl::diloco::TensorSpec>& tensors) {
  std::string s;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i == 12) return s + ", ... (" + std::to_string(tensors.size()) + " tensors)";
    s +=
        (i ? ", " : "") + tensors[i].name + " " + ShapeText(tensors[i].shape) + (tensors[i].is_embedding ? " emb" : "");
  }
  return s;
}

StatusOr<atl::diloco::TensorSpec> SpecOf(const atoll_param& p, size_t index, std::set<std::string>& names) {
  const std::string where = "parameter " + std::to_string(index);
  if (p.name == nullptr || p.name[0] == '\0') return atl::InvalidArgumentError(where + " has no name");
  atl::diloco::TensorSpec t;
  t.name = p.name;
  if (!names.insert(t.name).second) return atl::InvalidArgumentError("parameter name '" + t.name + "' repeats");
  if (p.data == nullptr) return atl::InvalidArgumentError("parameter '" + t.name + "' has no data (NULL)");
  if (p.ndim < 0 || p.ndim > 8) {
    return atl::InvalidArgumentError("parameter '" + t.name + "' has ndim " + std::to_string(p.ndim) + " (0..8)");
  }
  if (p.ndim > 0 && p.shape == nullptr)
    return atl::InvalidArgumentError("parameter '" + t.name + "' has no shape (NULL)");
  t.numel = 1;
  for (int d = 0; d < p.ndim; ++d) {
    if (p.shape[d] < 1 || p.shape[d] > (int64_t{1} << 40) / t.numel) {
      return atl::InvalidArgumentError("parameter '" + t.name + "' has dimension " + std::to_string(d) + " = " +
                                       std::to_string(p.shape[d]) + " (each must be ≥ 1, the tensor < 2^40 values)");
    }
    t.shape.push_back(p.shape[d]);
    t.numel *= p.shape[d];
  }
  t.is_embedding = p.is_embedding != 0;
  return t;
}

Status CheckOptions(const atoll_learner_options& o) {
  if (Str(o.syncer).empty()) return atl::InvalidArgumentError("options.syncer (host:port) is required");
  if (o.run_id == nullptr)
    return atl::InvalidArgumentError("options.run_id is NULL (the syncer's run id; may be \"\")");
  if (o.learner_id < -1)
    return atl::InvalidArgumentError("options.learner_id " + std::to_string(o.learner_id) + " (≥ 0, or -1)");
  auto mode = atl::diloco::ParseMode(Str(o.mode));
  if (!mode.ok()) return mode.status().WithContext("options.mode");
  if (*mode == atl::diloco::Mode::kDdp) {
    return atl::InvalidArgumentError("options.mode 'ddp' is not supported by the C API (it exchanges gradients)");
  }
  if (auto plan = atl::diloco::ParsePlanStrategy(Str(o.plan)); !plan.ok())
    return plan.status().WithContext("options.plan");
  ATOLL_RETURN_IF_ERROR(atl::diloco::Schedule::Of(*mode, o.H, o.fragments, o.tau).Validate());
  if (!(o.alpha >= 0 && o.alpha < 1)) return atl::InvalidArgumentError("options.alpha must be in [0, 1)");
  if (!(o.join_timeout_s >= 0 && o.join_timeout_s <= 3600)) {
    return atl::InvalidArgumentError("options.join_timeout_s must be in [0, 3600]");
  }
  if ((o.tls_cert_file == nullptr) != (o.tls_key_file == nullptr)) {
    return atl::InvalidArgumentError("options.tls_cert_file and tls_key_file go together");
  }
  return Status::Ok();
}

Status CheckSettings(const atoll_learner_settings& s, const atoll_param* params, size_t n) {
  const std::pair<const char*, double> positive[] = {{"call_timeout_s", s.call_timeout_s},
                                                     {"push_timeout_s", s.push_timeout_s},
                                                     {"heartbeat_s", s.heartbeat_s},
                                                     {"backoff_initial_s", s.backoff_initial_s},
                                                     {"backoff_max_s", s.backoff_max_s}};
  for (const auto& [name, v] : positive) {
    if (!(v > 0 && v <= 86400)) {
      return atl::InvalidArgumentError(std::string("settings.") + name + " " + std::to_string(v) +
                                       " (must be in (0, 86400] s)");
    }
  }
  if (!(s.min_link_mbps >= 0 && s.min_link_mbps <= 1e6)) {
    return atl::InvalidArgumentError("settings.min_link_mbps " + std::to_string(s.min_link_mbps) +
                                     " (0 to 1e6; 0: no allowance)");
  }
  if (s.backoff_max_s < s.backoff_initial_s) {
    return atl::InvalidArgumentError("settings.backoff_max_s is below backoff_initial_s");
  }
  for (size_t i = 0; s.staged != nullptr && i < n; ++i) {
    if (s.staged[i] != 0 && s.staged[i] != 1) {
      return atl::InvalidArgumentError(
          "settings.staged[" + std::to_string(i) + "] is " + std::to_string(s.staged[i]) + " (0 or 1)" +
          (params != nullptr && params[i].name ? std::string(" for '") + params[i].name + "'" : ""));
    }
  }
  return Status::Ok();
}

StatusOr<atl::transport::ClientOptions> ClientOptionsOf(const atoll_learner_options& o,
                                                        const atoll_learner_settings& s) {
  atl::transport::ClientOptions co;
  co.target = o.syncer;
  co.call_timeout_s = s.call_timeout_s;
  co.push_timeout_s = s.push_timeout_s;
  co.min_link_mbps = s.min_link_mbps;
  co.token = Str(o.token);
  if (o.token_file != nullptr) {
    ATOLL_ASSIGN_OR_RETURN(std::string text, atl::ReadFile(o.token_file));
    const auto first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos)
      return atl::InvalidArgumentError(Str(o.token_file) + " is empty (expected a token)");
    co.token = text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
  }
  co.tls.enabled = o.tls_ca_file != nullptr || o.tls_cert_file != nullptr;
  co.tls.ca_file = Str(o.tls_ca_file);
  co.tls.server_name = Str(o.tls_server_name);
  co.tls.cert_file = Str(o.tls_cert_file);
  co.tls.key_file = Str(o.tls_key_file);
  return co;
}

atl::learner::AgentOptions AgentOptionsOf(const atoll_learner_options& o, const atoll_learner_settings& s,
                                          atl::diloco::Mode mode, size_t num_params) {
  atl::learner::AgentOptions ao;
  ao.run_id = o.run_id;
  ao.learner_id = o.learner_id;
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  ao.host = std::string(host) + ":" + std::to_string(::getpid());
  ao.rejoin = o.rejoin != 0;
  ao.schedule = atl::diloco::Schedule::Of(mode, o.H, o.fragments, o.tau);
  ao.alpha = o.alpha;
  ao.keep_progress = o.keep_progress != 0;
  ao.initial_join_timeout_s = o.join_timeout_s;
  ao.check_schedule = true;
  ao.heartbeat_s = s.heartbeat_s;
  ao.backoff_initial_s = s.backoff_initial_s;
  ao.backoff_max_s = s.backoff_max_s;
  ao.state_dir = atl::capi::Str(s.state_dir);
  if (s.staged != nullptr) {
    ao.staged.assign(num_params, false);
    for (size_t i = 0; i < num_params; ++i) ao.staged[i] = s.staged[i] != 0;
  }
  return ao;
}

StatusOr<std::unique_ptr<atoll_learner>> Open(atoll_learner_options o, const atoll_learner_settings& settings,
                                              const atoll_param* params, size_t n) {
  ATOLL_RETURN_IF_ERROR(CheckOptions(o));
  if (params == nullptr || n == 0)
    return atl::InvalidArgumentError("no parameters (params is NULL or num_params is 0)");
  ATOLL_RETURN_IF_ERROR(CheckSettings(settings, params, n));
  std::vector<atl::diloco::TensorSpec> specs;
  std::vector<std::span<float>> views;
  std::set<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    ATOLL_ASSIGN_OR_RETURN(auto spec, SpecOf(params[i], i, names));
    views.emplace_back(params[i].data, static_cast<size_t>(spec.numel));
    specs.push_back(std::move(spec));
  }
  atl::diloco::PlanOptions po;
  po.num_fragments = o.fragments;
  po.strategy = *atl::diloco::ParsePlanStrategy(atl::capi::Str(o.plan));  // CheckOptions read it
  auto l = std::make_unique<atoll_learner>();
  ATOLL_ASSIGN_OR_RETURN(l->plan, atl::diloco::MakeFragmentPlan(specs, po));
  ATOLL_ASSIGN_OR_RETURN(auto co, ClientOptionsOf(o, settings));
  l->run_id = o.run_id;
  if (const std::string dir = atl::capi::Str(settings.state_dir); !dir.empty()) {
    bool rejoin = o.rejoin != 0;
    ATOLL_RETURN_IF_ERROR(atl::capi::OpenState(*l, dir, l->plan.num_fragments(), o.learner_id, rejoin));
    o.rejoin = rejoin ? 1 : 0;
  }
  ATOLL_ASSIGN_OR_RETURN(l->client, atl::transport::GrpcSyncerClient::Connect(co));
  const atl::diloco::Mode mode = *atl::diloco::ParseMode(atl::capi::Str(o.mode));  // CheckOptions read it
  l->agent = std::make_unique<atl::learner::LearnerAgent>(AgentOptionsOf(o, settings, mode, n), l->plan,
                                                          std::move(views), *l->client, atl::RealClock::Default());
  if (Status st = l->agent->Start(); !st.ok()) {
    if (st.message().find("model signature") == std::string::npos) return st;
    return Status(st.code(), st.message() + "; this learner's tensors: " + DescribeTensors(specs) +
                                 " — the syncer must be started with a model of these names, shapes and order");
  }
  if (l->agent->counters().joined) atl::capi::WriteState(*l);
  return l;
}

// A step of the caller's loop finished: the agent's after-step rule (LearnerAgent::AfterStep),
// then the progress the heartbeats report. Returns the merges applied.
int StepDone(atoll_learner& l, int64_t tokens, double loss) {
  const int n = l.agent->AfterStep(l.step, tokens).applied;
  ++l.step;
  l.tokens += tokens;
  l.loss = loss;
  atl::learner::Progress p;
  p.step = l.step;
  p.tokens = l.tokens;
  p.loss = loss;
  l.agent->SetProgress(p);
  return n;
}

}  // namespace

extern "C" {

void atoll_learner_options_init(atoll_learner_options* o) {
  if (o == nullptr) return;
  // The defaults of the structs these options become (AgentOptions, PlanOptions, Schedule).
  static const std::string run_id = atl::learner::AgentOptions{}.run_id;
  const atl::learner::AgentOptions agent;
  *o = atoll_learner_options{};
  o->run_id = run_id.c_str();
  o->learner_id = agent.learner_id;
  o->mode = atl::diloco::ModeName(atl::diloco::Mode::kDecoupled);
  o->plan = atl::diloco::PlanStrategyName(atl::diloco::PlanOptions{}.strategy);
  const atl::diloco::Schedule schedule;
  o->fragments = schedule.P;
  o->H = schedule.H;
  o->tau = schedule.tau;
  o->alpha = agent.alpha;
  o->keep_progress = agent.keep_progress ? 1 : 0;
  o->join_timeout_s = agent.initial_join_timeout_s;
}

int atoll_c_api_version(void) { return ATOLL_C_API_VERSION; }

void atoll_learner_settings_init(atoll_learner_settings* s) {
  if (s == nullptr) return;
  const atl::transport::ClientOptions co;
  const atl::learner::AgentOptions ao;
  *s = atoll_learner_settings{};
  s->struct_size = sizeof(atoll_learner_settings);
  s->call_timeout_s = co.call_timeout_s;
  s->push_timeout_s = co.push_timeout_s;
  s->min_link_mbps = co.min_link_mbps;
  s->heartbeat_s = ao.heartbeat_s;
  s->backoff_initial_s = ao.backoff_initial_s;
  s->backoff_max_s = ao.backoff_max_s;
}

atoll_status atoll_learner_open_ex(const atoll_learner_options* options, const atoll_learner_settings* settings,
                                   const atoll_param* params, size_t num_params, atoll_learner** out) {
  if (options == nullptr || out == nullptr)
    return Report(atl::InvalidArgumentError("options and out must not be NULL"));
  if (settings != nullptr && settings->struct_size < sizeof(size_t)) {
    return Report(atl::InvalidArgumentError("settings.struct_size is " + std::to_string(settings->struct_size) +
                                            " (atoll_learner_settings_init sets it)"));
  }
  try {
    auto l = Open(*options, atl::capi::SettingsOf(settings), params, num_params);
    if (!l.ok()) return Report(l.status());
    *out = l->release();
    return Report(Status::Ok());
  } catch (const std::exception& e) {
    return Report(atl::InternalError(std::string("atoll_learner_open: ") + e.what()));
  }
}

atoll_status atoll_learner_open(const atoll_learner_options* options, const atoll_param* params, size_t num_params,
                                atoll_learner** out) {
  return atoll_learner_open_ex(options, nullptr, params, num_params, out);
}

atoll_status atoll_learner_step(atoll_learner* l, int64_t tokens, double loss, int* applied) {
  if (l == nullptr) return Report(atl::InvalidArgumentError("learner is NULL"));
  if (tokens < 1) return Report(atl::InvalidArgumentError("tokens " + std::to_string(tokens) + " (must be ≥ 1)"));
  if (!std::isfinite(loss)) return Report(atl::InvalidArgumentError("loss is not finite"));
  if (const auto pending = l->agent->PendingSends(); !pending.empty()) {
    return Report(atl::InvalidArgumentError("fragment " + std::to_string(pending.front()) +
                                            " still waits for its staged values (atoll_learner_send)"));
  }
  if (Status fatal = l->agent->fatal_error(); !fatal.ok()) return Report(fatal);
  const int n = StepDone(*l, tokens, loss);
  if (atl::capi::StateDue(*l)) atl::capi::WriteState(*l);
  if (applied != nullptr) *applied = n;
  return Report(Status::Ok());
}

int atoll_learner_finish_requested(const atoll_learner* l) {
  return l != nullptr && l->agent->finish_requested() ? 1 : 0;
}

atoll_status atoll_learner_counters_get(const atoll_learner* l, atoll_learner_counters* out) {
  if (l == nullptr || out == nullptr) return Report(atl::InvalidArgumentError("learner and out must not be NULL"));
  const auto k = l->agent->counters();
  *out = atoll_learner_counters{};
  out->steps = l->step;
  out->pushes = k.pushes;
  out->pushes_failed = k.pushes_failed;
  out->pulls = k.pulls;
  out->fragments_applied = k.fragments_applied;
  out->joins = k.joins;
  out->catchup_fragments = k.catchup_fragments;
  out->payload_bytes_up = k.payload_bytes_up;
  out->payload_bytes_down = k.payload_bytes_down;
  out->version_held = k.version_held;
  out->learner_id = k.learner_id;
  out->joined = k.joined ? 1 : 0;
  return Report(Status::Ok());
}

atoll_status atoll_learner_close(atoll_learner* l, double flush_timeout_s) {
  if (l == nullptr) return Report(Status::Ok());
  std::unique_ptr<atoll_learner> owned(l);
  if (!(flush_timeout_s >= 0)) flush_timeout_s = 0;
  l->agent->UnstageAll();  // the caller refreshed the staged buffers: the flush reads them
  if (flush_timeout_s > 0 && !l->agent->finish_requested()) l->agent->FlushAll(l->step, flush_timeout_s);
  atl::learner::Progress done;
  done.step = l->step;
  done.tokens = l->tokens;
  done.loss = l->loss;
  done.state = atl::syncer::LearnerState::kDone;
  l->agent->SetProgress(done);
  const Status left = l->agent->Leave();
  if (!l->state_dir.empty()) atl::capi::WriteState(*l);
  return Report(left);
}

const char* atoll_last_error(void) { return atl::capi::LastError(); }

}  // extern "C"
