// JSON documents that carry their own checksum (manifests, the syncer's meta and learner table):
// the object is written with a "checksum" member holding ChecksumHex of the document's compact
// dump without that member, atomically (temp, fsync, rename). One format for every module.
// Thread-safety: free functions; concurrent writers of one path need outside coordination.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"

namespace atl {

// InvalidArgument when `object` is not a JSON object; I/O errors from the atomic write.
Status WriteJsonWithChecksum(const std::string& path, const nlohmann::json& object);
// Reads such a document; NotFound when absent; DataLoss when it does not parse, is not an object,
// or its checksum is missing or does not match. Returns the object without "checksum".
StatusOr<nlohmann::json> ReadJsonWithChecksum(const std::string& path);

}  // namespace atl
