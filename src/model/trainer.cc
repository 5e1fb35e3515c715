// TorchTrainer: the libtorch implementation of the torch-free Trainer interface (trainer.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/platform.h"
#include "atoll/model/data.h"
#include "atoll/model/safetensors.h"
#include "atoll/model/shard.h"
#include "atoll/model/trainer.h"
#include "atoll/model/model_spec.h"
#include "gpt.h"
#include "model_json.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

constexpr int kCheckpointVersion = 1;
constexpr double kAdamEps = 1e-8;

Status TorchError(const std::string& what, const std::exception& e) { return InternalError(what + ": " + e.what()); }

}  // namespace

Precision ResolvePrecision(Precision precision) {
  if (precision != Precision::kAuto) return precision;
  static const bool fast = FlagsHaveFastBf16(ReadCpuFlags());
  return fast ? Precision::kBf16 : Precision::kFp32;
}

namespace {

Status ValidateTrainerOptions(const TrainerOptions& o) {
  if (o.batch_size < 1 || o.replicas < 1 || o.threads < 1) {
    return InvalidArgumentError("batch_size, replicas and threads must be ≥ 1");
  }
  if (o.num_learners < 1 || o.learner_id < 0 || o.learner_id >= o.num_learners) {
    return InvalidArgumentError("learner_id " + std::to_string(o.learner_id) + " outside [0, num_learners " +
                                std::to_string(o.num_learners) + ")");
  }
  return ValidateModelConfig(o.model);
}

// Intra-op threads as asked; one inter-op thread. The inter-op count can be set once per
// process: a second trainer keeps the first value.
void SetTorchThreads(int threads) {
  at::set_num_threads(threads);
  try {
    at::set_num_interop_threads(1);
  } catch (const std::exception&) {
  }
}

class TorchTrainer final : public Trainer {
 public:
  static StatusOr<std::unique_ptr<Trainer>> Make(const TrainerOptions& o);

  const std::vector<diloco::TensorSpec>& tensors() const override { return specs_; }
  std::span<float> Parameter(int i) override {
    auto& t = model_->params().at(static_cast<size_t>(i)).tensor;
    return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
  }
  int64_t num_params() const override { return model_->num_params(); }
  StatusOr<StepStats> Step() override;
  StatusOr<StepStats> ComputeGradients() override;
  std::span<float> Gradient(int i) override {
    auto& t = model_->params().at(static_cast<size_t>(i)).tensor;
    if (!t.grad().defined()) t.mutable_grad() = torch::zeros_like(t);
    auto g = t.grad();
    ATOLL_CHECK(g.is_contiguous() && g.scalar_type() == torch::kFloat32);
    have_gradients_ = true;  // the caller may fill it (an all-reduced average)
    return {g.data_ptr<float>(), static_cast<size_t>(g.numel())};
  }
  StatusOr<StepStats> ApplyGradients(StepStats computed) override;
  StatusOr<EvalStats> Evaluate(int batches) override;
  Precision precision() const override { return precision_; }
  int64_t step() const override { return step_; }
  int64_t tokens_trained() const override { return tokens_; }
  int64_t tokens_per_step() const override { return int64_t{opts_.replicas} * opts_.batch_size * opts_.model.seq_len; }
  Status SaveCheckpoint(const std::string& dir) override;
  Status LoadCheckpoint(const std::string& dir) override;
  void ResetOptimizerState() override;

 private:
  // The stages of Make, after the model exists.
  void DescribeParameters();  // specs_ and zeroed AdamW moments, one per model parameter
  Status OpenReaders(const DataManifest& data);
  Status SkipConsumedBatches(int64_t start_step);

  // What checkpoint.json says, read and checked against this trainer.
  struct CheckpointManifest {
    int64_t step = 0, tokens = 0, adam_step = 0;
    std::vector<ReaderPosition> positions;  // one per replica
    std::string model_checksum, optimizer_checksum;
  };
  // The decoded safetensors files and, for each of specs_, the index of its values in them.
  struct CheckpointTensors {
    SafetensorsData model, optimizer;
    std::vector<int> param, exp_avg, exp_avg_sq;
  };
  Status CheckCompatible(const nlohmann::json& manifest, const std::string& dir,
                         const std::string& manifest_path) const;
  StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& dir) const;
  StatusOr<CheckpointTensors> ReadCheckpointTensors(const std::string& dir, const CheckpointManifest& m) const;

  TrainerOptions opts_;
  Precision precision_ = Precision::kFp32;  // opts_.precision resolved: kFp32 | kBf16
  bool bf16_ = false;
  std::string data_dir_;  // absolute
  std::unique_ptr<Gpt> model_;
  std::vector<diloco::TensorSpec> specs_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  int64_t adam_step_ = 0;
  bool have_gradients_ = false;
  std::chrono::steady_clock::time_point step_started_{};
  std::vector<ShardReader> readers_;  // one per replica
  torch::Tensor batch_;               // [B, T+1] int64, refilled every micro-batch
  std::vector<uint16_t> val_;
  int64_t step_ = 0;
  int64_t tokens_ = 0;
};

StatusOr<std::unique_ptr<Trainer>> TorchTrainer::Make(const TrainerOptions& o) {
  ATOLL_RETURN_IF_ERROR(ValidateTrainerOptions(o));
  ATOLL_ASSIGN_OR_RETURN(DataManifest data, LoadDataManifest(o.data_dir));
  if (o.model.vocab_size < data.vocab_size) {
    return InvalidArgumentError("model vocab_size " + std::to_string(o.model.vocab_size) +
                                " is smaller than the data's vocabulary (" + std::to_string(data.vocab_size) + ")");
  }
  SetTorchThreads(o.threads);

  auto t = std::unique_ptr<TorchTrainer>(new TorchTrainer());
  t->opts_ = o;
  t->precision_ = ResolvePrecision(o.precision);
  t->bf16_ = t->precision_ == Precision::kBf16;
  t->data_dir_ = fs::absolute(o.data_dir).string();
  ATOLL_ASSIGN_OR_RETURN(t->model_, Gpt::Create(o.model, o.seed));
  t->DescribeParameters();
  ATOLL_RETURN_IF_ERROR(t->OpenReaders(data));
  if (o.start_step < 0) return InvalidArgumentError("start_step must be ≥ 0");
  if (o.start_step > 0) ATOLL_RETURN_IF_ERROR(t->SkipConsumedBatches(o.start_step));
  ATOLL_ASSIGN_OR_RETURN(t->val_, LoadValTokens(data));
  t->batch_ = torch::empty({o.batch_size, o.model.seq_len + 1}, torch::kInt64);
  return std::unique_ptr<Trainer>(std::move(t));
}

void TorchTrainer::DescribeParameters() {
  for (const auto& p : model_->params()) {
    diloco::TensorSpec s;
    s.name = p.name;
    s.shape = p.tensor.sizes().vec();
    s.numel = p.tensor.numel();
    s.is_embedding = p.is_embedding;
    specs_.push_back(std::move(s));
    exp_avg_.push_back(torch::zeros_like(p.tensor));
    exp_avg_sq_.push_back(torch::zeros_like(p.tensor));
  }
}

// One reader per replica, each on its own shard of the token stream: learner l's replica r
// reads shard l·R + r of M·R.
Status TorchTrainer::OpenReaders(const DataManifest& data) {
  const TrainerOptions& o = opts_;
  ATOLL_ASSIGN_OR_RETURN(std::vector<uint16_t> train, LoadTrainTokens(data));
  auto stream = std::make_shared<const std::vector<uint16_t>>(std::move(train));
  for (int r = 0; r < o.replicas; ++r) {
    ShardReader::Options ro;
    ro.seq_len = o.model.seq_len;
    ro.batch_size = o.batch_size;
    ro.shard = o.learner_id * o.replicas + r;
    ro.num_shards = o.num_learners * o.replicas;
    ro.seed = o.seed;
    ATOLL_ASSIGN_OR_RETURN(ShardReader reader, ShardReader::Create(stream, ro));
    readers_.push_back(std::move(reader));
  }
  return Status::Ok();
}

// Skip the batches the previous incarnation consumed: position = start_step batches in.
Status TorchTrainer::SkipConsumedBatches(int64_t start_step) {
  for (auto& reader : readers_) {
    const int64_t per_epoch = std::max<int64_t>(1, reader.num_windows());
    const int64_t consumed = start_step * opts_.batch_size;
    ReaderPosition pos;
    pos.epoch = consumed / per_epoch;
    pos.index = consumed % per_epoch;
    ATOLL_RETURN_IF_ERROR(reader.Seek(pos));
  }
  step_ = start_step;
  return Status::Ok();
}

StatusOr<StepStats> TorchTrainer::Step() {
  ATOLL_ASSIGN_OR_RETURN(StepStats computed, ComputeGradients());
  return ApplyGradients(computed);
}

StatusOr<StepStats> TorchTrainer::ComputeGradients() {
  step_started_ = std::chrono::steady_clock::now();
  StepStats st;
  try {
    auto& params = model_->params();
    for (auto& p : params) p.tensor.mutable_grad() = torch::Tensor();
    const int64_t T = opts_.model.seq_len;
    double loss_sum = 0;
    for (auto& reader : readers_) {
      reader.NextBatch({batch_.data_ptr<int64_t>(), static_cast<size_t>(batch_.numel())});
      torch::Tensor loss;
      {
        CpuBf16Autocast autocast(bf16_);
        loss = model_->Loss(batch_.narrow(1, 0, T), batch_.narrow(1, 1, T));
      }
      // Averaged gradient of the replicas' micro-batches (one replica: the plain gradient).
      (readers_.size() > 1 ? loss / static_cast<double>(readers_.size()) : loss).backward();
      loss_sum += loss.item<double>();
    }
    st.loss = loss_sum / static_cast<double>(readers_.size());
    if (!std::isfinite(st.loss)) {
      return FailedPreconditionError("loss is not finite at step " + std::to_string(step_ + 1) +
                                     " (training diverged; lower the learning rate)");
    }
  } catch (const std::exception& e) {
    return TorchError("training step " + std::to_string(step_ + 1), e);
  }
  st.tokens = tokens_per_step();
  have_gradients_ = true;
  return st;
}

StatusOr<StepStats> TorchTrainer::ApplyGradients(StepStats st) {
  if (!have_gradients_) return FailedPreconditionError("ApplyGradients without ComputeGradients");
  have_gradients_ = false;
  try {
    auto& params = model_->params();
    std::vector<torch::Tensor> grads;
    for (auto& p : params) grads.push_back(p.tensor);
    st.grad_norm = torch::nn::utils::clip_grad_norm_(grads, opts_.optim.clip_norm);

    // AdamW (decoupled weight decay), the same arithmetic as torch.optim.AdamW.
    const auto& oc = opts_.optim;
    st.lr = ScheduledLearningRate(oc, step_);
    ++adam_step_;
    const double bc1 = 1.0 - std::pow(oc.beta1, static_cast<double>(adam_step_));
    const double bc2 = 1.0 - std::pow(oc.beta2, static_cast<double>(adam_step_));
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i].tensor;
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (params[i].decay && oc.weight_decay != 0) p.mul_(1.0 - st.lr * oc.weight_decay);
      exp_avg_[i].mul_(oc.beta1).add_(g, 1.0 - oc.beta1);
      exp_avg_sq_[i].mul_(oc.beta2).addcmul_(g, g, 1.0 - oc.beta2);
      auto denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bc2)).add_(kAdamEps);
      p.addcdiv_(exp_avg_[i], denom, -st.lr / bc1);
    }
  } catch (const std::exception& e) {
    return TorchError("training step " + std::to_string(step_ + 1), e);
  }
  const auto t0 = step_started_;
  ++step_;
  st.step = step_;
  st.tokens = tokens_per_step();
  tokens_ += st.tokens;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

StatusOr<EvalStats> TorchTrainer::Evaluate(int batches) {
  const int64_t T = opts_.model.seq_len, B = opts_.batch_size;
  const int64_t available = val_.size() > 1 ? static_cast<int64_t>(val_.size() - 1) / T : 0;
  const int64_t windows = std::min<int64_t>(std::max(1, batches) * B, available);
  if (windows < 1) {
    return FailedPreconditionError("validation set too small: " + std::to_string(val_.size()) +
                                   " tokens hold no window of " + std::to_string(T + 1));
  }
  EvalStats ev;
  double sum = 0;
  try {
    torch::NoGradGuard no_grad;
    for (int64_t start = 0; start < windows; start += B) {
      const int64_t rows = std::min(B, windows - start);
      auto buf = torch::empty({rows, T + 1}, torch::kInt64);
      auto* dst = buf.data_ptr<int64_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* src = val_.data() + (start + r) * T;
        for (int64_t k = 0; k <= T; ++k) dst[r * (T + 1) + k] = src[k];
      }
      auto loss = model_->Loss(buf.narrow(1, 0, T), buf.narrow(1, 1, T));
      sum += loss.item<double>() * static_cast<double>(rows * T);
      ev.tokens += rows * T;
    }
  } catch (const std::exception& e) {
    return TorchError("evaluation", e);
  }
  ev.loss = sum / static_cast<double>(ev.tokens);
  ev.perplexity = std::exp(ev.loss);
  return ev;
}

void TorchTrainer::ResetOptimizerState() {
  torch::NoGradGuard no_grad;
  for (auto& m : exp_avg_) m.zero_();
  for (auto& v : exp_avg_sq_) v.zero_();
  adam_step_ = 0;
}

Status TorchTrainer::SaveCheckpoint(const std::string& dir) {
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir));
  std::vector<std::span<const float>> values;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const auto& t = model_->params()[i].tensor;
    values.push_back({t.data_ptr<float>(), static_cast<size_t>(t.numel())});
  }
  nlohmann::json meta = {{"format", "atoll-model"}, {"step", step_}};
  ATOLL_ASSIGN_OR_RETURN(std::string model_bytes, EncodeSafetensors(specs_, values, meta));

  std::vector<diloco::TensorSpec> opt_specs;
  std::vector<std::span<const float>> opt_values;
  for (size_t i = 0; i < specs_.size(); ++i) {
    for (int k = 0; k < 2; ++k) {
      auto s = specs_[i];
      s.name = (k == 0 ? "exp_avg." : "exp_avg_sq.") + s.name;
      s.is_embedding = false;
      opt_specs.push_back(std::move(s));
      const auto& t = k == 0 ? exp_avg_[i] : exp_avg_sq_[i];
      opt_values.push_back({t.data_ptr<float>(), static_cast<size_t>(t.numel())});
    }
  }
  nlohmann::json opt_meta = {{"format", "atoll-adamw"}, {"adam_step", adam_step_}};
  ATOLL_ASSIGN_OR_RETURN(std::string opt_bytes, EncodeSafetensors(opt_specs, opt_values, opt_meta));

  ATOLL_RETURN_IF_ERROR(WriteFileAtomic((fs::path(dir) / "model.safetensors").string(), model_bytes));
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic((fs::path(dir) / "optimizer.safetensors").string(), opt_bytes));
  nlohmann::json positions = nlohmann::json::array();
  for (const auto& r : readers_) {
    positions.push_back({{"epoch", r.position().epoch}, {"index", r.position().index}});
  }
  nlohmann::json j = {
      {"format", "atoll-checkpoint"},
      {"version", kCheckpointVersion},
      {"step", step_},
      {"tokens_trained", tokens_},
      {"model_signature", ChecksumHex(diloco::ModelSignature(specs_))},
      {"model", ModelConfigToJson(opts_.model)},
      {"optimizer", OptimizerConfigToJson(opts_.optim)},
      {"optimizer_state", {{"file", "optimizer.safetensors"}, {"adam_step", adam_step_}}},
      {"trainer",
       {{"batch_size", opts_.batch_size},
        {"learner_id", opts_.learner_id},
        {"num_learners", opts_.num_learners},
        {"replicas", opts_.replicas},
        {"seed", opts_.seed},
        {"threads", opts_.threads}}},
      {"data", {{"dir", data_dir_}, {"positions", positions}}},
      {"files",
       {{"model.safetensors", {{"bytes", model_bytes.size()}, {"checksum", ChecksumHex(Checksum64(model_bytes))}}},
        {"optimizer.safetensors", {{"bytes", opt_bytes.size()}, {"checksum", ChecksumHex(Checksum64(opt_bytes))}}}}},
      {"created_unix", UnixSeconds()}};
  // The manifest goes last: it commits the files above.
  return WriteJsonWithChecksum((fs::path(dir) / "checkpoint.json").string(), j);
}

Status TorchTrainer::CheckCompatible(const nlohmann::json& j, const std::string& dir,
                                     const std::string& manifest_path) const {
  if (j.at("format") != "atoll-checkpoint" || j.at("version") != kCheckpointVersion) {
    return FailedPreconditionError(manifest_path + ": not an atoll checkpoint of version " +
                                   std::to_string(kCheckpointVersion));
  }
  const std::string sig = ChecksumHex(diloco::ModelSignature(specs_));
  if (j.at("model_signature") != sig) {
    return FailedPreconditionError("checkpoint " + dir + " holds a different model (" + j.at("model").dump() +
                                   ") than this trainer (" + ModelConfigToJson(opts_.model).dump() + ")");
  }
  // Bit-exact resumption replays the same batches: the data layout must match too.
  const auto& tr = j.at("trainer");
  if (tr.at("replicas") != opts_.replicas || tr.at("learner_id") != opts_.learner_id ||
      tr.at("num_learners") != opts_.num_learners || j.at("model").at("seq_len") != opts_.model.seq_len ||
      tr.at("seed") != opts_.seed) {
    return FailedPreconditionError("checkpoint " + dir + " was written with another data layout (" + tr.dump() +
                                   ", seq " + j.at("model").at("seq_len").dump() +
                                   "): resume with the same --replicas, "
                                   "--seq, --seed and learner id");
  }
  return Status::Ok();
}

StatusOr<TorchTrainer::CheckpointManifest> TorchTrainer::ReadCheckpointManifest(const std::string& dir) const {
  const std::string manifest_path = (fs::path(dir) / "checkpoint.json").string();
  if (!FileExists(manifest_path)) return NotFoundError("no checkpoint in " + dir);
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonWithChecksum(manifest_path));
  CheckpointManifest m;
  try {
    ATOLL_RETURN_IF_ERROR(CheckCompatible(j, dir, manifest_path));
    m.step = j.at("step");
    m.tokens = j.at("tokens_trained");
    m.adam_step = j.at("optimizer_state").at("adam_step");
    for (const auto& p : j.at("data").at("positions")) {
      m.positions.push_back({p.at("epoch").get<int64_t>(), p.at("index").get<int64_t>()});
    }
    m.model_checksum = j.at("files").at("model.safetensors").at("checksum");
    m.optimizer_checksum = j.at("files").at("optimizer.safetensors").at("checksum");
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(manifest_path + ": malformed checkpoint manifest: " + e.what());
  }
  if (m.positions.size() != readers_.size()) {
    return DataLossError(manifest_path + ": " + std::to_string(m.positions.size()) + " data positions for " +
                         std::to_string(readers_.size()) + " replicas");
  }
  return m;
}

StatusOr<TorchTrainer::CheckpointTensors> TorchTrainer::ReadCheckpointTensors(const std::string& dir,
                                                                              const CheckpointManifest& m) const {
  ATOLL_ASSIGN_OR_RETURN(std::string model_bytes,
                         ReadFileVerified((fs::path(dir) / "model.safetensors").string(), m.model_checksum));
  ATOLL_ASSIGN_OR_RETURN(std::string opt_bytes,
                         ReadFileVerified((fs::path(dir) / "optimizer.safetensors").string(), m.optimizer_checksum));
  CheckpointTensors t;
  ATOLL_ASSIGN_OR_RETURN(t.model, DecodeSafetensors(model_bytes));
  ATOLL_ASSIGN_OR_RETURN(t.optimizer, DecodeSafetensors(opt_bytes));
  for (const auto& s : specs_) {
    int a = t.model.Find(s.name), b = t.optimizer.Find("exp_avg." + s.name),
        c = t.optimizer.Find("exp_avg_sq." + s.name);
    if (a < 0 || b < 0 || c < 0 || t.model.tensors[a].shape != s.shape || t.optimizer.tensors[b].shape != s.shape ||
        t.optimizer.tensors[c].shape != s.shape) {
      return DataLossError("checkpoint " + dir + ": tensor " + s.name + " missing or of the wrong shape");
    }
    t.param.push_back(a);
    t.exp_avg.push_back(b);
    t.exp_avg_sq.push_back(c);
  }
  return t;
}

Status TorchTrainer::LoadCheckpoint(const std::string& dir) {
  ATOLL_ASSIGN_OR_RETURN(CheckpointManifest m, ReadCheckpointManifest(dir));
  ATOLL_ASSIGN_OR_RETURN(CheckpointTensors t, ReadCheckpointTensors(dir, m));
  // Validate everything before touching any state.
  for (size_t r = 0; r < readers_.size(); ++r) {
    if (m.positions[r].index > readers_[r].num_windows()) {
      return DataLossError("checkpoint " + dir +
                           ": data position beyond the shard (was the data "
                           "folder prepared again?)");
    }
  }
  auto copy_into = [](torch::Tensor& dst, const std::vector<float>& src) {
    std::memcpy(dst.data_ptr<float>(), src.data(), src.size() * sizeof(float));
  };
  for (size_t i = 0; i < specs_.size(); ++i) {
    copy_into(model_->params()[i].tensor, t.model.values[t.param[i]]);
    copy_into(exp_avg_[i], t.optimizer.values[t.exp_avg[i]]);
    copy_into(exp_avg_sq_[i], t.optimizer.values[t.exp_avg_sq[i]]);
  }
  for (size_t r = 0; r < readers_.size(); ++r) {
    ATOLL_RETURN_IF_ERROR(readers_[r].Seek(m.positions[r]));
  }
  adam_step_ = m.adam_step;
  step_ = m.step;
  tokens_ = m.tokens;
  return Status::Ok();
}

}  // namespace

namespace {

// The spec's values in place of the seed's (TrainerOptions::init_weights).
Status LoadInitWeights(const std::string& path, Trainer& trainer) {
  ATOLL_ASSIGN_OR_RETURN(ModelSpec spec, OpenModelSpec(path, kDefaultEmbeddingPatterns));
  if (spec.preset().empty()) {
    return FailedPreconditionError("model spec " + path +
                                   " is not one of atoll's presets: atoll's learners train "
                                   "their GPT only; train this model with the Python package (docs/python.md)");
  }
  std::vector<diloco::TensorSpec> names = trainer.tensors(), theirs = spec.tensors;
  for (auto* list : {&names, &theirs}) {
    for (auto& t : *list) t.is_embedding = false;  // the preset's own flags decide
  }
  const std::string diff = FirstTensorDifference(names, theirs);
  if (!diff.empty()) {
    return FailedPreconditionError("model spec " + path + " does not hold this preset's tensors (" + diff + ")");
  }
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    ATOLL_RETURN_IF_ERROR(ReadSpecTensor(spec, t, trainer.Parameter(static_cast<int>(t))));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  std::unique_ptr<Trainer> trainer;
  try {
    auto made = TorchTrainer::Make(options);
    if (!made.ok()) return made.status();
    trainer = std::move(*made);
  } catch (const std::exception& e) {
    return TorchError("creating the trainer", e);
  }
  if (!options.init_weights.empty()) ATOLL_RETURN_IF_ERROR(LoadInitWeights(options.init_weights, *trainer));
  return trainer;
}

}  // namespace atl::model
