#include "data/shards/pack.h"

#include "data/compositions.h"
#include "data/data_error.h"
#include "data/fashion_mnist.h"
#include "data/png.h"
#include "data/safetensors.h"
#include "data/splitmix64.h"
#include "data/tokenizer.h"
#include "data/video.h"
#include "data/shards/shard_index.h"
#include "data/shards/tar.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

namespace flowtrain::data {
namespace fs = std::filesystem;
namespace {

using Members = std::vector<std::pair<std::string, std::string>>;  // (extension, bytes)

// Cuts the sample stream into shards by count and size, and records the index.
class ShardSink {
 public:
  ShardSink(const PackOptions& options) : options_(options) {}

  void add(const std::string& key, const Members& members) {
    uint64_t size = 0;
    for (const auto& [ext, bytes] : members) size += 512 + (bytes.size() + 511) / 512 * 512;
    if (writer_ && (count_ >= options_.max_count || writer_->bytes() + size > static_cast<uint64_t>(options_.max_size)))
      close_shard();
    if (!writer_) {
      name_ = fmt::format("train-{:06d}.tar", index_.size());
      writer_ = std::make_unique<TarWriter>((fs::path(options_.out_dir) / name_).string());
    }
    for (const auto& [ext, bytes] : members) writer_->add(key + "." + ext, bytes);
    ++count_;
    ++total_;
  }

  PackResult finish() {
    if (writer_) close_shard();
    if (index_.empty()) throw DataError(fmt::format("data pack --from {}: no samples", options_.from));
    write_shard_index(options_.out_dir, index_);
    PackResult result;
    result.samples = total_;
    result.shards = static_cast<int64_t>(index_.size());
    for (const auto& s : index_) result.bytes += s.bytes;
    result.pattern = index_.size() == 1
                         ? (fs::path(options_.out_dir) / index_[0].name).string()
                         : (fs::path(options_.out_dir) / fmt::format("train-{{000000..{:06d}}}.tar", index_.size() - 1))
                               .string();
    return result;
  }

 private:
  void close_shard() {
    writer_->close();
    index_.push_back({name_, count_, writer_->bytes()});
    writer_.reset();
    count_ = 0;
  }

  const PackOptions& options_;
  std::unique_ptr<TarWriter> writer_;
  std::string name_;
  int64_t count_ = 0, total_ = 0;
  std::vector<ShardIndexEntry> index_;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read", path.string()));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

int64_t limited(int64_t n, int64_t limit) { return limit > 0 ? std::min(n, limit) : n; }

void pack_fashion_mnist(const PackOptions& o, ShardSink& sink) {
  if (o.split != "train" && o.split != "test")
    throw DataError(fmt::format("data pack: --split must be train or test, got '{}'", o.split));
  const ImageDataset set = load_fashion_mnist(o.path.empty() ? kFashionMnistDefaultDir : o.path, o.split);
  const auto& names = fashion_mnist_class_names();
  const int64_t n = limited(set.size(), o.limit);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = set.labels[i].item<int64_t>();
    sink.add(fmt::format("{}-{:07d}", o.split, i),
             {{"png", encode_png(set.images[i][0])}, {"cls", std::to_string(label)}, {"txt", names[label]}});
  }
}

// The member extension of an image file: "png" or "jpg" (for .jpg / .jpeg, any case); "" otherwise.
std::string image_member_extension(const fs::path& file) {
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".png") return "png";
  if (ext == ".jpg" || ext == ".jpeg") return "jpg";
  return "";
}

void pack_folder(const PackOptions& o, const std::string& dir, ShardSink& sink) {
  if (!fs::is_directory(dir)) throw DataError(fmt::format("data pack --from folder:{}: not a directory", dir));
  std::vector<fs::path> images;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && !image_member_extension(e.path()).empty()) images.push_back(e.path());
  std::sort(images.begin(), images.end());
  if (images.empty()) throw DataError(fmt::format("data pack --from folder:{}: no .png or .jpg files", dir));
  const int64_t n = limited(static_cast<int64_t>(images.size()), o.limit);
  for (int64_t i = 0; i < n; ++i) {
    const fs::path& image = images[static_cast<size_t>(i)];
    // The key: the path below the folder without its extension, dots made safe (a dot in a base
    // name would split it into a key and a different extension).
    std::string key = fs::relative(image, dir).replace_extension().string();
    std::replace(key.begin(), key.end(), '.', '_');
    Members members{{image_member_extension(image), read_file(image)}};
    fs::path caption = image;
    caption.replace_extension(".txt");
    if (fs::exists(caption)) members.emplace_back("txt", read_file(caption));
    sink.add(key, members);
  }
}

void pack_compositions(const PackOptions& o, const std::string& dir, ShardSink& sink) {
  const CompositionSet set = load_compositions(dir, "train");
  const int64_t n = limited(set.images.size(0), o.limit);
  for (int64_t i = 0; i < n; ++i) {
    const auto& item = set.items[static_cast<size_t>(i)];
    sink.add(fmt::format("train-{:07d}", i), {{"png", encode_png(set.images[i].permute({1, 2, 0}).contiguous())},
                                             {"txt", item.caption},
                                             {"json", composition_json(item)}});
  }
}

// Where a 16-pixel garment is in frame t of `frames` moving in `direction` across 32 pixels.
std::pair<int64_t, int64_t> moving_position(int64_t direction, int64_t t, int64_t frames) {
  const int64_t travel = std::min<int64_t>(16, frames - 1);  // one pixel a frame, at most 16
  const int64_t along = frames > 1 ? t * travel / (frames - 1) : 0, centre = 8;
  switch (direction) {
    case 0: return {centre, 16 - along};  // left
    case 1: return {centre, along};       // right
    case 2: return {16 - along, centre};  // up
    default: return {along, centre};      // down
  }
}

void check_pack_dir(const std::string& out_dir) {
  if (out_dir.empty()) throw DataError("data pack: --out is required");
  if (fs::exists(fs::path(out_dir) / "index.json") || fs::exists(fs::path(out_dir) / "train-000000.tar"))
    throw DataError(fmt::format("data pack: {} already holds shards (remove it or choose another --out)", out_dir));
  fs::create_directories(out_dir);
}

}  // namespace

at::Tensor render_moving_clip(const at::Tensor& garment, int64_t color, int64_t direction, int64_t frames) {
  // 28×28 -> 16×16 by area, then tinted: [16, 16, 3] float in [0, 255].
  const int64_t side = kMovingGarmentSide;
  const at::Tensor small = at::adaptive_avg_pool2d(garment.to(at::kFloat).reshape({1, 28, 28}), {side, side})[0];
  const at::Tensor tinted = small.unsqueeze(2) * composition_colors()[color].view({1, 1, 3});
  at::Tensor clip = at::zeros({frames, 32, 32, 3}, at::kFloat);
  for (int64_t t = 0; t < frames; ++t) {
    const auto [y, x] = moving_position(direction, t, frames);
    clip[t].narrow(0, y, side).narrow(1, x, side).copy_(tinted);
  }
  return clip.round().clamp(0, 255).to(at::kByte);
}

const std::vector<std::string>& moving_direction_names() {
  static const std::vector<std::string> names = {"left", "right", "up", "down"};
  return names;
}

namespace {

struct MovingItem {
  int64_t source = 0, label = 0, color = 0, direction = 0;
  std::string caption() const {
    const std::string& color_name = composition_color_names()[static_cast<size_t>(color)];
    return fmt::format("{} {} {} moving {}", color_name == "orange" ? "an" : "a", color_name,
                       composition_class_names()[static_cast<size_t>(label)],
                       moving_direction_names()[static_cast<size_t>(direction)]);
  }
  nlohmann::json json() const {
    return {{"caption", caption()},
            {"class", composition_class_names()[static_cast<size_t>(label)]},
            {"class_id", label},
            {"color", composition_color_names()[static_cast<size_t>(color)]},
            {"direction", moving_direction_names()[static_cast<size_t>(direction)]},
            {"source_index", source}};
  }
};

MovingItem draw_moving_item(SplitMix64& rng, const ImageDataset& set) {
  MovingItem item;
  item.source = static_cast<int64_t>(rng.below(static_cast<uint64_t>(set.size())));
  item.color = static_cast<int64_t>(rng.below(8));
  item.direction = static_cast<int64_t>(rng.below(4));
  item.label = set.labels[item.source].item<int64_t>();
  return item;
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f.flush()) throw DataError(fmt::format("{}: write failed", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw DataError(fmt::format("{}: rename failed: {}", path.string(), ec.message()));
}

}  // namespace

PackResult make_moving_fashion(const MovingFashionOptions& o) {
  if (o.num < 1 || o.frames < 2 || o.fps < 1 || o.num_eval < 0)
    throw DataError("make-moving-fashion: --num must be >= 1, --frames >= 2, --fps >= 1, --num-eval >= 0");
  check_pack_dir(o.out_dir);
  const std::string fashion_dir = o.fashion_dir.empty() ? kFashionMnistDefaultDir : o.fashion_dir;
  const ImageDataset set = load_fashion_mnist(fashion_dir, "train");
  const ImageDataset test = load_fashion_mnist(fashion_dir, "test");

  // The evaluation set first (test-split garments, its own random stream: more training clips
  // never change it), with the real clips the judge's ceiling is measured on; then the tokenizer
  // of the training captions; the shards last, so index.json marks a finished set.
  const fs::path dir(o.out_dir);
  SplitMix64 eval_rng{splitmix64_mix(o.seed ^ 0x6576616cull)};
  std::string eval_jsonl, eval_txt;
  std::vector<at::Tensor> eval_clips;
  for (int64_t i = 0; i < o.num_eval; ++i) {
    const MovingItem item = draw_moving_item(eval_rng, test);
    eval_jsonl += item.json().dump() + "\n";
    eval_txt += item.caption() + "\n";
    eval_clips.push_back(render_moving_clip(test.images[item.source], item.color, item.direction, o.frames));
  }
  std::vector<MovingItem> items;
  std::vector<std::string> captions;
  for (int64_t i = 0; i < o.num; ++i) {
    SplitMix64 rng{o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1};
    items.push_back(draw_moving_item(rng, set));
    captions.push_back(items.back().caption());
  }
  if (o.num_eval > 0) {
    write_text_atomic(dir / "eval_prompts.jsonl", eval_jsonl);
    write_text_atomic(dir / "eval_prompts.txt", eval_txt);
    // uint8 [M, T, 32, 32, 3] -> [M, T, 3, 32, 32], the layout clips are judged in.
    write_safetensors((dir / "eval_clips.safetensors").string(),
                      {{"clips", at::stack(eval_clips).permute({0, 1, 4, 2, 3}).contiguous()}});
  }
  write_text_atomic(dir / "tokenizer.model", Tokenizer::train(captions, o.vocab_size));
  const nlohmann::json manifest = {{"format", "flowtrain-moving-fashion"}, {"version", 1}, {"seed", o.seed},
                                   {"num", o.num}, {"num_eval", o.num_eval}, {"frames", o.frames}, {"fps", o.fps},
                                   {"fashion_mnist_dir", fs::absolute(fashion_dir).string()}};
  write_text_atomic(dir / "manifest.json", manifest.dump(2) + "\n");

  PackOptions pack;
  pack.from = "moving-fashion";
  pack.out_dir = o.out_dir;
  pack.max_count = o.max_count;
  ShardSink sink(pack);
  for (int64_t i = 0; i < o.num; ++i) {
    const MovingItem& item = items[static_cast<size_t>(i)];
    nlohmann::json meta = item.json();
    meta.erase("caption");
    sink.add(fmt::format("clip-{:07d}", i),
             {{"mp4", encode_video_lossless(render_moving_clip(set.images[item.source], item.color, item.direction,
                                                               o.frames),
                                            o.fps)},
              {"txt", item.caption()},
              {"cls", std::to_string(item.label)},
              {"json", meta.dump()}});
  }
  return sink.finish();
}

PackResult pack_shards(const PackOptions& o) {
  if (o.max_count < 1 || o.max_size < 1024)
    throw DataError("data pack: --max-count must be at least 1 and --max-size at least 1024 bytes");
  check_pack_dir(o.out_dir);
  ShardSink sink(o);
  if (o.from == "fashion-mnist") pack_fashion_mnist(o, sink);
  else if (o.from.rfind("folder:", 0) == 0) pack_folder(o, o.from.substr(7), sink);
  else if (o.from.rfind("compositions:", 0) == 0) pack_compositions(o, o.from.substr(13), sink);
  else
    throw DataError(fmt::format("data pack: unknown --from '{}' (fashion-mnist, folder:PATH or compositions:PATH)",
                                o.from));
  return sink.finish();
}

}  // namespace flowtrain::data
