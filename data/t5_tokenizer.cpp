#include "data/t5_tokenizer.h"

#include "data/data_error.h"

#include <sentencepiece_processor.h>

#include <stdexcept>

namespace flowtrain::data {

struct T5Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

T5Tokenizer::T5Tokenizer(const std::string& spiece_model) : impl_(std::make_unique<Impl>()), path_(spiece_model) {
  const auto status = impl_->processor.Load(spiece_model);
  if (!status.ok())
    throw DataError(spiece_model + ": not a SentencePiece model (" + status.ToString() + ")");
  if (impl_->processor.pad_id() < 0 || impl_->processor.eos_id() < 0)
    throw DataError(spiece_model + ": T5's tokenizer needs a pad and an end-of-sequence piece (this model has " +
                    (impl_->processor.pad_id() < 0 ? "no pad" : "no end-of-sequence") + " id)");
}

T5Tokenizer::~T5Tokenizer() = default;
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;

int64_t T5Tokenizer::pad_id() const { return impl_->processor.pad_id(); }
int64_t T5Tokenizer::eos_id() const { return impl_->processor.eos_id(); }

std::vector<int64_t> T5Tokenizer::encode(const std::string& text, int64_t max_length) const {
  if (max_length < 1) throw std::invalid_argument("T5Tokenizer: max_length must be >= 1");
  std::vector<int> pieces;
  const auto status = impl_->processor.Encode(text, &pieces);
  if (!status.ok()) throw DataError(path_ + ": cannot encode a caption (" + status.ToString() + ")");
  std::vector<int64_t> ids(pieces.begin(), pieces.end());
  if (static_cast<int64_t>(ids.size()) > max_length - 1) ids.resize(max_length - 1);  // the end id stays
  ids.push_back(eos_id());
  return ids;
}

T5Tokenizer::Batch T5Tokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length) const {
  const int64_t n = static_cast<int64_t>(texts.size());
  Batch batch{at::full({n, max_length}, pad_id(), at::kLong), at::zeros({n, max_length}, at::kBool), {}};
  auto ids = batch.ids.accessor<int64_t, 2>();
  auto mask = batch.mask.accessor<bool, 2>();
  for (int64_t row = 0; row < n; ++row) {
    std::vector<int64_t> kept = encode(texts[row], max_length + 1);  // one over tells a cut
    if (static_cast<int64_t>(kept.size()) > max_length) {
      batch.truncated.push_back(row);
      kept.erase(kept.end() - 2);  // the last piece goes; the end id stays last
    }
    for (size_t i = 0; i < kept.size(); ++i) {
      ids[row][static_cast<int64_t>(i)] = kept[i];
      mask[row][static_cast<int64_t>(i)] = true;
    }
  }
  return batch;
}

}  // namespace flowtrain::data
