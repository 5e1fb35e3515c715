// The output head and its loss in one autograd function (internal header: includes libtorch).
//
//   loss = mean_i [ logsumexp_v (h_i · W_v) − h_i · W_{t_i} ]      h [N, D], W [V, D], t [N]
//
// What `cross_entropy(linear(h, W), t)` computes, in fewer passes over the [N, V] logits: rows
// go through in chunks of about a million logits, and each chunk's fp32 logits are turned into the
// loss and the softmax while they are in cache (one exp per logit; the unfused path runs
// log-softmax, then exp again in its backward, over full-size fp32 copies). Training keeps only
// the softmax for the backward (bf16 under bf16 — what the unfused path rounds the logits'
// gradient to anyway), evaluation keeps nothing. Measured at the tiny model's vocabulary of 4096
// (where the head is ~40 % of a training step): `atoll train` 10–18 % faster per step.
//
// bf16 (the CPU autocast of training, `CpuBf16Autocast`): the products run in bf16 through
// oneDNN exactly as autocast runs `linear` (bf16 logits, then fp32 for the softmax), and the
// gradients come back fp32 for fp32 h and W; W's gradient sums the chunks' bf16 products in fp32.
// fp32: everything in fp32.
// Thread-safety: as any libtorch op.
#pragma once

#include <torch/torch.h>

namespace atl::model {

// Mean cross-entropy of h · Wᵀ against `targets` (int64, values in [0, V)). `chunk_rows` ≤ 0
// chooses about 2^20 logits per chunk; a positive value is for tests. Differentiable in h and W.
torch::Tensor LmHeadLoss(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& targets, bool bf16,
                         int64_t chunk_rows = 0);

}  // namespace atl::model
