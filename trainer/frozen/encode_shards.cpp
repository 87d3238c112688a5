#include "trainer/frozen/encode_shards.h"

#include "data/data_error.h"
#include "data/safetensors.h"
#include "data/shards/buckets.h"
#include "data/shards/shard_index.h"
#include "data/shards/byte_stream.h"
#include "data/shards/sample_decoder.h"
#include "data/shards/shard_list.h"
#include "data/shards/tar.h"
#include "data/shards/webdataset.h"
#include "trainer/builders.h"
#include "trainer/frozen/frozen_encoders.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <csignal>
#include <filesystem>
#include <map>
#include <optional>

namespace flowtrain::trainer {
namespace fs = std::filesystem;
namespace {

bool is_image_member(const std::string& extension) {
  return extension == "png" || extension == "jpg" || extension == "jpeg";
}

std::vector<data::Bucket> pixel_buckets(const Config& config, int64_t downsampling) {
  std::vector<data::Bucket> cells = config.data.buckets.empty()
                                        ? std::vector<data::Bucket>{{config.model.image_size, config.model.image_size}}
                                        : data::parse_buckets(config.data.buckets);
  for (auto& b : cells) b = {b.height * downsampling, b.width * downsampling};
  return cells;
}

// One decoded sample on its way through the encoders.
struct Pending {
  data::RawSample raw;
  at::Tensor image;  // uint8 [3, H, W] at its bucket's size (undefined without an autoencoder)
  int64_t bucket = -1;
  std::string caption;
};

class ShardEncoder {
 public:
  ShardEncoder(const Config& config, const EncodeOptions& options, FrozenEncoders& encoders)
      : options_(options), encoders_(encoders) {
    spec_.image = encoders.has_autoencoder() ? data::ImageKind::Image : data::ImageKind::None;
    spec_.channels = 3;
    if (encoders.has_autoencoder()) spec_.buckets = pixel_buckets(config, encoders.downsampling());
  }

  // Writes `entry`'s encoded samples to `out` (NAME.tmp, renamed when complete). With
  // `kill_midway`, half a batch is written and the process killed instead (a fault drill).
  void encode(const std::string& entry, const std::string& out, bool kill_midway, EncodeReport& report) {
    data::SampleReader reader(data::open_shard(entry));
    data::TarWriter writer(out);
    std::vector<Pending> batch;
    try {
      while (std::optional<data::RawSample> sample = reader.next()) {
        if (std::optional<Pending> p = decoded(std::move(*sample), report)) batch.push_back(std::move(*p));
        if (static_cast<int64_t>(batch.size()) == options_.batch) flush(batch, writer, report, kill_midway);
      }
    } catch (const data::DataError& e) {
      // A damaged tar (truncated, a bad header): the samples before the damage are kept, as the
      // loader keeps them; the rest of the shard is unreadable and counted as one damage.
      ++report.damaged;
      spdlog::warn("data encode: {}: damaged after the samples before it, which are kept: {}", entry, e.what());
    }
    flush(batch, writer, report, kill_midway);
    writer.close();
  }

 private:
  std::optional<Pending> decoded(data::RawSample raw, EncodeReport& report) {
    Pending p;
    try {
      if (!raw.error.empty()) throw data::DataError(raw.error);
      if (encoders_.has_text_encoders()) {
        const auto txt = raw.members.find("txt");
        if (txt == raw.members.end()) throw data::DataError("no .txt caption");
        p.caption = txt->second;
      }
      if (encoders_.has_autoencoder()) {
        data::DecodedSample d = data::decode_sample(raw, spec_);
        p.image = d.image;
        p.bucket = d.bucket;
      }
    } catch (const data::DataError& e) {
      ++report.damaged;
      spdlog::warn("data encode: {} sample '{}' skipped: {}", raw.shard, raw.key, e.what());
      return std::nullopt;
    }
    p.raw = std::move(raw);
    return p;
  }

  void flush(std::vector<Pending>& batch, data::TarWriter& writer, EncodeReport& report, bool kill_midway) {
    if (batch.empty()) return;
    std::vector<at::Tensor> latents(batch.size());
    if (encoders_.has_autoencoder()) {
      std::map<int64_t, std::vector<size_t>> by_bucket;  // one encoder call per shape
      for (size_t i = 0; i < batch.size(); ++i) by_bucket[batch[i].bucket].push_back(i);
      for (const auto& [bucket, rows] : by_bucket) {
        std::vector<at::Tensor> images;
        for (size_t i : rows) images.push_back(batch[i].image);
        const at::Tensor x = at::stack(images).to(at::kFloat).div(127.5).sub(1.0);  // uint8 -> [-1, 1]
        const at::Tensor z = encoders_.encode_images(x).cpu();
        for (size_t j = 0; j < rows.size(); ++j) latents[rows[j]] = z[static_cast<int64_t>(j)];
      }
    }
    std::optional<FrozenEncoders::Text> text;
    if (encoders_.has_text_encoders()) {
      std::vector<std::string> captions;
      for (const Pending& p : batch) captions.push_back(p.caption);
      text = encoders_.encode_text(captions);
      text->txt = text->txt.cpu();
      text->txt_mask = text->txt_mask.cpu();
      text->vec = text->vec.cpu();
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::string& key = batch[i].raw.key;
      const auto row = static_cast<int64_t>(i);
      for (const auto& [extension, bytes] : batch[i].raw.members)
        if (!(encoders_.has_autoencoder() && is_image_member(extension))) writer.add(key + "." + extension, bytes);
      if (latents[i].defined())
        writer.add(key + ".latent.safetensors", data::safetensors_bytes({{"latent", latents[i].to(options_.dtype)}}));
      if (text) {
        writer.add(key + ".txt_emb.safetensors",
                   data::safetensors_bytes({{"txt", text->txt[row].to(options_.dtype)}, {"txt_mask", text->txt_mask[row]}}));
        writer.add(key + ".vec.safetensors", data::safetensors_bytes({{"vec", text->vec[row].to(options_.dtype)}}));
      }
      ++report.samples;
      if (kill_midway && i + 1 == (batch.size() + 1) / 2) {
        spdlog::warn("data encode: debug.inject.encode_kill_after: killing this rank mid-shard");
        spdlog::default_logger()->flush();
        std::raise(SIGKILL);
      }
    }
    batch.clear();
  }

  const EncodeOptions& options_;
  FrozenEncoders& encoders_;
  data::SampleSpec spec_;
};

// When every input's output shard is in place, writes OUT/index.json (each shard's sample count,
// read from its tar headers), so a run training from the output counts nothing. Each rank calls
// this after its own last rename, so the rank that finishes last always finds them all.
void write_index_when_complete(const std::vector<std::string>& inputs, const std::string& out_dir) {
  std::vector<data::ShardIndexEntry> entries;
  for (const std::string& entry : inputs) {
    const fs::path out = fs::path(out_dir) / data::shard_basename(entry);
    if (!fs::exists(out)) return;  // another rank's shards are still being written
    entries.push_back({out.filename().string(), data::count_samples(out.string()),
                       static_cast<uint64_t>(fs::file_size(out))});
  }
  data::write_shard_index(out_dir, entries);
  spdlog::info("data encode: all {} shards are in place; wrote {}/index.json", entries.size(), out_dir);
}

}  // namespace

EncodeReport encode_shards(const Config& config, const EncodeOptions& options, int64_t rank, int64_t world) {
  if (config.model.autoencoder.empty() && config.model.t5_encoder.empty() && config.model.clip_encoder.empty())
    throw ConfigError("data encode: the config names no frozen model (model.autoencoder, model.text_encoders.*)");
  if (options.batch < 1) throw ConfigError("data encode: --batch must be >= 1");
  const std::vector<std::string> inputs = data::resolve_shard_list(options.inputs, "");
  // An output shard is named after its input: two inputs of one name would overwrite each other
  // (or the second be taken for done), and writing into the input folder would skip everything.
  std::map<std::string, std::string> by_name;
  for (const std::string& entry : inputs) {
    const std::string name = data::shard_basename(entry);
    const auto [it, fresh] = by_name.emplace(name, entry);
    if (!fresh)
      throw ConfigError("data encode: inputs " + it->second + " and " + entry + " have the same file name '" + name +
                        "', which names the output shard: encode them into different --out folders");
    if (data::is_local_entry(entry) &&
        fs::weakly_canonical(fs::path(data::local_path_of(entry)).parent_path()) == fs::weakly_canonical(options.out_dir))
      throw ConfigError("data encode: --out " + options.out_dir + " is the folder of input " + entry +
                        ": the outputs take their inputs' names");
  }
  std::vector<std::string> mine;
  for (size_t i = static_cast<size_t>(rank); i < inputs.size(); i += static_cast<size_t>(world)) mine.push_back(inputs[i]);
  fs::create_directories(options.out_dir);

  const c10::Device device = select_device(config.run);  // each rank its own GPU, as in training
  if (config.model.t5_encoder.empty() != config.model.clip_encoder.empty())
    throw ConfigError("data encode: FLUX's text conditioning needs both model.text_encoders.t5 and "
                      "model.text_encoders.clip (one is set)");
  FrozenEncoders encoders(config.model, device, device.is_cuda() ? at::kBFloat16 : at::kFloat);
  ShardEncoder shard_encoder(config, options, encoders);

  EncodeReport report;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string name = data::shard_basename(mine[i]);
    const std::string out = (fs::path(options.out_dir) / name).string();
    if (fs::exists(out)) {
      ++report.skipped_shards;
      continue;
    }
    const bool kill = config.debug.encode_kill_after > 0 && report.shards == config.debug.encode_kill_after;
    shard_encoder.encode(mine[i], out, kill, report);
    ++report.shards;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_shard = seconds / static_cast<double>(report.shards);
    spdlog::info("data encode: rank {}/{}: {} done ({}/{} shards, {} samples, {:.1f} samples/s, ETA {:.0f} s)", rank,
                 world, name, i + 1, mine.size(), report.samples, report.samples / std::max(seconds, 1e-9),
                 per_shard * static_cast<double>(mine.size() - i - 1));
  }
  write_index_when_complete(inputs, options.out_dir);
  return report;
}

}  // namespace flowtrain::trainer
