// Safetensors files and checksummed JSON manifests (atoll_checkpoint).
#include <gtest/gtest.h>

#include <cstring>

#include "atoll/core/file.h"
#include "atoll/model/safetensors.h"
#include "testing/data.h"
#include "testing/scratch.h"

namespace atl::model {
namespace {

using diloco::TensorSpec;

std::vector<TensorSpec> Specs() {
  return {{"tok_emb.weight", {3, 2}, 6, true}, {"norm", {2}, 2, false}, {"scalar", {}, 1, false}};
}

TEST(ModelSafetensors, RoundTripKeepsOrderShapesValuesFlagsAndMetadata) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-0.5f, 0.25f}, c = {42};
  auto bytes = EncodeSafetensors(Specs(), {a, b, c}, {{"step", 7}, {"note", "hi"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header is padded to 8 bytes";
  EXPECT_EQ(bytes->size(), 8 + n + 9 * sizeof(float));

  auto d = DecodeSafetensors(*bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->tensors.size(), 3u);
  EXPECT_EQ(d->tensors[0].name, "tok_emb.weight");
  EXPECT_TRUE(d->tensors[0].is_embedding);
  EXPECT_FALSE(d->tensors[1].is_embedding);
  EXPECT_EQ(d->tensors[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(d->tensors[2].shape, std::vector<int64_t>{});
  EXPECT_EQ(d->values[0], a);
  EXPECT_EQ(d->values[1], b);
  EXPECT_EQ(d->values[2], c);
  EXPECT_EQ(d->metadata["step"], "7");  // safetensors metadata values are strings
  EXPECT_EQ(d->metadata["note"], "hi");
  EXPECT_EQ(d->Find("norm"), 1);
  EXPECT_EQ(d->Find("missing"), -1);
}

TEST(ModelSafetensors, RejectsMismatchedInput) {
  std::vector<float> a(5), b(2), c(1);
  EXPECT_EQ(EncodeSafetensors(Specs(), {a, b, c}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors(Specs(), {b, c}, {}).status().code(), StatusCode::kInvalidArgument);
  std::vector<TensorSpec> dup = {{"x", {1}, 1, false}, {"x", {1}, 1, false}};
  EXPECT_EQ(EncodeSafetensors(dup, {c, c}, {}).status().code(), StatusCode::kInvalidArgument);
}

TEST(ModelSafetensors, CorruptionIsDetected) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-0.5f, 0.25f}, c = {42};
  auto bytes = EncodeSafetensors(Specs(), {a, b, c}, {});
  ASSERT_TRUE(bytes.ok());
  std::string flipped = *bytes;
  flipped[flipped.size() - 3] ^= 0x10;  // a data byte
  auto st = DecodeSafetensors(flipped).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("corrupted"), std::string::npos) << st;

  EXPECT_EQ(DecodeSafetensors(bytes->substr(0, bytes->size() - 4)).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSafetensors("abc").status().code(), StatusCode::kDataLoss);
  std::string bad_len = *bytes;
  bad_len[7] = 0x7f;  // header length far past the end
  EXPECT_EQ(DecodeSafetensors(bad_len).status().code(), StatusCode::kDataLoss);
}

TEST(ModelSafetensors, ReadsForeignFilesAndRejectsOtherDtypes) {
  // A file as the reference Python writer makes it: no atoll metadata, no checksum.
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  uint64_t n = header.size();
  std::string file(reinterpret_cast<const char*>(&n), 8);
  file += header;
  float v[2] = {1.5f, -2};
  file.append(reinterpret_cast<const char*>(v), 8);
  auto d = DecodeSafetensors(file);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->values[0], (std::vector<float>{1.5f, -2}));

  std::string f16 = R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  n = f16.size();
  std::string file2(reinterpret_cast<const char*>(&n), 8);
  file2 += f16 + "abcd";
  EXPECT_EQ(DecodeSafetensors(file2).status().code(), StatusCode::kInvalidArgument);
}

TEST(ModelSafetensors, FileRoundTripAndVerifiedRead) {
  auto dir = testing::ScratchDir("st_file");
  std::string path = dir + "/m.safetensors";
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {0, 1}, c = {3};
  ASSERT_TRUE(WriteSafetensors(path, Specs(), {a, b, c}, {}).ok());
  auto d = ReadSafetensors(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->values[1], b);
  EXPECT_EQ(ReadSafetensors(dir + "/none").status().code(), StatusCode::kNotFound);
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  auto wrong = ReadFileVerified(path, "0000000000000000");
  EXPECT_EQ(wrong.status().code(), StatusCode::kDataLoss);
}

TEST(ModelJsonWithChecksum, RoundTripAndTamperDetection) {
  auto dir = testing::ScratchDir("json");
  std::string path = dir + "/m.json";
  nlohmann::json j = {{"step", 12}, {"name", "x"}};
  ASSERT_TRUE(WriteJsonWithChecksum(path, j).ok());
  auto back = ReadJsonWithChecksum(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, j);

  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  std::string tampered = *text;
  tampered.replace(tampered.find("12"), 2, "13");
  ASSERT_TRUE(WriteFileAtomic(path, tampered).ok());
  EXPECT_EQ(ReadJsonWithChecksum(path).status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view("{not json")).ok());
  EXPECT_EQ(ReadJsonWithChecksum(path).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace atl::model
