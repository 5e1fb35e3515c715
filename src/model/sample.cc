// Text generation from a checkpoint (libtorch).
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/model/data.h"
#include "atoll/model/run.h"
#include "atoll/model/safetensors.h"
#include "gpt.h"
#include "model_json.h"

namespace atl::model {

StatusOr<SampleResult> Sample(const SampleOptions& o) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  if (o.max_new_tokens < 0 || o.temperature < 0 || o.top_k < 0 || o.threads < 1) {
    return InvalidArgumentError("sample: tokens, temperature and top-k must be ≥ 0");
  }
  ATOLL_ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(o.checkpoint));
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json j,
                         ReadJsonWithChecksum((fs::path(dir) / "checkpoint.json").string()));
  ModelConfig config;
  std::string data_dir = o.data_dir, model_sum;
  try {
    ATOLL_ASSIGN_OR_RETURN(config, ModelConfigFromJson(j.at("model")));
    if (data_dir.empty()) data_dir = j.at("data").at("dir").get<std::string>();
    model_sum = j.at("files").at("model.safetensors").at("checksum").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(dir + "/checkpoint.json: malformed: " + e.what());
  }
  ATOLL_ASSIGN_OR_RETURN(DataManifest data, LoadDataManifest(data_dir));
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(data));
  ATOLL_ASSIGN_OR_RETURN(std::string bytes,
                         ReadFileVerified((fs::path(dir) / "model.safetensors").string(),
                                          model_sum));
  ATOLL_ASSIGN_OR_RETURN(SafetensorsData weights, DecodeSafetensors(bytes));

  SampleResult res;
  try {
    at::set_num_threads(o.threads);
    ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Gpt> model, Gpt::Create(config, 0));
    for (auto& p : model->params()) {
      int i = weights.Find(p.name);
      if (i < 0 || weights.tensors[i].shape != p.tensor.sizes().vec()) {
        return DataLossError(dir + ": tensor " + p.name + " missing or of the wrong shape");
      }
      std::memcpy(p.tensor.data_ptr<float>(), weights.values[i].data(),
                  weights.values[i].size() * sizeof(float));
    }
    std::vector<int> ids = tok->Encode(o.prompt.empty() ? std::string("\n") : o.prompt);
    res.prompt_tokens = static_cast<int64_t>(ids.size());
    const size_t prompt_len = ids.size();
    Rng rng(o.seed);
    torch::NoGradGuard no_grad;
    for (int n = 0; n < o.max_new_tokens; ++n) {
      const size_t ctx = std::min<size_t>(ids.size(), static_cast<size_t>(config.seq_len));
      auto input = torch::empty({1, static_cast<int64_t>(ctx)}, torch::kInt64);
      for (size_t k = 0; k < ctx; ++k) {
        input.data_ptr<int64_t>()[k] = ids[ids.size() - ctx + k];
      }
      auto logits = model->Forward(input)[0][static_cast<int64_t>(ctx) - 1].to(torch::kFloat64);
      int next;
      if (o.temperature == 0) {
        next = static_cast<int>(logits.argmax().item<int64_t>());
      } else {
        logits = logits / o.temperature;
        if (o.top_k > 0 && o.top_k < logits.size(0)) {
          auto kth = std::get<0>(logits.topk(o.top_k)).min();
          logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
        }
        auto probs = torch::softmax(logits, 0).contiguous();
        const double* p = probs.data_ptr<double>();
        double u = rng.Uniform(), acc = 0;
        next = static_cast<int>(probs.size(0)) - 1;
        for (int64_t v = 0; v < probs.size(0); ++v) {
          acc += p[v];
          if (u < acc) {
            next = static_cast<int>(v);
            break;
          }
        }
      }
      ids.push_back(next);
    }
    res.new_tokens = static_cast<int64_t>(ids.size() - prompt_len);
    res.completion = tok->Decode(std::span<const int>(ids).subspan(prompt_len));
  } catch (const std::exception& e) {
    return InternalError(std::string("sampling: ") + e.what());
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace atl::model
