// bench_math: throughput of the syncer's hot math — merges (mean, RDA; M = 4 learners) and the
// wire codecs — each beside a memcpy of the same bytes, measured interleaved in the same run so
// that the ratio survives a shared, noisy machine. Prints a table and one JSON line at the end.
//
// Bytes counted: merges read M·N fp32 values; encode reads N fp32 values; decode writes N fp32
// values; the outer step touches 3·N (Δ, momentum, θ). The memcpy beside each op copies exactly
// that many bytes. Ratio = op time / memcpy time (median over the repetitions; lower is better).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/outer_optimizer.h"

namespace {

using atl::diloco::CodecOptions;
using atl::diloco::Encoding;

constexpr size_t kN = size_t{1} << 20;  // ~1M floats: about one fragment of a 24M model
constexpr size_t kM = 4;
constexpr int kReps = 9;

volatile unsigned char g_sink;

double Seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string op;
  double gbps;
  double memcpy_gbps;
  double ratio;
};

Result Measure(const std::string& op, size_t bytes, const std::function<void()>& fn) {
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  fn();  // warm caches, page in buffers
  std::memcpy(dst.data(), src.data(), bytes);
  std::vector<double> t_op, t_copy, ratio;
  for (int r = 0; r < kReps; ++r) {
    const double c = Seconds([&] {
      std::memcpy(dst.data(), src.data(), bytes);
      g_sink = dst[static_cast<size_t>(r) % bytes];
    });
    const double o = Seconds(fn);
    t_copy.push_back(c);
    t_op.push_back(o);
    ratio.push_back(o / c);
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  return {op, gb / Median(t_op), gb / Median(t_copy), Median(ratio)};
}

void Check(const atl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_math: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace

int main() {
  atl::Rng rng(1);
  std::vector<std::vector<float>> inputs(kM, std::vector<float>(kN));
  for (auto& v : inputs) {
    for (auto& x : v) x = static_cast<float>(rng.Normal() * 1e-3);
  }
  const std::vector<std::span<const float>> spans(inputs.begin(), inputs.end());
  const std::vector<double> weights = {1.0, 2.0, 0.5, 1.5};
  std::vector<float> out(kN);

  std::vector<Result> results;
  const size_t merge_bytes = kM * kN * sizeof(float);
  results.push_back(
      Measure("merge mean (M=4)", merge_bytes, [&] { Check(atl::diloco::WeightedMean(spans, weights, out)); }));
  results.push_back(
      Measure("merge RDA (M=4)", merge_bytes, [&] { Check(atl::diloco::RdaMerge(spans, weights, out)); }));

  std::vector<float> momentum(kN, 0.0f), theta(inputs[1]);
  results.push_back(Measure("outer step (Nesterov)", 3 * kN * sizeof(float),
                            [&] { Check(atl::diloco::OuterStep({}, inputs[0], momentum, theta)); }));

  const size_t value_bytes = kN * sizeof(float);
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    const CodecOptions options{e, 128};
    std::vector<std::byte> wire;
    wire.reserve(atl::diloco::EncodedSize(options, kN));
    const std::string name = atl::diloco::EncodingName(e);
    results.push_back(
        Measure("encode " + name, value_bytes, [&] { Check(atl::diloco::Encode(options, inputs[0], wire)); }));
    results.push_back(Measure("decode " + name, value_bytes, [&] { Check(atl::diloco::Decode(options, wire, out)); }));
  }

  std::printf("bench_math: N = %zu floats (%.1f MB), M = %zu, median of %d interleaved runs\n", kN,
              static_cast<double>(value_bytes) / 1e6, kM, kReps);
  std::printf("%-24s %10s %14s %18s\n", "op", "GB/s", "memcpy GB/s", "time / memcpy");
  for (const auto& r : results) {
    std::printf("%-24s %10.2f %14.2f %17.2fx\n", r.op.c_str(), r.gbps, r.memcpy_gbps, r.ratio);
  }
  std::string json =
      "{\"bench\":\"math\",\"n\":" + std::to_string(kN) + ",\"m\":" + std::to_string(kM) + ",\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "%s{\"op\":\"%s\",\"gbps\":%.3f,\"memcpy_gbps\":%.3f,\"ratio_vs_memcpy\":%.3f}",
                  i ? "," : "", results[i].op.c_str(), results[i].gbps, results[i].memcpy_gbps, results[i].ratio);
    json += buf;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  return 0;
}
