#include "atoll/syncer/durable_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"
#include "testing/toy_learner.h"
#include "testing/scratch.h"
#include "testing/small_core.h"

namespace atl::syncer {
namespace {

struct Env {
  std::string dir;
  diloco::FragmentPlan plan = testing::ToyPlan(3);
  SyncerOptions options;
  Env() {
    dir = testing::ScratchDir("durable");
    options.run_id = "durable";
    options.H = 3;
    options.round.grace = false;
    options.uplink = {diloco::Encoding::kFp32, 64};
    options.downlink = {diloco::Encoding::kFp32, 64};
  }
  ~Env() { std::filesystem::remove_all(dir); }
  SyncerCore Fresh() {
    std::vector<std::vector<float>> init;
    for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.5f);
    auto c = SyncerCore::Create(options, plan, init);
    ATOLL_CHECK(c.ok());
    return std::move(*c);
  }
  // Learner 0 pushes `values` (fp32) for fragment 0 against `base`.
  static Status Push(SyncerCore& core, int64_t base, const std::vector<float>& values) {
    std::vector<std::byte> payload(values.size() * 4);
    std::memcpy(payload.data(), values.data(), payload.size());
    PushHeaderData h{0, 0, base, 100, 2, diloco::Encoding::kFp32, 64, static_cast<int64_t>(values.size()), 0};
    return core.Push(testing::Stamped(core, h), payload, TimePoint{}).status();
  }
  // Joins learner 0 and runs `rounds` rounds of fragment 0.
  void Train(SyncerCore& core, int rounds, DurableState* durable) {
    ManualClock clock;
    JoinRequestData r{kProtocolVersion, "durable", diloco::ModelSignature(plan.tensors), 0, "t", true, {}, {}, {}};
    ATOLL_CHECK(core.Join(r, clock.Now()).ok());
    int64_t have = -1;
    for (int i = 0; i < rounds; ++i) {
      auto pulled = core.Pull(0, 0, have);
      ATOLL_CHECK(pulled.ok());
      have = pulled->version;
      ATOLL_CHECK(
          Push(core, have, std::vector<float>(static_cast<size_t>(plan.fragments[0].numel), 0.01f * (i + 1))).ok());
      for (const auto& rep : core.Poll(clock.Now(), clock)) {
        if (durable) ATOLL_CHECK(durable->SaveFragment(core, rep.fragment).ok());
      }
    }
    if (durable) ATOLL_CHECK(durable->SaveLearners(core).ok());
  }
  // A fresh core whose initial state and `rounds` rounds of fragment 0 are committed to `durable`.
  SyncerCore Committed(DurableState& durable, int rounds) {
    SyncerCore core = Fresh();
    ATOLL_CHECK(durable.SaveAll(core).ok());
    Train(core, rounds, &durable);
    return core;
  }
};

TEST(DurableState, RestoreGivesBackTheCommittedState) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  EXPECT_FALSE(durable.Exists());
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 5, &durable);
  ASSERT_EQ(core.version(0), 5);
  const uint64_t theta_sum = exchange::ValuesChecksum(core.theta(0));

  // "Restart": a fresh core from the initial values, then restore.
  SyncerCore restarted = env.Fresh();
  ASSERT_TRUE(durable.Exists());
  ASSERT_TRUE(durable.Restore(restarted, TimePoint{}).ok());
  EXPECT_EQ(restarted.versions(), core.versions());
  EXPECT_EQ(restarted.rounds_closed(), 5);
  EXPECT_EQ(exchange::ValuesChecksum(restarted.theta(0)), theta_sum);
  EXPECT_EQ(restarted.learners().at(0).rounds_joined, 5);
  // What each learner had merged, for its rejoin: fragment 0 at version 5, the others never.
  EXPECT_EQ(restarted.learners().at(0).merged_versions, (std::vector<int64_t>{5, -1, -1}));
  // Versions continue from the last committed round.
  env.Train(restarted, 1, nullptr);
  EXPECT_EQ(restarted.version(0), 6);
}

TEST(DurableState, AMergeTheTableRecordsButTheFragmentFileMissesIsNotClaimedAtRestart) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 2, &durable);
  // Killed between the two writes of a commit: the table (written first) holds round 3, the
  // fragment file still round 2.
  env.Train(core, 1, nullptr);
  ASSERT_TRUE(durable.SaveLearners(core).ok());
  ASSERT_EQ(core.learners().at(0).merged_versions[0], 3);
  SyncerCore restarted = env.Fresh();
  ASSERT_TRUE(durable.Restore(restarted, TimePoint{}).ok());
  EXPECT_EQ(restarted.version(0), 2);
  // Version 3 never existed for the restarted syncer: the learner must push that work again.
  EXPECT_EQ(restarted.learners().at(0).merged_versions[0], -1);
}

TEST(DurableState, CorruptionIsDetectedWithAClearErrorAndNothingChanges) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 2, &durable);
  const std::string frag = env.dir + "/fragment-001.bin";
  auto original = ReadFile(frag);
  ASSERT_TRUE(original.ok());

  // A flipped byte in the body.
  std::string flipped = *original;
  flipped[flipped.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(flipped)).ok());
  SyncerCore target = env.Fresh();
  Status st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("fragment-001.bin is corrupted: checksum mismatch"), std::string::npos) << st;
  EXPECT_EQ(target.version(0), 0);  // unchanged, even though fragment 0 was fine

  // A truncated file.
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(original->data(), original->size() - 7)).ok());
  st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st;

  // A corrupted manifest.
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(*original)).ok());
  auto meta = ReadFile(env.dir + "/meta.json");
  std::string bad_meta = *meta;
  bad_meta.replace(bad_meta.find("durable"), 7, "durabl3");
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/meta.json", std::string_view(bad_meta)).ok());
  st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("meta.json is corrupted"), std::string::npos) << st;

  // Intact again: restores.
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/meta.json", std::string_view(*meta)).ok());
  EXPECT_TRUE(durable.Restore(target, TimePoint{}).ok());
  EXPECT_EQ(target.version(0), 2);
}

TEST(DurableState, RefusesTheStateOfAnotherRun) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.options.run_id = "other";
  SyncerCore other = env.Fresh();
  Status st = durable.Restore(other, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("belongs to another run_id"), std::string::npos) << st;
}

// The public copy is committed with Θ_p: after a restart a learner whose copy's checksum matches
// the committed version resumes with deltas; a version older than that (the history is not
// committed) fetches in full once.
TEST(DurableState, ThePublicCopySurvivesARestartAndLearnersResumeWithDeltas) {
  Env env;
  env.options.downlink = {diloco::Encoding::kInt4, 64};  // Φ differs from Θ by the quantisation error
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 3, &durable);
  {  // one more round with uneven values, so that the int4 delta below is not exact
    std::vector<float> local(static_cast<size_t>(env.plan.fragments[0].numel));
    for (size_t i = 0; i < local.size(); ++i) local[i] = 0.3f * std::sin(0.7f * static_cast<float>(i));
    ASSERT_TRUE(Env::Push(core, 2, local).ok());
    ManualClock clock;
    for (const auto& rep : core.Poll(TimePoint{}, clock)) ASSERT_TRUE(durable.SaveFragment(core, rep.fragment).ok());
  }
  ASSERT_EQ(core.version(0), 4);
  const std::vector<float> learner_phi(core.public_values(0).begin(), core.public_values(0).end());
  ASSERT_NE(exchange::ValuesChecksum(learner_phi), exchange::ValuesChecksum(core.theta(0)));

  auto rejoin = [&](SyncerCore& c, uint64_t checksum) {
    JoinRequestData r{kProtocolVersion, "durable", diloco::ModelSignature(env.plan.tensors), 0, "t", true, {}, {}, {}};
    r.fragment_checksums = {checksum, 0, 0};
    auto reply = c.Join(r, TimePoint{});
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->fragment_held[0] : int64_t{-2};
  };
  SyncerCore restarted = env.Fresh();
  ASSERT_TRUE(durable.Restore(restarted, TimePoint{}).ok());
  EXPECT_EQ(std::memcmp(restarted.public_values(0).data(), learner_phi.data(), learner_phi.size() * 4), 0);
  // The learner holds version 4: nothing to fetch, and a push against it is accepted.
  EXPECT_EQ(rejoin(restarted, exchange::ValuesChecksum(learner_phi)), 4);
  auto again = restarted.Pull(0, 0, 4);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->not_modified);
  EXPECT_TRUE(Env::Push(restarted, 4, std::vector<float>(learner_phi.size(), 0.01f)).ok());
  // A learner at version 2 is not in the restarted syncer's reach: a full fetch, and a push
  // against version 2 asks for one (Aborted).
  EXPECT_EQ(rejoin(restarted, 12345), -1);
  auto full = restarted.Pull(0, 0, 2);
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->not_modified);
  EXPECT_FALSE(full->is_delta);
  EXPECT_EQ(Env::Push(restarted, 2, std::vector<float>(learner_phi.size(), 0.01f)).code(), StatusCode::kAborted);
}

// Issue 32: a state folder whose meta.json was lost made the syncer start over and overwrite
// every committed fragment file. Any syncer file without meta.json is refused, never written.
TEST(DurableState, AFolderWithFragmentsButNoMetaIsRefusedNeverOverwritten) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_EQ(durable.Inspect().value(), DurableState::Contents::kEmpty) << "absent";
  ASSERT_TRUE(durable.SaveAll(core).ok());
  EXPECT_EQ(durable.Inspect().value(), DurableState::Contents::kSaved);
  EXPECT_EQ(durable.SaveAll(core).code(), StatusCode::kFailedPrecondition) << "a saved state is never replaced";
  env.Train(core, 3, &durable);
  const auto committed = ReadFile(env.dir + "/fragment-000.bin");
  ASSERT_TRUE(committed.ok());
  std::filesystem::remove(env.dir + "/meta.json");
  auto inspected = durable.Inspect();
  ASSERT_EQ(inspected.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(inspected.status().message().find("fragment-000.bin"), std::string::npos) << inspected.status();
  EXPECT_NE(inspected.status().message().find("but no meta.json"), std::string::npos) << inspected.status();
  EXPECT_EQ(durable.SaveAll(env.Fresh()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadFile(env.dir + "/fragment-000.bin").value(), *committed) << "untouched";
  // Only a learner table, or only copies: refused as well.
  std::filesystem::remove_all(env.dir);
  std::filesystem::create_directories(env.dir + "/copies");
  EXPECT_EQ(durable.Inspect().status().code(), StatusCode::kFailedPrecondition);
  // Files that are no syncer state at all.
  std::filesystem::remove_all(env.dir);
  std::filesystem::create_directories(env.dir);
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/notes.txt", std::string_view("mine")).ok());
  inspected = durable.Inspect();
  ASSERT_EQ(inspected.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(inspected.status().message().find("not a syncer state"), std::string::npos) << inspected.status();
  // An empty folder is a fresh one: the initial state is renamed into its place.
  std::filesystem::remove(env.dir + "/notes.txt");
  EXPECT_EQ(durable.Inspect().value(), DurableState::Contents::kEmpty);
  ASSERT_TRUE(durable.SaveAll(env.Fresh()).ok());
  EXPECT_EQ(durable.Inspect().value(), DurableState::Contents::kSaved);
}

// Issue 32: a flipped bit in a fragment file's version was served (v59 instead of v51). Every
// header field is covered by a checksum now; each damaged field is refused, naming the file.
TEST(DurableState, AFlippedBitInAnyFragmentHeaderFieldIsRefusedNamingTheFile) {
  Env env;
  DurableState durable(env.dir);
  SyncerCore core = env.Committed(durable, 3);
  const std::string frag = env.dir + "/fragment-000.bin";
  const std::string original = ReadFile(frag).value();
  ASSERT_EQ(original.substr(0, 8), "ATOLFRG2");
  for (const auto& [offset, field] : std::vector<std::pair<size_t, std::string>>{{9, "version"},
                                                                                 {17, "round"},
                                                                                 {25, "numel"},
                                                                                 {33, "flags"},
                                                                                 {37, "lattice blocks"},
                                                                                 {41, "sweep share"},
                                                                                 {49, "body checksum"},
                                                                                 {57, "header checksum"}}) {
    std::string flipped = original;
    flipped[offset] ^= 0x08;
    ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(flipped)).ok());
    SyncerCore target = env.Fresh();
    Status st = durable.Restore(target, TimePoint{});
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << field;
    EXPECT_NE(st.message().find("fragment-000.bin is corrupted: its header checksum does not match"), std::string::npos)
        << field << ": " << st;
    EXPECT_EQ(target.version(0), 0) << "nothing restored";
  }
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(original)).ok());
  SyncerCore target = env.Fresh();
  ASSERT_TRUE(durable.Restore(target, TimePoint{}).ok());
  EXPECT_EQ(target.version(0), 3);
}

// A state written by the earlier format (a 40-byte header without its own checksum; Θ_p and the
// momentum only) still resumes.
TEST(DurableState, AFragmentFileOfTheEarlierFormatIsStillRead) {
  Env env;
  DurableState durable(env.dir);
  SyncerCore core = env.Committed(durable, 2);
  SyncerCore::FragmentSnapshot snap = core.SnapshotFragment(0);
  snap.momentum.resize(snap.theta.size());  // zeros where the outer step keeps none
  std::string body(reinterpret_cast<const char*>(snap.theta.data()), snap.theta.size() * 4);
  body.append(reinterpret_cast<const char*>(snap.momentum.data()), snap.momentum.size() * 4);
  const int64_t header[3] = {snap.version, snap.version, static_cast<int64_t>(snap.theta.size())};
  const uint64_t sum = Checksum64(body.data(), body.size());
  std::string v1 = "ATOLFRG1" + std::string(reinterpret_cast<const char*>(header), sizeof(header)) +
                   std::string(reinterpret_cast<const char*>(&sum), sizeof(sum)) + body;
  const std::string frag = env.dir + "/fragment-000.bin";
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(v1)).ok());
  SyncerCore target = env.Fresh();
  ASSERT_TRUE(durable.Restore(target, TimePoint{}).ok());
  EXPECT_EQ(target.version(0), 2);
  EXPECT_EQ(exchange::ValuesChecksum(target.theta(0)), exchange::ValuesChecksum(core.theta(0)));
}

TEST(DurableState, AMissingOrStrayFragmentFileIsRefused) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  const std::string one = ReadFile(env.dir + "/fragment-001.bin").value();
  std::filesystem::remove(env.dir + "/fragment-001.bin");
  SyncerCore target = env.Fresh();
  Status st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("fragment-001.bin is missing"), std::string::npos) << st;
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/fragment-001.bin", std::string_view(one)).ok());
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/fragment-007.bin", std::string_view(one)).ok());
  st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("fragment-007.bin, which is not one of the 3 fragments"), std::string::npos) << st;
  std::filesystem::remove(env.dir + "/fragment-007.bin");
  EXPECT_TRUE(durable.Restore(target, TimePoint{}).ok());
}

// Issue 32: a damaged learners.json or eval-start.json blocked a restart. They are not committed
// state: ignored with a warning that says what was lost, and rebuilt.
TEST(DurableState, ADamagedLearnerTableIsIgnoredWithAWarning) {
  Env env;
  DurableState durable(env.dir);
  SyncerCore core = env.Committed(durable, 4);
  std::string table = ReadFile(env.dir + "/learners.json").value();
  table[table.find("rounds_joined") + 2] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/learners.json", std::string_view(table)).ok());
  SyncerCore target = env.Fresh();
  DurableState reader(env.dir);
  ASSERT_TRUE(reader.Restore(target, TimePoint{}).ok());
  EXPECT_EQ(target.version(0), 4) << "the committed rounds are all there";
  EXPECT_TRUE(target.learners().empty()) << "the table is rebuilt as learners rejoin";
  EXPECT_EQ(target.rounds_closed(), 4) << "recounted from the fragments";
  ASSERT_EQ(reader.warnings().size(), 1u);
  EXPECT_NE(reader.warnings()[0].find("learners.json"), std::string::npos) << reader.warnings()[0];
  EXPECT_NE(reader.warnings()[0].find("Lost:"), std::string::npos) << reader.warnings()[0];
}

TEST(DurableState, ADamagedStartEvaluationIsIgnoredWithAWarning) {
  Env env;
  DurableState reader(env.dir);
  ASSERT_TRUE(reader.SaveAll(env.Fresh()).ok());
  const std::string eval = env.dir + "/eval-start.json";
  EXPECT_FALSE(reader.SavedStartEval()) << "none saved yet";
  ASSERT_TRUE(reader.SaveStartEval(4.75).ok());
  EXPECT_EQ(reader.SavedStartEval(), 4.75);
  ASSERT_TRUE(WriteFileAtomic(eval, std::string_view(R"({"loss": 3.25})")).ok());
  EXPECT_EQ(reader.SavedStartEval(), 3.25) << "the earlier format, without a checksum";
  for (const char* damaged : {R"({"loss": "x"})", "{\"loss\": 4.7", "", R"({"loss": 4.75, "checksum": "00"})"}) {
    ASSERT_TRUE(WriteFileAtomic(eval, std::string_view(damaged)).ok());
    const size_t before = reader.warnings().size();
    EXPECT_FALSE(reader.SavedStartEval()) << damaged;
    ASSERT_EQ(reader.warnings().size(), before + 1) << damaged;
    EXPECT_NE(reader.warnings().back().find("evaluated again"), std::string::npos) << reader.warnings().back();
  }
}

// Issue 32: a SIGKILL mid-write left temp files that were never removed. Only the syncer's own
// patterns are removed: its atomic-write temp files in the folder and copies/, and the temp folder
// of an interrupted initial write beside it.
TEST(DurableState, TempFilesOfAKilledSyncerAreRemovedAtStart) {
  Env env;
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(env.Fresh()).ok());
  namespace fs = std::filesystem;
  fs::create_directories(env.dir + "/copies");
  const fs::path parent = fs::path(env.dir).parent_path();
  const std::string name = fs::path(env.dir).filename().string();
  for (const std::string& f : {env.dir + "/.fragment-000.bin.tmp.AbC123", env.dir + "/.learners.json.tmp.x9Y8z7",
                               env.dir + "/copies/.learner-0-fragment-000.bin.tmp.QwErTy"}) {
    ASSERT_TRUE(WriteFileAtomic(f, std::string_view("partial")).ok());
  }
  fs::create_directories(parent / ("." + name + ".init-Zx12Cv"));
  ASSERT_TRUE(
      WriteFileAtomic((parent / ("." + name + ".init-Zx12Cv/fragment-000.bin")).string(), std::string_view("p")).ok());
  // Not the syncer's: kept.
  const std::vector<std::string> kept = {env.dir + "/.hidden", env.dir + "/copies/notes.tmp.txt",
                                         env.dir + "/.fragment-000.bin.tmp.ab"};
  for (const auto& f : kept) ASSERT_TRUE(WriteFileAtomic(f, std::string_view("keep")).ok());
  const std::vector<std::string> removed = durable.RemoveStaleTempFiles();
  EXPECT_EQ(removed.size(), 4u);
  EXPECT_FALSE(fs::exists(env.dir + "/.fragment-000.bin.tmp.AbC123"));
  EXPECT_FALSE(fs::exists(env.dir + "/copies/.learner-0-fragment-000.bin.tmp.QwErTy"));
  EXPECT_FALSE(fs::exists(parent / ("." + name + ".init-Zx12Cv")));
  for (const auto& f : kept) EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_TRUE(durable.RemoveStaleTempFiles().empty());
  SyncerCore target = env.Fresh();
  EXPECT_TRUE(durable.Restore(target, TimePoint{}).ok());
}

}  // namespace
}  // namespace atl::syncer
