// Checksums of byte spans (XXH3, 64-bit): used on every transfer chunk, every checkpoint and
// every persisted syncer state. Not cryptographic: they detect corruption, not forgery (the auth
// token and TLS cover the latter). Thread-safety: pure functions; Hasher is a value per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace atl {

uint64_t Checksum64(std::span<const std::byte> bytes);
uint64_t Checksum64(const void* data, size_t size);
inline uint64_t Checksum64(std::string_view s) { return Checksum64(s.data(), s.size()); }

// Fixed-width lowercase hex ("00ab…", 16 chars), as written in manifests and logs.
std::string ChecksumHex(uint64_t checksum);

// Streaming form for data that arrives in pieces; Digest() equals Checksum64 of the
// concatenation.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(const void* data, size_t size);
  void Update(std::span<const std::byte> bytes) { Update(bytes.data(), bytes.size()); }
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t*, kept opaque so xxhash.h stays out of the public headers
};

}  // namespace atl
