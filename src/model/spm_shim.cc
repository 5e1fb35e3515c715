// atoll_spm: a loadable module wrapping SentencePiece behind a C interface.
//
// Why a separate module: Debian's libsentencepiece bundles its own copy of protobuf-lite and
// exports those symbols. In a process that also loads libtorch (and with it libprotobuf.so),
// the two copies interpose each other and the process crashes during start-up. atoll therefore
// never links SentencePiece into a binary; tokenizer.cc dlopen()s this module with RTLD_LOCAL
// (and RTLD_DEEPBIND when libprotobuf is already loaded), so SentencePiece binds only to its
// own protobuf. Buffers returned by this module are malloc'd; release them with atl_spm_free.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece::logging {
void SetMinLogLevel(int v);  // exported by libsentencepiece, not declared in its headers
}  // namespace sentencepiece::logging

namespace {

char* CopyOut(const std::string& s, size_t* len) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) return nullptr;
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  if (len != nullptr) *len = s.size();
  return p;
}

// Feeds SentencePiece the lines of in-memory documents (no temporary files). Lines longer than
// SentencePiece's max_sentence_length are cut into pieces.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const char* const* texts, const size_t* lens, size_t n) : texts_(texts), lens_(lens), n_(n) {
    Advance();
  }
  bool done() const override { return doc_ >= n_; }
  void Next() override { Advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  static constexpr size_t kMaxLine = 4000;
  void Advance() {
    while (doc_ < n_) {
      std::string_view t(texts_[doc_], lens_[doc_]);
      if (pos_ >= t.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      size_t nl = t.find('\n', pos_);
      size_t end = nl == std::string_view::npos ? t.size() : nl;
      if (end - pos_ > kMaxLine) end = pos_ + kMaxLine;
      line_.assign(t.substr(pos_, end - pos_));
      pos_ = (end < t.size() && t[end] == '\n') ? end + 1 : end;
      if (!line_.empty()) return;
    }
  }
  const char* const* texts_;
  const size_t* lens_;
  size_t n_;
  size_t doc_ = 0;
  size_t pos_ = 0;
  std::string line_;
};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void atl_spm_free(void* p) { std::free(p); }

// Trains a BPE model on the lines of n documents. Returns 0 and the serialised model, or
// nonzero and an error message.
__attribute__((visibility("default"))) int atl_spm_train(const char* const* texts, const size_t* lens, size_t n,
                                                         const char* args, char** model, size_t* model_len,
                                                         char** error) {
  sentencepiece::logging::SetMinLogLevel(1);  // silence the INFO lines; warnings still show
  LineIterator lines(texts, lens, n);
  std::string out;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &out);
  if (!st.ok()) {
    *error = CopyOut(st.ToString(), nullptr);
    return 1;
  }
  *model = CopyOut(out, model_len);
  return 0;
}

__attribute__((visibility("default"))) void* atl_spm_load(const char* model, size_t len, char** error) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto st = sp->LoadFromSerializedProto(absl::string_view(model, len));
  if (!st.ok()) {
    *error = CopyOut(st.ToString(), nullptr);
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void atl_spm_release(void* h) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(h);
}

__attribute__((visibility("default"))) int atl_spm_vocab(void* h) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(h)->GetPieceSize();
}

__attribute__((visibility("default"))) int atl_spm_piece_to_id(void* h, const char* piece) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(h)->PieceToId(piece);
}

// Encodes one line (no '\n'): writes at most cap ids and returns how many there are (a piece
// never covers less than one byte, so len ids always suffice). -1 on error.
__attribute__((visibility("default"))) long atl_spm_encode(void* h, const char* text, size_t len, int* ids,
                                                           size_t cap) {
  std::vector<int> out;
  auto st = static_cast<sentencepiece::SentencePieceProcessor*>(h)->Encode(absl::string_view(text, len), &out);
  if (!st.ok()) return -1;
  std::memcpy(ids, out.data(), std::min(cap, out.size()) * sizeof(int));
  return static_cast<long>(out.size());
}

__attribute__((visibility("default"))) char* atl_spm_decode(void* h, const int* ids, size_t n, size_t* len) {
  std::string out;
  std::vector<int> v(ids, ids + n);
  auto st = static_cast<sentencepiece::SentencePieceProcessor*>(h)->Decode(v, &out);
  if (!st.ok()) out.clear();
  return CopyOut(out, len);
}

}  // extern "C"
