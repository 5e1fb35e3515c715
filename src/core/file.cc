#include "atoll/core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace atl {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

Status WriteAll(int fd, const std::byte* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return InternalError("write " + path + ": " + ErrnoText(errno));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status WriteFileAtomic(const std::string& path, std::span<const std::byte> bytes, Durability durability) {
  const bool sync = durability == Durability::kSync;
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // (Built with append: GCC 12 gives a false -Wrestrict on chained operator+ here.)
  std::string name = ".";
  name.append(target.filename().string()).append(".tmp.XXXXXX");
  std::string tmp = (dir / name).string();
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    const int err = errno;
    // Out of descriptors (a flood of connections) passes: Unavailable, so callers may retry.
    const bool transient = err == EMFILE || err == ENFILE || err == EINTR || err == EAGAIN;
    std::string msg = "create temp file for " + path + ": " + ErrnoText(err);
    return transient ? UnavailableError(std::move(msg)) : InternalError(std::move(msg));
  }
  Status st = WriteAll(fd, bytes.data(), bytes.size(), tmp);
  if (st.ok() && sync && ::fsync(fd) != 0) st = InternalError("fsync " + tmp + ": " + ErrnoText(errno));
  if (::fchmod(fd, 0644) != 0 && st.ok()) st = InternalError("chmod " + tmp + ": " + ErrnoText(errno));
  if (::close(fd) != 0 && st.ok()) st = InternalError("close " + tmp + ": " + ErrnoText(errno));
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = InternalError("rename " + tmp + " -> " + path + ": " + ErrnoText(errno));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (sync) SyncFolder(dir.string());
  return Status::Ok();
}

void SyncFolder(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: some file systems refuse fsync on folders
    ::close(dfd);
  }
}

Status WriteFileAtomic(const std::string& path, std::string_view text) {
  return WriteFileAtomic(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

Status WriteFileOwnerOnly(const std::string& path, std::string_view text) {
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(path, text));
  if (::chmod(path.c_str(), S_IRUSR | S_IWUSR) != 0) {
    return InternalError("chmod 0600 " + path + ": " + ErrnoText(errno));
  }
  return Status::Ok();
}

StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("no such file: " + path);
    return InternalError("open " + path + ": " + ErrnoText(errno));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return InternalError("read " + path + ": " + ErrnoText(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return InternalError("mkdir -p " + path + ": " + ec.message());
  return Status::Ok();
}

StatusOr<std::vector<std::string>> ListFilesRecursive(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  if (ec) return InvalidArgumentError("cannot read folder " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

bool IsAtomicWriteTempName(const std::string& name) {
  static constexpr std::string_view kTmp = ".tmp.";
  if (name.size() < 1 + 1 + kTmp.size() + 6 || name.front() != '.') return false;
  const size_t at = name.size() - 6 - kTmp.size();
  if (name.compare(at, kTmp.size(), kTmp) != 0) return false;
  return std::all_of(name.end() - 6, name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
}

StatusOr<std::vector<std::string>> RemoveStaleTempFiles(const std::string& dir,
                                                        const std::vector<std::string>& targets) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return removed;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!IsAtomicWriteTempName(name) || !it->is_regular_file(ec)) continue;
    const std::string target = name.substr(1, name.size() - 1 - 11);  // without "." and ".tmp.XXXXXX"
    if (!targets.empty() && std::find(targets.begin(), targets.end(), target) == targets.end()) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm)) removed.push_back(name);
  }
  if (ec) return InvalidArgumentError("cannot read folder " + dir + ": " + ec.message());
  std::sort(removed.begin(), removed.end());
  return removed;
}

bool FileExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace atl
