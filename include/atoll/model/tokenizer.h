// Tokenizers: text ↔ token ids for the learner's language model.
//
// Two kinds, both lossless (Decode(Encode(text)) == text for any UTF-8 or binary text):
//   "bpe"   a SentencePiece BPE model trained on the corpus (identity normalisation, no dummy
//           prefix, byte fallback for unseen characters; '\n' is the byte piece <0x0A>);
//   "byte"  one token per byte, vocabulary 256 (the baseline of byte-level comparisons).
// Token ids fit in uint16 (vocab ≤ 65536) because shards store them that way.
//
// Torch-free (target atoll_data). Thread-safety: a loaded Tokenizer is immutable; Encode and
// Decode may be called from several threads at once.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/core/status.h"

namespace atl::model {

inline constexpr int kMaxVocab = 65536;   // ids are stored as uint16
inline constexpr int kMinBpeVocab = 320;  // 256 byte pieces + specials + a few merges

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "bpe" | "byte"
  virtual int vocab_size() const = 0;
  virtual std::vector<int> Encode(std::string_view text) const = 0;
  // Ids outside [0, vocab) are skipped.
  virtual std::string Decode(std::span<const int> ids) const = 0;
};

std::unique_ptr<Tokenizer> MakeByteTokenizer();

// Loads a SentencePiece model file. NotFound / DataLoss (unparseable model) with the path.
StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& model_path);

// Trains a SentencePiece BPE model on the lines of `texts` (each a whole document; lines longer
// than SentencePiece's limit are split) and returns the serialised model (what
// LoadSentencePieceTokenizer reads from a file). Deterministic for the same input.
// InvalidArgument for vocab outside [kMinBpeVocab, kMaxVocab] or a corpus too small for it.
StatusOr<std::string> TrainSentencePieceModel(const std::vector<std::string_view>& texts, int vocab_size);
StatusOr<std::unique_ptr<Tokenizer>> SentencePieceTokenizerFromModel(const std::string& model);

}  // namespace atl::model
