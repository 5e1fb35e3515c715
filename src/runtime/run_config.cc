#include "atoll/runtime/run_config.h"

#include <toml++/toml.h>

#include <cmath>
#include <cstdio>
#include <type_traits>

#include "atoll/core/file.h"
#include "atoll/diloco/merge.h"
#include "atoll/transport/credentials.h"

namespace atl::runtime {
namespace {

// [limits]: the syncer's protection against hostile or broken clients.
template <typename Config, typename F>
void VisitLimitFields(Config& c, F&& f) {
  f("limits", "max_learners", c.max_learners);
  f("limits", "max_inflight_push_mb", c.max_inflight_push_mb);
  f("limits", "max_streams", c.max_streams);
  f("limits", "max_threads", c.max_threads);
  f("limits", "memory_quota_mb", c.memory_quota_mb);
  f("limits", "handshake_timeout_s", c.handshake_timeout_s);
  f("limits", "idle_timeout_s", c.idle_timeout_s);
  f("limits", "quarantine_factor", c.quarantine_factor);
  f("limits", "max_consecutive_rejects", c.max_consecutive_rejects);
  f("limits", "ban_seconds", c.ban_seconds);
  f("limits", "max_connections", c.max_connections);
  f("limits", "max_pushes_per_learner", c.max_pushes_per_learner);
  f("limits", "max_polls_per_learner", c.max_polls_per_learner);
  f("limits", "max_heartbeats_per_s", c.max_heartbeats_per_s);
  f("limits", "push_timeout_s", c.push_timeout_s);
  f("limits", "min_link_mbps", c.min_link_mbps);
  f("limits", "commit_reserve_mb", c.commit_reserve_mb);
  f("limits", "allowed_learners", c.allowed_learners);
}

// Every field of RunConfig, once: its TOML section, its key (the JSON form is flat) and the
// member. ToJson, FromJson and the TOML section check are all this one list.
template <typename Config, typename F>
void VisitFields(Config& c, F&& f) {
  f("run", "mode", c.mode);
  f("run", "learners", c.learners);
  f("run", "steps", c.steps);
  f("run", "seed", c.seed);
  f("run", "out", c.out);
  f("run", "data", c.data);
  f("run", "token", c.token);
  f("run", "run_id", c.run_id);
  f("run", "syncer_shards", c.syncer_shards);
  f("model", "preset", c.preset);
  f("model", "batch", c.batch);
  f("model", "seq", c.seq);
  f("model", "lr", c.lr);
  f("model", "warmup", c.warmup);
  f("model", "threads", c.threads);
  f("model", "precision", c.precision);
  f("model", "spec", c.spec);
  f("model", "embeddings", c.embeddings);
  f("diloco", "fragments", c.fragments);
  f("diloco", "H", c.H);
  f("diloco", "tau", c.tau);
  f("diloco", "quorum", c.quorum);
  f("diloco", "grace", c.grace);
  f("diloco", "gamma", c.gamma);
  f("diloco", "grace_cap", c.grace_cap);
  f("diloco", "merge", c.merge);
  f("diloco", "outer_lr", c.outer_lr);
  f("diloco", "outer_momentum", c.outer_momentum);
  f("diloco", "outer_step", c.outer_step);
  f("diloco", "outer_gradient", c.outer_gradient);
  f("diloco", "alpha", c.alpha);
  f("diloco", "keep_progress", c.keep_progress);
  f("diloco", "weights", c.weights);
  f("diloco", "plan", c.plan);
  f("diloco", "uplink", c.uplink);
  f("diloco", "downlink", c.downlink);
  f("diloco", "block", c.block);
  f("diloco", "compression", c.compression);
  f("diloco", "learner_timeout", c.learner_timeout);
  f("learners", "speeds", c.speeds);
  f("learners", "batches", c.batches);
  f("learners", "bandwidth_mbps", c.bandwidth_mbps);
  f("learners", "latency_ms", c.latency_ms);
  f("learners", "loss", c.loss);
  f("eval", "eval_batches", c.eval_batches);
  f("eval", "eval_every", c.eval_every);
  VisitLimitFields(c, f);
}

// The section a key lives in ("" for none); "chaos" is a nested table of its own.
std::string SectionOf(const std::string& key) {
  if (key == "chaos") return "chaos";
  std::string found;
  RunConfig probe;
  VisitFields(probe, [&](const char* section, const char* k, const auto&) {
    if (key == k) found = section;
  });
  return found;
}

bool IsSection(const std::string& s) {
  for (const char* known : {"run", "model", "diloco", "learners", "eval", "limits", "chaos"}) {
    if (s == known) return true;
  }
  return false;
}

nlohmann::json TomlToJson(const toml::node& node) {
  if (auto* t = node.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : *t) j[std::string(k.str())] = TomlToJson(v);
    return j;
  }
  if (auto* a = node.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : *a) j.push_back(TomlToJson(v));
    return j;
  }
  if (auto v = node.value<int64_t>(); v && node.is_integer()) return *v;
  if (auto v = node.value<double>(); v && node.is_floating_point()) return *v;
  if (auto v = node.value<bool>(); v && node.is_boolean()) return *v;
  if (auto v = node.value<std::string>()) return *v;
  return nullptr;
}

template <typename T>
Status Take(const nlohmann::json& j, const std::string& key, T& out) {
  if (!j.contains(key)) return Status::Ok();
  try {
    out = j.at(key).get<T>();
  } catch (const std::exception& e) {
    return InvalidArgumentError("config key '" + key + "': wrong type (" + e.what() + ")");
  }
  return Status::Ok();
}

Status Take(const nlohmann::json& j, const std::string& key, std::optional<double>& out) {
  if (!j.contains(key)) return Status::Ok();
  if (j.at(key).is_null()) {
    out.reset();
    return Status::Ok();
  }
  double v = 0;
  ATOLL_RETURN_IF_ERROR(Take(j, key, v));
  out = v;
  return Status::Ok();
}

// A setting with a fixed set of values: one of its enum's spellings.
template <typename E>
requires std::is_enum_v<E> Status Take(const nlohmann::json& j, const std::string& key, E& out) {
  std::string name = NamesOf(out).Name(out);
  ATOLL_RETURN_IF_ERROR(Take(j, key, name));
  auto parsed = NamesOf(out).Parse(name);
  if (!parsed.ok()) return parsed.status().WithContext("config key '" + key + "'");
  out = *parsed;
  return Status::Ok();
}

// A member's JSON form: an enum by its name, an unset optional as null.
template <typename T>
nlohmann::json JsonOf(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return NamesOf(value).Name(value);
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  } else {
    return value;
  }
}

}  // namespace

namespace {

// The run's size and inner training.
Status ValidateTraining(const RunConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("run config: " + m); };
  if (c.learners < 1 || c.learners > 256) return bad("learners must be in [1, 256]");
  if (c.steps < 1) return bad("steps must be ≥ 1");
  if (c.batch < 1 || c.seq < 2) return bad("batch must be ≥ 1 and seq ≥ 2");
  if (!(c.lr > 0) || !std::isfinite(c.lr)) return bad("lr must be > 0");
  if (c.warmup < 0) return bad("warmup must be ≥ 0");
  if (c.threads < 1) return bad("threads must be ≥ 1");
  return Status::Ok();
}

// Fragments, shards, the schedule, rounds, the merge and the outer step.
Status ValidateMethod(const RunConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("run config: " + m); };
  if (c.fragments < 1) return bad("fragments (P) must be ≥ 1");
  if (c.syncer_shards > 1 && c.mode == diloco::Mode::kDdp) return bad("ddp mode runs one syncer (syncer_shards = 1)");
  if (c.syncer_shards < 1 || c.syncer_shards > c.fragments)
    return bad("syncer_shards (S) must be in [1, fragments P] (S=" + std::to_string(c.syncer_shards) +
               ", P=" + std::to_string(c.fragments) + "): every shard owns at least one fragment");
  if (c.H < c.fragments)
    return bad("H (" + std::to_string(c.H) + ") must be ≥ fragments P (" + std::to_string(c.fragments) + ")");
  if (c.tau < 0 || c.tau >= c.H) return bad("tau must be in [0, H)");
  if (c.quorum < 1 || c.quorum > c.learners)
    return bad("quorum K must be in [1, learners] (K=" + std::to_string(c.quorum) +
               ", M=" + std::to_string(c.learners) + ")");
  if (!(c.gamma >= 0 && c.gamma <= 1)) return bad("gamma must be in [0, 1]");
  if (!(c.grace_cap >= 0)) return bad("grace_cap must be ≥ 0");
  if ((c.outer_lr && !(*c.outer_lr >= 0 && std::isfinite(*c.outer_lr))) ||
      (c.outer_momentum && !(*c.outer_momentum >= 0 && *c.outer_momentum < 1)))
    return bad("outer_lr must be ≥ 0 and outer_momentum in [0, 1)");
  if (!(c.alpha >= 0 && c.alpha < 1)) return bad("alpha must be in [0, 1)");
  return Status::Ok();
}

// The plan, encodings, per-learner speeds and batches, the emulated WAN, liveness, evaluation.
Status ValidateLinks(const RunConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("run config: " + m); };
  if (c.block < 8 || c.block > 65536 || c.block % 2) return bad("block must be even and in [8, 65536]");
  if (!(c.learner_timeout > 0)) return bad("learner_timeout must be > 0");
  if (!c.speeds.empty() && static_cast<int>(c.speeds.size()) != c.learners)
    return bad("speeds has " + std::to_string(c.speeds.size()) + " entries for " + std::to_string(c.learners) +
               " learners");
  for (double s : c.speeds)
    if (!(s > 0 && s <= 1)) return bad("every speed must be in (0, 1]");
  if (!c.batches.empty() && static_cast<int>(c.batches.size()) != c.learners)
    return bad("batches has " + std::to_string(c.batches.size()) + " entries for " + std::to_string(c.learners) +
               " learners");
  for (int b : c.batches)
    if (b < 1 || b > 65536) return bad("every batch size must be in [1, 65536]");
  if (!(c.bandwidth_mbps >= 0) || !(c.latency_ms >= 0) || !(c.loss >= 0 && c.loss < 1))
    return bad("bandwidth_mbps and latency_ms must be ≥ 0 and loss in [0, 1)");
  if (c.eval_batches < 1) return bad("eval_batches must be ≥ 1");
  if (c.eval_every < 0) return bad("eval_every must be ≥ 0 (0 = no evaluation during the run)");
  return Status::Ok();
}

// [limits].
Status ValidateLimits(const RunConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("run config: " + m); };
  if (c.max_learners < c.learners || c.max_learners > 1'000'000)
    return bad("max_learners must be in [learners, 1000000]");
  if (!(c.max_inflight_push_mb >= 1 && c.max_inflight_push_mb <= 1 << 20) ||
      !(c.memory_quota_mb >= 16 && c.memory_quota_mb <= 1 << 20))
    return bad("max_inflight_push_mb must be in [1, 1048576] and memory_quota_mb in [16, 1048576]");
  if (c.max_streams < 1 || c.max_streams > 100'000 || c.max_threads < 4 || c.max_threads > 100'000)
    return bad("max_streams must be in [1, 100000] and max_threads in [4, 100000]");
  if (!(c.handshake_timeout_s > 0 && c.handshake_timeout_s <= 3600) ||
      !(c.idle_timeout_s > 0 && c.idle_timeout_s <= 86'400))
    return bad("handshake_timeout_s must be in (0, 3600] and idle_timeout_s in (0, 86400]");
  if (!(c.quarantine_factor == 0 || (c.quarantine_factor >= 2 && c.quarantine_factor <= 1e6)))
    return bad("quarantine_factor must be 0 (off) or in [2, 1e6]");
  if (c.max_consecutive_rejects < 1 || !(c.ban_seconds >= 0 && c.ban_seconds <= 86'400))
    return bad("max_consecutive_rejects must be ≥ 1 and ban_seconds in [0, 86400]");
  if (c.max_connections < 16 || c.max_connections > 1'000'000 || c.max_pushes_per_learner < 1 ||
      c.max_pushes_per_learner > 1000 || c.max_polls_per_learner < 1 || c.max_polls_per_learner > 1000)
    return bad(
        "max_connections must be in [16, 1000000], max_pushes_per_learner and max_polls_per_learner in [1, 1000]");
  if (!(c.max_heartbeats_per_s >= 1 && c.max_heartbeats_per_s <= 1e6) ||
      !(c.push_timeout_s >= 1 && c.push_timeout_s <= 86'400))
    return bad("max_heartbeats_per_s must be in [1, 1e6] and push_timeout_s in [1, 86400]");
  if (!(c.min_link_mbps >= 0 && c.min_link_mbps <= 1e6))
    return bad("min_link_mbps must be in [0, 1e6] (0: no allowance for payload size)");
  if (!(c.commit_reserve_mb >= 0 && c.commit_reserve_mb <= 1 << 30))
    return bad("commit_reserve_mb must be in [0, 1073741824]");
  if (auto ids = transport::LearnerIdSet::Parse(c.allowed_learners); !ids.ok())
    return bad("allowed_learners: " + ids.status().message());
  return Status::Ok();
}

}  // namespace

Status ValidateRunConfig(const RunConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("run config: " + m); };
  ATOLL_RETURN_IF_ERROR(ValidateTraining(c));
  ATOLL_RETURN_IF_ERROR(ValidateMethod(c));
  ATOLL_RETURN_IF_ERROR(ValidateLinks(c));
  ATOLL_RETURN_IF_ERROR(ValidateLimits(c));
  for (const auto& e : c.chaos.events) {
    if (chaos::TargetsSyncer(e.kind) && e.target >= c.syncer_shards)
      return bad(
          std::string("a ") + chaos::FaultKindName(e.kind) + " event names syncer shard " + std::to_string(e.target) +
          " (its learner field), but there " +
          (c.syncer_shards == 1 ? std::string("is one syncer") : "are " + std::to_string(c.syncer_shards) + " shards"));
  }
  return chaos::ValidateChaos(c.chaos, c.learners);
}

diloco::OuterOptimizerOptions DefaultOuterOptimizer(diloco::Mode mode) {
  if (mode == diloco::Mode::kDecoupled) return {.lr = 1.0, .momentum = 0.0, .nesterov = true};
  return diloco::OuterOptimizerOptions{};
}

diloco::OuterOptimizerOptions OuterOptimizerOf(const RunConfig& c) {
  diloco::OuterOptimizerOptions o = DefaultOuterOptimizer(c.mode);
  if (c.outer_lr) o.lr = *c.outer_lr;
  if (c.outer_momentum) o.momentum = *c.outer_momentum;
  return o;
}

RunConfig Normalized(RunConfig c) {
  const diloco::OuterOptimizerOptions outer = OuterOptimizerOf(c);
  c.outer_lr = outer.lr;
  c.outer_momentum = outer.momentum;
  if (diloco::IsSynchronous(c.mode)) {
    c.quorum = c.learners;  // synchronous modes wait for everyone
    c.grace = false;
    c.outer_step = syncer::OuterStepRule::kRound;  // every round holds every learner: one full outer step each
  }
  if (c.mode == diloco::Mode::kDdp) {
    c.fragments = 1;  // the whole gradient every step (clipping is global)
    c.H = 1;
    c.tau = 0;
    c.uplink = diloco::Encoding::kBf16;  // bf16 gradients up, bf16 parameter deltas down
    c.downlink = diloco::Encoding::kBf16;
    c.compression = diloco::Compression::kNone;  // raw, as a data-parallel job's all-reduce moves them (the baseline)
  }
  return c;
}

diloco::CodecOptions UplinkCodec(const RunConfig& c) { return {c.uplink, c.block, c.compression}; }
diloco::CodecOptions DownlinkCodec(const RunConfig& c) { return {c.downlink, c.block, c.compression}; }

nlohmann::json ToJson(const RunConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  VisitFields(c, [&](const char*, const char* key, const auto& value) { j[key] = JsonOf(value); });
  j["chaos"] = chaos::ToJson(c.chaos);
  return j;
}

namespace {

std::string DefaultText(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v.get<double>());
    return buf;
  }
  if (v.is_array()) {
    std::string out;
    for (const auto& e : v) out += (out.empty() ? "" : " ") + DefaultText(e);
    return out;
  }
  return v.is_null() ? "" : v.dump();
}

}  // namespace

KeyHelp HelpOf(const std::string& key) {
  KeyHelp help;
  const RunConfig defaults;
  VisitFields(defaults, [&](const char*, const char* k, const auto& value) {
    if (key != k) return;
    help.default_text = DefaultText(JsonOf(value));
    if constexpr (std::is_enum_v<std::decay_t<decltype(value)>>)
      help.spellings = NamesOf(value).Alternatives(" | ", " | ");
  });
  return help;
}

StatusOr<RunConfig> FromJson(const nlohmann::json& j, RunConfig c) {
  if (!j.is_object()) return InvalidArgumentError("config must be an object");
  for (const auto& [k, v] : j.items()) {
    if (SectionOf(k).empty()) return InvalidArgumentError("unknown config key '" + k + "'");
  }
  Status st;
  VisitFields(c, [&](const char*, const char* key, auto& value) {
    if (st.ok()) st = Take(j, key, value);
  });
  ATOLL_RETURN_IF_ERROR(st);
  if (j.contains("chaos")) {
    ATOLL_ASSIGN_OR_RETURN(c.chaos, chaos::ChaosFromJson(j["chaos"]));
  }
  return c;
}

StatusOr<RunConfig> LoadRunConfig(const std::string& path, RunConfig base) {
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const bool is_json = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
  nlohmann::json flat;
  if (is_json) {
    try {
      flat = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      return InvalidArgumentError(path + ": not valid JSON: " + e.what());
    }
  } else {
    toml::table table;
    try {
      table = toml::parse(text, path);
    } catch (const toml::parse_error& e) {
      return InvalidArgumentError(path + ": not valid TOML: " + std::string(e.description()) + " at line " +
                                  std::to_string(e.source().begin.line));
    }
    nlohmann::json doc = TomlToJson(table);
    flat = nlohmann::json::object();
    for (const auto& [section, value] : doc.items()) {
      if (!IsSection(section) || !value.is_object()) {
        return InvalidArgumentError(path + ": unknown section [" + section +
                                    "] (expected run, model, diloco, learners, eval, chaos)");
      }
      if (section == "chaos") {
        flat["chaos"] = value;
        continue;
      }
      for (const auto& [k, v] : value.items()) {
        if (SectionOf(k) != section) {
          return InvalidArgumentError(path + ": unknown key '" + k + "' in [" + section + "]");
        }
        flat[k] = v;
      }
    }
  }
  auto c = FromJson(flat, base);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

}  // namespace atl::runtime
