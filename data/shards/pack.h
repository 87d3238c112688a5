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

}  // namespace flowtrain::data
