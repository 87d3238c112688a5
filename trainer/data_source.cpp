#include "trainer/data_source.h"

#include "data/data_error.h"
#include "data/loader.h"
#include "data/shards/buckets.h"
#include "data/shards/byte_stream.h"
#include "data/shards/shard_index.h"
#include "data/shards/shard_list.h"
#include "trainer/builders.h"
#include "trainer/family.h"
#include "trainer/frozen/online_encoding.h"
#include "trainer/run_conditioning.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace flowtrain::trainer {

namespace {

// Opens up to 8 remote entries (URLs, pipe: commands) spread over the list — the first, the
// last and evenly between — so a wrong bucket, host or credential is one error naming the entry
// before training starts rather than a run of damaged samples. (Local entries were all checked
// to exist; every shard is fully checked when it is read.)
void probe_remote_shards(const std::vector<std::string>& shards, const data::FetchOptions& fetch) {
  std::vector<size_t> remote;
  for (size_t i = 0; i < shards.size(); ++i)
    if (!data::is_local_entry(shards[i])) remote.push_back(i);
  if (remote.empty()) return;
  const size_t probes = std::min<size_t>(8, remote.size());
  for (size_t p = 0; p < probes; ++p) {
    const size_t i = remote[probes == 1 ? 0 : p * (remote.size() - 1) / (probes - 1)];
    auto stream = data::open_shard(shards[i], fetch);
    char byte;
    if (stream->read(&byte, 1) != 1)
      throw data::DataError(fmt::format("shard {}: empty (a pipe: command that wrote nothing, or an empty object)",
                                        shards[i]));
  }
}

}  // namespace

int64_t resolve_streams(const DataConfig& data, int64_t shards, int64_t dp_size, int64_t resumed_streams) {
  if (resumed_streams > 0) {
    if (data.streams > 0 && data.streams != resumed_streams)
      throw ConfigError(fmt::format("'data.streams' is {} but the checkpoint being resumed was written with {} streams "
                                    "(the stream count is fixed for the life of a run; set data.streams: {} or 0)",
                                    data.streams, resumed_streams, resumed_streams));
    return resumed_streams;
  }
  if (data.streams > 0) return data.streams;
  const int64_t workers = std::max<int64_t>(1, data.workers);
  // A multiple of the ranks, so every rank owns as many streams (an uneven split ends each epoch
  // when the ranks with fewer run dry, leaving the others' rest unused).
  const int64_t streams = std::min<int64_t>(shards, 4 * dp_size * workers) / dp_size * dp_size;
  return std::max<int64_t>(streams, std::min<int64_t>(shards, dp_size * workers));
}

data::ShardLoaderOptions shard_loader_options(const Config& c, int64_t dp_rank, int64_t dp_size,
                                              const c10::Device& device, int64_t resumed_streams) {
  data::ShardLoaderOptions o;
  o.fetch.retries = static_cast<int>(c.data.fetch_retries);
  o.fetch.connect_timeout_s = c.data.fetch_timeout_s;
  o.fetch.stall_timeout_s = c.data.fetch_timeout_s;
  o.shards = data::resolve_shard_list(c.data.shards, c.data.shard_list);
  probe_remote_shards(o.shards, o.fetch);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t counted = 0;
  const int threads = static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 16));
  o.shard_samples = data::shard_sample_counts(o.shards, c.data.shard_index, threads, o.fetch, &counted);
  if (counted > 0)
    spdlog::warn("{} of {} shards have no index entry and were counted by reading them ({:.1f} s); `flowtrain data "
                 "pack` writes index.json, or point data.shard_index at one",
                 counted, o.shards.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  o.streams = resolve_streams(c.data, static_cast<int64_t>(o.shards.size()), dp_size, resumed_streams);
  if (o.streams % dp_size != 0)
    spdlog::warn("data.streams {} is not a multiple of the {} data-parallel ranks: ranks own {} or {} streams, and each "
                 "epoch ends when those with fewer run dry (~{:.0f}% of an epoch unused); use a multiple",
                 o.streams, dp_size, o.streams / dp_size, o.streams / dp_size + 1,
                 100.0 * (o.streams % dp_size) / static_cast<double>(o.streams));
  o.shuffle_buffer = c.data.shuffle_buffer;
  o.global_batch = c.data.batch_size;
  o.workers = std::max<int64_t>(1, c.data.workers);
  o.prefetch = c.data.prefetch;
  o.seed = static_cast<uint64_t>(c.run.seed);
  o.rank = dp_rank;
  o.world = dp_size;
  const DataInput input = data_input(c);  // pixels through model.autoencoder in the step: f × the model's cells
  o.image_size = input.image_size;
  o.pin_memory = device.is_cuda();
  o.fail_on_damage = c.data.on_error == DamagePolicy::fail;
  o.max_skip_fraction = c.data.max_skip_fraction;
  o.warn = [](const std::string& line) { spdlog::warn("data: {}", line); };

  // What every sample must hold, from the model.
  const FamilySpec& family = model_family(c.model.arch);
  o.spec.image = c.data.image_member == ImageMember::latent ? data::ImageKind::Latent : data::ImageKind::Image;
  o.spec.channels = input.channels;
  o.spec.max_side = input.image_size;
  o.spec.video_frames = c.data.video_frames;
  o.spec.video_fps = c.data.video_fps;
  if (o.spec.video_frames > 0 && !c.data.buckets.empty())
    throw ConfigError("'data.buckets' and 'data.video.frames' together are not supported yet");
  // Clips train a video model frame for frame (no VAE here: a pixel frame is a latent frame).
  if (o.spec.video_frames == 1 && c.model.frames == 1)
    throw ConfigError("'data.video.frames' is 1: one-frame clips are images; an image model (model.frames 1) reads "
                      "image members (data.video.frames 0), a video model needs model.frames = data.video.frames > 1");
  if (o.spec.video_frames != (c.model.frames > 1 ? c.model.frames : 0))
    throw ConfigError(o.spec.video_frames > 0
                          ? fmt::format("'data.video.frames' is {} but 'model.frames' is {}: a video model trains on "
                                        "clips of its own length",
                                        o.spec.video_frames, c.model.frames)
                          : fmt::format("'model.frames' is {} but the shards are read as images: set "
                                        "'data.video.frames' {} to decode the .mp4 members as clips",
                                        c.model.frames, c.model.frames));
  try {
    o.spec.buckets = data::parse_buckets(c.data.buckets);
  } catch (const data::DataError& e) {
    throw ConfigError(e.what());
  }
  if (!o.spec.buckets.empty()) {
    if (!family.variable_resolution)
      throw ConfigError(fmt::format(
          "'data.buckets' needs a model whose position ids follow the image shape (model.arch {}); {}'s positional "
          "embedding is fixed at model.image_size",
          fmt::join(arch_names_where([](const FamilySpec& f) { return f.variable_resolution; }), "|"), c.model.arch));
    for (const auto& b : o.spec.buckets)
      if (b.height % c.model.patch != 0 || b.width % c.model.patch != 0)
        throw ConfigError(fmt::format("'data.buckets' shape {}x{} is not divisible by model.patch {}", b.height,
                                      b.width, c.model.patch));
    if (c.parallel.cp > 1)
      for (const auto& b : o.spec.buckets)
        if ((b.height / c.model.patch) * (b.width / c.model.patch) % c.parallel.cp != 0)
          throw ConfigError(fmt::format("'data.buckets' shape {}x{} has image tokens not divisible by parallel.cp {}",
                                        b.height, b.width, c.parallel.cp));
    for (auto& b : o.spec.buckets) b = {b.height * input.downsampling, b.width * input.downsampling};  // cells -> pixels
  }
  if (family.class_conditioning) {
    o.spec.label = true;
    o.spec.num_classes = class_count(c.model);
  } else if (!family.text_conditioning) {
    // An unconditioned model (the autoencoder) reads the images alone.
  } else if (reads_caption_tokens(c.model)) {
    o.spec.caption = true;
    auto tokenizer = data_tokenizer(c);
    const int64_t text_len = text_conditioning(c.model).length;
    o.spec.caption_fields = [tokenizer, text_len](const std::string& caption) {
      std::map<std::string, at::Tensor> fields = caption_token_fields(tokenizer->encode_batch({caption}, text_len));
      for (auto& [name, t] : fields) t = t[0];  // one sample's row
      return fields;
    };
  } else if (encodes_text_online(c)) {  // tokenized here, encoded in the step (online_encoding.h)
    o.spec.caption = true;
    auto tokens = frozen_caption_tokens(c);
    o.spec.caption_fields = [tokens](const std::string& caption) {
      std::map<std::string, at::Tensor> fields = tokens({caption});
      for (auto& [name, t] : fields) t = t[0];  // one sample's row
      return fields;
    };
  } else {
    o.spec.text_embeddings = true;
  }
  spdlog::info("data: {} shards, {} samples, {} streams (data.streams), members {} per sample", o.shards.size(),
               [&] {
                 int64_t n = 0;
                 for (int64_t s : o.shard_samples) n += s;
                 return n;
               }(),
               o.streams, data::required_members(o.spec));
  return o;
}

std::unique_ptr<data::BatchSource> make_batch_source(const Config& c, std::shared_ptr<const data::ImageDataset> dataset,
                                                     int64_t dp_rank, int64_t dp_size, const c10::Device& device,
                                                     const data::LoaderState& start) {
  if (c.data.source != DataSource::shards)
    return std::make_unique<data::Loader>(std::move(dataset), loader_options(c, dp_rank, dp_size, device), start);
  const auto resumed_streams = static_cast<int64_t>(start.stream_counts.size());
  return std::make_unique<data::ShardLoader>(shard_loader_options(c, dp_rank, dp_size, device, resumed_streams), start);
}

}  // namespace flowtrain::trainer
