// What conditions a run's model, decided once from the config and the data set: the training
// batches' conditioning, and that of the rows of sample grids and evaluations.
//
// What the model's family reads (trainer/family.h) decides it:
//   class-conditional                   labels; grid row i is class i % (the data's classes)
//   text, TextInput::Tokens             the data set's captions as tokens ("tokens", "txt_mask",
//                                       read with DIR/tokenizer.model); row i is evaluation prompt
//                                       i % P of DIR/eval_prompts.txt
//   text, TextInput::Embeddings         precomputed embeddings ("txt", "txt_mask", "vec") from
//                                       DIR/text_embeddings.safetensors; row i is training sample i
//   text, data.text_member caption      the captions tokenized for the frozen T5 and CLIP; the step
//                                       encodes them (trainer/frozen/online_encoding.h); rows as
//                                       with precomputed embeddings and model.text_encoders
//   text on data.source synthetic       random fields of the same shapes (synthetic_text_fields);
//                                       row i is training sample i
// Grid rows of a class-conditional model cycle through the data set's classes.
// With precomputed embeddings "txt_mask" is checked for shape and travels with the batch; whether
// the model masks attention with it is the model's own business.
#pragma once

#include "data/image_dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "models/conditioning.h"
#include "trainer/config/config.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flowtrain::trainer {

struct RunConditioning {
  std::function<models::Conditioning(const data::Batch& batch)> of_batch;
  // The conditioning of generated rows `rows` (int64 [n]) of a grid or an evaluation.
  std::function<models::Conditioning(const at::Tensor& rows)> of_rows;
  // The rows of an evaluation: class i % 10 (the judge's Fashion-MNIST classes) or evaluation
  // prompt i (of_rows).
  std::function<models::Conditioning(const at::Tensor& rows)> of_eval_rows;
  int64_t grid_columns = 10;  // images per row of a sample grid
};

// Throws ConfigError when the family and data.source do not fit (a text model on class labels,
// a class model on captions). `dataset`: the training set (the precomputed path's rows come from
// it); may be null where no training data are loaded (sample, eval), then those rows throw.
RunConditioning run_conditioning(const Config& config, std::shared_ptr<const data::ImageDataset> dataset);

// Texts as a caption-reading model takes them: "tokens" (int64 [N, text_len]) and "txt_mask"
// (bool [N, text_len]). The one place those names are given to a tokenizer's output.
std::map<std::string, at::Tensor> caption_token_fields(const data::Tokenizer::Batch& encoded);

// The tokenizer of a captioned data set: data.path/tokenizer.model.
std::shared_ptr<const data::Tokenizer> data_tokenizer(const Config& config);
// Prompts as the built-in text path's conditioning at model.text_len tokens: a prompt longer than
// that is cut with a warning naming it; an empty prompt is the unconditional one.
models::Conditioning prompt_conditioning(const Config& config, const data::Tokenizer& tokenizer,
                                         const std::vector<std::string>& prompts);

// The per-sample text fields of the compositions training set (data.source compositions):
// captions tokenized (built-in encoder: checks model.vocab_size covers the tokenizer) or the
// precomputed embeddings file (checks its widths against model.context_dim / vec_dim and its
// length against model.text_len, naming file, key and both shapes).
std::map<std::string, at::Tensor> text_fields(const Config& config, const std::vector<std::string>& captions);
// Random text fields of the same shapes for data.source synthetic (benchmarks, the PyTorch peer):
// tokens of 8 to model.text_len ids past the special ones, or N(0, 1) embeddings, or (text_member
// caption) captions of 1 to 40 words tokenized for the frozen encoders; a pure function of run.seed.
std::map<std::string, at::Tensor> synthetic_text_fields(const Config& config, int64_t n);

}  // namespace flowtrain::trainer
