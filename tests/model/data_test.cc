// Tokenizers, shard files, per-learner shards and `data prepare` (atoll_data; torch-free).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "atoll/core/file.h"
#include "atoll/model/data.h"
#include "atoll/model/shard.h"
#include "atoll/model/tokenizer.h"
#include "testing/data.h"
#include "testing/scratch.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

const std::string kAwkwardText =
    "In the beginning  God created\tthe heaven.\n\n  Indented line 12345 "
    "with ümlauts, “quotes”, emoji 🙂 and a\x01 control byte.\nno trailing newline";

TEST(ModelTokenizer, ByteRoundTrip) {
  auto tok = MakeByteTokenizer();
  EXPECT_EQ(tok->vocab_size(), 256);
  auto ids = tok->Encode(kAwkwardText);
  EXPECT_EQ(ids.size(), kAwkwardText.size());
  EXPECT_EQ(tok->Decode(ids), kAwkwardText);
}

TEST(ModelTokenizer, SentencePieceTrainsAndRoundTripsLosslessly) {
  std::string corpus = testing::TinyCorpus(60000);
  auto model = TrainSentencePieceModel({corpus}, 400);
  ASSERT_TRUE(model.ok()) << model.status();
  auto tok = SentencePieceTokenizerFromModel(*model);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->kind(), "bpe");
  EXPECT_EQ((*tok)->vocab_size(), 400);
  for (const std::string& text : {corpus.substr(0, 2000), kAwkwardText, std::string("\n\n"), std::string("")}) {
    auto ids = (*tok)->Encode(text);
    for (int id : ids) ASSERT_TRUE(id >= 0 && id < 400);
    EXPECT_EQ((*tok)->Decode(ids), text);
  }
  // BPE compresses the text it was trained on.
  EXPECT_LT((*tok)->Encode(corpus).size() * 2, corpus.size());
  // Deterministic: the same corpus gives the same model.
  auto again = TrainSentencePieceModel({corpus}, 400);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *model);
}

TEST(ModelTokenizer, BadVocabAndEmptyCorpusAreRejected) {
  std::string corpus = testing::TinyCorpus(2000);
  EXPECT_EQ(TrainSentencePieceModel({corpus}, 70000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainSentencePieceModel({corpus}, 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainSentencePieceModel({std::string_view()}, 400).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SentencePieceTokenizerFromModel("not a model").status().code(), StatusCode::kDataLoss);
}

TEST(ModelShard, FileRoundTripAndCorruption) {
  auto dir = testing::ScratchDir("shard");
  std::vector<uint16_t> tokens = {0, 1, 2, 65535, 7};
  std::string path = dir + "/a.bin";
  ASSERT_TRUE(WriteTokenShard(path, 65536, tokens).ok());
  auto s = ReadTokenShard(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->vocab, 65536);
  EXPECT_EQ(s->tokens, tokens);
  EXPECT_EQ(fs::file_size(path), kShardHeaderBytes + 2 * tokens.size());

  EXPECT_EQ(WriteTokenShard(path, 65537, tokens).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteTokenShard(path, 100, tokens).code(), StatusCode::kInvalidArgument);

  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[kShardHeaderBytes + 1] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(path, bad).ok());
  auto st = ReadTokenShard(path).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("corrupted"), std::string::npos) << st;
  ASSERT_TRUE(WriteFileAtomic(path, bytes->substr(0, bytes->size() - 2)).ok());
  EXPECT_EQ(ReadTokenShard(path).status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view("plain text, not a shard at all")).ok());
  EXPECT_EQ(ReadTokenShard(path).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ReadTokenShard(dir + "/missing.bin").status().code(), StatusCode::kNotFound);
}

TEST(ModelShard, LearnerShardsAreDisjointAndCoverTheData) {
  const int64_t n = 10001;
  const int seq = 16;
  for (int m : {1, 2, 3, 8}) {
    std::set<int64_t> all;
    size_t total = 0;
    for (int i = 0; i < m; ++i) {
      auto w = ShardWindows(n, seq, i, m);
      total += w.size();
      all.insert(w.begin(), w.end());
      // Sizes differ by at most one window.
      EXPECT_NEAR(static_cast<double>(w.size()), (n - 1) / seq / static_cast<double>(m), 1.0);
    }
    EXPECT_EQ(total, all.size()) << "overlap with " << m << " shards";
    EXPECT_EQ(static_cast<int64_t>(all.size()), (n - 1) / seq) << "every window covered";
    EXPECT_EQ(*all.rbegin() + seq + 1, (n - 1) / seq * seq + 1) << "last window in range";
  }
}

std::shared_ptr<const std::vector<uint16_t>> Iota(size_t n) {
  auto v = std::make_shared<std::vector<uint16_t>>(n);
  for (size_t i = 0; i < n; ++i) (*v)[i] = static_cast<uint16_t>(i % 60000);
  return v;
}

std::vector<int64_t> Batch(ShardReader& r) {
  std::vector<int64_t> out(static_cast<size_t>(r.options().batch_size) * (r.options().seq_len + 1));
  r.NextBatch(out);
  return out;
}

TEST(ModelShardReader, DeterministicResumableAndWithinItsShard) {
  auto stream = Iota(5000);
  ShardReader::Options o;
  o.seq_len = 8;
  o.batch_size = 4;
  o.shard = 1;
  o.num_shards = 3;
  o.seed = 99;
  auto a = ShardReader::Create(stream, o);
  auto b = ShardReader::Create(stream, o);
  ASSERT_TRUE(a.ok() && b.ok());
  auto owned = ShardWindows(5000, 8, 1, 3);
  std::set<int64_t> mine(owned.begin(), owned.end());
  std::vector<std::vector<int64_t>> seen;
  for (int i = 0; i < 100; ++i) {  // several epochs (≈208 windows / 4 per batch)
    auto x = Batch(*a);
    EXPECT_EQ(x, Batch(*b)) << "same seed, same order";
    for (int row = 0; row < 4; ++row) {
      int64_t start = x[static_cast<size_t>(row) * 9];
      EXPECT_TRUE(mine.count(start)) << "window " << start << " not in shard 1";
      for (int k = 1; k < 9; ++k) EXPECT_EQ(x[static_cast<size_t>(row) * 9 + k], start + k);
    }
    seen.push_back(x);
  }
  // Resume from a saved position reproduces the continuation.
  auto c = ShardReader::Create(stream, o);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 57; ++i) Batch(*c);
  ReaderPosition pos = c->position();
  auto want = Batch(*c);
  auto d = ShardReader::Create(stream, o);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->Seek(pos).ok());
  EXPECT_EQ(Batch(*d), want);
  EXPECT_EQ(d->Seek({0, 1000000}).code(), StatusCode::kInvalidArgument);

  o.seed = 100;
  auto e = ShardReader::Create(stream, o);
  ASSERT_TRUE(e.ok());
  EXPECT_NE(Batch(*e), seen[0]) << "another seed, another order";
  o.num_shards = 10000;
  o.shard = 9999;
  EXPECT_EQ(ShardReader::Create(stream, o).status().code(), StatusCode::kFailedPrecondition);
}

TEST(ModelPrepareData, UserTextByteTokenizerIsIdempotent) {
  auto dir = testing::ScratchDir("prep_byte");
  std::string text = testing::TinyCorpus(30000);
  std::string in = testing::WriteText(dir, "in.txt", text);
  DataOptions o;
  o.out_dir = dir + "/data";
  o.tokenizer = TokenizerKind::kByte;
  o.inputs = {in};
  auto m = PrepareData(o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tokenizer, TokenizerKind::kByte);
  EXPECT_EQ(m->vocab_size, 256);
  EXPECT_EQ(m->train_tokens + m->val_tokens, static_cast<int64_t>(text.size()));
  EXPECT_GT(m->val_tokens, 0);
  EXPECT_NEAR(static_cast<double>(m->val_tokens) / text.size(), 0.03, 0.015);

  auto train = LoadTrainTokens(*m);
  auto val = LoadValTokens(*m);
  ASSERT_TRUE(train.ok() && val.ok());
  EXPECT_EQ(static_cast<int64_t>(train->size()), m->train_tokens);
  auto tok = LoadTokenizer(*m);
  ASSERT_TRUE(tok.ok());
  std::vector<int> ids(train->begin(), train->begin() + 200);
  EXPECT_EQ((*tok)->Decode(ids), text.substr(0, 200)) << "train starts with the text";

  auto mtime = fs::last_write_time(dir + "/data/data.json");
  auto again = PrepareData(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(fs::last_write_time(dir + "/data/data.json"), mtime) << "nothing rewritten";
  EXPECT_EQ(again->json, m->json);

  // Changing the input prepares again.
  testing::WriteText(dir, "in.txt", text + "more text\n");
  auto changed = PrepareData(o);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(changed->train_tokens + changed->val_tokens, static_cast<int64_t>(text.size()) + 10);

  // EnsureDataPrepared keeps whatever the folder holds.
  auto ensured = EnsureDataPrepared(o.out_dir, nullptr);
  ASSERT_TRUE(ensured.ok()) << ensured.status();
  EXPECT_EQ(ensured->tokenizer, TokenizerKind::kByte);
}

// A corpus of several 1 MB encoding chunks: the tokens are the text in order, split into train
// and validation blocks exactly as SplitValidation does (every 33rd 4096-token block, the 17th
// of each period, is validation).
TEST(ModelPrepareData, ChunkedEncodingKeepsTheTextInOrder) {
  auto dir = testing::ScratchDir("prep_chunks");
  std::string text;
  for (int i = 0; text.size() < 2'600'000; ++i)
    text += "line " + std::to_string(i) + ": " + testing::TinyCorpus(40 + i % 50) + "\n";
  std::string in = testing::WriteText(dir, "in.txt", text);
  DataOptions o;
  o.out_dir = dir + "/data";
  o.tokenizer = TokenizerKind::kByte;
  o.inputs = {in};
  auto m = PrepareData(o);
  ASSERT_TRUE(m.ok()) << m.status();
  auto train = LoadTrainTokens(*m);
  ASSERT_TRUE(train.ok());
  std::string expected;
  for (size_t b = 0, start = 0; start < text.size(); ++b, start += 4096) {
    if (b % 33 != 16) expected += text.substr(start, 4096);
  }
  ASSERT_EQ(train->size(), expected.size());
  EXPECT_TRUE(std::equal(train->begin(), train->end(), expected.begin(),
                         [](uint16_t id, char c) { return id == static_cast<unsigned char>(c); }));
}

TEST(ModelPrepareData, BpeFolderInputAndShardInput) {
  auto dir = testing::ScratchDir("prep_bpe");
  fs::create_directories(dir + "/in/sub");
  testing::WriteText(dir + "/in", "a.txt", testing::TinyCorpus(20000, 1));
  testing::WriteText(dir + "/in/sub", "b.md", testing::TinyCorpus(20000, 2));
  testing::WriteText(dir + "/in", "blob.bin", std::string("\0\1\2binary", 9));
  DataOptions o;
  o.out_dir = dir + "/data";
  o.vocab_size = 350;
  o.inputs = {dir + "/in"};
  auto m = PrepareData(o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tokenizer, TokenizerKind::kBpe);
  EXPECT_EQ(m->vocab_size, 350);
  EXPECT_EQ(m->json["sources"].size(), 2u) << "binary file skipped";
  EXPECT_TRUE(fs::exists(dir + "/data/tokenizer.model"));
  auto tok = LoadTokenizer(*m);
  ASSERT_TRUE(tok.ok()) << tok.status();

  // The prepared shards can seed another data folder.
  DataOptions s;
  s.out_dir = dir + "/data2";
  s.shards = m->train_files;
  auto m2 = PrepareData(s);
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ(m2->tokenizer, TokenizerKind::kExternal);
  EXPECT_EQ(m2->vocab_size, 350);
  EXPECT_EQ(m2->train_tokens + m2->val_tokens, m->train_tokens);
  EXPECT_EQ(LoadTokenizer(*m2).status().code(), StatusCode::kFailedPrecondition);
}

TEST(ModelPrepareData, BadInputGivesClearErrors) {
  auto dir = testing::ScratchDir("prep_bad");
  DataOptions o;
  o.out_dir = dir + "/data";
  o.inputs = {dir + "/does_not_exist.txt"};
  auto st = PrepareData(o).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("does_not_exist.txt"), std::string::npos) << st;

  o.inputs = {testing::WriteText(dir, "empty.txt", "")};
  st = PrepareData(o).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("empty"), std::string::npos) << st;

  o.inputs = {testing::WriteText(dir, "ok.txt", "some text\n")};
  o.vocab_size = 70000;
  st = PrepareData(o).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("uint16"), std::string::npos) << st;

  o.vocab_size = 4096;
  EXPECT_EQ(ParseTokenizerKind("wordpiece").status().message(),
            "tokenizer must be bpe, byte or external (got 'wordpiece')");
  o.tokenizer = TokenizerKind::kExternal;  // the kind of a folder from shards, not a request
  EXPECT_EQ(PrepareData(o).status().code(), StatusCode::kInvalidArgument);
  o.tokenizer = TokenizerKind::kBpe;
  o.shards = {dir + "/x.bin"};
  EXPECT_EQ(PrepareData(o).status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(LoadDataManifest(dir + "/nowhere").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl::model
