#include "atoll/syncer/public_copy.h"

#include <fmt/format.h>

#include "atoll/exchange/fragment_exchange.h"

namespace atl::syncer {

int DownlinkQmax(diloco::Encoding downlink) {
  switch (downlink) {
    case diloco::Encoding::kInt2: return 1;
    case diloco::Encoding::kInt4: return 7;
    case diloco::Encoding::kInt8: return 127;
    case diloco::Encoding::kBf16: return 255;
    case diloco::Encoding::kFp32: return 0;
  }
  return 7;
}

PublicCopy::PublicCopy(exchange::Lattice lattice, std::vector<float> phi, int64_t version, PublicCopyOptions options)
    : options_(options),
      lattice_(std::move(lattice)),
      phi_(std::move(phi)),
      checksum_(exchange::ValuesChecksum(phi_, options_.pool)),
      version_(version) {
  if (phi_.capacity() < options_.capacity) phi_.reserve(options_.capacity);
}

StatusOr<PublicCopy> PublicCopy::Create(std::span<const float> initial, int block, PublicCopyOptions options) {
  ATOLL_ASSIGN_OR_RETURN(exchange::Lattice lattice, exchange::MakeLattice(initial, block));
  std::vector<float> phi(initial.begin(), initial.end());
  exchange::SnapToLattice(lattice, phi);
  return PublicCopy(std::move(lattice), std::move(phi), 0, options);
}

StatusOr<PublicCopy> PublicCopy::Restore(exchange::Lattice lattice, std::vector<float> values, int64_t version,
                                         PublicCopyOptions options) {
  if (values.size() != lattice.numel || version < 0) {
    return InvalidArgumentError(
        fmt::format("public copy: {} values at version {} for a lattice of {}", values.size(), version, lattice.numel));
  }
  std::vector<float> snapped = values;
  exchange::SnapToLattice(lattice, snapped);
  if (exchange::ValuesChecksum(snapped) != exchange::ValuesChecksum(values)) {
    return InvalidArgumentError("public copy: the values are not on their lattice");
  }
  return PublicCopy(std::move(lattice), std::move(values), version, options);
}

Status PublicCopy::Advance(std::span<const float> theta, int64_t version) {
  ATOLL_CHECK(version == version_ + 1);
  exchange::LatticeStepStats stats;
  std::vector<float> next = phi_;
  std::vector<std::byte> delta;
  ATOLL_RETURN_IF_ERROR(
      exchange::EncodeLatticeStep(lattice_, options_.qmax, theta, next, delta, &stats, options_.pool));
  Commit(next, std::move(delta), version, stats.saturated);
  return Status::Ok();
}

std::vector<std::byte> PublicCopy::Commit(std::vector<float>& next, std::vector<std::byte> delta, int64_t version,
                                          int64_t saturated, std::optional<uint64_t> checksum) {
  ATOLL_CHECK(next.size() == phi_.size());
  phi_.swap(next);
  return CommitInPlace(std::move(delta), version, saturated, checksum);
}

std::vector<std::byte> PublicCopy::CommitInPlace(std::vector<std::byte> delta, int64_t version, int64_t saturated,
                                                 std::optional<uint64_t> checksum) {
  ATOLL_CHECK(version == version_ + 1);
  Past past;
  past.version = version;
  past.delta = std::move(delta);
  if (history_.empty()) base_checksum_ = checksum_;
  checksum_ = past.checksum = checksum.has_value() ? *checksum : exchange::ValuesChecksum(phi_, options_.pool);
  version_ = version;
  saturated_ += saturated;
  history_.push_back(std::move(past));
  cache_.clear();
  cache_held_ = 0;
  return Evict();
}

size_t PublicCopy::HistoryBytes() const {
  size_t n = 0;
  for (const Past& p : history_) n += p.delta.size();
  return n;
}

std::vector<std::byte> PublicCopy::Evict() {
  std::vector<std::byte> spare;
  while (!history_.empty() &&
         (static_cast<int>(history_.size()) > options_.history_versions ||
          (options_.history_bytes > 0 && history_.size() > 1 && HistoryBytes() > options_.history_bytes))) {
    base_checksum_ = history_.front().checksum;
    if (history_.front().delta.capacity() > spare.capacity()) spare.swap(history_.front().delta);
    history_.pop_front();
  }
  spare.clear();
  return spare;
}

int64_t PublicCopy::oldest() const { return history_.empty() ? version_ : history_.front().version - 1; }

std::optional<int64_t> PublicCopy::VersionOf(uint64_t c) const {
  if (c == checksum_) return version_;
  for (const Past& p : history_) {
    if (p.checksum == c) return p.version;
  }
  if (!history_.empty() && c == base_checksum_) return oldest();
  return std::nullopt;
}

Status PublicCopy::ValuesAt(int64_t u, std::vector<float>& out) const {
  if (u < oldest() || u > version_) {
    return OutOfRangeError(fmt::format("public copy: version {} is not held (versions {}..{})", u, oldest(), version_));
  }
  out.assign(phi_.begin(), phi_.end());
  for (auto it = history_.rbegin(); it != history_.rend() && it->version > u; ++it) {
    ATOLL_RETURN_IF_ERROR(exchange::ApplyLatticeDelta(lattice_, it->delta, out, -1, options_.pool));
  }
  return Status::Ok();
}

StatusOr<std::vector<std::byte>> PublicCopy::Compressed(std::vector<std::byte> raw, size_t* raw_size) const {
  *raw_size = raw.size();
  if (options_.compression == diloco::Compression::kNone) return raw;
  std::vector<std::byte> out;
  ATOLL_RETURN_IF_ERROR(diloco::CompressBytes(raw, out, options_.pool));
  return out;
}

StatusOr<SharedPull> PublicCopy::Serve(int64_t have, int fragment, uint64_t incarnation) {
  ATOLL_CHECK(have != version_);
  const bool delta = have >= oldest() && have < version_;
  const int64_t key = delta ? have : -1;
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  auto made = std::make_shared<PullPayload>();
  PullPayload& out = *made;
  out.fragment = fragment;
  out.incarnation = incarnation;
  out.version = version_;
  out.is_delta = delta;
  out.base_version = delta ? have : -1;
  out.block_size = lattice_.block;
  out.compression = options_.compression;
  out.value_checksum = checksum_;
  std::vector<std::byte> raw;
  if (delta) {
    std::vector<std::span<const std::byte>> chain;
    for (const Past& p : history_) {
      if (p.version > have) chain.emplace_back(p.delta);
    }
    if (chain.size() == 1) {
      raw.assign(chain.front().begin(), chain.front().end());  // one round behind: that round's delta
    } else {
      ATOLL_RETURN_IF_ERROR(exchange::SumLatticeDeltas(lattice_, chain, raw, options_.pool));
    }
  } else {
    ATOLL_RETURN_IF_ERROR(exchange::EncodeLatticeFull(lattice_, phi_, raw, options_.pool));
  }
  size_t raw_size = 0;
  ATOLL_ASSIGN_OR_RETURN(out.bytes, Compressed(std::move(raw), &raw_size));
  out.raw_bytes = raw_size;
  SharedPull shared = std::move(made);
  if (cache_held_ + out.bytes.size() <= options_.cache_bytes) {
    cache_held_ += out.bytes.size();
    cache_.emplace(key, shared);
  }
  return shared;
}

size_t PublicCopy::HeldBytes() const {
  return phi_.capacity() * sizeof(float) + lattice_.exp.capacity() + HistoryBytes() + cache_held_;
}

}  // namespace atl::syncer
