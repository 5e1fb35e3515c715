// Per-learner credentials (docs/security.md). A run secret, held by the syncer and the operator
// (`atoll run`), derives one token per learner and one operator token:
//   learner m:  hex(HMAC-SHA256(secret, "atoll-learner\n" + run_id + "\n" + m))
//   operator:   hex(HMAC-SHA256(secret, "atoll-operator\n" + run_id))
// so a learner's token lets it act only as itself, and only the operator may call Finish.
// Tokens are compared in constant time. Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace atl::transport {

std::string LearnerToken(std::string_view secret, std::string_view run_id, int learner_id);
std::string OperatorToken(std::string_view secret, std::string_view run_id);
// Constant-time equality (OpenSSL CRYPTO_memcmp); sizes are not secret.
bool TokensEqual(std::string_view a, std::string_view b);

}  // namespace atl::transport
