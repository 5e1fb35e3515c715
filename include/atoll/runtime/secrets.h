// The credential files of a run (docs/security.md, docs/deployment.md): the TLS files a syncer or
// learner is given, secret and token files, and the per-learner credentials `atoll run` writes
// for its children.
// Thread-safety: values and functions of the calling thread.
#pragma once

#include <string>

#include "atoll/core/status.h"
#include "atoll/runtime/run_config.h"

namespace atl::runtime {

struct TlsFiles {
  std::string cert, key;    // syncer: its certificate; learner: its client certificate (mutual TLS)
  std::string ca;           // learner: the CA that signed the syncer's certificate
  std::string server_name;  // learner
  std::string client_ca;    // syncer: require learner certificates signed by this CA (mutual TLS)
};

// A secret or token file's contents without surrounding whitespace; InvalidArgument when empty.
StatusOr<std::string> ReadSecretFile(const std::string& path);
// True for 127.x.x.x, localhost, [::1] and unix: addresses.
bool IsLoopbackAddress(const std::string& address);

// Per-learner credentials of a run (docs/security.md): a fresh random secret in
// <out>/secrets/run.secret and learner m's token in <out>/secrets/learner-<m>.token (folder 0700,
// files 0600). Returns the operator token. `atoll run` passes these files to its children.
StatusOr<std::string> WriteRunCredentials(const RunConfig& c);
std::string SecretsDir(const RunConfig& c);

}  // namespace atl::runtime
