// Fashion compositions: an embedded text-to-image task whose prompts can only be followed by
// reading the text. Each sample is a 56×56 RGB canvas of four 28×28 slots (top-left, top-right,
// bottom-left, bottom-right) holding one or two Fashion-MNIST garments on black, each tinted one
// of 8 colours (pixel = grey value × colour), with a caption naming class, colour and place of
// every garment ("a red sneaker in the top left and a blue bag in the bottom right", "a cyan dress
// above a white sandal on the left", …) and its ground truth as JSON.
//
// `flowtrain data make-compositions --out DIR` writes, deterministically from (seed, counts):
//   DIR/train_images.safetensors   images uint8 [N, 3, 56, 56]  (garments of the train split)
//   DIR/train.jsonl                one sample's JSON a line, in the same order
//   DIR/captions.txt               the training captions (the tokenizer's corpus)
//   DIR/tokenizer.model            SentencePiece model trained on captions.txt (data/tokenizer.h)
//   DIR/eval_prompts.jsonl         evaluation prompts, garments of the test split:
//                                  {"caption", "heldout", "objects": [{"class", "class_id", "color", "slot"}]}
//   DIR/eval_prompts.txt           the same captions one a line (for `flowtrain sample --prompts`)
//   DIR/eval_images.safetensors    real canvases of the evaluation prompts (the judge's ceiling, FD floor)
//   DIR/manifest.json              counts, seed, format version
// A fixed list of (class, colour) pairs (held_out_pairs) never appears in training; evaluation
// prompts holding one are marked "heldout".
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace flowtrain::data {

inline constexpr int64_t kCompositionSide = 56, kSlotSide = 28, kNumSlots = 4, kNumColors = 8;

const std::vector<std::string>& composition_slot_names();   // top_left, top_right, bottom_left, bottom_right
const std::vector<std::string>& composition_color_names();  // red, green, blue, yellow, magenta, cyan, white, orange
// The colours as RGB multipliers in [0, 1], [8, 3] float; every colour's largest component is 1,
// so the brightest channel of a tinted pixel is the garment's grey value.
at::Tensor composition_colors();
// Fashion-MNIST's class names in lower case ("t-shirt/top", …, "sneaker", "bag", "ankle boot").
const std::vector<std::string>& composition_class_names();
// The (class id, colour id) pairs kept out of training.
const std::vector<std::pair<int64_t, int64_t>>& held_out_pairs();
bool is_held_out(int64_t class_id, int64_t color);

struct CompositionObject {
  int64_t class_id = 0, color = 0, slot = 0;
  int64_t source_index = -1;  // the garment's index in its Fashion-MNIST split (-1: unknown)
};

struct Composition {
  std::string caption;
  std::vector<CompositionObject> objects;  // 1 or 2, distinct slots
  bool heldout = false;                    // holds a held-out (class, colour) pair
};

// The JSON of one sample (source indices included when known) and its parser; throws DataError
// naming `where` on malformed lines.
std::string composition_json(const Composition& c, bool with_sources = true);
Composition parse_composition(const std::string& json_line, const std::string& where);

// The canvas of `objects` with their garments (uint8 [28, 28] each, in object order): uint8
// [3, 56, 56], garment grey × colour, rounded, in the object's slot; black elsewhere.
at::Tensor render_composition(const std::vector<CompositionObject>& objects, const std::vector<at::Tensor>& garments);

struct CompositionsOptions {
  std::string fashion_dir;  // Fashion-MNIST IDX files
  std::string out_dir;
  int64_t num_train = 30000, num_eval = 1000;
  uint64_t seed = 0;
  int64_t vocab_size = 256;  // upper bound of the tokenizer's pieces
};
// Writes the data set into a sibling temporary directory and renames it to out_dir at the end,
// so an interrupted run leaves nothing at out_dir. Throws DataError when out_dir exists.
void make_compositions(const CompositionsOptions& options);

// A split read back: "train" (train_images + train.jsonl) or "eval" (eval_images +
// eval_prompts.jsonl). Throws DataError naming the file on a missing or inconsistent file.
struct CompositionSet {
  at::Tensor images;  // uint8 [N, 3, 56, 56]
  std::vector<Composition> items;
};
CompositionSet load_compositions(const std::string& dir, const std::string& split);
// Evaluation prompts alone (eval_prompts.jsonl).
std::vector<Composition> load_eval_prompts(const std::string& dir);
// The "caption" of every line of DIR/eval_prompts.jsonl, whatever else the line holds (the
// compositions' objects, a moving-fashion clip's direction): the prompts sample grids are drawn
// from. Throws DataError naming the file and line.
std::vector<std::string> load_eval_captions(const std::string& dir);

}  // namespace flowtrain::data
