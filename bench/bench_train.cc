// bench_train: tokens/s of atoll's training step (Trainer::Step: data reader, GPT, clipping,
// AdamW, schedule) against a minimal hand-written libtorch loop on the same model module and
// batch shape, measured side by side in one run (alternating rounds, medians). Optionally also
// against the conventional PyTorch (Python) loop of shared/anchors/torch_baseline.py on the same
// byte-level model size, at the same precision (the anchor with --bf16 when atoll trains in bf16),
// measured in the same run. Prints ratios and one JSON line at the end.
//
// Usage: bench_train [--data DIR] [--preset tiny] [--batch 16] [--seq 256] [--threads 1]
//                    [--precision auto|fp32|bf16]
//                    [--rounds 5] [--steps 4] [--anchor-steps 30] [--no-anchor]
// The data folder is prepared with the default corpus if needed (as `atoll train` does).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../src/model/gpt.h"
#include "atoll/core/platform.h"
#include "atoll/model/data.h"
#include "atoll/model/trainer.h"

namespace {

namespace fs = std::filesystem;
using atl::model::Trainer;
using atl::model::TrainerOptions;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

[[noreturn]] void Die(const std::string& what, const atl::Status& st) {
  std::fprintf(stderr, "bench_train: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

// The reference: what a libtorch user writes by hand — same GPT module, a fixed batch,
// torch::optim::AdamW, clip_grad_norm_. No data pipeline, no schedule, no bookkeeping.
struct MinimalLoop {
  std::unique_ptr<atl::model::Gpt> model;
  std::unique_ptr<torch::optim::AdamW> opt;
  std::vector<torch::Tensor> params;
  torch::Tensor x, y;

  MinimalLoop(const TrainerOptions& o, const std::vector<uint16_t>& tokens) {
    auto m = atl::model::Gpt::Create(o.model, o.seed);
    if (!m.ok()) Die("model", m.status());
    model = std::move(m).value();
    for (auto& p : model->params()) params.push_back(p.tensor);
    opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(o.optim.lr)
                                                            .betas({o.optim.beta1, o.optim.beta2})
                                                            .weight_decay(o.optim.weight_decay));
    const int64_t T = o.model.seq_len, B = o.batch_size;
    auto batch = torch::empty({B, T + 1}, torch::kInt64);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t <= T; ++t) batch[b][t] = tokens[static_cast<size_t>(b * 997 + t)];
    }
    x = batch.narrow(1, 0, T);
    y = batch.narrow(1, 1, T);
  }
  void Step(double clip) {
    opt->zero_grad();
    auto loss = model->Loss(x, y);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, clip);
    opt->step();
    (void)loss.item<double>();  // the atoll step reads the loss too
  }
};

struct Args {
  std::string data = "data";
  std::string preset = "tiny";
  atl::model::Precision precision = atl::model::Precision::kAuto;
  int batch = 16, seq = 256, threads = 1, rounds = 5, steps = 4, anchor_steps = 30;
  bool anchor = true;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_train: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--data") a.data = next();
    else if (k == "--preset") a.preset = next();
    else if (k == "--precision") {
      auto p = atl::model::ParsePrecision(next());
      if (!p.ok()) Die("--precision", p.status());
      a.precision = *p;
    } else if (k == "--batch") a.batch = std::stoi(next());
    else if (k == "--seq") a.seq = std::stoi(next());
    else if (k == "--threads") a.threads = std::stoi(next());
    else if (k == "--rounds") a.rounds = std::stoi(next());
    else if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--anchor-steps") a.anchor_steps = std::stoi(next());
    else if (k == "--no-anchor") a.anchor = false;
    else {
      std::fprintf(stderr, "bench_train: unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

struct Pair {
  double atoll_tps = 0, minimal_tps = 0, atoll_ms = 0, minimal_ms = 0;
};

// Alternates rounds of `steps` atoll steps and `steps` minimal steps (order flipped every round
// so drift on a shared machine hits both alike); returns the medians.
Pair SideBySide(const TrainerOptions& o, const std::vector<uint16_t>& tokens, int rounds, int steps) {
  auto trainer = Trainer::Create(o);
  if (!trainer.ok()) Die("trainer", trainer.status());
  MinimalLoop ref(o, tokens);
  const double tokens_per_step = static_cast<double>(o.batch_size) * o.model.seq_len;
  // Warm-up: first steps allocate.
  for (int i = 0; i < 2; ++i) {
    if (!(*trainer)->Step().ok()) Die("step", atl::InternalError("warm-up"));
    ref.Step(o.optim.clip_norm);
  }
  std::vector<double> a_ms, m_ms;
  auto time_atoll = [&] {
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
      auto st = (*trainer)->Step();
      if (!st.ok()) Die("step", st.status());
    }
    a_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps);
  };
  auto time_minimal = [&] {
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) ref.Step(o.optim.clip_norm);
    m_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps);
  };
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      time_atoll();
      time_minimal();
    } else {
      time_minimal();
      time_atoll();
    }
    std::printf("  round %d: atoll %.0f ms/step, minimal libtorch %.0f ms/step\n", r + 1, a_ms.back(), m_ms.back());
    std::fflush(stdout);
  }
  Pair p;
  p.atoll_ms = Median(a_ms);
  p.minimal_ms = Median(m_ms);
  p.atoll_tps = 1000 * tokens_per_step / p.atoll_ms;
  p.minimal_tps = 1000 * tokens_per_step / p.minimal_ms;
  return p;
}

// Runs the PyTorch anchor single-worker and returns its tokens/s (0 when unavailable).
// The anchor at atoll's precision: bf16 autocast (--bf16) exactly when atoll trains in bf16.
double RunAnchor(const Args& a, const fs::path& script, const std::string& workdir) {
  const bool bf16 = atl::model::ResolvePrecision(a.precision) == atl::model::Precision::kBf16;
  std::string cmd = "ANCHOR_WORKDIR='" + workdir + "' /usr/bin/python3 '" + script.string() +
                    "' --mode ddp -W 1 --steps " + std::to_string(a.anchor_steps) +
                    " --d-model 128 --n-layer 4 --n-head 4 --seq " + std::to_string(a.seq) + " --batch " +
                    std::to_string(a.batch) + " --eval-every " + std::to_string(a.anchor_steps) + " --eval-batches 1" +
                    (bf16 ? " --bf16" : "") + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  // The launcher prints one JSON object as its last line.
  size_t brace = out.rfind("\n{");
  std::string last = brace == std::string::npos ? out : out.substr(brace + 1);
  auto j = nlohmann::json::parse(last, nullptr, false);
  if (j.is_discarded() || !j.contains("tokens_per_second")) return 0;
  return j["tokens_per_second"].get<double>();
}

}  // namespace

int main(int argc, char** argv) {
  atl::EnsureBlasEnvironmentOrReexec(argc, argv);
  atl::KeepFreedMemory();  // as the atoll binary does: both loops reuse their pages, not fault in new ones
  Args a = Parse(argc, argv);
  std::printf("bench_train: OPENBLAS_CORETYPE=%s, threads %d\n",
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)", a.threads);
  auto data = atl::model::EnsureDataPrepared(a.data, [](const std::string& s) { std::printf("%s\n", s.c_str()); });
  if (!data.ok()) Die("data", data.status());
  auto tokens = atl::model::LoadTrainTokens(*data);
  if (!tokens.ok()) Die("data", tokens.status());

  TrainerOptions o;
  auto config = atl::model::PresetConfig(a.preset, data->vocab_size);
  if (!config.ok()) Die("preset", config.status());
  o.model = *config;
  o.model.seq_len = a.seq;
  o.data_dir = a.data;
  o.batch_size = a.batch;
  o.threads = a.threads;
  o.precision = a.precision;
  o.optim.total_steps = 1000;
  const char* precision = atl::model::PrecisionName(atl::model::ResolvePrecision(a.precision));
  std::printf(
      "model %s: %.2f M params, batch %d × seq %d; atoll trains in %s (the minimal loop and the "
      "PyTorch anchor in fp32)\n",
      a.preset.c_str(), atl::model::ParameterCount(o.model) / 1e6, a.batch, a.seq, precision);
  Pair p = SideBySide(o, *tokens, a.rounds, a.steps);
  const double ratio = p.atoll_tps / p.minimal_tps;
  std::printf(
      "atoll Trainer::Step %.0f tokens/s (%.0f ms/step) vs minimal libtorch loop %.0f "
      "tokens/s (%.0f ms/step): ratio %.3f (target ≥ 0.95)\n",
      p.atoll_tps, p.atoll_ms, p.minimal_tps, p.minimal_ms, ratio);

  nlohmann::json out = {{"bench", "train"},
                        {"preset", a.preset},
                        {"params", atl::model::ParameterCount(o.model)},
                        {"batch", a.batch},
                        {"seq", a.seq},
                        {"threads", a.threads},
                        {"precision", *precision},
                        {"atoll_tokens_per_s", p.atoll_tps},
                        {"atoll_ms_per_step", p.atoll_ms},
                        {"minimal_libtorch_tokens_per_s", p.minimal_tps},
                        {"ratio_vs_minimal_libtorch", ratio}};

  // The conventional PyTorch loop (Python) on the byte-level model of the anchor script.
  fs::path script = ATOLL_ANCHOR_SCRIPT;
  if (!a.anchor) {
    std::printf("PyTorch anchor: skipped (--no-anchor)\n");
  } else if (!fs::exists(script)) {
    std::printf("PyTorch anchor: skipped (%s not found)\n", script.string().c_str());
  } else if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    std::printf("PyTorch anchor: skipped (/usr/bin/python3 cannot import torch)\n");
  } else {
    // atoll on the anchor's shape: bytes of the KJV, d128, 4 layers, 4 heads, GELU MLP 4·d.
    const std::string work = (fs::temp_directory_path() / "atoll-bench-anchor").string();
    atl::model::DataOptions d;
    d.out_dir = work + "/data-byte";
    d.tokenizer = atl::model::TokenizerKind::kByte;
    d.inputs = {(fs::path(a.data) / "text/kjv.txt").string()};
    auto bd = atl::model::PrepareData(d);
    if (!bd.ok()) Die("byte data", bd.status());
    TrainerOptions ob = o;
    ob.data_dir = d.out_dir;
    ob.model.preset = "anchor";
    ob.model.vocab_size = 256;
    ob.model.d_model = 128;
    ob.model.n_layers = 4;
    ob.model.n_heads = 4;
    ob.model.d_ff = 512;
    ob.model.mlp = atl::model::Mlp::kGelu;
    std::printf(
        "PyTorch anchor (%s, %d steps, single worker) vs atoll on the same shape "
        "(byte-level, %.2f M params), both in %s:\n",
        script.filename().string().c_str(), a.anchor_steps, atl::model::ParameterCount(ob.model) / 1e6,
        atl::model::PrecisionName(atl::model::ResolvePrecision(a.precision)));
    auto bt = atl::model::LoadTrainTokens(*bd);
    if (!bt.ok()) Die("byte data", bt.status());
    Pair before = SideBySide(ob, *bt, 3, a.steps);
    const double py = RunAnchor(a, script, work);
    Pair after = SideBySide(ob, *bt, 3, a.steps);
    const double atoll_byte = (before.atoll_tps + after.atoll_tps) / 2;
    if (py > 0) {
      std::printf("atoll %.0f tokens/s vs PyTorch %.0f tokens/s: ratio %.3f\n", atoll_byte, py, atoll_byte / py);
      out["anchor_atoll_tokens_per_s"] = atoll_byte;
      out["anchor_pytorch_tokens_per_s"] = py;
      out["ratio_vs_pytorch"] = atoll_byte / py;
    } else {
      std::printf("PyTorch anchor: no result (the script failed)\n");
    }
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
