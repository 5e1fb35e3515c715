#include "atoll/model/shard.h"

#include <bit>
#include <cstring>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/core/rng.h"

namespace atl::model {
namespace {

static_assert(std::endian::native == std::endian::little, "shard files are little-endian");

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t vocab;
  uint32_t reserved;
  uint64_t count;
  uint64_t checksum;
};
static_assert(sizeof(Header) == kShardHeaderBytes);

}  // namespace

Status WriteTokenShard(const std::string& path, int vocab, std::span<const uint16_t> tokens) {
  if (vocab < 1 || vocab > 65536) {
    return InvalidArgumentError("shard " + path + ": vocab " + std::to_string(vocab) +
                                " does not fit uint16 ids (1..65536)");
  }
  for (uint16_t t : tokens) {
    if (t >= vocab) {
      return InvalidArgumentError("shard " + path + ": token " + std::to_string(t) + " ≥ vocab " +
                                  std::to_string(vocab));
    }
  }
  Header h{kShardMagic, kShardVersion, static_cast<uint32_t>(vocab),
           0,           tokens.size(), Checksum64(tokens.data(), tokens.size_bytes())};
  std::string bytes(sizeof(h) + tokens.size_bytes(), '\0');
  std::memcpy(bytes.data(), &h, sizeof(h));
  if (!tokens.empty()) std::memcpy(bytes.data() + sizeof(h), tokens.data(), tokens.size_bytes());
  return WriteFileAtomic(path, bytes);
}

StatusOr<TokenShard> ReadTokenShard(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  Header h{};
  if (bytes.size() < sizeof(h)) return DataLossError(path + ": not a token shard (too short)");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kShardMagic) return DataLossError(path + ": not a token shard (bad magic)");
  if (h.version != kShardVersion) {
    return InvalidArgumentError(path + ": shard version " + std::to_string(h.version) + ", this atoll reads version " +
                                std::to_string(kShardVersion));
  }
  if (h.vocab < 1 || h.vocab > 65536) {
    return DataLossError(path + ": shard header vocab " + std::to_string(h.vocab) + " invalid");
  }
  if ((bytes.size() - sizeof(h)) != h.count * 2) {
    return DataLossError(path + ": truncated or oversized shard (header says " + std::to_string(h.count) +
                         " tokens, file holds " + std::to_string((bytes.size() - sizeof(h)) / 2) + ")");
  }
  const char* payload = bytes.data() + sizeof(h);
  uint64_t sum = Checksum64(payload, h.count * 2);
  if (sum != h.checksum) {
    return DataLossError(path + " is corrupted: token checksum " + ChecksumHex(sum) + ", header says " +
                         ChecksumHex(h.checksum));
  }
  TokenShard shard;
  shard.vocab = static_cast<int>(h.vocab);
  shard.tokens.resize(h.count);
  if (h.count) std::memcpy(shard.tokens.data(), payload, h.count * 2);
  for (uint16_t t : shard.tokens) {
    if (t >= h.vocab) {
      return InvalidArgumentError(path + ": token " + std::to_string(t) + " ≥ vocab " + std::to_string(h.vocab));
    }
  }
  return shard;
}

std::vector<int64_t> ShardWindows(int64_t stream_tokens, int seq_len, int shard, int num_shards) {
  std::vector<int64_t> out;
  if (seq_len < 1 || num_shards < 1 || shard < 0 || shard >= num_shards) return out;
  const int64_t windows = stream_tokens > 1 ? (stream_tokens - 1) / seq_len : 0;
  for (int64_t j = shard; j < windows; j += num_shards) out.push_back(j * seq_len);
  return out;
}

StatusOr<ShardReader> ShardReader::Create(std::shared_ptr<const std::vector<uint16_t>> stream, const Options& options) {
  if (!stream) return InvalidArgumentError("ShardReader: no token stream");
  if (options.seq_len < 1 || options.batch_size < 1) {
    return InvalidArgumentError("ShardReader: seq_len and batch_size must be ≥ 1");
  }
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards) {
    return InvalidArgumentError("ShardReader: shard " + std::to_string(options.shard) + " of " +
                                std::to_string(options.num_shards) + " is invalid");
  }
  auto windows = ShardWindows(static_cast<int64_t>(stream->size()), options.seq_len, options.shard, options.num_shards);
  if (windows.empty()) {
    return FailedPreconditionError("training data too small: " + std::to_string(stream->size()) +
                                   " tokens give shard " + std::to_string(options.shard) + " of " +
                                   std::to_string(options.num_shards) + " no window of " +
                                   std::to_string(options.seq_len + 1) + " tokens");
  }
  return ShardReader(std::move(stream), options, std::move(windows));
}

ShardReader::ShardReader(std::shared_ptr<const std::vector<uint16_t>> stream, const Options& options,
                         std::vector<int64_t> windows)
    : stream_(std::move(stream)), options_(options), windows_(std::move(windows)) {
  Shuffle();
}

void ShardReader::Shuffle() {
  order_ = windows_;
  uint64_t mix = options_.seed ^ 0x6a09e667f3bcc908ULL;
  uint64_t a = SplitMix64(mix);
  mix ^= static_cast<uint64_t>(options_.shard) * 0x9e3779b97f4a7c15ULL;
  uint64_t b = SplitMix64(mix);
  mix ^= static_cast<uint64_t>(pos_.epoch) * 0xbf58476d1ce4e5b9ULL;
  uint64_t c = SplitMix64(mix);
  Rng rng(a ^ (b << 1) ^ (c << 2));
  for (size_t i = order_.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.UniformInt(i));
    std::swap(order_[i - 1], order_[j]);
  }
}

void ShardReader::NextBatch(std::span<int64_t> out) {
  const size_t row = static_cast<size_t>(options_.seq_len) + 1;
  ATOLL_CHECK(out.size() == row * static_cast<size_t>(options_.batch_size));
  for (int b = 0; b < options_.batch_size; ++b) {
    if (pos_.index >= static_cast<int64_t>(order_.size())) {
      ++pos_.epoch;
      pos_.index = 0;
      Shuffle();
    }
    const uint16_t* src = stream_->data() + order_[static_cast<size_t>(pos_.index++)];
    int64_t* dst = out.data() + static_cast<size_t>(b) * row;
    for (size_t t = 0; t < row; ++t) dst[t] = src[t];
  }
}

Status ShardReader::Seek(const ReaderPosition& pos) {
  if (pos.epoch < 0 || pos.index < 0 || pos.index > num_windows()) {
    return InvalidArgumentError("reader position (epoch " + std::to_string(pos.epoch) + ", index " +
                                std::to_string(pos.index) + ") outside a shard of " + std::to_string(num_windows()) +
                                " windows");
  }
  pos_ = pos;
  Shuffle();
  return Status::Ok();
}

}  // namespace atl::model
