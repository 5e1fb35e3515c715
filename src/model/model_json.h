// JSON forms of the model and optimizer configs, as stored in checkpoint.json and config.json
// (internal, torch-free).
#pragma once

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"
#include "atoll/model/trainer.h"

namespace atl::model {

nlohmann::json ModelConfigToJson(const ModelConfig& c);
nlohmann::json OptimizerConfigToJson(const OptimizerConfig& c);
// InvalidArgument naming the missing or mistyped field.
StatusOr<ModelConfig> ModelConfigFromJson(const nlohmann::json& j);

}  // namespace atl::model
