// Recognising the folders that hold a trained model (model_source.h), loading their weights and
// evaluating them. Torch-free: the model is reached through Trainer and named fp32 spans.
#include "atoll/model/model_source.h"

#include <chrono>
#include <cstring>
#include <filesystem>

#include "atoll/core/file.h"
#include "atoll/model/data.h"
#include "atoll/model/run.h"
#include "model_json.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

constexpr char kLayouts[] =
    "expected an `atoll train` checkpoint folder (checkpoint.json), an `atoll train` run folder "
    "(checkpoints/step_*) or an `atoll run` folder (global.safetensors + config.json)";

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// An `atoll train` checkpoint folder (kind checkpoint or train run).
StatusOr<ModelSource> FromCheckpoint(const std::string& path, const std::string& dir, ModelSourceKind kind) {
  const std::string manifest = (fs::path(dir) / "checkpoint.json").string();
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonWithChecksum(manifest));
  ModelSource s;
  s.kind = kind;
  s.path = path;
  s.checkpoint_dir = dir;
  s.weights_file = (fs::path(dir) / "model.safetensors").string();
  try {
    if (j.value("format", "") != "atoll-checkpoint") {
      return InvalidArgumentError(manifest + " is not an atoll checkpoint manifest");
    }
    ATOLL_ASSIGN_OR_RETURN(s.model, ModelConfigFromJson(j.at("model")));
    s.data_dir = j.at("data").at("dir").get<std::string>();
    s.weights_checksum = j.at("files").at("model.safetensors").at("checksum").get<std::string>();
    s.batch_size = j.at("trainer").at("batch_size").get<int>();
    s.seed = j.at("trainer").at("seed").get<uint64_t>();
    s.step = j.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(manifest + ": malformed checkpoint manifest: " + e.what());
  }
  if (kind == ModelSourceKind::kTrainRun) {
    // The run's evaluation batches, when its config.json says (optional).
    auto text = ReadFile((fs::path(path) / "config.json").string());
    if (text.ok()) {
      auto c = nlohmann::json::parse(*text, nullptr, false);
      if (c.is_object() && c.contains("eval_batches") && c["eval_batches"].is_number_integer()) {
        s.eval_batches = c["eval_batches"].get<int>();
      }
    }
  }
  return s;
}

// The flat run config `atoll run` writes (runtime/run_config.cc ToJson): only the keys that
// shape the model and its data are read here (the model library cannot see the runtime's).
Status ReadClusterConfig(const std::string& config_path, ModelSource& s) {
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(config_path + " is corrupted: not a JSON object");
  }
  if (j.contains("model") || !j.contains("preset") || !j.contains("data")) {
    return InvalidArgumentError(config_path +
                                " is not an `atoll run` config (no 'preset' and "
                                "'data' keys)");
  }
  try {
    s.model.preset = j.at("preset").get<std::string>();
    s.model.seq_len = j.value("seq", 256);
    s.data_dir = j.at("data").get<std::string>();
    s.batch_size = j.value("batch", 16);
    s.seed = j.value("seed", uint64_t{0});
    s.eval_batches = j.value("eval_batches", 0);
    s.run_id = j.value("run_id", std::string());
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(config_path + ": malformed run config: " + e.what());
  }
  return Status::Ok();
}

// An `atoll run` folder (or a .safetensors file inside one).
StatusOr<ModelSource> FromClusterRun(const std::string& path, const std::string& folder, const std::string& weights,
                                     const std::string& data_dir) {
  ModelSource s;
  s.kind = ModelSourceKind::kClusterRun;
  s.path = path;
  s.weights_file = weights;
  ATOLL_RETURN_IF_ERROR(ReadClusterConfig((fs::path(folder) / "config.json").string(), s));
  const std::string vocab_dir = data_dir.empty() ? s.data_dir : data_dir;
  auto manifest = LoadDataManifest(vocab_dir);
  if (!manifest.ok()) {
    return manifest.status().WithContext("the vocabulary of the run in " + folder + " comes from its data folder " +
                                         vocab_dir + " (pass --data with the same prepared data if it moved)");
  }
  const int seq = s.model.seq_len;
  auto config = PresetConfig(s.model.preset, manifest->vocab_size);
  if (!config.ok()) return config.status().WithContext(folder + "/config.json");
  s.model = *config;
  s.model.seq_len = seq;
  if (!FileExists(weights)) {
    if (FileExists((fs::path(folder) / "state" / "meta.json").string())) {
      return FailedPreconditionError(folder +
                                     " holds no global.safetensors (the run did not finish). Write one from the "
                                     "syncer's committed state: atoll export --state " +
                                     folder + "/state");
    }
    return NotFoundError("no global.safetensors in " + folder + " (" + kLayouts + ")");
  }
  return s;
}

// FailedPrecondition unless `eval_dir` tokenises text as the model's own data folder does (the
// loss of a model on another tokenizer's ids means nothing). Passes when the model's folder is
// gone (nothing to compare with).
Status CheckSameTokenizer(const ModelSource& s, const DataManifest& eval) {
  auto own = LoadDataManifest(s.data_dir);
  if (!own.ok()) return Status::Ok();
  const auto key = [](const DataManifest& m) {
    return std::string(TokenizerKindName(m.tokenizer)) + "/" + std::to_string(m.vocab_size) + "/" +
           m.json.value("tokenizer_checksum", std::string());
  };
  if (key(*own) == key(eval)) return Status::Ok();
  return FailedPreconditionError("data folder " + eval.dir + " uses another tokenizer (" +
                                 TokenizerKindName(eval.tokenizer) + ", vocab " + std::to_string(eval.vocab_size) +
                                 ") than the one the model was trained with in " + s.data_dir + " (" +
                                 TokenizerKindName(own->tokenizer) + ", vocab " + std::to_string(own->vocab_size) +
                                 "): evaluate on data prepared with the same tokenizer");
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

const char* ModelSourceKindName(ModelSourceKind kind) {
  switch (kind) {
    case ModelSourceKind::kCheckpoint: return "checkpoint";
    case ModelSourceKind::kTrainRun: return "train run";
    case ModelSourceKind::kClusterRun: return "atoll run";
  }
  return "?";
}

std::string ModelSource::Describe() const {
  std::string where =
      kind == ModelSourceKind::kCheckpoint ? "checkpoint " + checkpoint_dir
      : kind == ModelSourceKind::kTrainRun
          ? "train run folder " + path + " (checkpoint " + fs::path(checkpoint_dir).filename().string() + ")"
          : "atoll run folder " + fs::path(weights_file).parent_path().string() + " (" +
                fs::path(weights_file).filename().string() + ")";
  return where + "; preset " + model.preset + ", vocab " + std::to_string(model.vocab_size) + ", seq " +
         std::to_string(model.seq_len);
}

StatusOr<ModelSource> ResolveModelSource(const std::string& path, const std::string& data_dir) {
  std::error_code ec;
  if (path.empty()) return InvalidArgumentError("no model given (" + std::string(kLayouts) + ")");
  if (fs::is_regular_file(path, ec)) {
    const std::string folder = fs::path(path).parent_path().string();
    if (EndsWith(path, ".safetensors") && FileExists(folder + "/config.json")) {
      return FromClusterRun(path, folder.empty() ? "." : folder, path, data_dir);
    }
    return InvalidArgumentError(path + " is a file; " + kLayouts +
                                ", or a .safetensors file inside an `atoll run` folder");
  }
  if (!fs::is_directory(path, ec)) return NotFoundError("no model at " + path + ": no such folder");
  if (FileExists((fs::path(path) / "checkpoint.json").string())) {
    return FromCheckpoint(path, path, ModelSourceKind::kCheckpoint);
  }
  if (fs::is_directory(fs::path(path) / "checkpoints", ec)) {
    ATOLL_ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(path));
    return FromCheckpoint(path, dir, ModelSourceKind::kTrainRun);
  }
  const bool has_config = FileExists((fs::path(path) / "config.json").string());
  const std::string global = (fs::path(path) / "global.safetensors").string();
  if (has_config && (FileExists(global) || fs::is_directory(fs::path(path) / "state", ec))) {
    return FromClusterRun(path, path, global, data_dir);
  }
  if (FileExists(global)) {
    return NotFoundError(path +
                         " holds global.safetensors but no config.json: an `atoll run` "
                         "folder's model shape and data folder come from its config.json; copy "
                         "the run's config.json beside it");
  }
  return NotFoundError("no checkpoint at " + path + " (" + kLayouts + ")");
}

Status LoadSourceWeights(const ModelSource& source, const std::vector<diloco::TensorSpec>& specs,
                         const std::function<std::span<float>(size_t)>& param) {
  StatusOr<SafetensorsData> read = DataLossError("unread");
  if (!source.weights_checksum.empty()) {
    ATOLL_ASSIGN_OR_RETURN(std::string bytes, ReadFileVerified(source.weights_file, source.weights_checksum));
    read = DecodeSafetensors(bytes);
    if (!read.ok()) read = read.status().WithContext(source.weights_file);
  } else {
    read = ReadSafetensors(source.weights_file);
  }
  if (!read.ok()) return read.status();
  const SafetensorsData& w = *read;
  const std::string file_run = w.metadata.value("run_id", std::string());
  if (!source.run_id.empty() && !file_run.empty() && file_run != source.run_id) {
    return FailedPreconditionError(source.weights_file + " holds the model of run '" + file_run + "', not of run '" +
                                   source.run_id +
                                   "' whose config.json is "
                                   "beside it: keep each run's files in its own run folder");
  }
  std::vector<const std::vector<float>*> src;
  for (const auto& spec : specs) {
    const int i = w.Find(spec.name);
    if (i < 0) {
      return DataLossError(source.weights_file + ": tensor " + spec.name + " is missing (" + source.Describe() + ")");
    }
    if (w.tensors[static_cast<size_t>(i)].shape != spec.shape) {
      return DataLossError(source.weights_file + ": tensor " + spec.name + " is " +
                           ShapeText(w.tensors[static_cast<size_t>(i)].shape) + " in the file but " +
                           ShapeText(spec.shape) + " in the model it is loaded into (the source: " + source.Describe() +
                           "); use the source's model flags and the data folder it was trained "
                           "on");
    }
    src.push_back(&w.values[static_cast<size_t>(i)]);
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    std::span<float> dst = param(k);
    if (dst.size() != src[k]->size()) return InternalError("parameter view of the wrong size");
    std::memcpy(dst.data(), src[k]->data(), dst.size() * sizeof(float));
  }
  return Status::Ok();
}

Status LoadSourceWeights(const ModelSource& source, Trainer& trainer) {
  return LoadSourceWeights(source, trainer.tensors(),
                           [&trainer](size_t i) { return trainer.Parameter(static_cast<int>(i)); });
}

StatusOr<EvalResult> EvaluateSource(const EvalOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.batches < 0 || o.batch_size < 0 || o.threads < 1) {
    return InvalidArgumentError(
        "eval: --batches and --batch must be ≥ 0 (0 = the source's), "
        "--threads ≥ 1");
  }
  EvalResult r;
  ATOLL_ASSIGN_OR_RETURN(r.source, ResolveModelSource(o.checkpoint, o.data_dir));
  r.data_dir = o.data_dir.empty() ? r.source.data_dir : o.data_dir;
  ATOLL_ASSIGN_OR_RETURN(DataManifest data, LoadDataManifest(r.data_dir));
  if (!o.data_dir.empty()) ATOLL_RETURN_IF_ERROR(CheckSameTokenizer(r.source, data));
  r.batches = o.batches > 0 ? o.batches : (r.source.eval_batches > 0 ? r.source.eval_batches : kDefaultEvalBatches);
  r.batch_size = o.batch_size > 0 ? o.batch_size : r.source.batch_size;

  TrainerOptions t;
  t.model = r.source.model;
  t.data_dir = r.data_dir;
  t.batch_size = r.batch_size;
  t.seed = r.source.seed;
  t.threads = o.threads;
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(t));
  ATOLL_RETURN_IF_ERROR(LoadSourceWeights(r.source, *trainer));
  ATOLL_ASSIGN_OR_RETURN(r.stats, trainer->Evaluate(r.batches));
  r.params = trainer->num_params();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace atl::model
