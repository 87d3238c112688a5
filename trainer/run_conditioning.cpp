#include "trainer/run_conditioning.h"

#include "data/compositions.h"
#include "data/safetensors.h"
#include "trainer/family.h"
#include "trainer/frozen/frozen_sampling.h"
#include "trainer/frozen/online_encoding.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <mutex>

namespace flowtrain::trainer {

namespace fs = std::filesystem;

namespace {

bool builtin_text(const Config& c) { return reads_caption_tokens(c.model); }

std::string text_conditioned_archs() {
  return fmt::format("{}", fmt::join(arch_names_where([](const FamilySpec& f) { return bool(f.text_conditioning); }), "|"));
}

// Captioned data needs a model conditioned on text.
void require_text_model(const Config& c) {
  if (c.data.source == DataSource::compositions && model_family(c.model.arch).class_conditioning)
    throw ConfigError(fmt::format("'model.arch' {} is class-conditional and data.source 'compositions' has captions, "
                                  "not class labels (use model.arch {})",
                                  c.model.arch, text_conditioned_archs()));
}

std::string embeddings_path(const Config& c) { return (fs::path(c.data.path) / "text_embeddings.safetensors").string(); }

std::vector<std::string> eval_prompt_captions(const Config& c) { return data::load_eval_captions(c.data.path); }

}  // namespace

std::map<std::string, at::Tensor> caption_token_fields(const data::Tokenizer::Batch& encoded) {
  return {{"tokens", encoded.tokens}, {"txt_mask", encoded.mask}};
}

std::shared_ptr<const data::Tokenizer> data_tokenizer(const Config& c) {
  auto tokenizer = std::make_shared<data::Tokenizer>((fs::path(c.data.path) / "tokenizer.model").string());
  const int64_t vocab_size = text_conditioning(c.model).vocab_size;
  if (tokenizer->vocab_size() > vocab_size)
    throw ConfigError(fmt::format("'model.vocab_size' is {} but the tokenizer {} has {} pieces (set it >= {})",
                                  vocab_size, tokenizer->path(), tokenizer->vocab_size(),
                                  tokenizer->vocab_size()));
  return tokenizer;
}

models::Conditioning prompt_conditioning(const Config& c, const data::Tokenizer& tokenizer,
                                         const std::vector<std::string>& prompts) {
  const int64_t text_len = text_conditioning(c.model).length;
  const auto encoded = tokenizer.encode_batch(prompts, text_len);
  constexpr size_t kNamed = 3;  // prompts named one by one; the rest are counted
  for (size_t i = 0; i < std::min(kNamed, encoded.truncated.size()); ++i)
    spdlog::warn("prompt {} has more than model.text_len = {} tokens; cut to fit: \"{}\"", encoded.truncated[i] + 1,
                 text_len, prompts[encoded.truncated[i]]);
  if (encoded.truncated.size() > kNamed)
    spdlog::warn("... and {} more prompts cut to model.text_len = {} tokens", encoded.truncated.size() - kNamed,
                 text_len);
  models::Conditioning cond;
  for (const auto& [name, t] : caption_token_fields(encoded)) cond.set(name, t);
  return cond;
}

std::map<std::string, at::Tensor> text_fields(const Config& c, const std::vector<std::string>& captions) {
  require_text_model(c);  // before looking for embeddings a class-conditional model could not use
  if (builtin_text(c)) {
    const auto tokenizer = data_tokenizer(c);
    const int64_t text_len = text_conditioning(c.model).length;
    const auto encoded = tokenizer->encode_batch(captions, text_len);
    if (!encoded.truncated.empty())
      spdlog::warn("{} of {} captions have more than model.text_len = {} tokens and are cut, e.g. \"{}\"",
                   encoded.truncated.size(), captions.size(), text_len, captions[encoded.truncated[0]]);
    return caption_token_fields(encoded);
  }
  if (encodes_text_online(c)) return frozen_caption_tokens(c)(captions);  // encoded in the step
  // Precomputed embeddings, one row per caption.
  const std::string path = embeddings_path(c);
  if (!fs::exists(path))
    throw ConfigError(fmt::format("'model.text_encoder_layers' is 0 (precomputed text embeddings) but {} does not "
                                  "exist; set model.text_encoder_layers > 0 to train the built-in text encoder",
                                  path));
  const data::SafetensorsReader reader(path);
  const TextConditioning text = text_conditioning(c.model);
  const int64_t n = static_cast<int64_t>(captions.size());
  auto check = [&](const std::string& key, const std::vector<int64_t>& expected, const std::string& why) {
    if (!reader.contains(key)) throw ConfigError(fmt::format("{}: no tensor '{}' ({})", path, key, why));
    if (reader.shape(key) != expected)
      throw ConfigError(fmt::format("{}: '{}' has shape [{}], the config needs [{}] ({})", path, key,
                                    fmt::join(reader.shape(key), ", "), fmt::join(expected, ", "), why));
  };
  check("txt", {n, text.length, text.width}, "samples × model.text_len × model.context_dim");
  check("vec", {n, text.pooled_width}, "samples × model.vec_dim");
  std::map<std::string, at::Tensor> fields = {{"txt", reader.get("txt").to(at::kFloat)},
                                              {"vec", reader.get("vec").to(at::kFloat)}};
  if (reader.contains("txt_mask")) {
    check("txt_mask", {n, text.length}, "samples × model.text_len");
    fields["txt_mask"] = reader.get("txt_mask").to(at::kBool);
  }
  return fields;
}

std::map<std::string, at::Tensor> synthetic_text_fields(const Config& c, int64_t n) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.run.seed) + 1);
  const TextConditioning text = text_conditioning(c.model);
  const int64_t L = text.length;
  const at::Tensor lengths = at::randint(std::min<int64_t>(8, L), L + 1, {n}, gen, at::kLong);
  const at::Tensor mask = at::arange(L, at::kLong).unsqueeze(0) < lengths.unsqueeze(1);
  if (encodes_text_online(c)) {  // captions of 1 to 40 words, tokenized for the frozen encoders
    std::vector<std::string> captions;
    for (int64_t i = 0; i < n; ++i) {
      std::string caption;
      for (int64_t w = 0, words = 1 + (i * 7919) % 40; w < words; ++w) caption += fmt::format("word{} ", (i + w) % 97);
      captions.push_back(caption);
    }
    return frozen_caption_tokens(c)(captions);
  }
  if (builtin_text(c)) {
    const at::Tensor ids = at::randint(data::Tokenizer::kEosId + 1, text.vocab_size, {n, L}, gen, at::kLong);
    return caption_token_fields({ids * mask.to(at::kLong), mask, {}});
  }
  return {{"txt", at::randn({n, L, text.width}, gen)}, {"vec", at::randn({n, text.pooled_width}, gen)}, {"txt_mask", mask}};
}

RunConditioning run_conditioning(const Config& c, std::shared_ptr<const data::ImageDataset> dataset) {
  const FamilySpec& family = model_family(c.model.arch);
  RunConditioning rc;
  if (!family.class_conditioning && !family.text_conditioning) {  // an unconditioned model: nothing to read
    rc.of_batch = [](const data::Batch&) { return models::Conditioning{}; };
    rc.of_rows = [arch = c.model.arch](const at::Tensor&) -> models::Conditioning {
      throw ConfigError(fmt::format("'model.arch' {} is not sampled: it has no conditioning to sample rows of", arch));
    };
    rc.of_eval_rows = rc.of_rows;
    return rc;
  }
  if (family.class_conditioning) {
    require_text_model(c);
    const auto& of_labels = family.class_conditioning;
    // Grid rows cycle through the classes the data has (a model may have more label slots).
    const int64_t classes = dataset && dataset->num_classes > 0 ? dataset->num_classes : class_count(c.model);
    rc.of_batch = [of_labels](const data::Batch& b) { return of_labels(b.labels); };
    rc.of_rows = [of_labels, classes](const at::Tensor& rows) { return of_labels(rows % classes); };
    rc.of_eval_rows = [of_labels](const at::Tensor& rows) { return of_labels(rows % 10); };
    rc.grid_columns = std::min<int64_t>(classes, 10);
    return rc;
  }
  if (c.data.source == DataSource::fashion_mnist)
    throw ConfigError(fmt::format("'model.arch' {} is conditioned on text, and data.source '{}' provides class labels "
                                  "only (use data.source compositions: `flowtrain data make-compositions`)",
                                  c.model.arch, name_of(c.data.source)));
  rc.grid_columns = 8;
  // Captions (compositions, or shards' .txt members) through the built-in encoder; grid and
  // evaluation rows are the prompts of data.path/eval_prompts.jsonl.
  if (builtin_text(c) && (c.data.source == DataSource::compositions || c.data.source == DataSource::shards)) {
    rc.of_batch = [](const data::Batch& b) {
      return models::Conditioning{{"tokens", b.fields.at("tokens")}, {"txt_mask", b.fields.at("txt_mask")}};
    };
    auto prompts = std::make_shared<models::Conditioning>(prompt_conditioning(c, *data_tokenizer(c), eval_prompt_captions(c)));
    rc.of_rows = [prompts](const at::Tensor& rows) { return prompts->index_select(rows % prompts->batch()); };
    rc.of_eval_rows = rc.of_rows;
    return rc;
  }
  rc.of_batch = [](const data::Batch& b) {
    models::Conditioning cond;
    for (const auto& [name, t] : b.fields) cond.set(name, t);
    return cond;
  };
  if (has_frozen_text_encoders(c.model)) {
    // The frozen text encoders embed the evaluation prompts (data.path/eval_prompts.jsonl) on
    // first use, as FLUX's sampling embeds its prompts.
    struct Prompts {
      std::once_flag once;
      models::Conditioning cond;
    };
    auto prompts = std::make_shared<Prompts>();
    rc.of_rows = [prompts, c](const at::Tensor& rows) {
      std::call_once(prompts->once, [&] { prompts->cond = frozen_prompt_conditioning(c, eval_prompt_captions(c)); });
      return prompts->cond.index_select(rows % prompts->cond.batch());
    };
    rc.of_eval_rows = rc.of_rows;
    return rc;
  }
  rc.of_rows = [dataset](const at::Tensor& rows) {
    if (!dataset)
      throw ConfigError("a model on precomputed (or synthetic) text embeddings is sampled on its training samples' "
                        "text rows, which are not loaded here; sample it from a training run (sample.every)");
    models::Conditioning cond;
    for (const auto& [name, t] : dataset->fields) cond.set(name, t);
    return cond.index_select(rows % dataset->size());
  };
  rc.of_eval_rows = rc.of_rows;
  return rc;
}

}  // namespace flowtrain::trainer
