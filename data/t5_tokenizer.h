// T5's tokenizer as FLUX.1 runs it (transformers' T5Tokenizer on the checkpoint's spiece.model):
// SentencePiece pieces of the caption, then the end-of-sequence id; cut to max_length with the
// end id kept last; padded with the pad id to max_length (FLUX pads to 512 for dev, 256 for
// schnell, and attends to the padding). Ids are the model's: T5's pad 0, eos 1, unk 2; the 100
// <extra_id_N> sentinels above the pieces are never produced from text.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace flowtrain::data {

class T5Tokenizer {
 public:
  // Loads spiece.model; throws DataError naming it when it is not a SentencePiece model or has no
  // pad or end-of-sequence piece.
  explicit T5Tokenizer(const std::string& spiece_model);
  ~T5Tokenizer();
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;

  int64_t pad_id() const;
  int64_t eos_id() const;
  // The ids of one caption: pieces + eos, at most max_length (unpadded).
  std::vector<int64_t> encode(const std::string& text, int64_t max_length) const;

  struct Batch {
    at::Tensor ids;                  // int64 [N, max_length], padded with pad_id
    at::Tensor mask;                 // bool [N, max_length], true on the ids of the caption
    std::vector<int64_t> truncated;  // rows whose caption was cut
  };
  Batch encode_batch(const std::vector<std::string>& texts, int64_t max_length) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace flowtrain::data
