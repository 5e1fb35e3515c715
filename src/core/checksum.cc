#include "atoll/core/checksum.h"

#include <xxhash.h>

#include <cstdio>

#include "atoll/core/status.h"

namespace atl {

uint64_t Checksum64(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t Checksum64(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string ChecksumHex(uint64_t checksum) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(checksum));
  return std::string(buf, 16);
}

Hasher::Hasher() : state_(XXH3_createState()) {
  ATOLL_CHECK(state_ != nullptr);
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Hasher::~Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Hasher::Update(const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

uint64_t Hasher::Digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

}  // namespace atl
