#include "atoll/model/tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "atoll/core/file.h"

namespace atl::model {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int vocab_size() const override { return 256; }
  std::vector<int> Encode(std::string_view text) const override {
    std::vector<int> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string Decode(std::span<const int> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int id : ids) {
      if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
    }
    return out;
  }
};

// The SentencePiece module's C interface (spm_shim.cc), resolved once per process.
struct SpmApi {
  void (*free_buf)(void*);
  int (*train)(const char* const*, const size_t*, size_t, const char*, char**, size_t*, char**);
  void* (*load)(const char*, size_t, char**);
  void (*release)(void*);
  int (*vocab)(void*);
  int (*piece_to_id)(void*, const char*);
  long (*encode)(void*, const char*, size_t, int*, size_t);
  char* (*decode)(void*, const int*, size_t, size_t*);
};

std::vector<std::string> ModuleCandidates() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  if (const char* env = std::getenv("ATOLL_SPM_MODULE")) out.emplace_back(env);
#ifdef ATOLL_SPM_MODULE_PATH
  out.emplace_back(ATOLL_SPM_MODULE_PATH);
#endif
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      out.push_back((dir / "libatoll_spm.so").string());
      out.push_back((dir / "src/model/libatoll_spm.so").string());
      if (out.size() > 12) break;
    }
  }
  out.emplace_back("libatoll_spm.so");  // the loader's search path
  return out;
}

StatusOr<const SpmApi*> Spm() {
  static std::once_flag once;
  static SpmApi api;
  static Status error;
  std::call_once(once, [] {
    // With libprotobuf in the global scope (libtorch loaded), SentencePiece must not see it: it
    // is loaded into a link-map namespace of its own (dlmopen), where it binds to its bundled
    // protobuf-lite and to its own libstdc++ (RTLD_DEEPBIND is not enough: std::cerr is
    // copy-relocated into the executable, and SentencePiece's logging crashes on the other
    // copy). Without libprotobuf, a plain RTLD_LOCAL dlopen (sanitizers reject dlmopen).
    const bool isolate = dlsym(RTLD_DEFAULT, "_ZN6google8protobuf8internal13VerifyVersionEiiPKc") != nullptr;
    void* h = nullptr;
    std::string tried;
    for (const auto& path : ModuleCandidates()) {
      if (path.find('/') != std::string::npos && !FileExists(path)) continue;
      h = isolate ? dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL)
                  : dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
      const char* e = dlerror();
      tried += "\n  " + path + ": " + (e ? e : "?");
    }
    if (h == nullptr) {
      error = FailedPreconditionError(
          "the SentencePiece module libatoll_spm.so could not be loaded (set ATOLL_SPM_MODULE "
          "to its path, or use --tokenizer byte)" +
          tried);
      return;
    }
    auto sym = [h](const char* name) { return dlsym(h, name); };
    api.free_buf = reinterpret_cast<decltype(api.free_buf)>(sym("atl_spm_free"));
    api.train = reinterpret_cast<decltype(api.train)>(sym("atl_spm_train"));
    api.load = reinterpret_cast<decltype(api.load)>(sym("atl_spm_load"));
    api.release = reinterpret_cast<decltype(api.release)>(sym("atl_spm_release"));
    api.vocab = reinterpret_cast<decltype(api.vocab)>(sym("atl_spm_vocab"));
    api.piece_to_id = reinterpret_cast<decltype(api.piece_to_id)>(sym("atl_spm_piece_to_id"));
    api.encode = reinterpret_cast<decltype(api.encode)>(sym("atl_spm_encode"));
    api.decode = reinterpret_cast<decltype(api.decode)>(sym("atl_spm_decode"));
    if (!api.free_buf || !api.train || !api.load || !api.release || !api.vocab || !api.piece_to_id || !api.encode ||
        !api.decode) {
      error = FailedPreconditionError("libatoll_spm.so lacks its C interface (stale build?)");
    }
  });
  if (!error.ok()) return error;
  return &api;
}

std::string TakeString(const SpmApi* api, char* p, size_t len) {
  std::string s(p ? p : "", p ? len : 0);
  api->free_buf(p);
  return s;
}

std::string TakeError(const SpmApi* api, char* err) { return TakeString(api, err, err ? std::strlen(err) : 0); }

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const SpmApi* api, void* handle)
      : api_(api), h_(handle), vocab_(api->vocab(handle)), newline_id_(api->piece_to_id(handle, "<0x0A>")) {}
  ~SentencePieceTokenizer() override { api_->release(h_); }
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::string kind() const override { return "bpe"; }
  int vocab_size() const override { return vocab_; }

  // SentencePiece treats its input as one line; newlines are encoded as the byte piece <0x0A>
  // between independently encoded lines so the stream keeps the text's line structure.
  std::vector<int> Encode(std::string_view text) const override {
    std::vector<int> out;
    std::vector<int> ids;
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t nl = text.find('\n', pos);
      std::string_view line = text.substr(pos, nl == std::string_view::npos ? text.npos : nl - pos);
      if (!line.empty()) {
        ids.resize(line.size() + 1);
        long n = api_->encode(h_, line.data(), line.size(), ids.data(), ids.size());
        if (n > static_cast<long>(ids.size())) {  // cannot happen; stay correct if it does
          ids.resize(static_cast<size_t>(n));
          n = api_->encode(h_, line.data(), line.size(), ids.data(), ids.size());
        }
        if (n > 0) out.insert(out.end(), ids.begin(), ids.begin() + n);
      }
      if (nl == std::string_view::npos) break;
      out.push_back(newline_id_);
      pos = nl + 1;
    }
    return out;
  }

  std::string Decode(std::span<const int> ids) const override {
    std::vector<int> valid;
    valid.reserve(ids.size());
    for (int id : ids) {
      if (id >= 0 && id < vocab_) valid.push_back(id);
    }
    size_t len = 0;
    char* p = api_->decode(h_, valid.data(), valid.size(), &len);
    return TakeString(api_, p, len);
  }

 private:
  const SpmApi* api_;
  void* h_;
  int vocab_;
  int newline_id_;
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

StatusOr<std::unique_ptr<Tokenizer>> SentencePieceTokenizerFromModel(const std::string& model) {
  ATOLL_ASSIGN_OR_RETURN(const SpmApi* api, Spm());
  char* err = nullptr;
  void* h = api->load(model.data(), model.size(), &err);
  if (h == nullptr) {
    return DataLossError("not a SentencePiece model: " + TakeError(api, err));
  }
  if (api->vocab(h) > kMaxVocab) {
    const int n = api->vocab(h);
    api->release(h);
    return InvalidArgumentError("SentencePiece model has " + std::to_string(n) +
                                " pieces; shards store ids as uint16 (at most 65536)");
  }
  std::unique_ptr<Tokenizer> tok = std::make_unique<SentencePieceTokenizer>(api, h);
  return tok;
}

StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& model_path) {
  ATOLL_ASSIGN_OR_RETURN(std::string model, ReadFile(model_path));
  auto tok = SentencePieceTokenizerFromModel(model);
  if (!tok.ok()) return tok.status().WithContext(model_path);
  return tok;
}

StatusOr<std::string> TrainSentencePieceModel(const std::vector<std::string_view>& texts, int vocab_size) {
  if (vocab_size < kMinBpeVocab || vocab_size > kMaxVocab) {
    return InvalidArgumentError("BPE vocabulary size " + std::to_string(vocab_size) + " is outside [" +
                                std::to_string(kMinBpeVocab) + ", " + std::to_string(kMaxVocab) +
                                "] (ids are stored as uint16)");
  }
  size_t total = 0;
  for (auto t : texts) total += t.size();
  if (total == 0) return InvalidArgumentError("cannot train a tokenizer on an empty corpus");
  ATOLL_ASSIGN_OR_RETURN(const SpmApi* api, Spm());
  // Identity normalisation, no dummy prefix and no whitespace folding keep the tokenizer
  // lossless; byte fallback covers characters the corpus never showed. One thread keeps the
  // merge order independent of scheduling.
  std::string args = "--model_type=bpe --vocab_size=" + std::to_string(vocab_size) +
                     " --character_coverage=1.0 --byte_fallback=true"
                     " --normalization_rule_name=identity --remove_extra_whitespaces=false"
                     " --add_dummy_prefix=false --split_digits=true --num_threads=1"
                     " --max_sentence_length=4192 --input_sentence_size=0 --minloglevel=2"
                     " --model_prefix=";
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (auto t : texts) {
    ptrs.push_back(t.data());
    lens.push_back(t.size());
  }
  char* model = nullptr;
  char* err = nullptr;
  size_t model_len = 0;
  if (api->train(ptrs.data(), lens.data(), ptrs.size(), args.c_str(), &model, &model_len, &err) != 0) {
    return InvalidArgumentError("SentencePiece training failed (vocab " + std::to_string(vocab_size) + "): " +
                                TakeError(api, err) + " — use a smaller --vocab, more text, or --tokenizer byte");
  }
  return TakeString(api, model, model_len);
}

}  // namespace atl::model
