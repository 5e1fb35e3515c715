#include "atoll/core/json_file.h"

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/core/text.h"

namespace atl {

Status WriteJsonWithChecksum(const std::string& path, const nlohmann::json& object) {
  if (!object.is_object()) return InvalidArgumentError("WriteJsonWithChecksum: not an object");
  nlohmann::json doc = object;
  doc.erase("checksum");
  const std::string sum = ChecksumHex(Checksum64(DumpJson(doc)));
  doc["checksum"] = sum;
  return WriteFileAtomic(path, DumpJson(doc, 2) + "\n");
}

StatusOr<nlohmann::json> ReadJsonWithChecksum(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return DataLossError(path + " is corrupted: not a JSON object");
  if (!doc.contains("checksum") || !doc["checksum"].is_string()) {
    return DataLossError(path + " is corrupted: no checksum member");
  }
  const std::string want = doc["checksum"].get<std::string>();
  doc.erase("checksum");
  const std::string got = ChecksumHex(Checksum64(DumpJson(doc)));
  if (got != want) return DataLossError(path + " is corrupted: checksum " + got + ", expected " + want);
  return doc;
}

}  // namespace atl
