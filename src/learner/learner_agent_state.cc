// LearnerAgent's public copies on disk and at join: the state folder (AgentOptions::state_dir)
// a restarted process resumes from, and which copies the syncer says a joining learner holds.
#include <cstdio>
#include <cstring>

#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/learner/learner_agent.h"

namespace atl::learner {
namespace {

// A learner's state file of one fragment: magic "ATOLLST1", then the header below, then Φ (fp32)
// and the lattice exponents. The checksum covers the values; the syncer checks them again.
constexpr char kStateMagic[8] = {'A', 'T', 'O', 'L', 'L', 'S', 'T', '1'};
struct StateHeader {
  char magic[8];
  int64_t version;
  int64_t numel;
  int32_t block;
  uint32_t blocks;
  uint64_t values_checksum;
};
static_assert(sizeof(StateHeader) == 40, "the learner state header is pinned at 40 bytes");

std::string StatePath(const std::string& dir, int p) {
  char name[32];
  std::snprintf(name, sizeof(name), "/fragment-%03d.bin", p);
  return dir + name;
}

}  // namespace

void LearnerAgent::LoadState() {
  if (options_.state_dir.empty()) return;
  int64_t loaded = 0;
  for (int p = 0; p < plan_.num_fragments(); ++p) {
    if (!Mine(p)) continue;
    auto bytes = ReadFile(StatePath(options_.state_dir, p));
    if (!bytes.ok() || bytes->size() < sizeof(StateHeader)) continue;
    StateHeader h{};
    std::memcpy(&h, bytes->data(), sizeof(h));
    const size_t n = static_cast<size_t>(plan_.fragments[static_cast<size_t>(p)].numel);
    if (std::memcmp(h.magic, kStateMagic, 8) != 0 || h.numel != static_cast<int64_t>(n) || h.version < 0 ||
        bytes->size() != sizeof(h) + n * sizeof(float) + h.blocks) {
      continue;  // damaged or another model's: this fragment is fetched as usual
    }
    std::vector<float> values(n);
    std::memcpy(values.data(), bytes->data() + sizeof(h), n * sizeof(float));
    exchange::Lattice lattice;
    lattice.block = h.block;
    lattice.numel = n;
    lattice.exp.resize(h.blocks);
    std::memcpy(lattice.exp.data(), bytes->data() + sizeof(h) + n * sizeof(float), h.blocks);
    if (exchange::ValuesChecksum(values) != h.values_checksum || h.block < 8 ||
        lattice.exp.size() != (n + static_cast<size_t>(h.block) - 1) / static_cast<size_t>(h.block)) {
      continue;
    }
    const size_t pi = static_cast<size_t>(p);
    public_[pi] = std::move(values);
    lattice_[pi] = std::move(lattice);
    have_[pi] = h.version;
    loaded_[pi] = true;
    NoteHeld(p, h.values_checksum);
    ++loaded;
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_.state_loaded = loaded;
}

void LearnerAgent::SaveState(int p) {
  const size_t pi = static_cast<size_t>(p);
  const std::vector<float>& values = public_[pi];
  const uint64_t checksum = exchange::ValuesChecksum(values);
  NoteHeld(p, checksum);
  if (options_.state_dir.empty()) return;
  StateHeader h{};
  std::memcpy(h.magic, kStateMagic, 8);
  h.version = have_[pi];
  h.numel = static_cast<int64_t>(values.size());
  h.block = lattice_[pi].block;
  h.blocks = static_cast<uint32_t>(lattice_[pi].exp.size());
  h.values_checksum = checksum;
  std::vector<std::byte> buf(sizeof(h) + values.size() * sizeof(float) + h.blocks);
  std::memcpy(buf.data(), &h, sizeof(h));
  std::memcpy(buf.data() + sizeof(h), values.data(), values.size() * sizeof(float));
  std::memcpy(buf.data() + sizeof(h) + values.size() * sizeof(float), lattice_[pi].exp.data(), h.blocks);
  // No fsync: the state is a cache that the syncer verifies (checksums) when the learner rejoins.
  Status st = MakeDirs(options_.state_dir);
  if (st.ok()) st = WriteFileAtomic(StatePath(options_.state_dir, p), buf, Durability::kNoSync);
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.state_errors += 1;
  }
}

void LearnerAgent::AdoptHeld(const syncer::JoinReplyData& reply) {
  const size_t P = public_.size();
  const bool said = reply.fragment_held.size() == P;
  for (size_t p = 0; p < P && options_.exchange_fragments; ++p) {
    if (!Mine(static_cast<int>(p))) continue;
    const int64_t held = said ? reply.fragment_held[p] : -1;
    const bool initial = held == 0 && p < reply.fragment_initial.size() && reply.fragment_initial[p];
    if (initial && !initial_.empty() && !loaded_[p]) {
      // The run's initial values: snapped to their lattice they are the public copy at version 0.
      auto lattice = exchange::MakeLattice(initial_[p], reply.downlink.block_size);
      if (!lattice.ok()) {
        have_[p] = -1;
        continue;
      }
      exchange::SnapToLattice(*lattice, initial_[p]);
      public_[p] = std::move(initial_[p]);
      lattice_[p] = std::move(*lattice);
      have_[p] = 0;
    } else if (held >= 0 && have_[p] >= 0 && lattice_[p].numel == public_[p].size()) {
      have_[p] = held;   // the copy it holds, as the syncer knows it (a rejoin, or a restarted syncer)
      if (loaded_[p]) {  // a restarted process: its model starts from that copy (a pull may replace it)
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back({static_cast<int>(p), held, 0, false, public_[p], {}});
      }
    } else {
      have_[p] = -1;  // unknown to the syncer, or no lattice to apply deltas on: a full fetch
    }
    loaded_[p] = false;
    NoteHeld(static_cast<int>(p), have_[p] >= 0 ? exchange::ValuesChecksum(public_[p]) : 0);
  }
  initial_.clear();
}

void LearnerAgent::OfferCopies(const syncer::JoinReplyData& reply) {
  for (int p : reply.rebuild_wanted) {
    const auto pi = static_cast<size_t>(p);
    if (p < 0 || pi >= public_.size() || !Mine(p) || have_[pi] < 0 || public_[pi].empty()) continue;
    syncer::PushHeaderData h;
    h.learner_id = reply.learner_id;
    h.push_session = reply.push_session;
    {
      std::lock_guard<std::mutex> lock(mu_);
      h.push_seq = ++push_seq_;
      counters_.copies_offered += 1;
    }
    h.fragment = p;
    h.base_version = have_[pi];
    h.encoding = diloco::Encoding::kFp32;
    h.compression = diloco::Compression::kNone;
    h.num_values = static_cast<int64_t>(public_[pi].size());
    h.public_copy = true;
    std::vector<std::byte> payload(public_[pi].size() * sizeof(float));
    std::memcpy(payload.data(), public_[pi].data(), payload.size());
    auto r = api_.Push(h, payload);
    std::lock_guard<std::mutex> lock(mu_);
    if (r.ok()) {
      counters_.copies_adopted += 1;
      counters_.payload_bytes_up += static_cast<int64_t>(payload.size());
    } else {
      std::fprintf(stderr, "learner %d: the rebuilding syncer did not adopt its copy of fragment %d: %s\n",
                   reply.learner_id, p, r.status().ToString().c_str());
    }
  }
}

void LearnerAgent::NoteHeld(int p, uint64_t checksum) {
  std::lock_guard<std::mutex> lock(mu_);
  held_[static_cast<size_t>(p)] = {have_[static_cast<size_t>(p)], checksum};
}

std::vector<LearnerAgent::HeldCopy> LearnerAgent::HeldCopies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace atl::learner
