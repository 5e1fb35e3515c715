#include "lm_head_loss.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>

namespace atl::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kLogitsPerChunk = int64_t{1} << 20;

class LmHeadLossFn : public torch::autograd::Function<LmHeadLossFn> {
 public:
  // keep: the backward will run (training), so the softmax is kept for it — in bf16 under
  // bf16 (what the unfused path casts the logits' gradient to before its bf16 matmul anyway).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& targets, bool bf16, int64_t chunk, bool keep) {
    // The dtypes below are explicit: autocast must not re-cast inside.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const int64_t n = h.size(0);
    const auto hc = bf16 ? h.to(torch::kBFloat16) : h;
    const auto wc = bf16 ? w.to(torch::kBFloat16) : w;
    auto total = torch::zeros({}, h.options().dtype(torch::kFloat64));
    torch::Tensor probs = keep ? torch::empty({n, w.size(0)}, hc.options()) : torch::Tensor();
    torch::Tensor raw = bf16 ? torch::empty({std::min(chunk, n), w.size(0)}, hc.options()) : torch::Tensor();
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t m = std::min(chunk, n - s);
      torch::Tensor logits;  // fp32 [m, V]
      if (bf16) {
        auto r = raw.narrow(0, 0, m);
        at::mm_out(r, hc.narrow(0, s, m), wc.t());  // bf16 logits, as autocast's linear makes them
        logits = r.to(torch::kFloat32);
      } else {
        logits = at::mm(hc.narrow(0, s, m), wc.t());
      }
      const auto t = targets.narrow(0, s, m).unsqueeze(1);
      auto picked = logits.gather(1, t).squeeze(1);
      auto top = logits.amax(1, /*keepdim=*/true);
      auto e = logits.sub_(top).exp_();  // in place: one exp per logit
      auto sum = e.sum(1, /*keepdim=*/true);
      auto lse = top.squeeze(1) + sum.log().squeeze(1);
      total.add_((lse - picked).sum(torch::kFloat64));
      if (keep) probs.narrow(0, s, m).copy_(e.div_(sum));  // softmax
    }
    ctx->save_for_backward({h, w, targets, probs});
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["chunk"] = chunk;
    return (total / static_cast<double>(std::max<int64_t>(1, n))).to(torch::kFloat32);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const auto& w = saved[1];
    const auto& targets = saved[2];
    const auto& probs = saved[3];
    TORCH_CHECK(probs.defined(), "LmHeadLoss: backward of a forward that kept no softmax");
    const bool bf16 = ctx->saved_data["bf16"].toBool();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t n = h.size(0);
    const auto hc = bf16 ? h.to(torch::kBFloat16) : h;
    const auto wc = bf16 ? w.to(torch::kBFloat16) : w;
    const double scale = grad[0].item<double>() / static_cast<double>(std::max<int64_t>(1, n));
    auto grad_h = torch::empty_like(h);
    auto grad_w = torch::zeros_like(w);
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t m = std::min(chunk, n - s);
      // (softmax − one-hot of the targets) · d(loss)/d(mean) / N
      auto p = probs.narrow(0, s, m).to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
      p.scatter_add_(1, targets.narrow(0, s, m).unsqueeze(1), torch::full({m, 1}, -1.0f, p.options()));
      p.mul_(scale);
      const auto g = bf16 ? p.to(torch::kBFloat16) : p;
      grad_h.narrow(0, s, m).copy_(at::mm(g, wc));
      if (bf16) {
        grad_w.add_(at::mm(g.t(), hc.narrow(0, s, m)));
      } else {
        grad_w.addmm_(g.t(), hc.narrow(0, s, m));
      }
    }
    return {grad_h, grad_w, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor LmHeadLoss(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& targets, bool bf16,
                         int64_t chunk_rows) {
  TORCH_CHECK(h.dim() == 2 && w.dim() == 2 && h.size(1) == w.size(1), "LmHeadLoss: h [N, D] and w [V, D]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0) && targets.scalar_type() == torch::kInt64,
              "LmHeadLoss: targets must be int64 [N]");
  const int64_t chunk =
      chunk_rows > 0 ? chunk_rows : std::max<int64_t>(64, kLogitsPerChunk / std::max<int64_t>(1, w.size(0)));
  const bool keep = torch::GradMode::is_enabled() && (h.requires_grad() || w.requires_grad());
  return LmHeadLossFn::apply(h, w, targets, bf16, chunk, keep);
}

}  // namespace atl::model
