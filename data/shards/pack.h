// `flowtrain data pack`: writes a data set as WebDataset shards DIR/train-000000.tar, … plus
// DIR/index.json (shard_index.h), each shard written to .tmp and renamed, so an interrupted pack
// leaves whole shards only. Sources:
//   fashion-mnist        (--path, --split train|test) members .png (28×28 gray), .cls (the
//                        label), .txt (the class name as a caption)
//   folder:PATH          every .png / .jpg / .jpeg under PATH (sorted, recursively), bytes as they
//                        are, with a same-named .txt caption when there is one
//   compositions:PATH    a `flowtrain data make-compositions` directory's training canvases:
//                        .png (56×56 RGB), .txt (the caption), .json (the ground truth)
#pragma once

#include <cstdint>
#include <string>

namespace flowtrain::data {

struct PackOptions {
  std::string from;                     // fashion-mnist | folder:PATH | compositions:PATH
  std::string path;                     // fashion-mnist: the IDX directory
  std::string split = "train";          // fashion-mnist: train | test
  std::string out_dir;                  // created; must not hold shards already
  int64_t max_count = 10000;            // samples per shard
  int64_t max_size = int64_t{1} << 30;  // bytes per shard (a sample never spans shards)
  int64_t limit = 0;                    // pack only the first N samples (0: all)
};

struct PackResult {
  int64_t samples = 0, shards = 0;
  uint64_t bytes = 0;
  std::string pattern;  // DIR/train-{000000..00000N}.tar
};

// Throws DataError naming the source or file on bad input; never leaves a partial shard.
PackResult pack_shards(const PackOptions& options);

// `flowtrain data make-moving-fashion`: a synthetic video set as shards — a Fashion-MNIST garment
// (train split, shrunk to 16×16, tinted one of the compositions' 8 colours) moving one pixel a
// frame left, right, up or down across a black 32×32 frame. Members: `.mp4` (lossless H.264,
// data/video.h), `.txt` ("a red sneaker moving left"), `.cls` (the garment's class), `.json`
// ({"class", "class_id", "color", "direction", "source_index"}). A pure function of the options.
// Beside the shards: `tokenizer.model` (SentencePiece BPE of the training captions, for the
// built-in text encoder), `eval_prompts.jsonl` (one evaluation prompt a line: {"caption", "class",
// "class_id", "color", "direction", "source_index"}, garments from the test split),
// `eval_prompts.txt` (the captions) and `eval_clips.safetensors` ("clips": the real clips of those
// prompts, uint8 [M, T, 3, 32, 32], for the judge's ceiling), `manifest.json` (the options and the
// Fashion-MNIST directory the judge's classifier trains on).
struct MovingFashionOptions {
  std::string fashion_dir;  // Fashion-MNIST IDX files ("" = Debian's)
  std::string out_dir;
  int64_t num = 2000, frames = 16, fps = 8, max_count = 500;
  int64_t num_eval = 200;
  int64_t vocab_size = 128;  // upper bound on the tokenizer's pieces
  uint64_t seed = 0;
};
PackResult make_moving_fashion(const MovingFashionOptions& options);

// The side a moving-fashion garment is drawn at (the motion judge crops windows of it).
inline constexpr int64_t kMovingGarmentSide = 16;

// One moving-fashion clip: the 28×28 garment (uint8) shrunk to 16×16, tinted palette colour
// `color`, moving one pixel a frame (at most 16 in all) in `direction` (0 left, 1 right, 2 up,
// 3 down) across a black 32×32 frame: uint8 [frames, 32, 32, 3].
at::Tensor render_moving_clip(const at::Tensor& garment, int64_t color, int64_t direction, int64_t frames);
const std::vector<std::string>& moving_direction_names();  // left, right, up, down

}  // namespace flowtrain::data
