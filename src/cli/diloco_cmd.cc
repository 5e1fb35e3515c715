// `atoll demo` and `atoll plan`: the pure math of Decoupled DiLoCo (src/diloco) shown to a
// person. Thin: flags in, library calls, printing out.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/format.h"
#include "atoll/core/rng.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/outer_optimizer.h"
#include "command.h"

namespace atl::cli {
namespace {

namespace dl = atl::diloco;

int Fail(const char* command, const Status& s) {
  std::fprintf(stderr, "atoll %s: %s\n", command, s.ToString().c_str());
  return 2;
}

// ---- atoll plan ---------------------------------------------------------------------------

struct PlanFlags {
  int fragments = dl::PlanOptions{}.num_fragments;
  std::string strategy = dl::PlanStrategyName(dl::PlanOptions{}.strategy);
  bool no_split = false;
  bool json = false;
};

nlohmann::ordered_json PlanJson(const dl::FragmentPlan& plan, const dl::PlanOptions& o) {
  nlohmann::ordered_json j;
  j["strategy"] = dl::PlanStrategyName(o.strategy);
  j["split_large"] = o.split_large;
  j["num_fragments"] = plan.num_fragments();
  j["total_numel"] = plan.total_numel;
  j["ideal_numel"] = plan.ideal_numel;
  j["peak_to_ideal"] = plan.peak_to_ideal;
  j["tensors"] = nlohmann::ordered_json::array();
  for (const auto& t : plan.tensors) {
    j["tensors"].push_back(
        {{"name", t.name}, {"shape", t.shape}, {"numel", t.numel}, {"is_embedding", t.is_embedding}});
  }
  j["fragments"] = nlohmann::ordered_json::array();
  for (const auto& f : plan.fragments) {
    nlohmann::ordered_json slices = nlohmann::ordered_json::array();
    for (const auto& s : f.slices) {
      slices.push_back({{"tensor", plan.tensors[static_cast<size_t>(s.tensor)].name},
                        {"offset", s.offset},
                        {"count", s.count},
                        {"is_embedding", s.is_embedding}});
    }
    j["fragments"].push_back({{"index", f.index}, {"numel", f.numel}, {"slices", slices}});
  }
  return j;
}

int RunPlan(const PlanFlags& flags) {
  dl::PlanOptions o;
  o.num_fragments = flags.fragments;
  o.split_large = !flags.no_split;
  auto strategy = dl::ParsePlanStrategy(flags.strategy);
  if (!strategy.ok()) return Fail("plan", strategy.status().WithContext("--strategy"));
  o.strategy = *strategy;
  auto plan = dl::MakeFragmentPlan(dl::ExampleGptTensors(), o);
  if (!plan.ok()) return Fail("plan", plan.status());
  if (flags.json) {
    std::printf("%s\n", PlanJson(*plan, o).dump().c_str());
  } else {
    std::printf("Fragment plan of the tiny GPT (vocab 4096, d 128, 4 layers), %s%s:\n%s",
                dl::PlanStrategyName(o.strategy),
                o.strategy == dl::PlanStrategy::kBalanced && !o.split_large ? ", no splitting" : "",
                dl::DescribePlan(*plan).c_str());
  }
  return 0;
}

void RegisterPlan(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Print the fragment plan of the tiny GPT shape (how parameters split into P fragments)");
  sub->add_option("-P,--fragments", flags->fragments, "Number of fragments P (≥ 1)")->capture_default_str();
  sub->add_option("--strategy", flags->strategy, "balanced (greedy bin packing) or strided (by layer)")
      ->capture_default_str();
  sub->add_flag("--no-split", flags->no_split, "Never cut large tensors into row blocks");
  sub->add_flag("--json", flags->json, "Print the plan as one JSON object");
  sub->callback([flags, &ctx] { ctx.action = [flags] { return RunPlan(*flags); }; });
}

// ---- atoll demo ---------------------------------------------------------------------------

// 1. How three planners cut the tensors into P fragments.
Status ShowFragmentPlans(const std::vector<dl::TensorSpec>& tensors, int64_t total) {
  const int P = 24;
  std::printf("1. Fragments: P = %d, ideal %s values each\n", P,
              Grouped(static_cast<int64_t>(std::llround(static_cast<double>(total) / P))).c_str());
  struct Variant {
    const char* label;
    dl::PlanOptions options;
  };
  const Variant variants[] = {
      {"balanced (largest first into lightest, split big tensors)", {P, dl::PlanStrategy::kBalanced, true}},
      {"balanced without splitting", {P, dl::PlanStrategy::kBalanced, false}},
      {"strided (layer i -> fragment i mod P)", {P, dl::PlanStrategy::kStrided, true}},
  };
  for (const auto& v : variants) {
    ATOLL_ASSIGN_OR_RETURN(dl::FragmentPlan plan, dl::MakeFragmentPlan(tensors, v.options));
    int64_t lo = plan.total_numel, hi = 0;
    int empty = 0;
    for (const auto& f : plan.fragments) {
      lo = std::min(lo, f.numel);
      hi = std::max(hi, f.numel);
      empty += f.numel == 0 ? 1 : 0;
    }
    std::printf("   %-58s peak/ideal %5.2f  sizes %s..%s", v.label, plan.peak_to_ideal, Grouped(lo).c_str(),
                Grouped(hi).c_str());
    if (empty > 0) std::printf("  (%d empty)", empty);
    std::printf("\n");
  }
  std::printf("   (the embedding is %.1fx the ideal fragment: balanced cuts it into row blocks)\n\n",
              static_cast<double>(tensors[0].numel) * P / static_cast<double>(total));
  return Status::Ok();
}

// 2. The staggered schedule: which fragment goes out after each step, which merge comes back.
void ShowSchedule() {
  const dl::Schedule schedule;  // the defaults: P = H = 24, τ = 2
  std::printf("2. Staggered schedule, H = %d, P = %d, tau = %d: one fragment out, one back per step\n", schedule.H,
              schedule.P, schedule.tau);
  for (int64_t t = 0; t < 5; ++t) {
    std::printf("   after step %lld: send fragment %d", static_cast<long long>(t), schedule.FragmentAt(t));
    const int64_t sent = t + 1 - schedule.DueStep(0);  // the step whose merge is due before t + 1
    if (sent >= 0) {
      std::printf(", apply merged fragment %d (sent after step %lld, due before step %lld)", schedule.FragmentAt(sent),
                  static_cast<long long>(sent), static_cast<long long>(schedule.DueStep(sent)));
    }
    std::printf("\n");
  }
  const dl::Schedule slow{.H = 48, .P = 24, .tau = 2};
  std::printf("   with H = 48: fragment p goes out at step 2p of each period (fragment 5 at step %d)\n\n",
              slow.SendOffset(5));
}

// 3. Merge: M learners' outer gradients are nearly orthogonal in high dimension, so their
// weighted mean shrinks with M while the RDA merge keeps the norm. Returns the RDA merge.
StatusOr<std::vector<float>> ShowMerges(size_t n) {
  const int64_t tokens[4] = {32768, 32768, 16384, 8192};
  const int64_t steps[4] = {24, 24, 24, 12};
  std::vector<std::vector<float>> grads(4, std::vector<float>(n));
  Rng rng(2026);
  for (auto& g : grads) {
    for (auto& x : g) x = static_cast<float>(rng.Normal());
    const double norm = dl::L2Norm(g);
    for (auto& x : g) x = static_cast<float>(x / norm);
  }
  std::vector<double> weights;
  std::printf("3. Merging 4 outer gradients of %s values, each of norm 1 (cosine ~ 0)\n",
              Grouped(static_cast<int64_t>(n)).c_str());
  std::printf("   token weights w = tokens^2 / steps:");
  for (int m = 0; m < 4; ++m) {
    weights.push_back(dl::TokenWeight(tokens[m], steps[m]));
    std::printf(" %.3g", weights.back());
  }
  std::printf("\n");
  const std::vector<std::span<const float>> spans(grads.begin(), grads.end());
  std::vector<float> mean(n), rda(n);
  ATOLL_RETURN_IF_ERROR(dl::WeightedMean(spans, weights, mean));
  ATOLL_RETURN_IF_ERROR(dl::RdaMerge(spans, weights, rda));
  std::printf("   weighted mean: norm %.3f  (shrinks with M; the outer lr would have to follow)\n", dl::L2Norm(mean));
  std::printf("   RDA:           norm %.3f  (mean of the norms, mean of the directions)\n\n", dl::L2Norm(rda));
  return rda;
}

// 4. One outer step from θ = 0 with the merge as the outer gradient.
Status ShowOuterStep(const std::vector<float>& delta) {
  std::vector<float> theta(delta.size(), 0.0f), momentum(delta.size(), 0.0f);
  const dl::OuterOptimizerOptions opt;  // lr 0.7, momentum 0.9, Nesterov
  ATOLL_RETURN_IF_ERROR(dl::OuterStep(opt, delta, momentum, theta));
  std::printf(
      "4. One Nesterov step (lr %.1f, momentum %.1f) with the RDA merge as delta:\n"
      "   |theta' - theta| = %.3f = lr * (1 + momentum) * |delta| on the first step\n\n",
      opt.lr, opt.momentum, dl::L2Norm(theta));
  return Status::Ok();
}

// 5. Wire size and round-trip error of each codec on the same outer gradient.
Status ShowCodecs(const std::vector<float>& delta) {
  const size_t n = delta.size();
  std::printf("5. Codecs on that outer gradient (%s values, blocks of 128):\n",
              Grouped(static_cast<int64_t>(n)).c_str());
  std::vector<std::byte> wire;
  std::vector<float> back(n);
  for (dl::Encoding e :
       {dl::Encoding::kFp32, dl::Encoding::kBf16, dl::Encoding::kInt8, dl::Encoding::kInt4, dl::Encoding::kInt2}) {
    const dl::CodecOptions co{e, 128};
    ATOLL_RETURN_IF_ERROR(dl::Encode(co, delta, wire));
    ATOLL_RETURN_IF_ERROR(dl::Decode(co, wire, back));
    double max_err = 0, max_abs = 0;
    for (size_t i = 0; i < n; ++i) {
      max_err = std::max(max_err, std::fabs(static_cast<double>(delta[i]) - back[i]));
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(delta[i])));
    }
    std::printf("   %s  %9s bytes (%4.1fx smaller)  max error %.2e (%.3f%% of max |x|)\n", dl::EncodingName(e),
                Grouped(static_cast<int64_t>(wire.size())).c_str(),
                static_cast<double>(n * 4) / static_cast<double>(wire.size()), max_err, 100 * max_err / max_abs);
  }
  return Status::Ok();
}

Status ShowDemo() {
  const auto tensors = dl::ExampleGptTensors();
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel;
  std::printf(
      "atoll demo: the math of Decoupled DiLoCo on a tiny GPT\n"
      "(vocab 4096, d 128, 4 layers, tied embedding: %zu tensors, %s parameters)\n\n",
      tensors.size(), Grouped(total).c_str());
  ATOLL_RETURN_IF_ERROR(ShowFragmentPlans(tensors, total));
  ShowSchedule();
  ATOLL_ASSIGN_OR_RETURN(std::vector<float> rda, ShowMerges(65536));
  ATOLL_RETURN_IF_ERROR(ShowOuterStep(rda));
  ATOLL_RETURN_IF_ERROR(ShowCodecs(rda));
  std::printf("\nSee docs/diloco.md for the formulas; `atoll plan --help` for the plan tool.\n");
  return Status::Ok();
}

int RunDemo() {
  const Status s = ShowDemo();
  return s.ok() ? 0 : Fail("demo", s);
}

void RegisterDemo(CLI::App& app, CommandContext& ctx) {
  CLI::App* sub = app.add_subcommand(
      "demo", "A one-second tour of the math: fragment plan, schedule, RDA merge, outer step, codecs");
  sub->callback([&ctx] { ctx.action = [] { return RunDemo(); }; });
}

}  // namespace

ATOLL_COMMAND(90, RegisterDemo);
ATOLL_COMMAND(91, RegisterPlan);

}  // namespace atl::cli
