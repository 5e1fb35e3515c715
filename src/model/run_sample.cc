// Text generation from a trained model: checkpoint, train run or atoll run folder (libtorch).
#include <chrono>
#include <cmath>

#include "atoll/core/rng.h"
#include "atoll/model/data.h"
#include "atoll/model/model_source.h"
#include "atoll/model/run.h"
#include "gpt.h"

namespace atl::model {

namespace {

// The next token from the last position's logits (fp64): argmax at temperature 0, else seeded
// top-k sampling.
int PickToken(torch::Tensor logits, const SampleOptions& o, Rng& rng) {
  if (o.temperature == 0) return static_cast<int>(logits.argmax().item<int64_t>());
  logits = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < logits.size(0)) {
    auto kth = std::get<0>(logits.topk(o.top_k)).min();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
  }
  auto probs = torch::softmax(logits, 0).contiguous();
  const double* p = probs.data_ptr<double>();
  double u = rng.Uniform(), acc = 0;
  for (int64_t v = 0; v < probs.size(0); ++v) {
    acc += p[v];
    if (u < acc) return static_cast<int>(v);
  }
  return static_cast<int>(probs.size(0)) - 1;
}

}  // namespace

StatusOr<SampleResult> Sample(const SampleOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.max_new_tokens < 0 || o.temperature < 0 || o.top_k < 0 || o.threads < 1) {
    return InvalidArgumentError("sample: tokens, temperature and top-k must be ≥ 0");
  }
  ATOLL_ASSIGN_OR_RETURN(ModelSource source, ResolveModelSource(o.checkpoint, o.data_dir));
  const ModelConfig& config = source.model;
  ATOLL_ASSIGN_OR_RETURN(DataManifest data, LoadDataManifest(o.data_dir.empty() ? source.data_dir : o.data_dir));
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(data));

  SampleResult res;
  try {
    at::set_num_threads(o.threads);
    ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Gpt> model, Gpt::Create(config, 0));
    std::vector<diloco::TensorSpec> specs;
    for (const auto& p : model->params()) {
      diloco::TensorSpec spec;
      spec.name = p.name;
      spec.shape = p.tensor.sizes().vec();
      spec.numel = p.tensor.numel();
      specs.push_back(std::move(spec));
    }
    ATOLL_RETURN_IF_ERROR(LoadSourceWeights(source, specs, [&model](size_t i) {
      auto& t = model->params()[i].tensor;
      return std::span<float>(t.data_ptr<float>(), static_cast<size_t>(t.numel()));
    }));
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
      const int next = PickToken(logits, o, rng);
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
