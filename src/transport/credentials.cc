#include "atoll/transport/credentials.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "atoll/core/status.h"

namespace atl::transport {
namespace {

std::string HmacHex(std::string_view key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const unsigned char* ok = HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                                 reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  ATOLL_CHECK_MSG(ok != nullptr, "HMAC-SHA256 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[mac[i] >> 4]);
    out.push_back(kHex[mac[i] & 15]);
  }
  return out;
}

}  // namespace

std::string LearnerToken(std::string_view secret, std::string_view run_id, int learner_id) {
  return HmacHex(secret, "atoll-learner\n" + std::string(run_id) + "\n" + std::to_string(learner_id));
}

std::string OperatorToken(std::string_view secret, std::string_view run_id) {
  return HmacHex(secret, "atoll-operator\n" + std::string(run_id));
}

bool TokensEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace atl::transport
