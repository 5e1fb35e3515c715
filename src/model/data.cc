// `atoll data prepare`: corpus → tokenizer → shards + validation split + data.json.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cmath>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

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

std::string JoinPath(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

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
  if (o.tokenizer == TokenizerKind::kExternal) {
    return InvalidArgumentError(
        "tokenizer must be bpe or byte (a folder of external tokens is prepared from --shards)");
  }
  if (o.tokenizer == TokenizerKind::kBpe && o.shards.empty()) {
    if (o.vocab_size > kMaxVocab) {
      return InvalidArgumentError("vocabulary size " + std::to_string(o.vocab_size) +
                                  " is too large: token ids are stored as uint16, so the "
                                  "vocabulary must be at most 65536");
    }
    if (o.vocab_size < kMinBpeVocab) {
      return InvalidArgumentError("vocabulary size " + std::to_string(o.vocab_size) +
                                  " is too small for BPE (minimum " + std::to_string(kMinBpeVocab) +
                                  ": 256 byte pieces + merges); or use --tokenizer byte");
    }
  }
  if (!(o.val_fraction > 0 && o.val_fraction <= 0.5)) {
    return InvalidArgumentError("validation fraction must be in (0, 0.5]");
  }
  if (!o.shards.empty() && !o.inputs.empty()) {
    return InvalidArgumentError("--shards cannot be combined with text --input: the shards' tokenizer is unknown");
  }
  if (o.out_dir.empty()) return InvalidArgumentError("empty data folder name");
  return Status::Ok();
}

bool FilesPresent(const DataManifest& m) {
  for (const auto& f : m.train_files) {
    if (!FileExists(f)) return false;
  }
  if (!FileExists(m.val_file)) return false;
  if (m.tokenizer == TokenizerKind::kBpe && !FileExists(JoinPath(m.dir, "tokenizer.model"))) return false;
  return true;
}

// Cuts the stream into blocks; every `period`-th block (offset period/2) is validation.
void SplitValidation(const std::vector<uint16_t>& stream, double val_fraction, std::vector<uint16_t>* train,
                     std::vector<uint16_t>* val) {
  const size_t period = std::max<size_t>(2, static_cast<size_t>(std::lround(1.0 / val_fraction)));
  const size_t block = std::clamp<size_t>(stream.size() / (period * 4), 1, 4096);
  for (size_t b = 0, start = 0; start < stream.size(); ++b, start += block) {
    size_t end = std::min(stream.size(), start + block);
    auto& dst = (b % period == period / 2) ? *val : *train;
    dst.insert(dst.end(), stream.begin() + static_cast<std::ptrdiff_t>(start),
               stream.begin() + static_cast<std::ptrdiff_t>(end));
  }
}

// A piece of one source, ending at a newline (or the source's end).
struct EncodeChunk {
  size_t text = 0;
  std::string_view part;
  std::vector<int> ids;
};

// Sources cut into ~1 MB chunks at newlines. Encode works line by line, so the chunks' ids
// concatenated are exactly the source's.
std::vector<EncodeChunk> SplitAtNewlines(const std::vector<CorpusText>& texts) {
  constexpr size_t kChunk = 1 << 20;
  std::vector<EncodeChunk> chunks;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string_view t = texts[i].text;
    for (size_t pos = 0; pos < t.size();) {
      size_t end = std::min(t.size(), pos + kChunk);
      if (end < t.size()) {
        const size_t nl = t.find('\n', end);
        end = nl == std::string_view::npos ? t.size() : nl + 1;
      }
      chunks.push_back({i, t.substr(pos, end - pos), {}});
      pos = end;
    }
  }
  return chunks;
}

// Encodes the sources: two workers (this machine has two cores) take the chunks in order; this
// thread reports progress with an ETA every 2 s.
std::vector<std::vector<int>> EncodeAll(const Tokenizer& tok, const std::vector<CorpusText>& texts,
                                        const std::function<void(const std::string&)>& log) {
  std::vector<EncodeChunk> chunks = SplitAtNewlines(texts);
  size_t total = 0;
  for (const auto& c : chunks) total += c.part.size();
  std::atomic<size_t> next{0}, encoded{0};
  std::mutex mu;
  std::condition_variable cv;
  size_t workers_left = std::min<size_t>(2, chunks.size());
  std::vector<std::thread> pool;
  for (size_t w = 0, n = workers_left; w < n; ++w) {
    pool.emplace_back([&] {
      for (size_t k; (k = next++) < chunks.size();) {
        chunks[k].ids = tok.Encode(chunks[k].part);
        encoded += chunks[k].part.size();
      }
      std::lock_guard<std::mutex> lock(mu);
      --workers_left;
      cv.notify_all();
    });
  }
  const double t0 = RealClock::Default().NowSeconds();
  {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, std::chrono::seconds(2), [&] { return workers_left == 0; })) {
      const double done = static_cast<double>(encoded.load()), dt = RealClock::Default().NowSeconds() - t0;
      if (done <= 0) continue;  // no rate yet
      const double eta = dt * (static_cast<double>(total) - done) / done;
      Log(log, fmt::format("data: encoding {:3.0f}% ({:.1f} of {:.1f} MB), ETA {:.0f} s",
                           100 * done / static_cast<double>(total), done / 1e6, static_cast<double>(total) / 1e6, eta));
    }
  }
  for (auto& t : pool) t.join();
  std::vector<std::vector<int>> ids(texts.size());
  for (auto& c : chunks) ids[c.text].insert(ids[c.text].end(), c.ids.begin(), c.ids.end());
  return ids;
}

}  // namespace

StatusOr<DataManifest> LoadDataManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  if (!FileExists(path)) {
    return NotFoundError("no prepared data in " + dir + " (run: atoll data prepare --out " + dir + ")");
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
    auto kind = ParseTokenizerKind(j.at("tokenizer").get<std::string>());
    if (!kind.ok()) return DataLossError(path + ": " + kind.status().message());
    m.tokenizer = *kind;
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

namespace {

// The token stream and its provenance, as the tokenising stage hands it to the writing stage.
struct TokenStream {
  std::vector<uint16_t> tokens;
  nlohmann::json sources = nlohmann::json::array();
  TokenizerKind tokenizer_kind = TokenizerKind::kExternal;
  int vocab = 0;
  std::string tokenizer_checksum;  // of tokenizer.model; only for "bpe"
};

// What was asked for, recorded in data.json: a later prepare with the same request (and
// unchanged inputs) can reuse the folder.
StatusOr<nlohmann::json> DescribeRequest(const DataOptions& o) {
  nlohmann::json request = {{"version", kDataVersion}, {"val_fraction", o.val_fraction}};
  if (!o.shards.empty()) {
    ATOLL_ASSIGN_OR_RETURN(request["shards"], DescribeInputs(o.shards));
    request["tokenizer"] = TokenizerKindName(TokenizerKind::kExternal);
    return request;
  }
  request["tokenizer"] = TokenizerKindName(o.tokenizer);
  request["vocab_size"] = o.tokenizer == TokenizerKind::kByte ? 256 : o.vocab_size;
  if (o.inputs.empty()) {
    request["inputs"] = "debian-default";
  } else {
    ATOLL_ASSIGN_OR_RETURN(request["inputs"], DescribeInputs(o.inputs));
  }
  return request;
}

// Shards tokenised elsewhere: concatenated as they are, with the largest vocabulary among them.
StatusOr<TokenStream> ConcatenateShards(const std::vector<std::string>& paths) {
  TokenStream out;
  out.tokenizer_kind = TokenizerKind::kExternal;
  for (const auto& path : paths) {
    auto shard = ReadTokenShard(path);
    if (!shard.ok()) return shard.status();
    out.vocab = std::max(out.vocab, shard->vocab);
    out.sources.push_back({{"name", fs::path(path).filename().string()},
                           {"source", fs::absolute(path).string()},
                           {"tokens", shard->tokens.size()}});
    out.tokens.insert(out.tokens.end(), shard->tokens.begin(), shard->tokens.end());
  }
  return out;
}

// The text to tokenise: the inputs, or the default corpus (kept under text/ for inspection).
// Each source ends in a newline so that sources do not run into each other.
StatusOr<std::vector<CorpusText>> GatherTexts(const DataOptions& o) {
  std::vector<CorpusText> texts;
  if (o.inputs.empty()) {
    Log(o.log,
        "data: extracting the default corpus (King James Bible, World English Bible, "
        "fortunes)");
    ATOLL_ASSIGN_OR_RETURN(texts, ExtractDefaultCorpora(o.log));
    ATOLL_RETURN_IF_ERROR(MakeDirs(JoinPath(o.out_dir, "text")));
    for (const auto& t : texts) {
      ATOLL_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(o.out_dir, "text/" + t.name + ".txt"), t.text));
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
  Log(o.log, fmt::format("data: {:.1f} MB of text from {} source(s)", static_cast<double>(bytes) / 1e6, texts.size()));
  return texts;
}

// The byte tokenizer, or a SentencePiece BPE trained on the texts and saved as tokenizer.model.
StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const DataOptions& o, const std::vector<CorpusText>& texts,
                                                   TokenStream& out) {
  if (o.tokenizer == TokenizerKind::kByte) {
    out.tokenizer_kind = TokenizerKind::kByte;
    return MakeByteTokenizer();
  }
  const double t1 = RealClock::Default().NowSeconds();
  std::vector<std::string_view> views;
  for (const auto& t : texts) views.push_back(t.text);
  ATOLL_ASSIGN_OR_RETURN(std::string model, TrainSentencePieceModel(views, o.vocab_size));
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(o.out_dir, "tokenizer.model"), model));
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, SentencePieceTokenizerFromModel(model));
  out.tokenizer_kind = TokenizerKind::kBpe;
  out.tokenizer_checksum = ChecksumHex(Checksum64(model));
  Log(o.log, fmt::format("data: trained SentencePiece BPE, vocab {}, in {:.1f} s", tok->vocab_size(),
                         RealClock::Default().NowSeconds() - t1));
  return tok;
}

StatusOr<TokenStream> TokeniseTexts(const DataOptions& o) {
  ATOLL_ASSIGN_OR_RETURN(std::vector<CorpusText> texts, GatherTexts(o));
  TokenStream out;
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, MakeTokenizer(o, texts, out));
  out.vocab = tok->vocab_size();
  auto ids = EncodeAll(*tok, texts, o.log);
  for (size_t i = 0; i < texts.size(); ++i) {
    for (int id : ids[i]) out.tokens.push_back(static_cast<uint16_t>(id));
    out.sources.push_back({{"name", texts[i].name},
                           {"source", texts[i].source},
                           {"bytes", texts[i].text.size()},
                           {"tokens", ids[i].size()}});
  }
  return out;
}

// Writes train_000.bin, train_001.bin, ... (kTokensPerShardFile tokens each) and returns their
// manifest entries. Shard files of an earlier, longer preparation are removed first: a reader
// must never pick up a stale train_NNN.bin the manifest does not list.
StatusOr<nlohmann::json> WriteTrainShards(const std::string& dir, int vocab, const std::vector<uint16_t>& train) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 13 && name.rfind("train_", 0) == 0 && name.substr(9) == ".bin") {
      fs::remove(e.path(), ec);
    }
  }
  nlohmann::json files = nlohmann::json::array();
  for (size_t start = 0, i = 0; start < train.size(); start += kTokensPerShardFile, ++i) {
    const std::string name = fmt::format("train_{:03}.bin", i);
    size_t n = std::min(kTokensPerShardFile, train.size() - start);
    ATOLL_RETURN_IF_ERROR(
        WriteTokenShard(JoinPath(dir, name), vocab, std::span<const uint16_t>(train).subspan(start, n)));
    files.push_back({{"file", name}, {"tokens", n}});
  }
  return files;
}

nlohmann::json DataManifestJson(const TokenStream& s, const nlohmann::json& train_files, size_t train_tokens,
                                size_t val_tokens, const nlohmann::json& request, double seconds) {
  nlohmann::json j = {{"format", "atoll-data"},
                      {"version", kDataVersion},
                      {"tokenizer", TokenizerKindName(s.tokenizer_kind)},
                      {"vocab_size", s.vocab},
                      {"sources", s.sources},
                      {"train", train_files},
                      {"val", {{"file", "val.bin"}, {"tokens", val_tokens}}},
                      {"train_tokens", train_tokens},
                      {"val_tokens", val_tokens},
                      {"request", request},
                      {"prepare_seconds", seconds},
                      {"created_unix", UnixSeconds()}};
  if (s.tokenizer_kind == TokenizerKind::kBpe) {
    j["tokenizer_file"] = "tokenizer.model";
    j["tokenizer_checksum"] = s.tokenizer_checksum;
  }
  return j;
}

// Splits the stream, writes the shards, val.bin and data.json; logs the one-line summary.
Status WriteDataset(const DataOptions& o, const TokenStream& s, const nlohmann::json& request, double t0) {
  std::vector<uint16_t> train, val;
  SplitValidation(s.tokens, o.val_fraction, &train, &val);
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json train_files, WriteTrainShards(o.out_dir, s.vocab, train));
  ATOLL_RETURN_IF_ERROR(WriteTokenShard(JoinPath(o.out_dir, "val.bin"), s.vocab, val));
  std::error_code ec;
  if (s.tokenizer_kind != TokenizerKind::kBpe) fs::remove(JoinPath(o.out_dir, "tokenizer.model"), ec);

  const double seconds = RealClock::Default().NowSeconds() - t0;
  ATOLL_RETURN_IF_ERROR(
      WriteJsonWithChecksum(JoinPath(o.out_dir, kManifestName),
                            DataManifestJson(s, train_files, train.size(), val.size(), request, seconds)));
  Log(o.log, fmt::format("data: {} tokens ({}, vocab {}): train {} in {} shard file(s), val {}; "
                         "{:.1f} s → {}",
                         Grouped(static_cast<int64_t>(s.tokens.size())), TokenizerKindName(s.tokenizer_kind), s.vocab,
                         Grouped(static_cast<int64_t>(train.size())), train_files.size(),
                         Grouped(static_cast<int64_t>(val.size())), seconds, o.out_dir));
  return Status::Ok();
}

}  // namespace

StatusOr<DataManifest> PrepareData(const DataOptions& o) {
  ATOLL_RETURN_IF_ERROR(ValidateOptions(o));
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json request, DescribeRequest(o));
  if (!o.force) {
    auto existing = LoadDataManifest(o.out_dir);
    if (existing.ok() && existing->json.value("request", nlohmann::json()) == request && FilesPresent(*existing)) {
      Log(o.log, "data: " + o.out_dir + " is already prepared (" + Grouped(existing->train_tokens) + " train tokens)");
      return existing;
    }
  }

  const double t0 = RealClock::Default().NowSeconds();
  ATOLL_RETURN_IF_ERROR(MakeDirs(o.out_dir));
  ATOLL_ASSIGN_OR_RETURN(TokenStream stream, o.shards.empty() ? TokeniseTexts(o) : ConcatenateShards(o.shards));
  if (stream.tokens.size() < 2) {
    return InvalidArgumentError("corpus is empty: it tokenises to " + std::to_string(stream.tokens.size()) + " tokens");
  }
  ATOLL_RETURN_IF_ERROR(WriteDataset(o, stream, request, t0));
  return LoadDataManifest(o.out_dir);
}

StatusOr<DataManifest> EnsureDataPrepared(const std::string& dir, const std::function<void(const std::string&)>& log) {
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
  switch (m.tokenizer) {
    case TokenizerKind::kByte: return MakeByteTokenizer();
    case TokenizerKind::kBpe: return LoadSentencePieceTokenizer(JoinPath(m.dir, "tokenizer.model"));
    case TokenizerKind::kExternal: break;
  }
  return FailedPreconditionError("data in " + m.dir +
                                 " was prepared from token shards (external tokenizer): no "
                                 "tokenizer to load");
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
