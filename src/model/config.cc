// Model presets and config checks (torch-free).
#include "atoll/model/trainer.h"
#include "model_json.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace atl::model {
namespace {

struct Preset {
  const char* name;
  int d_model, n_layers, n_heads, d_ff;
};
constexpr Preset kPresets[] = {
    {"tiny", 128, 4, 4, 344},   // ≈ 1.3 M params at vocab 4096
    {"small", 256, 5, 8, 688},  // ≈ 5.0 M
    {"base", 512, 6, 8, 1280},  // ≈ 20.2 M
};

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.emplace_back(p.name);
  return out;
}

StatusOr<ModelConfig> PresetConfig(const std::string& preset, int vocab_size) {
  for (const auto& p : kPresets) {
    if (preset == p.name) {
      ModelConfig c;
      c.preset = p.name;
      c.vocab_size = vocab_size;
      c.d_model = p.d_model;
      c.n_layers = p.n_layers;
      c.n_heads = p.n_heads;
      c.d_ff = p.d_ff;
      c.seq_len = 256;
      c.mlp = Mlp::kSwiglu;
      return c;
    }
  }
  std::string names;
  for (const auto& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  return InvalidArgumentError("unknown model preset '" + preset + "' (known: " + names + ")");
}

Status ValidateModelConfig(const ModelConfig& c) {
  if (c.vocab_size < 2 || c.vocab_size > 65536) {
    return InvalidArgumentError("vocab_size " + std::to_string(c.vocab_size) + " outside [2, 65536]");
  }
  if (c.d_model < 2 || c.n_layers < 1 || c.n_heads < 1 || c.d_ff < 1 || c.seq_len < 1) {
    return InvalidArgumentError("model sizes must be positive (d_model " + std::to_string(c.d_model) + ", layers " +
                                std::to_string(c.n_layers) + ", heads " + std::to_string(c.n_heads) + ", d_ff " +
                                std::to_string(c.d_ff) + ", seq " + std::to_string(c.seq_len) + ")");
  }
  if (c.d_model % c.n_heads != 0 || (c.d_model / c.n_heads) % 2 != 0) {
    return InvalidArgumentError("d_model " + std::to_string(c.d_model) + " must split into " +
                                std::to_string(c.n_heads) + " heads of even width (rotary embeddings rotate pairs)");
  }
  return Status::Ok();
}

int64_t ParameterCount(const ModelConfig& c) {
  const int64_t D = c.d_model, F = c.d_ff;
  const int64_t mlp = (c.mlp == Mlp::kSwiglu ? 3 : 2) * D * F;
  const int64_t block = 2 * D + 4 * D * D + mlp;
  return int64_t{c.vocab_size} * D + c.n_layers * block + D;
}

}  // namespace atl::model

namespace atl::model {

int64_t EffectiveWarmupSteps(const OptimizerConfig& o) {
  return o.total_steps > 0 ? std::min(o.warmup_steps, o.total_steps / 2) : o.warmup_steps;
}

std::string WarmupCutNote(const OptimizerConfig& o) {
  const int64_t warmup = EffectiveWarmupSteps(o);
  if (warmup >= o.warmup_steps) return "";
  return "a warm-up of " + std::to_string(o.warmup_steps) + " steps is more than half of the " +
         std::to_string(o.total_steps) + " steps: the learning rate warms up over " + std::to_string(warmup) +
         " steps, then decays";
}

double ScheduledLearningRate(const OptimizerConfig& o, int64_t step) {
  const int64_t warmup = EffectiveWarmupSteps(o);
  if (warmup > 0 && step < warmup) {
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, o.total_steps - warmup));
  const double t = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  return o.lr * (o.min_lr_frac + (1.0 - o.min_lr_frac) * 0.5 * (1.0 + std::cos(std::numbers::pi * t)));
}

}  // namespace atl::model

namespace atl::model {

nlohmann::json ModelConfigToJson(const ModelConfig& c) {
  return {{"preset", c.preset},     {"vocab_size", c.vocab_size}, {"d_model", c.d_model},
          {"n_layers", c.n_layers}, {"n_heads", c.n_heads},       {"d_ff", c.d_ff},
          {"seq_len", c.seq_len},   {"mlp", MlpName(c.mlp)}};
}

nlohmann::json OptimizerConfigToJson(const OptimizerConfig& c) {
  return {{"lr", c.lr},
          {"min_lr_frac", c.min_lr_frac},
          {"warmup_steps", c.warmup_steps},
          {"total_steps", c.total_steps},
          {"weight_decay", c.weight_decay},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"clip_norm", c.clip_norm}};
}

StatusOr<ModelConfig> ModelConfigFromJson(const nlohmann::json& j) {
  ModelConfig c;
  try {
    c.preset = j.at("preset").get<std::string>();
    c.vocab_size = j.at("vocab_size").get<int>();
    c.d_model = j.at("d_model").get<int>();
    c.n_layers = j.at("n_layers").get<int>();
    c.n_heads = j.at("n_heads").get<int>();
    c.d_ff = j.at("d_ff").get<int>();
    c.seq_len = j.at("seq_len").get<int>();
    ATOLL_ASSIGN_OR_RETURN(c.mlp, ParseMlp(j.at("mlp").get<std::string>()));
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("model config: ") + e.what());
  }
  ATOLL_RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

}  // namespace atl::model
