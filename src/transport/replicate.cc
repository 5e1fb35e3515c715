// Replication's wire (docs/decisions/023): the leader streams state files from its disk, the
// standby receives them file by file.
#include <fstream>
#include <memory>

#include "atoll/core/checksum.h"
#include "wire.h"

namespace atl::transport {
namespace {

// A name the follower may write in its state folder: no separators, not "." or "..".
bool PlainName(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\0') == std::string::npos &&
         n.size() <= 255;
}

}  // namespace

StatusOr<int64_t> WriteReplicate(const syncer::ReplicateBatch& batch, const std::string& dir,
                                 grpc::ServerWriter<atl::v1::ReplicateChunk>* writer) {
  atl::v1::ReplicateChunk msg;
  auto* h = msg.mutable_header();
  h->set_leader_epoch(batch.epoch);
  h->set_seq(batch.seq);
  h->set_snapshot(batch.snapshot);
  std::vector<std::unique_ptr<std::ifstream>> files;
  for (const std::string& name : batch.files) {
    auto in = std::make_unique<std::ifstream>(dir + "/" + name, std::ios::binary | std::ios::ate);
    if (!*in) {
      if (batch.snapshot && name != "meta.json") continue;  // e.g. no eval-start.json yet
      return NotFoundError("replicate: " + dir + "/" + name + " cannot be read");
    }
    auto* f = h->add_files();
    f->set_name(name);
    f->set_size(static_cast<int64_t>(in->tellg()));
    in->seekg(0);
    files.push_back(std::move(in));
  }
  if (!writer->Write(msg)) return UnavailableError("replicate: the follower went away");
  int64_t offset = 0;
  std::string buf(kMaxChunkBytes, '\0');
  for (size_t i = 0; i < files.size(); ++i) {
    int64_t left = h->files(static_cast<int>(i)).size();
    while (left > 0) {
      const auto n = static_cast<std::streamsize>(std::min<int64_t>(left, static_cast<int64_t>(kMaxChunkBytes)));
      if (!files[i]->read(buf.data(), n)) return DataLossError("replicate: reading " + h->files(int(i)).name());
      atl::v1::ReplicateChunk c;
      auto* d = c.mutable_data();
      d->set_offset(offset);
      d->set_data(buf.data(), static_cast<size_t>(n));
      d->set_checksum(Checksum64(buf.data(), static_cast<size_t>(n)));
      if (!writer->Write(c)) return UnavailableError("replicate: the follower went away");
      offset += n;
      left -= n;
    }
  }
  return offset;
}

StatusOr<syncer::ReplicateBatch> ReadReplicate(grpc::ClientReaderInterface<atl::v1::ReplicateChunk>* reader,
                                               const ReplicaFileSink& on_file, bool& ended) {
  atl::v1::ReplicateChunk msg;
  ended = false;
  if (!reader->Read(&msg)) {
    ended = true;
    return DataLossError("replicate: the reply did not start with a header");
  }
  if (msg.kind_case() != atl::v1::ReplicateChunk::kHeader) {
    return DataLossError("replicate: the reply did not start with a header");
  }
  const atl::v1::ReplicateHeader h = msg.header();
  const syncer::ReplicateBatch head{h.leader_epoch(), h.seq(), h.snapshot(), {}};
  syncer::ReplicateBatch out = head;
  int64_t total = 0;
  for (const auto& f : h.files()) {
    if (!PlainName(f.name())) return InvalidArgumentError("replicate: '" + f.name() + "' is not a file name");
    if (f.size() < 0) return DataLossError("replicate: a negative file size");
    total += f.size();
  }
  std::vector<std::byte> bytes;
  int64_t base = 0;  // offset of the current file in the stream
  int next = 0;
  const auto deliver = [&]() -> Status {  // every file whose bytes are all in
    while (next < h.files_size() && static_cast<int64_t>(bytes.size()) >= h.files(next).size()) {
      const auto n = static_cast<size_t>(h.files(next).size());
      std::string file(reinterpret_cast<const char*>(bytes.data()), n);
      bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
      ATOLL_RETURN_IF_ERROR(on_file(head, h.files(next).name(), std::move(file)));
      out.files.push_back(h.files(next).name());
      base += static_cast<int64_t>(n);
      ++next;
    }
    return Status::Ok();
  };
  ATOLL_RETURN_IF_ERROR(deliver());  // empty files
  while (reader->Read(&msg)) {
    if (msg.kind_case() != atl::v1::ReplicateChunk::kData) return DataLossError("replicate: a second header");
    atl::v1::DataChunk d = msg.data();
    d.set_offset(d.offset() - base);  // AppendChunk checks offsets within what is held
    ATOLL_RETURN_IF_ERROR(AppendChunk(d, total - base, bytes).WithContext("replicate"));
    ATOLL_RETURN_IF_ERROR(deliver());
  }
  ended = true;
  if (next != h.files_size()) {
    return DataLossError("replicate: the stream ended after " + std::to_string(base + int64_t(bytes.size())) + " of " +
                         std::to_string(total) + " bytes");
  }
  return out;
}

}  // namespace atl::transport
