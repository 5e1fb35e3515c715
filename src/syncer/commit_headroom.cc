#include "atoll/syncer/commit_headroom.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

namespace atl::syncer {
namespace {

std::string MiB(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

StatusOr<uint64_t> CommitHeadroom::FileSystemFreeBytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) {
    return UnavailableError("cannot measure the free space of " + dir + ": " + std::strerror(errno));
  }
  return static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_frsize);
}

CommitHeadroom::CommitHeadroom(std::string dir, uint64_t commit_bytes, int reserve_fds, FreeBytes free_bytes)
    : dir_(std::move(dir)), commit_bytes_(commit_bytes), want_fds_(reserve_fds), free_bytes_(std::move(free_bytes)) {
  Refill();
}

CommitHeadroom::~CommitHeadroom() {
  for (int fd : reserve_) ::close(fd);
}

void CommitHeadroom::Refill() {
  while (static_cast<int>(reserve_.size()) < want_fds_) {
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // Check() says so
    reserve_.push_back(fd);
  }
}

CommitHeadroom::Released CommitHeadroom::ReleaseForCommit() {
  for (int fd : reserve_) ::close(fd);
  reserve_.clear();
  return Released(this);
}

Status CommitHeadroom::Check() {
  Refill();
  if (static_cast<int>(reserve_.size()) < want_fds_) {
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    return ResourceExhaustedError(fmt::format(
        "out of file descriptors: {} of the {} kept for commits could be opened (the process may hold {}); close "
        "connections or raise the limit (ulimit -n)",
        reserve_.size(), want_fds_,
        r.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : std::to_string(r.rlim_cur)));
  }
  ATOLL_ASSIGN_OR_RETURN(const uint64_t free, free_bytes_(dir_));
  if (free < commit_bytes_) {
    return ResourceExhaustedError(
        fmt::format("only {} free in {}, a commit needs {} (the largest fragment file and "
                    "the margin): free some space",
                    MiB(free), dir_, MiB(commit_bytes_)));
  }
  return Status::Ok();
}

uint64_t CommitBytes(const diloco::FragmentPlan& plan, uint64_t margin_bytes) {
  const auto n = static_cast<uint64_t>(plan.largest_numel());
  // A fragment file at its largest: the 64-byte header, Θ_p, the momentum, the public copy Φ_p
  // and at most one lattice exponent byte per value (durable_state.cc).
  return 64 + 3 * n * sizeof(float) + n + margin_bytes;
}

}  // namespace atl::syncer
