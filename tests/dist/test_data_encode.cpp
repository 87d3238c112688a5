// `flowtrain data encode` end to end: image+caption shards through the frozen FLUX stack (the
// small release of tests/frozen_fixture.h) on two ranks under `flowtrain launch`. A rank killed
// mid-shard (debug.inject.encode_kill_after) leaves finished shards and a temporary file; the
// rerun skips the finished ones and redoes the rest, and the result is byte for byte what one
// uninterrupted process writes: no shard lost or doubled. The latents are the autoencoder's of
// the bucketed image, a Flux run trains from the output as it is, and its samples are prompts
// through the frozen text encoders and latents through the autoencoder's decoder.
#include "cli_runner.h"
#include "data/png.h"
#include "data/safetensors.h"
#include "data/shards/buckets.h"
#include "data/shards/byte_stream.h"
#include "data/shards/shard_index.h"
#include "data/shards/tar.h"
#include "data/shards/webdataset.h"
#include "frozen_fixture.h"
#include "test_util.h"
#include "trainer/frozen/frozen_models.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace flowtrain {
namespace {
namespace fs = std::filesystem;
using test::run_flowtrain;

constexpr int kShards = 5, kSamplesPerShard = 5;

// Shards of RGB PNGs of assorted shapes with captions and a json; one sample's PNG is garbage.
void write_input_shards(const std::string& dir) {
  fs::create_directories(dir);
  torch::manual_seed(5);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{20, 20}, {14, 24}, {30, 18}, {16, 16}, {12, 22}};
  const std::vector<std::string> words = {"a red dress", "two blue sneakers", "a bag", "an ankle boot", "a grey coat"};
  for (int s = 0; s < kShards; ++s) {
    data::TarWriter w(dir + "/in-" + std::to_string(s) + ".tar");
    for (int i = 0; i < kSamplesPerShard; ++i) {
      const std::string key = "s" + std::to_string(s) + "_" + std::to_string(i);
      const auto [h, wd] = shapes[(s + i) % shapes.size()];
      const at::Tensor image = at::randint(0, 256, {h, wd, 3}, at::kByte);
      w.add(key + ".png", s == 2 && i == 3 ? std::string("not a png") : data::encode_png(image));
      w.add(key + ".txt", words[(s * 2 + i) % words.size()] + " on the left, sample " + key);
      w.add(key + ".json", "{\"id\": \"" + key + "\"}");
    }
    w.close();
  }
}

std::string write_config(const std::string& dir, const test::FrozenRelease& release) {
  const std::string path = dir + "/encode.yaml";
  std::ofstream(path) << "run:\n  name: encode\n  out_dir: " << dir << "/run\n  device: cpu\n  seed: 1\n"
                      << "model:\n  arch: flux\n  size: flux-tiny\n  hidden: 64\n  heads: 2\n  axes_dim: 8,12,12\n"
                      << "  depth: 1\n  depth_single: 1\n  context_dim: 32\n  vec_dim: 32\n  text_len: 16\n"
                      << "  text_encoder_layers: 0\n  patch: 2\n  image_size: 8\n  in_channels: 4\n"
                      << release.model_yaml(16)
                      << "data:\n  source: shards\n  image_member: latent\n  buckets: [8x8, 6x10]\n  batch_size: 4\n"
                      << "  workers: 1\n  shards: " << dir << "/encoded/in-{0..4}.tar\n"
                      << "train:\n  steps: 2\n  log_every: 1\n  threads: 1\n"
                      << "sample:\n  every: 0\ncheckpoint:\n  every: 0\n";
  return path;
}

std::vector<std::string> tar_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(DataEncode, TwoRanksResumeAfterAKillWithNoShardLostOrDoubledAndTrainingReadsTheOutput) {
  const std::string dir = test::scratch_dir("data_encode");
  write_input_shards(dir + "/in");
  const test::FrozenRelease release = test::write_frozen_release(dir + "/release");
  const std::string config = write_config(dir, release);
  const std::string inputs = " --in '" + dir + "/in/in-{0..4}.tar'";

  // One uninterrupted process: the reference output.
  auto r = run_flowtrain("data encode -c " + config + inputs + " --out " + dir + "/reference --batch 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 damaged skipped"), std::string::npos) << r.output;
  std::vector<std::string> expected;
  for (int s = 0; s < kShards; ++s) expected.push_back("in-" + std::to_string(s) + ".tar");
  expected.push_back("index.json");  // written once every shard is in place
  ASSERT_EQ(tar_files(dir + "/reference"), expected);

  // Two ranks; each is killed mid-way through its second shard.
  const std::string launch = "launch --nproc-per-node 2 -- data encode -c " + config + inputs + " --out " + dir +
                             "/encoded --batch 3";
  r = run_flowtrain(launch + " --set debug.allow_inject=true --set debug.inject.encode_kill_after=1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  std::vector<std::string> after_kill = tar_files(dir + "/encoded");
  const auto finished = std::count_if(after_kill.begin(), after_kill.end(),
                                      [](const std::string& n) { return n.size() > 4 && n.substr(n.size() - 4) == ".tar"; });
  EXPECT_GE(finished, 1);
  EXPECT_LT(finished, kShards);
  EXPECT_TRUE(std::any_of(after_kill.begin(), after_kill.end(),
                          [](const std::string& n) { return n.find(".tmp") != std::string::npos; }))
      << "the kill should land mid-write";
  EXPECT_FALSE(fs::exists(dir + "/encoded/index.json")) << "no index while shards are missing";

  r = run_flowtrain(launch);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already done"), std::string::npos) << r.output;
  ASSERT_EQ(tar_files(dir + "/encoded"), expected);  // and no temporary file left
  for (const std::string& name : expected)
    EXPECT_EQ(test::read_file(dir + "/encoded/" + name), test::read_file(dir + "/reference/" + name)) << name;
  // The index counts what each shard holds: 5 samples a shard, 4 in the one with the damaged PNG.
  const std::map<std::string, int64_t> counts = data::read_shard_index(dir + "/encoded/index.json");
  EXPECT_EQ(counts, (std::map<std::string, int64_t>{
                        {"in-0.tar", 5}, {"in-1.tar", 5}, {"in-2.tar", 4}, {"in-3.tar", 5}, {"in-4.tar", 5}}));

  // What a sample holds: the autoencoder's latent of its image fitted to the nearest bucket, T5's
  // embedding with its mask, CLIP's pooled vector, the caption and json; no image.
  data::SampleReader reader(data::open_shard(dir + "/reference/in-0.tar"));
  const std::optional<data::RawSample> first = reader.next();
  ASSERT_TRUE(first.has_value());
  std::set<std::string> members;
  for (const auto& [extension, bytes] : first->members) members.insert(extension);
  EXPECT_EQ(members, (std::set<std::string>{"json", "latent.safetensors", "txt", "txt_emb.safetensors", "vec.safetensors"}));
  const data::SafetensorsReader latent(first->members.at("latent.safetensors"), "latent");
  data::SampleReader input(data::open_shard(dir + "/in/in-0.tar"));
  const at::Tensor image = data::decode_png(input.next()->members.at("png"), "in-0 png").permute({2, 0, 1});
  const std::vector<data::Bucket> buckets = {{16, 16}, {12, 20}};  // 8x8 and 6x10 cells, 2 pixels each
  const at::Tensor fitted =
      data::fit_to_bucket(image, buckets[data::nearest_bucket(buckets, image.size(1), image.size(2))]);
  models::Autoencoder ae = trainer::load_autoencoder(release.autoencoder);
  const at::Tensor z = ae->encode(fitted.unsqueeze(0).to(at::kFloat).div(127.5).sub(1.0))[0];
  // The same function on the same input in the same process kind: only the batch around it
  // (the encoder ran on 3 samples) may change the summation order.
  EXPECT_TRUE(at::allclose(latent.get("latent"), z, 1e-5, 1e-6));
  const data::SafetensorsReader txt(first->members.at("txt_emb.safetensors"), "txt_emb");
  EXPECT_EQ(txt.get("txt").sizes(), (at::IntArrayRef{16, 32}));
  EXPECT_EQ(txt.get("txt_mask").scalar_type(), at::kBool);
  EXPECT_EQ(data::SafetensorsReader(first->members.at("vec.safetensors"), "vec").get("vec").sizes(), (at::IntArrayRef{32}));

  // The loader trains from the output unchanged, its sample counts from the index.
  r = run_flowtrain("train -c " + config);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_metrics(dir + "/run").size(), 2u) << r.output;
  EXPECT_EQ(r.output.find("have no index entry"), std::string::npos) << r.output;

  // Samples: the evaluation prompts through the frozen T5 and CLIP, the latents through the
  // autoencoder's decoder: a grid of 4 pixel images of 16×16 (8×8 latent cells, 2 pixels each)
  // in one row, 2 pixels of padding around each (an undecoded grid would be of 8×8 cells).
  fs::create_directories(dir + "/prompts");
  std::ofstream(dir + "/prompts/eval_prompts.jsonl") << "{\"caption\": \"a red dress on the left\"}\n"
                                                     << "{\"caption\": \"a bag\"}\n";
  r = run_flowtrain("train -c " + config + " --set run.out_dir=" + dir + "/sampled --set data.path=" + dir +
                    "/prompts --set sample.every=2 --set sample.num=4 --set checkpoint.every=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const at::Tensor grid = data::read_png(dir + "/sampled/samples/step-0000002.png");
  EXPECT_EQ(grid.sizes(), (at::IntArrayRef{20, 4 * 18 + 2, 3}));
  r = run_flowtrain("sample -c " + config + " --checkpoint " + test::ckpt(dir + "/sampled", 2) +
                    " --prompt 'an ankle boot' --out " + dir + "/boot.png");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(data::read_png(dir + "/boot.png").size(0), 20);
}

TEST(DataEncode, RefusesCollidingOutputsAndKeepsWhatADamagedTarHeld) {
  const std::string dir = test::scratch_dir("data_encode_bad");
  write_input_shards(dir + "/in");
  const test::FrozenRelease release = test::write_frozen_release(dir + "/release");
  const std::string config = write_config(dir, release);
  fs::create_directories(dir + "/other");
  fs::copy_file(dir + "/in/in-0.tar", dir + "/other/in-0.tar");
  // Two inputs of one name would write one output shard.
  auto r = run_flowtrain("data encode -c " + config + " --in " + dir + "/in/in-0.tar " + dir + "/other/in-0.tar --out " +
                         dir + "/out");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("have the same file name 'in-0.tar'"), std::string::npos) << r.output;
  // Outputs into the inputs' folder would be taken for finished.
  r = run_flowtrain("data encode -c " + config + " --in " + dir + "/in/in-1.tar --out " + dir + "/in");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is the folder of input"), std::string::npos) << r.output;
  // CLIP without T5 is not FLUX's conditioning.
  r = run_flowtrain("data encode -c " + config + " --set model.text_encoders.t5= --set model.text_encoders.t5_tokenizer= --in " +
                    dir + "/in/in-1.tar --out " + dir + "/out");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("needs both model.text_encoders.t5 and model.text_encoders.clip"), std::string::npos)
      << r.output;

  // A tar cut mid-way: the samples before the cut are encoded, the damage counted, the run goes on.
  const std::string cut = dir + "/cut/in-3.tar";
  fs::create_directories(dir + "/cut");
  const std::string bytes = test::read_file(dir + "/in/in-3.tar");
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  r = run_flowtrain("data encode -c " + config + " --in " + cut + " " + dir + "/in/in-4.tar --out " + dir + "/out");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("damaged after the samples before it"), std::string::npos) << r.output;
  int64_t kept = 0;
  data::SampleReader reader(data::open_shard(dir + "/out/in-3.tar"));
  while (reader.next()) ++kept;
  EXPECT_GE(kept, 1);
  EXPECT_LT(kept, kSamplesPerShard);
  EXPECT_TRUE(fs::exists(dir + "/out/in-4.tar"));
}

// Online encoding (trainer/frozen/online_encoding.h) trains on the same tensors as the
// precomputed path: the same seed over the raw image+caption shards, encoded in each step, and
// over their `data encode` output gives the same losses and gradient norms, step for step.
TEST(DataEncode, OnlineEncodingInTheStepTrainsAsThePrecomputedShardsDo) {
  const std::string dir = test::scratch_dir("data_encode_online");
  write_input_shards(dir + "/in");
  const test::FrozenRelease release = test::write_frozen_release(dir + "/release");
  const std::string config = write_config(dir, release);
  // Shards 0 and 1 have no damaged sample (shard 2 has), so both runs see the same samples.
  auto r = run_flowtrain("data encode -c " + config + " --in '" + dir + "/in/in-{0..1}.tar' --out " + dir +
                         "/encoded --batch 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string common = " --set train.steps=3 --set data.shards=" + dir + "/";
  r = run_flowtrain("train -c " + config + common + "encoded/in-{0..1}.tar --set run.out_dir=" + dir + "/precomputed");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_flowtrain("train -c " + config + common + "in/in-{0..1}.tar --set run.out_dir=" + dir +
                    "/online --set data.image_member=image --set data.text_member=caption");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("frozen encoders"), std::string::npos) << r.output;  // its own share of the step

  const auto precomputed = test::read_metrics(dir + "/precomputed"), online = test::read_metrics(dir + "/online");
  ASSERT_EQ(precomputed.size(), 3u);
  ASSERT_EQ(online.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    // Both fp32 on the CPU, the same images and captions; the encoders ran on other batches
    // (`data encode`'s 4 of mixed buckets vs the step's 4 of one bucket), which may reorder the
    // convolutions' sums (~1e-7 relative in a latent; 1.2e-7 in the loss when this was written).
    for (const char* key : {"loss", "grad_norm"})
      EXPECT_NEAR(online[i][key].get<double>(), precomputed[i][key].get<double>(),
                  1e-5 * std::abs(precomputed[i][key].get<double>()))
          << key << " at step " << i + 1;
    EXPECT_GT(online[i]["encode_s"].get<double>(), 0.0);
    EXPECT_EQ(precomputed[i]["encode_s"].get<double>(), 0.0);
  }

  // The checkpoint names the frozen files by content: a copy elsewhere resumes, an autoencoder with
  // one byte changed is refused with both files named.
  fs::copy_file(release.autoencoder, dir + "/copy.safetensors");
  std::string changed = test::read_file(release.autoencoder);
  changed.back() = static_cast<char>(changed.back() ^ 1);  // the last byte of the last tensor
  std::ofstream(dir + "/changed.safetensors", std::ios::binary) << changed;
  const std::string online_run = "train -c " + config + common + "in/in-{0..1}.tar --set run.out_dir=" + dir +
                                 "/online --set data.image_member=image --set data.text_member=caption";
  r = run_flowtrain(online_run + " --set train.steps=4 --set model.autoencoder=" + dir + "/changed.safetensors");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("was trained with 'model.autoencoder' " + release.autoencoder), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("this run's config names " + dir + "/changed.safetensors"), std::string::npos) << r.output;
  r = run_flowtrain(online_run + " --set train.steps=4 --set model.autoencoder=" + dir + "/copy.safetensors");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;

  // A model whose shapes do not fit the files is refused before anything is written, naming both.
  r = run_flowtrain("train -c " + config + common + "in/in-{0..1}.tar --set run.out_dir=" + dir +
                    "/bad --set data.image_member=image --set model.in_channels=16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'model.in_channels' is 16 but the autoencoder " + release.autoencoder), std::string::npos)
      << r.output;
  r = run_flowtrain("train -c " + config + common + "in/in-{0..1}.tar --set run.out_dir=" + dir +
                    "/bad --set data.text_member=caption --set model.text_len=8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'model.text_len' is 8 but model.text_encoders.t5_max_length is 16"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/bad"));
}

}  // namespace
}  // namespace flowtrain
