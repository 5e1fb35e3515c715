// Durable file helpers. Every file atoll writes that another process may read (checkpoints,
// syncer state, summaries) goes through WriteFileAtomic: write to a temp file in the same folder,
// fsync it, rename over the target, fsync the folder. A reader therefore sees the old file or the
// new one, never a torn one, even if the writer is SIGKILLed at any instant.
// Thread-safety: functions are reentrant; concurrent writers of one path race only on which
// complete version wins.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/core/status.h"

namespace atl {

// Errors are Internal, except Unavailable when the temp file cannot be created for a transient
// reason (EMFILE/ENFILE: out of file descriptors; EINTR, EAGAIN), which a caller may retry.
// Durability::kNoSync skips both fsyncs: still never torn (the rename is atomic), but a power
// loss may keep the old file — for caches whose readers verify what they read.
enum class Durability { kSync, kNoSync };
Status WriteFileAtomic(const std::string& path, std::span<const std::byte> bytes,
                       Durability durability = Durability::kSync);
Status WriteFileAtomic(const std::string& path, std::string_view text);
// WriteFileAtomic, then the file made readable and writable by its owner only (0600): for files
// that hold a secret, a token or a URL with one.
Status WriteFileOwnerOnly(const std::string& path, std::string_view text);

// Reads a whole file. NotFound when absent; DataLoss/Internal on read errors.
StatusOr<std::string> ReadFile(const std::string& path);

// fsync of a folder (after a rename into it), best effort: some file systems refuse it.
void SyncFolder(const std::string& dir);

// Creates a folder and its parents (like mkdir -p). OK if it exists.
Status MakeDirs(const std::string& path);

bool FileExists(const std::string& path);

// Removes what a WriteFileAtomic killed mid-write left in `dir` (not below it): files named
// ".<target>.tmp.XXXXXX" (its temp pattern), for the targets named in `targets`, or for any
// target when `targets` is empty. Only for a folder no other process writes to at the same time.
// Returns the names removed (sorted); InvalidArgument when the folder cannot be read (an absent
// folder holds nothing: OK, none).
StatusOr<std::vector<std::string>> RemoveStaleTempFiles(const std::string& dir,
                                                        const std::vector<std::string>& targets = {});
// Whether `name` is a temp file of WriteFileAtomic (".<target>.tmp.XXXXXX").
bool IsAtomicWriteTempName(const std::string& name);

// Every regular file below `dir` (recursively), sorted by path, so callers read folders in a
// deterministic order. InvalidArgument naming the folder when it cannot be walked.
StatusOr<std::vector<std::string>> ListFilesRecursive(const std::string& dir);

}  // namespace atl
