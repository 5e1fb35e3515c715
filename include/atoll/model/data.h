// The training data of a learner: corpus extraction, tokenizer training, tokenisation into
// shard files, the validation split, and the data folder's manifest.
//
// A data folder (default "data/") holds
//   text/<source>.txt     plain text extracted from each default corpus (kept for inspection)
//   tokenizer.model       SentencePiece model (tokenizer "bpe"; absent for "byte"/"external")
//   train_NNN.bin         training token shards (≤ 1 Mi tokens each; format in shard.h)
//   val.bin               held-out validation tokens
//   data.json             manifest: tokenizer kind, vocab, sources, token counts, file
//                         checksums, and the request that produced it (self-checksummed)
// The default corpus is ~13 MB of public-domain English installed from Debian packages by
// scripts/setup: the King James Bible (bible-kjv), the World English Bible (sword-text-web via
// diatheke) and fortunes. Users may pass their own text files or folders, or tokenised .bin
// shards instead.
//
// Validation split: the token stream (sources concatenated in order) is cut into blocks; every
// k-th block (k = round(1 / val_fraction)) goes to val.bin, so validation covers every source.
//
// Torch-free (target atoll_data). Thread-safety: functions are reentrant; two processes must not
// prepare the same folder at once (files are replaced atomically, data.json last, so a reader
// never sees a half-written set).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/enum_names.h"
#include "atoll/core/status.h"
#include "atoll/model/tokenizer.h"

namespace atl::model {

// How a data folder's text became token ids: a SentencePiece BPE trained on it (tokenizer.model),
// bytes, or elsewhere (token shards given to `atoll data prepare --shards`: no tokenizer here).
enum class TokenizerKind { kBpe, kByte, kExternal };
inline constexpr EnumNames<TokenizerKind, 3> kTokenizerKindNames{
    "tokenizer",
    {{{TokenizerKind::kBpe, "bpe"}, {TokenizerKind::kByte, "byte"}, {TokenizerKind::kExternal, "external"}}}};
constexpr const auto& NamesOf(TokenizerKind) { return kTokenizerKindNames; }
inline const char* TokenizerKindName(TokenizerKind k) { return kTokenizerKindNames.Name(k); }
inline StatusOr<TokenizerKind> ParseTokenizerKind(std::string_view s) { return kTokenizerKindNames.Parse(s); }

struct DataOptions {
  std::string out_dir = "data";
  int vocab_size = 4096;                          // for tokenizer "bpe"
  TokenizerKind tokenizer = TokenizerKind::kBpe;  // bpe or byte (external: give `shards`)
  std::vector<std::string> inputs;                // user text files or folders (default: Debian corpora)
  std::vector<std::string> shards;                // user token shards (.bin); excludes `inputs`
  double val_fraction = 0.03;
  bool force = false;                           // rebuild even when data.json matches the request
  std::function<void(const std::string&)> log;  // progress lines; null = silent
};

struct DataManifest {
  std::string dir;
  TokenizerKind tokenizer = TokenizerKind::kByte;
  int vocab_size = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> train_files;  // absolute or dir-relative paths, in stream order
  std::string val_file;
  nlohmann::json json;  // the whole data.json
};

// One extracted default corpus.
struct CorpusText {
  std::string name;    // kjv | web | fortunes
  std::string source;  // where it came from (for the manifest)
  std::string text;
};

// Extracts the default corpora. FailedPrecondition naming the missing Debian package (run
// scripts/setup) when none is installed; sources that are missing are skipped with a log line.
StatusOr<std::vector<CorpusText>> ExtractDefaultCorpora(const std::function<void(const std::string&)>& log);

// Reads user text inputs: files, or folders walked recursively in name order (files holding NUL
// bytes in their first 8 KiB are skipped as binary). NotFound for a missing path.
StatusOr<std::vector<CorpusText>> ReadTextInputs(const std::vector<std::string>& inputs);

// Prepares the folder for `options`. Idempotent: when data.json already records the same request
// and its files are present, returns at once without touching anything (unless force).
// InvalidArgument for bad input (vocab too large for uint16, empty corpus, unknown tokenizer,
// shards mixed with text inputs), NotFound for a missing input.
StatusOr<DataManifest> PrepareData(const DataOptions& options);

// Loads data.json of a prepared folder (verifying its checksum). NotFound when absent.
StatusOr<DataManifest> LoadDataManifest(const std::string& dir);

// What the runtime and `atoll train` call before training: the folder's existing data when it
// is prepared (whatever request made it), otherwise the default corpus prepared with defaults.
StatusOr<DataManifest> EnsureDataPrepared(const std::string& dir, const std::function<void(const std::string&)>& log);

// The tokenizer of a prepared folder. FailedPrecondition for kExternal (shards only).
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const DataManifest& manifest);

// All training shards concatenated (verified), and the validation tokens.
StatusOr<std::vector<uint16_t>> LoadTrainTokens(const DataManifest& manifest);
StatusOr<std::vector<uint16_t>> LoadValTokens(const DataManifest& manifest);

}  // namespace atl::model
