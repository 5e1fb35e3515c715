// The credential files of a run: what `atoll run` writes for its children and what a hand-started
// syncer or learner reads.
#include "atoll/runtime/secrets.h"

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "atoll/core/file.h"
#include "atoll/transport/credentials.h"

namespace atl::runtime {

std::string SecretsDir(const RunConfig& c) { return c.out + "/secrets"; }

StatusOr<std::string> ReadSecretFile(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return InvalidArgumentError(path + " is empty (expected a secret or token)");
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

bool IsLoopbackAddress(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address.rfind("localhost:", 0) == 0 || address.rfind("[::1]:", 0) == 0 ||
         address.rfind("unix:", 0) == 0;
}

StatusOr<std::string> WriteRunCredentials(const RunConfig& c) {
  namespace fs = std::filesystem;
  const std::string dir = SecretsDir(c);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("mkdir " + dir + ": " + ec.message());
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) return InternalError("chmod 0700 " + dir + ": " + ec.message());
  unsigned char random[32];
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  const bool got = f != nullptr && std::fread(random, 1, sizeof(random), f) == sizeof(random);
  if (f) std::fclose(f);
  if (!got) return InternalError("cannot read 32 random bytes from /dev/urandom");
  std::string secret;
  for (unsigned char ch : random) secret += fmt::format("{:02x}", ch);
  ATOLL_RETURN_IF_ERROR(WriteFileOwnerOnly(dir + "/run.secret", secret));
  for (int m = 0; m < c.learners; ++m) {
    ATOLL_RETURN_IF_ERROR(WriteFileOwnerOnly(dir + "/learner-" + std::to_string(m) + ".token",
                                             transport::LearnerToken(secret, c.run_id, m)));
  }
  return transport::OperatorToken(secret, c.run_id);
}

}  // namespace atl::runtime
