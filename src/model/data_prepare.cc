// `atoll data prepare`: corpus → tokenizer → shards + validation split + data.json.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/format.h"
#include "atoll/model/data.h"
#include "atoll/model/safetensors.h"
#include "atoll/model/shard.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

constexpr int kDataVersion = 1;
constexpr size_t kTokensPerShardFile = 1 << 20;
constexpr char kManifestName[] = "data.json";

void Log(const std::function<void(const std::string&)>& log, const std::string& line) {
  if (log) log(line);
}

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// size + mtime of each input (files inside folders listed): enough to notice edited inputs.
StatusOr<nlohmann::json> DescribeInputs(const std::vector<std::string>& paths) {
  nlohmann::json out = nlohmann::json::array();
  auto describe = [&out](const fs::path& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      out.push_back({{"path", fs::absolute(p).string()},
                     {"bytes", static_cast<int64_t>(st.st_size)},
                     {"mtime", static_cast<int64_t>(st.st_mtime)}});
    }
  };
  for (const auto& in : paths) {
    std::error_code ec;
    fs::path p(in);
    if (fs::is_directory(p, ec)) {
      ATOLL_ASSIGN_OR_RETURN(auto files, ListFilesRecursive(in));  // was: walk errors ignored
      for (const auto& f : files) describe(f);
    } else if (fs::exists(p, ec)) {
      describe(p);
    } else {
      return NotFoundError("input not found: " + in);
    }
  }
  return out;
}

Status ValidateOptions(const DataOptions& o) {
  if (o.tokenizer != "bpe" && o.tokenizer != "byte") {
    return InvalidArgumentError("unknown tokenizer '" + o.tokenizer + "' (use bpe or byte)");
  }
  if (o.tokenizer == "bpe" && o.shards.empty()) {
    if (o.vocab_size > kMaxVocab) {
      return InvalidArgumentError("vocabulary size " + std::to_string(o.vocab_size) +
                                  " is too large: token ids are stored as uint16, so the "
                                  "vocabulary must be at most 65536");
    }
    if (o.vocab_size < kMinBpeVocab) {
      return InvalidArgumentError("vocabulary size " + std::to_string(o.vocab_size) +
                                  " is too small for BPE (minimum " +
                                  std::to_string(kMinBpeVocab) +
                                  ": 256 byte pieces + merges); or use --tokenizer byte");
    }
  }
  if (!(o.val_fraction > 0 && o.val_fraction <= 0.5)) {
    return InvalidArgumentError("validation fraction must be in (0, 0.5]");
  }
  if (!o.shards.empty() && !o.inputs.empty()) {
    return InvalidArgumentError(
        "--shards cannot be combined with text --input: the shards' tokenizer is unknown");
  }
  if (o.out_dir.empty()) return InvalidArgumentError("empty data folder name");
  return Status::Ok();
}

bool FilesPresent(const DataManifest& m) {
  for (const auto& f : m.train_files) {
    if (!FileExists(f)) return false;
  }
  if (!FileExists(m.val_file)) return false;
  if (m.tokenizer == "bpe" && !FileExists(JoinPath(m.dir, "tokenizer.model"))) return false;
  return true;
}

// Cuts the stream into blocks; every `period`-th block (offset period/2) is validation.
void SplitValidation(const std::vector<uint16_t>& stream, double val_fraction,
                     std::vector<uint16_t>* train, std::vector<uint16_t>* val) {
  const size_t period = std::max<size_t>(2, static_cast<size_t>(std::lround(1.0 / val_fraction)));
  const size_t block = std::clamp<size_t>(stream.size() / (period * 4), 1, 4096);
  for (size_t b = 0, start = 0; start < stream.size(); ++b, start += block) {
    size_t end = std::min(stream.size(), start + block);
    auto& dst = (b % period == period / 2) ? *val : *train;
    dst.insert(dst.end(), stream.begin() + static_cast<std::ptrdiff_t>(start),
               stream.begin() + static_cast<std::ptrdiff_t>(end));
  }
}

// Encodes the sources on up to two threads (this machine has two cores).
std::vector<std::vector<int>> EncodeAll(const Tokenizer& tok,
                                        const std::vector<CorpusText>& texts) {
  std::vector<std::vector<int>> ids(texts.size());
  std::vector<std::thread> pool;
  const size_t workers = std::min<size_t>(2, texts.size());
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = w; i < texts.size(); i += workers) ids[i] = tok.Encode(texts[i].text);
    });
  }
  for (auto& t : pool) t.join();
  return ids;
}

}  // namespace

StatusOr<DataManifest> LoadDataManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  if (!FileExists(path)) {
    return NotFoundError("no prepared data in " + dir + " (run: atoll data prepare --out " + dir +
                         ")");
  }
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonWithChecksum(path));
  DataManifest m;
  try {
    if (j.at("format").get<std::string>() != "atoll-data") {
      return DataLossError(path + ": not an atoll data manifest");
    }
    if (j.at("version").get<int>() != kDataVersion) {
      return FailedPreconditionError(path + ": data version " + j.at("version").dump() +
                                     "; re-run atoll data prepare --force");
    }
    m.dir = dir;
    m.tokenizer = j.at("tokenizer").get<std::string>();
    m.vocab_size = j.at("vocab_size").get<int>();
    m.train_tokens = j.at("train_tokens").get<int64_t>();
    m.val_tokens = j.at("val_tokens").get<int64_t>();
    for (const auto& f : j.at("train")) m.train_files.push_back(JoinPath(dir, f.at("file")));
    m.val_file = JoinPath(dir, j.at("val").at("file").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(path + ": malformed manifest: " + e.what());
  }
  m.json = std::move(j);
  return m;
}

StatusOr<DataManifest> PrepareData(const DataOptions& o) {
  ATOLL_RETURN_IF_ERROR(ValidateOptions(o));
  const bool byte = o.tokenizer == "byte";
  nlohmann::json request = {{"version", kDataVersion},
                            {"val_fraction", o.val_fraction}};
  if (!o.shards.empty()) {
    ATOLL_ASSIGN_OR_RETURN(request["shards"], DescribeInputs(o.shards));
    request["tokenizer"] = "external";
  } else {
    request["tokenizer"] = o.tokenizer;
    request["vocab_size"] = byte ? 256 : o.vocab_size;
    if (o.inputs.empty()) {
      request["inputs"] = "debian-default";
    } else {
      ATOLL_ASSIGN_OR_RETURN(request["inputs"], DescribeInputs(o.inputs));
    }
  }

  if (!o.force) {
    auto existing = LoadDataManifest(o.out_dir);
    if (existing.ok() && existing->json.value("request", nlohmann::json()) == request &&
        FilesPresent(*existing)) {
      Log(o.log, "data: " + o.out_dir + " is already prepared (" +
                     Grouped(existing->train_tokens) + " train tokens)");
      return existing;
    }
  }

  const double t0 = RealClock::Default().NowSeconds();
  ATOLL_RETURN_IF_ERROR(MakeDirs(o.out_dir));
  nlohmann::json sources = nlohmann::json::array();
  std::vector<uint16_t> stream;
  std::string tokenizer_kind;
  int vocab = 0;
  std::string tokenizer_checksum;

  if (!o.shards.empty()) {
    tokenizer_kind = "external";
    for (const auto& path : o.shards) {
      auto shard = ReadTokenShard(path);
      if (!shard.ok()) return shard.status();
      vocab = std::max(vocab, shard->vocab);
      sources.push_back({{"name", fs::path(path).filename().string()},
                         {"source", fs::absolute(path).string()},
                         {"tokens", shard->tokens.size()}});
      stream.insert(stream.end(), shard->tokens.begin(), shard->tokens.end());
    }
  } else {
    std::vector<CorpusText> texts;
    if (o.inputs.empty()) {
      Log(o.log, "data: extracting the default corpus (King James Bible, World English Bible, "
                 "fortunes)");
      ATOLL_ASSIGN_OR_RETURN(texts, ExtractDefaultCorpora(o.log));
      ATOLL_RETURN_IF_ERROR(MakeDirs(JoinPath(o.out_dir, "text")));
      for (const auto& t : texts) {
        ATOLL_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(o.out_dir, "text/" + t.name + ".txt"),
                                              t.text));
      }
    } else {
      ATOLL_ASSIGN_OR_RETURN(texts, ReadTextInputs(o.inputs));
    }
    size_t bytes = 0;
    for (auto& t : texts) {
      if (!t.text.empty() && t.text.back() != '\n') t.text.push_back('\n');
      bytes += t.text.size();
    }
    if (bytes == 0) {
      std::string what = o.inputs.empty() ? std::string("the default corpus") : o.inputs[0];
      return InvalidArgumentError("corpus is empty: " + what + " holds no text to train on");
    }
    Log(o.log, "data: " + Fmt("%.1f", bytes / 1e6) + " MB of text from " +
                   std::to_string(texts.size()) + " source(s)");

    std::unique_ptr<Tokenizer> tok;
    if (byte) {
      tok = MakeByteTokenizer();
      tokenizer_kind = "byte";
    } else {
      const double t1 = RealClock::Default().NowSeconds();
      std::vector<std::string_view> views;
      for (const auto& t : texts) views.push_back(t.text);
      ATOLL_ASSIGN_OR_RETURN(std::string model, TrainSentencePieceModel(views, o.vocab_size));
      ATOLL_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(o.out_dir, "tokenizer.model"), model));
      ATOLL_ASSIGN_OR_RETURN(tok, SentencePieceTokenizerFromModel(model));
      tokenizer_kind = "bpe";
      tokenizer_checksum = ChecksumHex(Checksum64(model));
      Log(o.log, "data: trained SentencePiece BPE, vocab " + std::to_string(tok->vocab_size()) +
                     ", in " + Fmt("%.1f", RealClock::Default().NowSeconds() - t1) + " s");
    }
    vocab = tok->vocab_size();
    auto ids = EncodeAll(*tok, texts);
    for (size_t i = 0; i < texts.size(); ++i) {
      for (int id : ids[i]) stream.push_back(static_cast<uint16_t>(id));
      sources.push_back({{"name", texts[i].name},
                         {"source", texts[i].source},
                         {"bytes", texts[i].text.size()},
                         {"tokens", ids[i].size()}});
    }
  }
  if (stream.size() < 2) {
    return InvalidArgumentError("corpus is empty: it tokenises to " +
                                std::to_string(stream.size()) + " tokens");
  }

  std::vector<uint16_t> train, val;
  SplitValidation(stream, o.val_fraction, &train, &val);

  // Remove shard files of an earlier preparation that this one does not overwrite.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o.out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 13 && name.rfind("train_", 0) == 0 && name.substr(9) == ".bin") {
      fs::remove(e.path(), ec);
    }
  }
  nlohmann::json train_files = nlohmann::json::array();
  for (size_t start = 0, i = 0; start < train.size(); start += kTokensPerShardFile, ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "train_%03zu.bin", i);
    size_t n = std::min(kTokensPerShardFile, train.size() - start);
    ATOLL_RETURN_IF_ERROR(WriteTokenShard(JoinPath(o.out_dir, name), vocab,
                                          std::span<const uint16_t>(train).subspan(start, n)));
    train_files.push_back({{"file", name}, {"tokens", n}});
  }
  ATOLL_RETURN_IF_ERROR(WriteTokenShard(JoinPath(o.out_dir, "val.bin"), vocab, val));
  if (tokenizer_kind != "bpe") fs::remove(JoinPath(o.out_dir, "tokenizer.model"), ec);

  const double seconds = RealClock::Default().NowSeconds() - t0;
  nlohmann::json j = {{"format", "atoll-data"},
                      {"version", kDataVersion},
                      {"tokenizer", tokenizer_kind},
                      {"vocab_size", vocab},
                      {"sources", sources},
                      {"train", train_files},
                      {"val", {{"file", "val.bin"}, {"tokens", val.size()}}},
                      {"train_tokens", train.size()},
                      {"val_tokens", val.size()},
                      {"request", request},
                      {"prepare_seconds", seconds},
                      {"created_unix", UnixSeconds()}};
  if (tokenizer_kind == "bpe") {
    j["tokenizer_file"] = "tokenizer.model";
    j["tokenizer_checksum"] = tokenizer_checksum;
  }
  ATOLL_RETURN_IF_ERROR(WriteJsonWithChecksum(JoinPath(o.out_dir, kManifestName), j));
  Log(o.log, "data: " + Grouped(static_cast<int64_t>(stream.size())) + " tokens (" +
                 tokenizer_kind + ", vocab " + std::to_string(vocab) + "): train " +
                 Grouped(static_cast<int64_t>(train.size())) + " in " +
                 std::to_string(train_files.size()) + " shard file(s), val " +
                 Grouped(static_cast<int64_t>(val.size())) + "; " +
                 Fmt("%.1f", seconds) + " s → " + o.out_dir);
  return LoadDataManifest(o.out_dir);
}

StatusOr<DataManifest> EnsureDataPrepared(const std::string& dir,
                                          const std::function<void(const std::string&)>& log) {
  auto existing = LoadDataManifest(dir);
  if (existing.ok() && FilesPresent(*existing)) return existing;
  if (existing.ok() || existing.status().code() != StatusCode::kNotFound) {
    Log(log, "data: " + dir + " is incomplete or damaged (" +
                 (existing.ok() ? std::string("files missing") : existing.status().message()) +
                 "); preparing the default corpus again");
  }
  DataOptions o;
  o.out_dir = dir;
  o.log = log;
  o.force = true;
  return PrepareData(o);
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const DataManifest& m) {
  if (m.tokenizer == "byte") return MakeByteTokenizer();
  if (m.tokenizer == "bpe") return LoadSentencePieceTokenizer(JoinPath(m.dir, "tokenizer.model"));
  return FailedPreconditionError("data in " + m.dir + " was prepared from token shards (" +
                                 m.tokenizer + " tokenizer): no tokenizer to load");
}

StatusOr<std::vector<uint16_t>> LoadTrainTokens(const DataManifest& m) {
  std::vector<uint16_t> out;
  out.reserve(static_cast<size_t>(m.train_tokens));
  for (const auto& f : m.train_files) {
    ATOLL_ASSIGN_OR_RETURN(TokenShard s, ReadTokenShard(f));
    if (s.vocab > m.vocab_size) {
      return DataLossError(f + ": vocab " + std::to_string(s.vocab) + " exceeds the manifest's " +
                           std::to_string(m.vocab_size));
    }
    out.insert(out.end(), s.tokens.begin(), s.tokens.end());
  }
  return out;
}

StatusOr<std::vector<uint16_t>> LoadValTokens(const DataManifest& m) {
  ATOLL_ASSIGN_OR_RETURN(TokenShard s, ReadTokenShard(m.val_file));
  return std::move(s.tokens);
}

}  // namespace atl::model
