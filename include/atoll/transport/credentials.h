// Per-learner credentials (docs/security.md). A run secret, held by the syncer and the operator
// (`atoll run`), derives one token per learner and one operator token:
//   learner m:  hex(HMAC-SHA256(secret, "atoll-learner\n" + run_id + "\n" + m))
//   operator:   hex(HMAC-SHA256(secret, "atoll-operator\n" + run_id))
// so a learner's token lets it act only as itself, and only the operator may call Finish.
// Tokens are compared in constant time. Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "atoll/core/status.h"

namespace atl::transport {

// TLS for the gRPC server and client (grpc_server.h, grpc_client.h).
struct TlsOptions {
  bool enabled = false;
  // Server: its certificate and key (PEM). Client: its own certificate and key for mutual TLS
  // (both empty: no client certificate).
  std::string cert_file, key_file;
  std::string ca_file;      // client: the CA that signed the server certificate
  std::string server_name;  // client: override of the expected host name
  // Server: mutual TLS — every client must present a certificate signed by this CA (PEM);
  // empty: clients are not asked for one.
  std::string client_ca_file;
};

// The learner ids a syncer with per-learner credentials accepts tokens for (run-file key
// `allowed_learners`, docs/security.md): "" = any id, else ids and ranges, e.g. "0-3,7". A
// learner left out — a revoked credential — is refused (PERMISSION_DENIED) whatever its token.
class LearnerIdSet {
 public:
  // InvalidArgument for anything but comma-separated ids and a-b ranges (a ≤ b) in [0, 1000000].
  static StatusOr<LearnerIdSet> Parse(std::string_view text);
  bool any() const { return ranges_.empty(); }
  bool Contains(int64_t id) const;
  std::string ToString() const;  // "" for any

 private:
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // inclusive
};

std::string LearnerToken(std::string_view secret, std::string_view run_id, int learner_id);
std::string OperatorToken(std::string_view secret, std::string_view run_id);
// Constant-time equality (OpenSSL CRYPTO_memcmp); sizes are not secret.
bool TokensEqual(std::string_view a, std::string_view b);

}  // namespace atl::transport
