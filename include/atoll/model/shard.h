// Token shard files and the per-learner batch reader.
//
// Shard file (".bin", little-endian): a 32-byte header then `count` uint16 token ids.
//   offset 0  u32 magic    'ATOK' (0x4B4F5441)
//   offset 4  u32 version  1
//   offset 8  u32 vocab    ids are < vocab (≤ 65536)
//   offset 12 u32 reserved 0
//   offset 16 u64 count    number of tokens
//   offset 24 u64 checksum XXH3-64 of the token bytes, verified on read
//
// Shards of one learner: the training token stream (all train shards concatenated) is cut into
// W = (N − 1) / seq non-overlapping windows of seq + 1 tokens (window j starts at j·seq; the
// extra token is the last target). Of M shards, shard i owns the windows j with j mod M = i:
// shards are disjoint, together cover every window, and each sees every part of the corpus.
// A reader visits its windows in epochs, each a fresh permutation seeded by (seed, shard,
// epoch); its position (epoch, index) can be saved and restored, so a resumed learner reads
// exactly the batches it would have read.
//
// Torch-free (target atoll_data). Thread-safety: ShardReader is a value used by one thread;
// the token vector it shares is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl::model {

inline constexpr uint32_t kShardMagic = 0x4B4F5441;  // "ATOK" read as little-endian bytes
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 32;

struct TokenShard {
  int vocab = 0;
  std::vector<uint16_t> tokens;
};

// Writes atomically. InvalidArgument when vocab is outside [1, 65536] or a token is ≥ vocab.
Status WriteTokenShard(const std::string& path, int vocab, std::span<const uint16_t> tokens);
// NotFound; DataLoss for a bad magic, truncated file or checksum mismatch (message names the
// path); InvalidArgument for an unknown version or a token ≥ vocab.
StatusOr<TokenShard> ReadTokenShard(const std::string& path);

struct ReaderPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // next window within the epoch's permutation
  friend bool operator==(const ReaderPosition&, const ReaderPosition&) = default;
};

// The windows (start offsets into the stream) owned by `shard` of `num_shards`.
std::vector<int64_t> ShardWindows(int64_t stream_tokens, int seq_len, int shard, int num_shards);

class ShardReader {
 public:
  struct Options {
    int seq_len = 256;
    int batch_size = 16;
    int shard = 0;  // which of num_shards this reader owns
    int num_shards = 1;
    uint64_t seed = 0;
  };
  // FailedPrecondition when the stream is too short to give this shard one window.
  static StatusOr<ShardReader> Create(std::shared_ptr<const std::vector<uint16_t>> stream, const Options& options);

  // Fills `out` (batch_size × (seq_len + 1), row-major) with the next batch.
  void NextBatch(std::span<int64_t> out);

  ReaderPosition position() const { return pos_; }
  // InvalidArgument when the index is outside this shard's window count.
  Status Seek(const ReaderPosition& pos);
  int64_t num_windows() const { return static_cast<int64_t>(windows_.size()); }
  const Options& options() const { return options_; }

 private:
  ShardReader(std::shared_ptr<const std::vector<uint16_t>> stream, const Options& options,
              std::vector<int64_t> windows);
  void Shuffle();  // order_ for pos_.epoch

  std::shared_ptr<const std::vector<uint16_t>> stream_;
  Options options_;
  std::vector<int64_t> windows_;
  std::vector<int64_t> order_;
  ReaderPosition pos_;
};

}  // namespace atl::model
