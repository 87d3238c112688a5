#include "data/tokenizer.h"

#include "data/data_error.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>

// Exported by libsentencepiece but declared only in its source tree (src/common.h): the trainer
// prints "Running command: …" at INFO before it reads its own --minloglevel flag, so the level is
// set around the call instead.
namespace sentencepiece::logging {
int GetMinLogLevel();
void SetMinLogLevel(int level);
}  // namespace sentencepiece::logging

namespace flowtrain::data {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

// Feeds the captions to the trainer from memory, so the model records no file paths and the same
// captions give the same bytes wherever the data set is made.
class CaptionIterator : public sentencepiece::SentenceIterator {
 public:
  explicit CaptionIterator(const std::vector<std::string>& captions) : captions_(captions) {}
  bool done() const override { return i_ >= captions_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return captions_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& captions_;
  size_t i_ = 0;
};

}  // namespace

std::string Tokenizer::train(const std::vector<std::string>& captions, int64_t vocab_size) {
  // BPE: on a caption corpus of a few dozen words it merges every word into one piece within a
  // few hundred merges (a unigram model of the same size kept splitting words into letters).
  // hard_vocab_limit=false: a small corpus may not fill vocab_size.
  const std::string args = fmt::format(
      "--vocab_size={} --model_type=bpe --hard_vocab_limit=false --character_coverage=1.0 --pad_id={} "
      "--unk_id={} --eos_id={} --bos_id=-1 --num_threads=1 --minloglevel=2",
      vocab_size, kPadId, kUnkId, kEosId);
  CaptionIterator corpus(captions);
  std::string model;
  const int level = sentencepiece::logging::GetMinLogLevel();
  sentencepiece::logging::SetMinLogLevel(2);  // errors only
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &corpus, &model);
  sentencepiece::logging::SetMinLogLevel(level);
  if (!status.ok()) throw DataError(fmt::format("training the tokenizer failed: {}", status.ToString()));
  return model;
}

Tokenizer::Tokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()), path_(model_path) {
  const auto status = impl_->processor.Load(model_path);
  if (!status.ok())
    throw DataError(fmt::format("{}: not a SentencePiece tokenizer model ({})", model_path, status.ToString()));
  if (impl_->processor.pad_id() != kPadId || impl_->processor.eos_id() != kEosId)
    throw DataError(fmt::format("{}: the tokenizer must use pad id {} and end-of-text id {} (has {} and {})",
                                model_path, kPadId, kEosId, impl_->processor.pad_id(), impl_->processor.eos_id()));
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int64_t Tokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  // Blank text (spaces, a CRLF line's "\r") is the empty prompt: no tokens, the unconditional input.
  if (text.find_first_not_of(" \t\r\n") != std::string::npos) {
    const auto status = impl_->processor.Encode(text, &ids);
    if (!status.ok()) throw DataError(fmt::format("{}: cannot encode '{}': {}", path_, text, status.ToString()));
    ids.push_back(static_cast<int>(kEosId));
  }
  return {ids.begin(), ids.end()};
}

Tokenizer::Batch Tokenizer::encode_batch(const std::vector<std::string>& texts, int64_t length) const {
  const int64_t n = static_cast<int64_t>(texts.size());
  Batch out;
  out.tokens = at::full({n, length}, kPadId, at::kLong);
  out.mask = at::zeros({n, length}, at::kBool);
  auto tokens = out.tokens.accessor<int64_t, 2>();
  auto mask = out.mask.accessor<bool, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t> ids = encode(texts[i]);
    if (static_cast<int64_t>(ids.size()) > length) out.truncated.push_back(i);
    const int64_t used = std::min<int64_t>(length, static_cast<int64_t>(ids.size()));
    for (int64_t j = 0; j < used; ++j) {
      tokens[i][j] = ids[j];
      mask[i][j] = true;
    }
  }
  return out;
}

}  // namespace flowtrain::data
