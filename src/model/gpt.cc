#include "gpt.h"

#include <ATen/autocast_mode.h>

#include <cmath>

#include "lm_head_loss.h"

namespace atl::model {
namespace {

constexpr double kNormEps = 1e-5;
constexpr double kRopeBase = 10000.0;

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& gain) {
  // x [B,T,D]: x / rms(x) · gain
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + kNormEps) * gain;
}

}  // namespace

CpuBf16Autocast::CpuBf16Autocast(bool on) : on_(on) {
  if (!on_) return;
  prev_ = at::autocast::is_cpu_enabled();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::increment_nesting();
}

CpuBf16Autocast::~CpuBf16Autocast() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(prev_);
}

StatusOr<std::unique_ptr<Gpt>> Gpt::Create(const ModelConfig& c, uint64_t seed) {
  ATOLL_RETURN_IF_ERROR(ValidateModelConfig(c));
  std::unique_ptr<Gpt> g(new Gpt(c));
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t D = c.d_model, F = c.d_ff, V = c.vocab_size;
  const double std_in = 0.02, std_out = 0.02 / std::sqrt(2.0 * c.n_layers);
  auto normal = [&](std::vector<int64_t> shape, double std) {
    return torch::empty(shape, opts).normal_(0.0, std, gen);
  };
  auto add = [&](std::string name, torch::Tensor t, bool emb, bool decay) {
    t.set_requires_grad(true);
    g->params_.push_back({std::move(name), t, emb, decay});
    return t;
  };

  g->tok_emb_ = add("tok_emb.weight", normal({V, D}, std_in), true, true);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    Block b;
    b.attn_norm = add(p + "attn_norm.weight", torch::ones({D}, opts), false, false);
    b.wqkv = add(p + "attn.wqkv.weight", normal({3 * D, D}, std_in), false, true);
    b.wo = add(p + "attn.wo.weight", normal({D, D}, std_out), false, true);
    b.mlp_norm = add(p + "mlp_norm.weight", torch::ones({D}, opts), false, false);
    const int64_t in_rows = c.mlp == Mlp::kSwiglu ? 2 * F : F;
    b.w_in = add(p + "mlp.w_in.weight", normal({in_rows, D}, std_in), false, true);
    b.w_out = add(p + "mlp.w_out.weight", normal({D, F}, std_out), false, true);
    g->blocks_.push_back(std::move(b));
  }
  g->final_norm_ = add("final_norm.weight", torch::ones({D}, opts), false, false);

  const int64_t hd = D / c.n_heads, T = c.seq_len;
  auto inv_freq = torch::pow(kRopeBase, -torch::arange(0, hd, 2, opts) / static_cast<double>(hd));
  auto angles = torch::outer(torch::arange(T, opts), inv_freq);  // [T, hd/2]
  g->cos_ = angles.cos();
  g->sin_ = angles.sin();
  g->mask_ = torch::full({T, T}, -std::numeric_limits<float>::infinity(), opts).triu(1);
  return g;
}

int64_t Gpt::num_params() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.tensor.numel();
  return n;
}

torch::Tensor Gpt::Rope(const torch::Tensor& x, int64_t t) const {
  // x [B,H,T,hd] → rotated pairs (x1, x2) of the two halves.
  const int64_t half = x.size(-1) / 2;
  auto cos = cos_.narrow(0, 0, t), sin = sin_.narrow(0, 0, t);  // [T, hd/2]
  auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

torch::Tensor Gpt::Forward(const torch::Tensor& idx) const {
  return torch::linear(Hidden(idx), tok_emb_);  // [B,T,V]
}

torch::Tensor Gpt::Hidden(const torch::Tensor& idx) const {
  const int64_t B = idx.size(0), T = idx.size(1);
  const int64_t D = config_.d_model, H = config_.n_heads, hd = D / H;
  TORCH_CHECK(T <= config_.seq_len, "sequence of ", T, " tokens exceeds seq_len ", config_.seq_len);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto mask = mask_.narrow(0, 0, T).narrow(1, 0, T);  // [T, T]

  auto x = torch::embedding(tok_emb_, idx);  // [B,T,D]
  for (const auto& b : blocks_) {
    auto h = RmsNorm(x, b.attn_norm);
    auto qkv = torch::linear(h, b.wqkv).view({B, T, 3, H, hd}).permute({2, 0, 3, 1, 4});
    auto q = Rope(qkv[0], T) * scale;                                             // [B,H,T,hd]
    auto k = Rope(qkv[1], T);                                                     // [B,H,T,hd]
    auto v = qkv[2];                                                              // [B,H,T,hd]
    auto att = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) + mask, -1);  // [B,H,T,T]
    auto y = torch::matmul(att, v).transpose(1, 2).reshape({B, T, D});            // [B,T,D]
    x = x + torch::linear(y, b.wo);

    h = RmsNorm(x, b.mlp_norm);
    torch::Tensor m;
    if (config_.mlp == Mlp::kSwiglu) {
      auto gu = torch::linear(h, b.w_in).chunk(2, -1);  // 2 × [B,T,F]
      m = torch::silu(gu[0]) * gu[1];
    } else {
      m = torch::gelu(torch::linear(h, b.w_in));  // [B,T,F]
    }
    x = x + torch::linear(m, b.w_out);
  }
  return RmsNorm(x, final_norm_);  // [B,T,D]
}

torch::Tensor Gpt::Loss(const torch::Tensor& idx, const torch::Tensor& targets) const {
  // The tied output head and the cross-entropy fused (lm_head_loss.h): the same loss as
  // cross_entropy(Forward(idx)) without the [B·T, V] logits in memory.
  auto h = Hidden(idx);
  return LmHeadLoss(h.reshape({-1, h.size(-1)}), tok_emb_, targets.reshape({-1}).to(torch::kInt64),
                    at::autocast::is_cpu_enabled());
}

}  // namespace atl::model
