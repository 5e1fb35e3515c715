#include "atoll/model/model_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "atoll/core/file.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/model/safetensors.h"
#include "testing/scratch.h"

namespace atl::model {
namespace {

std::string Scratch(const char* name) {
  static const std::string dir = testing::ScratchDir("spec");
  return dir + "/" + name;
}

// A small foreign model: untied head, RMSNorm gains, names no atoll preset uses.
std::vector<diloco::TensorSpec> Foreign() {
  return {{"model.embed_tokens.weight", {64, 16}, 1024, false},
          {"model.layers.0.self_attn.q_proj.weight", {16, 16}, 256, false},
          {"model.layers.0.input_layernorm.weight", {16}, 16, false},
          {"lm_head.weight", {64, 16}, 1024, false}};
}

float ValueOf(size_t t, int64_t i) { return 0.01f * static_cast<float>(t + 1) + 1e-4f * static_cast<float>(i % 97); }

TEST(ModelSpec, WrittenTensorByTensorAndReadBackPerFragment) {
  const std::string path = Scratch("foreign.safetensors");
  auto tensors = Foreign();
  ASSERT_TRUE(WriteModelSpec(path, tensors, {{"source", "test"}}, [](size_t t, int64_t begin, std::span<float> out) {
                for (size_t i = 0; i < out.size(); ++i) out[i] = ValueOf(t, begin + static_cast<int64_t>(i));
              }).ok());
  auto spec = OpenModelSpec(path, kDefaultEmbeddingPatterns);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->tensors.size(), 4u);
  EXPECT_EQ(spec->num_params(), 2320);
  EXPECT_EQ(spec->preset(), "");
  // The writer marks no embeddings (atoll.embeddings = []): the file's word wins over patterns.
  for (const auto& t : spec->tensors) EXPECT_FALSE(t.is_embedding) << t.name;
  EXPECT_TRUE(VerifyModelSpec(*spec).ok());
  diloco::PlanOptions po;
  po.num_fragments = 3;
  auto plan = diloco::MakeFragmentPlan(spec->tensors, po);
  ASSERT_TRUE(plan.ok());
  for (const auto& f : plan->fragments) {
    std::vector<float> values(static_cast<size_t>(f.numel));
    ASSERT_TRUE(ReadSpecFragment(*spec, f, values).ok());
    size_t pos = 0;
    for (const auto& s : f.slices) {
      for (int64_t i = 0; i < s.count; ++i)
        ASSERT_EQ(values[pos++], ValueOf(static_cast<size_t>(s.tensor), s.offset + i));
    }
  }
  // The file is a plain safetensors file: atoll's reader takes it too.
  auto st = ReadSafetensors(path);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->values[3][5], ValueOf(3, 5));
}

// A file from another writer (no atoll metadata), in bf16: embeddings come from the patterns.
TEST(ModelSpec, Bf16FilesFromOtherWritersAndEmbeddingPatterns) {
  const std::string path = Scratch("bf16.safetensors");
  nlohmann::ordered_json header;
  header["wte.weight"] = {{"dtype", "BF16"}, {"shape", {2, 2}}, {"data_offsets", {0, 8}}};
  header["h.0.w"] = {{"dtype", "F16"}, {"shape", {2}}, {"data_offsets", {8, 12}}};
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');
  const uint64_t n = head.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += head;
  const uint16_t bf16[4] = {0x3f80, 0xbf80, 0x4000, 0x0000};  // 1, -1, 2, 0
  const uint16_t f16[2] = {0x3c00, 0xc000};                   // 1, -2
  bytes.append(reinterpret_cast<const char*>(bf16), 8);
  bytes.append(reinterpret_cast<const char*>(f16), 4);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  auto spec = OpenModelSpec(path, kDefaultEmbeddingPatterns);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->tensors[0].is_embedding);
  EXPECT_FALSE(spec->tensors[1].is_embedding);
  std::vector<float> a(4), b(2);
  ASSERT_TRUE(ReadSpecTensor(*spec, 0, a).ok());
  ASSERT_TRUE(ReadSpecTensor(*spec, 1, b).ok());
  EXPECT_EQ(a, (std::vector<float>{1, -1, 2, 0}));
  EXPECT_EQ(b, (std::vector<float>{1, -2}));
  auto none = OpenModelSpec(path, {});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->tensors[0].is_embedding);
}

TEST(ModelSpec, BadFilesAreRefusedWithTheReason) {
  EXPECT_EQ(OpenModelSpec(Scratch("missing.safetensors"), {}).status().code(), StatusCode::kNotFound);
  const std::string path = Scratch("bad.safetensors");
  ASSERT_TRUE(WriteFileAtomic(path, std::string("abc")).ok());
  EXPECT_EQ(OpenModelSpec(path, {}).status().code(), StatusCode::kDataLoss);
  // A dtype a spec cannot hold.
  nlohmann::ordered_json header;
  header["x"] = {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}};
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');
  const uint64_t n = head.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += head + std::string(8, '\0');
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  auto st = OpenModelSpec(path, {});
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("I64"), std::string::npos) << st.status();
  // Data corrupted after writing: Verify names the file.
  const std::string good = Scratch("corrupt.safetensors");
  ASSERT_TRUE(WriteModelSpec(good, Foreign(), {}, [](size_t, int64_t, std::span<float> out) {
                for (float& v : out) v = 0.5f;
              }).ok());
  {
    std::fstream f(good, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x11');
  }
  auto spec = OpenModelSpec(good, {});
  ASSERT_TRUE(spec.ok());
  Status v = VerifyModelSpec(*spec);
  EXPECT_EQ(v.code(), StatusCode::kDataLoss);
  EXPECT_NE(v.message().find("corrupt"), std::string::npos) << v;
}

TEST(ModelSpec, TheFirstDifferingTensorIsNamed) {
  auto a = Foreign(), b = Foreign();
  EXPECT_EQ(FirstTensorDifference(a, b), "");
  b[2].shape = {32};
  b[2].numel = 32;
  EXPECT_EQ(FirstTensorDifference(a, b),
            "tensor 2: the learner has 'model.layers.0.input_layernorm.weight' [16], "
            "the syncer's model 'model.layers.0.input_layernorm.weight' [32]");
  b = Foreign();
  b.pop_back();
  EXPECT_NE(FirstTensorDifference(a, b).find("'lm_head.weight' [64, 16] is only in the learner's"), std::string::npos);
  b = Foreign();
  b[0].is_embedding = true;
  EXPECT_NE(FirstTensorDifference(a, b).find("(embedding)"), std::string::npos);
}

}  // namespace
}  // namespace atl::model
