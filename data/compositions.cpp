#include "data/compositions.h"

#include "data/data_error.h"
#include "data/fashion_mnist.h"
#include "data/safetensors.h"
#include "data/splitmix64.h"
#include "data/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace flowtrain::data {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string>& composition_slot_names() {
  static const std::vector<std::string> names = {"top_left", "top_right", "bottom_left", "bottom_right"};
  return names;
}

const std::vector<std::string>& composition_color_names() {
  static const std::vector<std::string> names = {"red", "green", "blue", "yellow", "magenta", "cyan", "white", "orange"};
  return names;
}

at::Tensor composition_colors() {
  static const float rgb[kNumColors][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 1, 0},
                                           {1, 0, 1}, {0, 1, 1}, {1, 1, 1}, {1, 0.5f, 0}};
  return at::from_blob(const_cast<float*>(&rgb[0][0]), {kNumColors, 3}, at::kFloat).clone();
}

const std::vector<std::string>& composition_class_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> lower;
    for (std::string n : fashion_mnist_class_names()) {
      std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return std::tolower(ch); });
      lower.push_back(n);
    }
    return lower;
  }();
  return names;
}

const std::vector<std::pair<int64_t, int64_t>>& held_out_pairs() {
  // One pair per colour, each on another class: (sneaker, red), (dress, blue), (bag, green),
  // (coat, yellow), (trouser, magenta), (sandal, cyan), (pullover, white), (ankle boot, orange).
  static const std::vector<std::pair<int64_t, int64_t>> pairs = {{7, 0}, {3, 2}, {8, 1}, {4, 3},
                                                                 {1, 4}, {5, 5}, {2, 6}, {9, 7}};
  return pairs;
}

bool is_held_out(int64_t class_id, int64_t color) {
  for (const auto& [c, k] : held_out_pairs())
    if (c == class_id && k == color) return true;
  return false;
}

// ---- captions ----------------------------------------------------------------------------------

namespace {

// The noun a caption uses for a class (Fashion-MNIST's names are not all phrase-ready).
const char* const kNouns[10] = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
// Paraphrases of each slot.
const char* const kSlotPhrases[kNumSlots][3] = {{"top left", "upper left", "top left corner"},
                                                {"top right", "upper right", "top right corner"},
                                                {"bottom left", "lower left", "bottom left corner"},
                                                {"bottom right", "lower right", "bottom right corner"}};

std::string object_phrase(const CompositionObject& o) {
  const std::string& color = composition_color_names()[o.color];
  return fmt::format("{} {} {}", color[0] == 'o' ? "an" : "a", color, kNouns[o.class_id]);
}

std::string place_phrase(const CompositionObject& o, SplitMix64& rng) {
  static const char* const forms[] = {"{} in the {}", "{} at the {}", "{} placed in the {}"};
  return fmt::format(fmt::runtime(forms[rng.below(3)]), object_phrase(o), kSlotPhrases[o.slot][rng.below(3)]);
}

int64_t row_of(int64_t slot) { return slot / 2; }
int64_t column_of(int64_t slot) { return slot % 2; }

// A caption that names every object's class, colour and slot without ambiguity.
std::string make_caption(const std::vector<CompositionObject>& objects, SplitMix64& rng) {
  if (objects.size() == 1) {
    static const char* const forms[] = {"{}", "{}", "the {1} holds {0}"};
    const int form = static_cast<int>(rng.below(3));
    if (form < 2) return place_phrase(objects[0], rng);
    return fmt::format(fmt::runtime(forms[2]), object_phrase(objects[0]), kSlotPhrases[objects[0].slot][rng.below(3)]);
  }
  const CompositionObject &a = objects[0], &b = objects[1];
  const bool same_column = column_of(a.slot) == column_of(b.slot), same_row = row_of(a.slot) == row_of(b.slot);
  // Relations for objects sharing a column or a row (half the time), absolute places otherwise.
  if ((same_column || same_row) && rng.below(2) == 0) {
    const bool flip = rng.below(2) == 1;  // name the second-placed object first
    if (same_column) {
      const CompositionObject& top = row_of(a.slot) == 0 ? a : b;
      const CompositionObject& bottom = row_of(a.slot) == 0 ? b : a;
      const char* side = column_of(a.slot) == 0 ? "left" : "right";
      return flip ? fmt::format("{} below {} on the {}", object_phrase(bottom), object_phrase(top), side)
                  : fmt::format("{} above {} on the {}", object_phrase(top), object_phrase(bottom), side);
    }
    const CompositionObject& left = column_of(a.slot) == 0 ? a : b;
    const CompositionObject& right = column_of(a.slot) == 0 ? b : a;
    const char* row = row_of(a.slot) == 0 ? "top" : "bottom";
    return flip ? fmt::format("{} to the right of {} in the {} row", object_phrase(right), object_phrase(left), row)
                : fmt::format("{} to the left of {} in the {} row", object_phrase(left), object_phrase(right), row);
  }
  const char* joiner = rng.below(2) == 0 ? " and " : ", ";
  return place_phrase(a, rng) + joiner + place_phrase(b, rng);
}

// Indices of each class in a split, for drawing a garment of a given class.
std::vector<std::vector<int64_t>> indices_by_class(const at::Tensor& labels) {
  std::vector<std::vector<int64_t>> by_class(10);
  auto l = labels.accessor<int64_t, 1>();
  for (int64_t i = 0; i < labels.size(0); ++i) by_class[l[i]].push_back(i);
  return by_class;
}

// One composition: 1 or 2 garments in distinct slots. `heldout` asks for at least one held-out
// pair; otherwise none appears.
Composition draw_composition(SplitMix64& rng, const std::vector<std::vector<int64_t>>& by_class, bool heldout) {
  Composition c;
  const int64_t count = 1 + static_cast<int64_t>(rng.below(2));
  std::vector<int64_t> slots = {0, 1, 2, 3};
  for (int64_t i = 0; i < count; ++i) std::swap(slots[i], slots[i + rng.below(kNumSlots - i)]);
  const int64_t forced = heldout ? static_cast<int64_t>(rng.below(count)) : -1;
  for (int64_t i = 0; i < count; ++i) {
    CompositionObject o;
    o.slot = slots[i];
    if (i == forced) {
      const auto& pair = held_out_pairs()[rng.below(held_out_pairs().size())];
      o.class_id = pair.first;
      o.color = pair.second;
    } else {
      do {
        o.class_id = static_cast<int64_t>(rng.below(10));
        o.color = static_cast<int64_t>(rng.below(kNumColors));
      } while (is_held_out(o.class_id, o.color));
    }
    const auto& pool = by_class[o.class_id];
    o.source_index = pool[rng.below(pool.size())];
    c.objects.push_back(o);
  }
  c.heldout = heldout;
  c.caption = make_caption(c.objects, rng);
  return c;
}

at::Tensor render_all(const std::vector<Composition>& items, const at::Tensor& split_images) {
  at::Tensor out = at::empty({static_cast<int64_t>(items.size()), 3, kCompositionSide, kCompositionSide}, at::kByte);
  for (size_t i = 0; i < items.size(); ++i) {
    std::vector<at::Tensor> garments;
    for (const auto& o : items[i].objects) garments.push_back(split_images[o.source_index][0]);
    out[static_cast<int64_t>(i)].copy_(render_composition(items[i].objects, garments));
  }
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f.flush()) throw DataError(fmt::format("{}: write failed", path.string()));
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream f(path);
  // eval_prompts.jsonl is read here for both text-conditioned sets, so the hint names both makers.
  if (!f)
    throw DataError(fmt::format("{}: cannot open (make the data set with `flowtrain data make-compositions`, or "
                                "`flowtrain data make-moving-fashion` for video shards)",
                                path.string()));
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

// ---- JSON --------------------------------------------------------------------------------------

std::string composition_json(const Composition& c, bool with_sources) {
  json objects = json::array();
  for (const auto& o : c.objects) {
    json j = {{"class", composition_class_names()[o.class_id]},
              {"class_id", o.class_id},
              {"color", composition_color_names()[o.color]},
              {"slot", composition_slot_names()[o.slot]}};
    if (with_sources && o.source_index >= 0) j["source_index"] = o.source_index;
    objects.push_back(j);
  }
  json line = {{"caption", c.caption}, {"heldout", c.heldout}, {"objects", objects}};
  return line.dump();
}

Composition parse_composition(const std::string& text, const std::string& where) {
  auto index_of = [&](const std::vector<std::string>& names, const std::string& value, const char* what) {
    auto it = std::find(names.begin(), names.end(), value);
    if (it == names.end()) throw DataError(fmt::format("{}: unknown {} '{}'", where, what, value));
    return static_cast<int64_t>(it - names.begin());
  };
  try {
    const json j = json::parse(text);
    Composition c;
    c.caption = j.at("caption").get<std::string>();
    c.heldout = j.value("heldout", false);
    for (const auto& o : j.at("objects")) {
      CompositionObject obj;
      obj.class_id = o.at("class_id").get<int64_t>();
      if (obj.class_id < 0 || obj.class_id >= 10) throw DataError(fmt::format("{}: class_id {} not in [0, 10)", where, obj.class_id));
      obj.color = index_of(composition_color_names(), o.at("color").get<std::string>(), "color");
      obj.slot = index_of(composition_slot_names(), o.at("slot").get<std::string>(), "slot");
      obj.source_index = o.value("source_index", int64_t{-1});
      c.objects.push_back(obj);
    }
    return c;
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: malformed composition JSON ({})", where, e.what()));
  }
}

// ---- rendering ---------------------------------------------------------------------------------

at::Tensor render_composition(const std::vector<CompositionObject>& objects, const std::vector<at::Tensor>& garments) {
  TORCH_CHECK(objects.size() == garments.size(), "render_composition: one garment per object");
  const at::Tensor colors = composition_colors();
  at::Tensor canvas = at::zeros({3, kCompositionSide, kCompositionSide}, at::kFloat);
  for (size_t i = 0; i < objects.size(); ++i) {
    const auto& o = objects[i];
    const at::Tensor grey = garments[i].to(at::kFloat).reshape({1, kSlotSide, kSlotSide});
    canvas.narrow(1, (o.slot / 2) * kSlotSide, kSlotSide)
        .narrow(2, (o.slot % 2) * kSlotSide, kSlotSide)
        .copy_(grey * colors[o.color].reshape({3, 1, 1}));
  }
  return canvas.round().clamp(0, 255).to(at::kByte);
}

// ---- the data set ------------------------------------------------------------------------------

void make_compositions(const CompositionsOptions& o) {
  fs::path out(o.out_dir);
  if (!out.has_filename()) out = out.parent_path();  // "DIR/": the staging directory goes beside DIR, not in it
  if (fs::exists(out)) throw DataError(fmt::format("{}: already exists (choose a new --out)", o.out_dir));
  if (o.num_train < 1 || o.num_eval < 1) throw DataError("make-compositions: --num-train and --num-eval must be >= 1");
  const ImageDataset train = load_fashion_mnist(o.fashion_dir, "train");
  const ImageDataset test = load_fashion_mnist(o.fashion_dir, "test");

  // Separate streams for the two splits: adding training samples never changes the evaluation set.
  SplitMix64 train_rng{splitmix64_mix(o.seed ^ 0x747261696eull)}, eval_rng{splitmix64_mix(o.seed ^ 0x6576616cull)};
  const auto train_classes = indices_by_class(train.labels), test_classes = indices_by_class(test.labels);
  std::vector<Composition> train_items, eval_items;
  for (int64_t i = 0; i < o.num_train; ++i) train_items.push_back(draw_composition(train_rng, train_classes, false));
  for (int64_t i = 0; i < o.num_eval; ++i)  // every 4th evaluation prompt holds a held-out pair
    eval_items.push_back(draw_composition(eval_rng, test_classes, i % 4 == 3));

  fs::path tmp = out;
  tmp += fmt::format(".partial-{}", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    std::string captions, train_jsonl, eval_jsonl, eval_txt;
    std::vector<std::string> caption_lines;
    for (const auto& c : train_items) {
      captions += c.caption + "\n";
      caption_lines.push_back(c.caption);
      train_jsonl += composition_json(c) + "\n";
    }
    for (const auto& c : eval_items) {
      eval_jsonl += composition_json(c, /*with_sources=*/false) + "\n";
      eval_txt += c.caption + "\n";
    }
    write_text(tmp / "captions.txt", captions);
    write_text(tmp / "train.jsonl", train_jsonl);
    write_text(tmp / "eval_prompts.jsonl", eval_jsonl);
    write_text(tmp / "eval_prompts.txt", eval_txt);
    write_safetensors((tmp / "train_images.safetensors").string(), {{"images", render_all(train_items, train.images)}});
    write_safetensors((tmp / "eval_images.safetensors").string(), {{"images", render_all(eval_items, test.images)}});
    write_text(tmp / "tokenizer.model", Tokenizer::train(caption_lines, o.vocab_size));
    const Tokenizer tokenizer((tmp / "tokenizer.model").string());
    json manifest = {{"format", "flowtrain-compositions"}, {"version", 1},       {"seed", o.seed},
                     {"num_train", o.num_train},           {"num_eval", o.num_eval}, {"side", kCompositionSide},
                     {"tokenizer_vocab_size", tokenizer.vocab_size()}, {"fashion_mnist_dir", fs::absolute(o.fashion_dir).string()}};
    write_text(tmp / "manifest.json", manifest.dump(2) + "\n");
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

CompositionSet load_compositions(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "eval") throw DataError("load_compositions: split must be train or eval, got " + split);
  const fs::path root(dir);
  const fs::path images_path = root / (split == "train" ? "train_images.safetensors" : "eval_images.safetensors");
  const fs::path jsonl_path = root / (split == "train" ? "train.jsonl" : "eval_prompts.jsonl");
  if (!fs::exists(images_path))
    throw DataError(fmt::format("{}: missing (make the data set with `flowtrain data make-compositions --out {}`)",
                                images_path.string(), dir));
  CompositionSet set;
  const SafetensorsReader reader(images_path.string());
  if (!reader.contains("images")) throw DataError(fmt::format("{}: no tensor 'images'", images_path.string()));
  set.images = reader.get("images");
  if (set.images.scalar_type() != at::kByte || set.images.dim() != 4 || set.images.size(1) != 3)
    throw DataError(fmt::format("{}: 'images' must be uint8 [N, 3, H, W], got {} [{}]", images_path.string(),
                                c10::toString(set.images.scalar_type()), fmt::join(set.images.sizes(), ", ")));
  const auto lines = read_lines(jsonl_path);
  for (size_t i = 0; i < lines.size(); ++i)
    set.items.push_back(parse_composition(lines[i], fmt::format("{}:{}", jsonl_path.string(), i + 1)));
  if (static_cast<int64_t>(set.items.size()) != set.images.size(0))
    throw DataError(fmt::format("{} has {} lines but {} has {} images", jsonl_path.string(), set.items.size(),
                                images_path.string(), set.images.size(0)));
  return set;
}

std::vector<Composition> load_eval_prompts(const std::string& dir) {
  const fs::path path = fs::path(dir) / "eval_prompts.jsonl";
  const auto lines = read_lines(path);
  std::vector<Composition> items;
  for (size_t i = 0; i < lines.size(); ++i)
    items.push_back(parse_composition(lines[i], fmt::format("{}:{}", path.string(), i + 1)));
  return items;
}

std::vector<std::string> load_eval_captions(const std::string& dir) {
  const fs::path path = fs::path(dir) / "eval_prompts.jsonl";
  const auto lines = read_lines(path);
  std::vector<std::string> captions;
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      captions.push_back(json::parse(lines[i]).at("caption").get<std::string>());
    } catch (const json::exception& e) {
      throw DataError(fmt::format("{}:{}: {}", path.string(), i + 1, e.what()));
    }
  }
  return captions;
}

}  // namespace flowtrain::data
