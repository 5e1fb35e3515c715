#include "atoll/transport/credentials.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <optional>

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

StatusOr<LearnerIdSet> LearnerIdSet::Parse(std::string_view text) {
  LearnerIdSet set;
  if (!text.empty() && text.back() == ',')
    return InvalidArgumentError("learner ids '" + std::string(text) + "' end with a comma");
  const auto number = [](std::string_view t) -> std::optional<int64_t> {
    if (t.empty() || t.size() > 7 || t.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
    const int64_t v = std::stoll(std::string(t));
    return v <= 1'000'000 ? std::optional<int64_t>(v) : std::nullopt;
  };
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    const size_t dash = item.find('-');
    const auto lo = number(item.substr(0, dash));
    const auto hi = dash == std::string_view::npos ? lo : number(item.substr(dash + 1));
    if (!lo || !hi || *lo > *hi) {
      return InvalidArgumentError("learner ids '" + std::string(item) +
                                  "': want ids and ranges in [0, 1000000], e.g. \"0-3,7\"");
    }
    set.ranges_.emplace_back(*lo, *hi);
  }
  return set;
}

bool LearnerIdSet::Contains(int64_t id) const {
  if (ranges_.empty()) return true;
  for (const auto& [lo, hi] : ranges_) {
    if (id >= lo && id <= hi) return true;
  }
  return false;
}

std::string LearnerIdSet::ToString() const {
  std::string out;
  for (const auto& [lo, hi] : ranges_) {
    out += (out.empty() ? "" : ",") + std::to_string(lo) + (lo == hi ? "" : "-" + std::to_string(hi));
  }
  return out;
}

bool TokensEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace atl::transport
