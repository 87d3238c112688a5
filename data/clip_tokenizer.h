// CLIP's tokenizer as FLUX.1 runs it: byte-level BPE over the vocabulary of OpenAI's CLIP
// (49,408 ids: 256 bytes, the same with "</w>", 48,894 merges, <|startoftext|> 49406,
// <|endoftext|> 49407), each caption as [start] + pieces + [end], cut to max_length (77) with
// the end id kept last, padded to max_length (FLUX pads with the end id, open_clip with 0).
//
// Clean-up and splitting are those of transformers' CLIPTokenizer (the `tokenizers` pipeline of
// transformers 5, CLIPTokenizerFast before): Unicode NFC, every run of white space to one space,
// each character lower-cased on its own (full case mapping, no context: "Σ" is always "σ"), then
// the caption split into 's|'t|'re|'ve|'m|'ll|'d, runs of letters (\p{L}), single digits
// (\p{N}) and runs of anything else but white space; each piece's UTF-8 bytes are mapped to
// printable characters and merged by rank. open_clip's SimpleTokenizer differs only in its
// clean-up: ftfy.fix_text (mojibake, curly quotes, ligatures, full-width forms, C1 controls) and
// HTML unescaping twice; flowtrain does neither (counted in tests/unit/test_clip_tokenizer.cpp).
// Text that spells a special token ("<|endoftext|>") is tokenized as text, never as the token;
// transformers splits it out as the token (49407) first — the one difference on captions, untested
// by the golden set, which holds no such text.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace flowtrain::data {

class ClipTokenizer {
 public:
  // `path`: open_clip's bpe_simple_vocab_16e6.txt(.gz), or a folder holding Hugging Face's
  // vocab.json + merges.txt (the tokenizer/ folder of FLUX.1's release). Throws DataError naming
  // the file when it cannot be read or is not such a vocabulary.
  explicit ClipTokenizer(const std::string& path);

  int64_t start_id() const { return start_id_; }
  int64_t end_id() const { return end_id_; }
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }

  // The ids of one caption: start + pieces + end, at most max_length (unpadded).
  std::vector<int64_t> encode(const std::string& text, int64_t max_length) const;

  struct Batch {
    at::Tensor ids;                  // int64 [N, max_length], padded with pad_id
    at::Tensor mask;                 // bool [N, max_length], true on start, pieces and end
    std::vector<int64_t> truncated;  // rows whose caption was cut
  };
  // pad_id < 0 pads with the end id (FLUX's tokenizer files say so).
  Batch encode_batch(const std::vector<std::string>& texts, int64_t max_length, int64_t pad_id = -1) const;

 private:
  void load_open_clip(const std::string& file);
  void load_hugging_face(const std::string& folder);
  // The caption's ids without start and end, stopping once `limit` are there (the rest would be cut).
  std::vector<int64_t> pieces_of(const std::string& text, size_t limit) const;
  void append_bpe(const std::string& word, std::vector<int64_t>& ids) const;

  std::string path_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, int64_t> merge_rank_;  // "left right" -> rank
  int64_t start_id_ = -1, end_id_ = -1;
};

}  // namespace flowtrain::data
