#include "atoll/runtime/run_config.h"

#include <toml++/toml.h>

#include <cmath>
#include <set>

#include "atoll/core/file.h"

namespace atl::runtime {
namespace {

// Which section of the TOML file each key lives in (the JSON form is flat).
const std::vector<std::pair<std::string, std::vector<std::string>>>& Sections() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> s = {
      {"run", {"mode", "learners", "steps", "seed", "out", "data", "token", "run_id"}},
      {"model", {"preset", "batch", "seq", "lr", "warmup", "threads"}},
      {"diloco", {"fragments", "H", "tau", "quorum", "grace", "gamma", "grace_cap", "merge",
                  "outer_lr", "outer_momentum", "alpha", "plan", "uplink", "downlink", "block",
                  "learner_timeout"}},
      {"learners", {"speeds", "bandwidth_mbps", "latency_ms", "loss"}},
      {"eval", {"eval_batches"}},
      {"chaos", {"chaos"}},  // kept as a nested table (see LoadRunConfig)
  };
  return s;
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

}  // namespace

Status ValidateRunConfig(const RunConfig& c) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("run config: " + m); };
  if (c.mode != "decoupled" && c.mode != "diloco" && c.mode != "ddp")
    return bad("mode must be decoupled, diloco or ddp (got '" + c.mode + "')");
  if (c.learners < 1 || c.learners > 256) return bad("learners must be in [1, 256]");
  if (c.steps < 1) return bad("steps must be ≥ 1");
  if (c.batch < 1 || c.seq < 2) return bad("batch must be ≥ 1 and seq ≥ 2");
  if (!(c.lr > 0) || !std::isfinite(c.lr)) return bad("lr must be > 0");
  if (c.warmup < 0) return bad("warmup must be ≥ 0");
  if (c.threads < 1) return bad("threads must be ≥ 1");
  if (c.fragments < 1) return bad("fragments (P) must be ≥ 1");
  if (c.H < c.fragments) return bad("H (" + std::to_string(c.H) + ") must be ≥ fragments P (" + std::to_string(c.fragments) + ")");
  if (c.tau < 0 || c.tau >= c.H) return bad("tau must be in [0, H)");
  if (c.quorum < 1 || c.quorum > c.learners)
    return bad("quorum K must be in [1, learners] (K=" + std::to_string(c.quorum) + ", M=" + std::to_string(c.learners) + ")");
  if (!(c.gamma >= 0 && c.gamma <= 1)) return bad("gamma must be in [0, 1]");
  if (!(c.grace_cap >= 0)) return bad("grace_cap must be ≥ 0");
  if (c.merge != "rda" && c.merge != "mean") return bad("merge must be rda or mean");
  if (!(c.outer_lr >= 0) || !(c.outer_momentum >= 0 && c.outer_momentum < 1))
    return bad("outer_lr must be ≥ 0 and outer_momentum in [0, 1)");
  if (!(c.alpha >= 0 && c.alpha < 1)) return bad("alpha must be in [0, 1)");
  if (c.plan != "balanced" && c.plan != "strided") return bad("plan must be balanced or strided");
  for (const auto* e : {&c.uplink, &c.downlink})
    if (*e != "fp32" && *e != "bf16" && *e != "int8" && *e != "int4") return bad("encoding must be fp32, bf16, int8 or int4 (got '" + *e + "')");
  if (c.block < 8 || c.block > 65536 || c.block % 2) return bad("block must be even and in [8, 65536]");
  if (!(c.learner_timeout > 0)) return bad("learner_timeout must be > 0");
  if (!c.speeds.empty() && static_cast<int>(c.speeds.size()) != c.learners)
    return bad("speeds has " + std::to_string(c.speeds.size()) + " entries for " + std::to_string(c.learners) + " learners");
  for (double s : c.speeds)
    if (!(s > 0 && s <= 1)) return bad("every speed must be in (0, 1]");
  if (!(c.bandwidth_mbps >= 0) || !(c.latency_ms >= 0) || !(c.loss >= 0 && c.loss < 1))
    return bad("bandwidth_mbps and latency_ms must be ≥ 0 and loss in [0, 1)");
  if (c.eval_batches < 1) return bad("eval_batches must be ≥ 1");
  return chaos::ValidateChaos(c.chaos, c.learners);
}

RunConfig Normalized(RunConfig c) {
  if (c.mode != "decoupled") {
    c.quorum = c.learners;  // synchronous modes wait for everyone
    c.grace = false;
  }
  if (c.mode == "ddp") {
    c.fragments = 1;        // the whole gradient every step (clipping is global)
    c.H = 1;
    c.tau = 0;
    c.uplink = "bf16";      // bf16 gradients up, bf16 parameter deltas down
    c.downlink = "bf16";
  }
  return c;
}

nlohmann::json ToJson(const RunConfig& c) {
  return {{"mode", c.mode}, {"learners", c.learners}, {"steps", c.steps}, {"seed", c.seed},
          {"out", c.out}, {"data", c.data}, {"token", c.token}, {"run_id", c.run_id},
          {"preset", c.preset}, {"batch", c.batch}, {"seq", c.seq}, {"lr", c.lr},
          {"warmup", c.warmup}, {"threads", c.threads}, {"fragments", c.fragments}, {"H", c.H},
          {"tau", c.tau}, {"quorum", c.quorum}, {"grace", c.grace}, {"gamma", c.gamma},
          {"grace_cap", c.grace_cap}, {"merge", c.merge}, {"outer_lr", c.outer_lr},
          {"outer_momentum", c.outer_momentum}, {"alpha", c.alpha}, {"plan", c.plan},
          {"uplink", c.uplink}, {"downlink", c.downlink}, {"block", c.block},
          {"learner_timeout", c.learner_timeout}, {"speeds", c.speeds},
          {"bandwidth_mbps", c.bandwidth_mbps}, {"latency_ms", c.latency_ms}, {"loss", c.loss},
          {"eval_batches", c.eval_batches}, {"chaos", chaos::ToJson(c.chaos)}};
}

StatusOr<RunConfig> FromJson(const nlohmann::json& j, RunConfig c) {
  if (!j.is_object()) return InvalidArgumentError("config must be an object");
  std::set<std::string> known;
  for (const auto& [section, keys] : Sections()) known.insert(keys.begin(), keys.end());
  for (const auto& [k, v] : j.items()) {
    if (!known.count(k)) return InvalidArgumentError("unknown config key '" + k + "'");
  }
  ATOLL_RETURN_IF_ERROR(Take(j, "mode", c.mode));
  ATOLL_RETURN_IF_ERROR(Take(j, "learners", c.learners));
  ATOLL_RETURN_IF_ERROR(Take(j, "steps", c.steps));
  ATOLL_RETURN_IF_ERROR(Take(j, "seed", c.seed));
  ATOLL_RETURN_IF_ERROR(Take(j, "out", c.out));
  ATOLL_RETURN_IF_ERROR(Take(j, "data", c.data));
  ATOLL_RETURN_IF_ERROR(Take(j, "token", c.token));
  ATOLL_RETURN_IF_ERROR(Take(j, "run_id", c.run_id));
  ATOLL_RETURN_IF_ERROR(Take(j, "preset", c.preset));
  ATOLL_RETURN_IF_ERROR(Take(j, "batch", c.batch));
  ATOLL_RETURN_IF_ERROR(Take(j, "seq", c.seq));
  ATOLL_RETURN_IF_ERROR(Take(j, "lr", c.lr));
  ATOLL_RETURN_IF_ERROR(Take(j, "warmup", c.warmup));
  ATOLL_RETURN_IF_ERROR(Take(j, "threads", c.threads));
  ATOLL_RETURN_IF_ERROR(Take(j, "fragments", c.fragments));
  ATOLL_RETURN_IF_ERROR(Take(j, "H", c.H));
  ATOLL_RETURN_IF_ERROR(Take(j, "tau", c.tau));
  ATOLL_RETURN_IF_ERROR(Take(j, "quorum", c.quorum));
  ATOLL_RETURN_IF_ERROR(Take(j, "grace", c.grace));
  ATOLL_RETURN_IF_ERROR(Take(j, "gamma", c.gamma));
  ATOLL_RETURN_IF_ERROR(Take(j, "grace_cap", c.grace_cap));
  ATOLL_RETURN_IF_ERROR(Take(j, "merge", c.merge));
  ATOLL_RETURN_IF_ERROR(Take(j, "outer_lr", c.outer_lr));
  ATOLL_RETURN_IF_ERROR(Take(j, "outer_momentum", c.outer_momentum));
  ATOLL_RETURN_IF_ERROR(Take(j, "alpha", c.alpha));
  ATOLL_RETURN_IF_ERROR(Take(j, "plan", c.plan));
  ATOLL_RETURN_IF_ERROR(Take(j, "uplink", c.uplink));
  ATOLL_RETURN_IF_ERROR(Take(j, "downlink", c.downlink));
  ATOLL_RETURN_IF_ERROR(Take(j, "block", c.block));
  ATOLL_RETURN_IF_ERROR(Take(j, "learner_timeout", c.learner_timeout));
  ATOLL_RETURN_IF_ERROR(Take(j, "speeds", c.speeds));
  ATOLL_RETURN_IF_ERROR(Take(j, "bandwidth_mbps", c.bandwidth_mbps));
  ATOLL_RETURN_IF_ERROR(Take(j, "latency_ms", c.latency_ms));
  ATOLL_RETURN_IF_ERROR(Take(j, "loss", c.loss));
  ATOLL_RETURN_IF_ERROR(Take(j, "eval_batches", c.eval_batches));
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
      return InvalidArgumentError(path + ": not valid TOML: " + std::string(e.description()) +
                                  " at line " + std::to_string(e.source().begin.line));
    }
    nlohmann::json doc = TomlToJson(table);
    flat = nlohmann::json::object();
    for (const auto& [section, value] : doc.items()) {
      auto sec = std::find_if(Sections().begin(), Sections().end(),
                              [&](const auto& s) { return s.first == section; });
      if (sec == Sections().end() || !value.is_object()) {
        return InvalidArgumentError(path + ": unknown section [" + section + "] (expected run, model, diloco, learners, eval, chaos)");
      }
      if (section == "chaos") {
        flat["chaos"] = value;
        continue;
      }
      for (const auto& [k, v] : value.items()) {
        if (std::find(sec->second.begin(), sec->second.end(), k) == sec->second.end()) {
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
