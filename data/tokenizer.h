// The text tokenizer of the built-in text path: a SentencePiece model (Debian's libsentencepiece),
// trained on a data set's caption corpus when the data set is made and stored with it
// (DIR/tokenizer.model), so training, sampling and evaluation read captions with the same pieces.
//
// Ids: 0 is padding (masked out in the text encoder), 1 unknown, 2 end of text (appended to every
// caption, so even a one-word prompt has two tokens); no beginning-of-text id.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace flowtrain::data {

class Tokenizer {
 public:
  // Trains a BPE model on the captions and returns the serialized model (the bytes of a
  // `.model` file). `vocab_size` is an upper bound: a small corpus yields fewer pieces.
  // Single-threaded and fed from memory, so the bytes are a pure function of the captions.
  // Throws DataError with SentencePiece's message.
  static std::string train(const std::vector<std::string>& captions, int64_t vocab_size);

  // Loads a model file; throws DataError naming it.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  int64_t vocab_size() const;  // ids are in [0, vocab_size)
  static constexpr int64_t kPadId = 0, kUnkId = 1, kEosId = 2;
  const std::string& path() const { return path_; }

  std::vector<int64_t> encode(const std::string& text) const;  // pieces then end-of-text
  struct Batch {
    at::Tensor tokens;               // int64 [N, length], padded with kPadId
    at::Tensor mask;                 // bool [N, length], true on real tokens
    std::vector<int64_t> truncated;  // rows whose text had more than `length` tokens (cut to fit)
  };
  // An empty or blank text gives an all-padding row (mask all false): the unconditional prompt.
  Batch encode_batch(const std::vector<std::string>& texts, int64_t length) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace flowtrain::data
