// The reference decoder-only transformer (internal header: includes libtorch).
//
//   tokens [B,T] → tok_emb → N × { x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x)) } → RMSNorm
//                → logits = h · tok_embᵀ  (the output head is tied to the token embedding)
// Attention is causal multi-head self-attention with rotary position embeddings (NeoX-style
// half rotation, base 10000) on q and k; the MLP is SwiGLU (silu(x·W_gate)·(x·W_up))·W_down or
// GELU. No biases. Shapes are noted per line in gpt.cc.
//
// Parameters are plain leaf tensors with requires_grad, listed in a fixed order with stable
// names (see Params()); the training code updates them in place so their storage never moves.
// Thread-safety: Forward is const and may run on several threads; training is single-threaded.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/model/trainer.h"

namespace atl::model {

struct GptParam {
  std::string name;
  torch::Tensor tensor;  // fp32, contiguous, requires_grad
  bool is_embedding = false;
  bool decay = false;  // AdamW weight decay applies (matrices; not norm gains)
};

// bf16 autocast on the CPU for the scope (matrix products in bf16 — AMX / AVX-512-BF16 kernels
// through oneDNN — with fp32 weights, fp32 residual stream and fp32 gradients); `on = false`
// does nothing. Only the training forward pass runs under it; evaluation stays fp32.
class CpuBf16Autocast {
 public:
  explicit CpuBf16Autocast(bool on);
  ~CpuBf16Autocast();
  CpuBf16Autocast(const CpuBf16Autocast&) = delete;
  CpuBf16Autocast& operator=(const CpuBf16Autocast&) = delete;

 private:
  bool on_, prev_ = false;
};

class Gpt {
 public:
  // Initialises weights from `seed` alone (N(0, 0.02); residual output projections scaled by
  // 1/√(2·n_layers); norm gains 1). InvalidArgument for an invalid config.
  static StatusOr<std::unique_ptr<Gpt>> Create(const ModelConfig& config, uint64_t seed);

  // idx: [B, T] int64 with T ≤ seq_len → logits [B, T, vocab].
  torch::Tensor Forward(const torch::Tensor& idx) const;
  // The final-normed hidden states [B, T, D] (Forward is these times the tied embeddingᵀ).
  torch::Tensor Hidden(const torch::Tensor& idx) const;
  // Mean token cross-entropy of Forward(idx) against targets [B, T], computed without the logits
  // in memory (LmHeadLoss); under CpuBf16Autocast the head's products are bf16 as in Forward.
  torch::Tensor Loss(const torch::Tensor& idx, const torch::Tensor& targets) const;

  const ModelConfig& config() const { return config_; }
  std::vector<GptParam>& params() { return params_; }
  const std::vector<GptParam>& params() const { return params_; }
  int64_t num_params() const;

 private:
  struct Block {
    torch::Tensor attn_norm;  // [D]
    torch::Tensor wqkv;       // [3D, D]
    torch::Tensor wo;         // [D, D]
    torch::Tensor mlp_norm;   // [D]
    torch::Tensor w_in;       // [2F, D] swiglu (gate; up) | [F, D] gelu
    torch::Tensor w_out;      // [D, F]
  };
  explicit Gpt(const ModelConfig& config) : config_(config) {}
  torch::Tensor Rope(const torch::Tensor& x, int64_t t) const;

  ModelConfig config_;
  torch::Tensor tok_emb_;  // [V, D]
  std::vector<Block> blocks_;
  torch::Tensor final_norm_;  // [D]
  torch::Tensor cos_, sin_;   // [seq_len, hd/2] rotary tables
  torch::Tensor mask_;        // [seq_len, seq_len] 0 on/below the diagonal, -inf above
  std::vector<GptParam> params_;
};

}  // namespace atl::model
