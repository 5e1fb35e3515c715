// Tiny deterministic corpora and the byte-level data folders prepared from them, for the tests
// that train a model.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/model/data.h"
#include "testing/scratch.h"

namespace atl::testing {

// ~bytes of English-like lines from a small vocabulary (so a tiny model can learn it fast).
inline std::string TinyCorpus(size_t bytes, uint64_t seed = 1) {
  static const char* kWords[] = {"the", "king",  "said",  "unto",  "his",   "people", "and",
                                 "lo",  "a",     "great", "light", "came",  "upon",   "land",
                                 "of",  "river", "they",  "went",  "forth", "in",     "peace"};
  Rng rng(seed);
  std::string out;
  while (out.size() < bytes) {
    int words = 4 + static_cast<int>(rng.UniformInt(8));
    for (int w = 0; w < words; ++w) {
      if (w) out.push_back(' ');
      out += kWords[rng.UniformInt(sizeof(kWords) / sizeof(kWords[0]))];
    }
    out += ".\n";
  }
  return out;
}

inline std::string WriteText(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = (std::filesystem::path(dir) / name).string();
  Status st = WriteFileAtomic(path, text);
  (void)st;
  return path;
}

// A byte-level data folder prepared once per process from `bytes` of TinyCorpus, in a scratch
// folder named `name` (the tests of one binary share it).
inline const std::string& TinyByteData(const std::string& name, size_t bytes) {
  static const std::string dir = [&] {
    const std::string d = ScratchDir(name);
    model::DataOptions o;
    o.out_dir = d + "/data";
    o.tokenizer = model::TokenizerKind::kByte;
    o.inputs = {WriteText(d, "corpus.txt", TinyCorpus(bytes))};
    auto m = model::PrepareData(o);
    if (!m.ok()) std::abort();  // the tests cannot run without it
    return o.out_dir;
  }();
  return dir;
}

}  // namespace atl::testing
