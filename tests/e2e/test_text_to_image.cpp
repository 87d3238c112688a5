// Text-to-image end to end through the CLI: make a compositions set, train Flux with the built-in
// text path, resume bit for bit, sample from prompts, export the two parts, start a run from the
// exported transformer, and score prompt following.
#include "cli_runner.h"
#include "data/compositions.h"
#include "data/png.h"
#include "data/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

// One set for the binary: 800 training canvases, 40 evaluation prompts.
const std::string& t2i_data() {
  static const std::string dir = [] {
    const std::string d = scratch_dir("t2i_data") + "/set";
    auto r = run_flowtrain("data make-compositions --out " + d + " --num-train 800 --num-eval 40 --seed 1 --fashion-mnist " +
                           fashion_mnist_dir());
    if (r.exit_code != 0) ADD_FAILURE() << r.output;
    return d;
  }();
  return dir;
}

CommandResult train_t2i(const std::string& out_dir, const std::vector<std::string>& sets = {}) {
  std::string args = "train -c " + source_path("tests/configs/tiny_t2i.yaml") + " --set run.out_dir=" + out_dir +
                     " --set data.path=" + t2i_data();
  for (const auto& s : sets) args += " --set " + s;
  return run_flowtrain(args);
}

std::string config_args(const std::string& run) { return "-c " + run + "/config.yaml"; }

}  // namespace

TEST(TextToImage, TrainsResumesBitForBitSamplesFromPromptsAndExportsTwoParts) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("t2i_run");
  auto r = train_t2i(run, {"checkpoint.every=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(run);
  ASSERT_EQ(rows.size(), 40u);
  // The zero-initialised model starts near E[(ε − x0)²] ≈ 1.9 on these mostly black canvases; a
  // model that learns roughly halves it within 40 steps. A 25% drop fails a model that does not.
  const double first = mean_loss(rows, 0, 5), last = mean_loss(rows, 35, 40);
  EXPECT_LT(last, 0.75 * first) << "first 5 steps " << first << ", last 5 " << last;

  // Resume: 20 steps, then on to 40 — the same weights, EMA, optimizer and metrics as straight.
  const std::string resumed = scratch_dir("t2i_resumed");
  ASSERT_EQ(train_t2i(resumed, {"checkpoint.every=20", "train.steps=20"}).exit_code, 0);
  r = train_t2i(resumed, {"checkpoint.every=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"model.safetensors", "ema.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file(ckpt(run, 40) + "/" + f), read_file(ckpt(resumed, 40) + "/" + f)) << f;
  const auto again = read_metrics(resumed);
  ASSERT_EQ(again.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["loss"], again[i]["loss"]) << i;

  // Sampling from prompts: one PNG per line and sample, seeded (the same twice); a too-long
  // prompt is cut with a warning naming it; an empty line is the unconditional prompt.
  const std::string prompts = run + "/prompts.txt";
  std::string long_prompt = "a red sneaker in the top left";
  for (int i = 0; i < 8; ++i) long_prompt += " and a blue bag in the bottom right";
  write_file(prompts, "a red sneaker in the top left\n\n" + long_prompt + "\n");
  const std::string sample = "sample " + config_args(run) + " --checkpoint " + ckpt(run, 40) + " --prompts " + prompts +
                             " --per-prompt 2 --steps 3 --seed 5 --out ";
  r = run_flowtrain(sample + run + "/pngs --dump-inputs " + run + "/inputs.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("prompt 3 has more than model.text_len = 32 tokens"), std::string::npos) << r.output;
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(fs::exists(run + "/pngs/0000" + std::to_string(i) + ".png")) << i;
  EXPECT_FALSE(fs::exists(run + "/pngs/00006.png"));
  ASSERT_EQ(run_flowtrain(sample + run + "/pngs_again").exit_code, 0);
  EXPECT_EQ(read_file(run + "/pngs/00004.png"), read_file(run + "/pngs_again/00004.png"));
  // The dump holds the reference forward's arguments for the 6 conditional rows.
  const flowtrain::data::SafetensorsReader dump(run + "/inputs.safetensors");
  EXPECT_EQ(dump.shape("img"), (std::vector<int64_t>{6, 196, 48}));    // 14×14 tokens of 3·4·4
  EXPECT_EQ(dump.shape("img_ids"), (std::vector<int64_t>{6, 196, 3}));
  EXPECT_EQ(dump.shape("txt"), (std::vector<int64_t>{6, 32, 32}));
  EXPECT_EQ(dump.shape("txt_ids"), (std::vector<int64_t>{6, 32, 3}));
  EXPECT_EQ(dump.shape("y"), (std::vector<int64_t>{6, 32}));
  EXPECT_EQ(dump.shape("timesteps"), (std::vector<int64_t>{6}));
  EXPECT_EQ(dump.get("timesteps")[0].item<float>(), 1.0f);  // the first step starts at pure noise
  // Rows 2 and 3 are the empty prompt: the encoder's null input (zeros).
  EXPECT_EQ(dump.get("txt")[2].abs().max().item<float>(), 0.0f);
  EXPECT_EQ(dump.get("y")[3].abs().max().item<float>(), 0.0f);

  // Export: the transformer with the reference key names, the text encoder in its own file.
  const std::string flux_file = run + "/flux.safetensors", text_file = run + "/text_encoder.safetensors";
  r = run_flowtrain("export --checkpoint " + ckpt(run, 40) + " --out " + flux_file);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--text-encoder-out"), std::string::npos) << r.output;
  r = run_flowtrain("export --checkpoint " + ckpt(run, 40) + " --out " + flux_file + " --text-encoder-out " + text_file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const flowtrain::data::SafetensorsReader flux(flux_file), text(text_file);
  std::set<std::string> keys(flux.keys().begin(), flux.keys().end());
  for (const char* key : {"img_in.weight", "txt_in.weight", "time_in.in_layer.weight", "vector_in.out_layer.bias",
                          "double_blocks.0.img_attn.qkv.weight", "double_blocks.0.txt_attn.norm.key_norm.scale",
                          "double_blocks.0.img_mod.lin.weight", "single_blocks.1.linear1.weight",
                          "single_blocks.1.modulation.lin.weight", "final_layer.adaLN_modulation.1.weight"})
    EXPECT_TRUE(keys.count(key)) << key;
  for (const auto& k : flux.keys()) EXPECT_EQ(k.find("transformer."), std::string::npos) << k;
  EXPECT_TRUE(text.contains("token_embedding.weight"));
  EXPECT_TRUE(text.contains("layers.0.qkv.weight"));

  // --init-from the exported transformer: the new run's first loss differs from a fresh start's
  // (the text encoder starts fresh, the transformer from the file); a file of another size fails
  // before anything is written, naming the file, a key and both shapes.
  const std::string init = scratch_dir("t2i_init");
  r = run_flowtrain("train -c " + source_path("tests/configs/tiny_t2i.yaml") + " --set run.out_dir=" + init +
                    " --set data.path=" + t2i_data() + " --set train.steps=2 --init-from " + flux_file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(read_metrics(init)[0]["loss"], rows[0]["loss"]);
  const std::string bad = scratch_dir("t2i_init_bad");
  r = run_flowtrain("train -c " + source_path("tests/configs/tiny_t2i.yaml") + " --set run.out_dir=" + bad +
                    " --set data.path=" + t2i_data() + " --set model.context_dim=48 --init-from " +
                    flux_file);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(flux_file + ": does not fit the model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("txt_in.weight (file [64, 32], model [64, 48])"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(bad + "/checkpoints"));

  // Prompt following: the JSON with every key; the judge's ceiling on real canvases is high.
  r = run_flowtrain("eval " + config_args(run) + " --checkpoint " + ckpt(run, 40) + " --num 16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output.substr(r.output.rfind("{\"prompt_accuracy\"")));
  for (const char* key : {"prompt_accuracy", "object_accuracy", "class_accuracy", "color_accuracy", "position_accuracy",
                          "heldout_prompt_accuracy", "prompt_accuracy_ceiling", "fd", "fd_floor", "num"})
    EXPECT_TRUE(json.contains(key)) << key;
  EXPECT_EQ(json["num"], 16);
  // The classifier (> 90 % on Fashion-MNIST) reads both garments of most real canvases right.
  EXPECT_GT(json["prompt_accuracy_ceiling"].get<double>(), 0.6);
  // The held-out loss on every evaluation canvas: below the zero model's E[(ε − x0)²] = 1 + E[x0²]
  // (≤ 2, canvases in [−1, 1]), above 0 (the velocity cannot be predicted exactly).
  ASSERT_TRUE(json.contains("val_loss"));
  EXPECT_GT(json["val_loss"].get<double>(), 0.0);
  EXPECT_LT(json["val_loss"].get<double>(), 2.0);
  EXPECT_TRUE(fs::exists(ckpt(run, 40) + "/eval.json"));
  // --raw scores the raw weights (other samples than the EMA's: another FD) into its own file.
  r = run_flowtrain("eval " + config_args(run) + " --checkpoint " + ckpt(run, 40) + " --num 16 --raw");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("eval: raw weights"), std::string::npos) << r.output;
  const auto raw_json = nlohmann::json::parse(read_file(ckpt(run, 40) + "/eval-raw.json"));
  EXPECT_NE(raw_json["fd"].get<double>(), json["fd"].get<double>());
  EXPECT_NE(raw_json["val_loss"].get<double>(), json["val_loss"].get<double>());  // the loss of other weights
  EXPECT_EQ(nlohmann::json::parse(read_file(ckpt(run, 40) + "/eval.json"))["fd"].get<double>(),
            json["fd"].get<double>());
}

TEST(TextToImage, MismatchedDataAndModelsFailWithOneClearError) {
  REQUIRE_DATA();
  // A text model on class labels, and a class model on captions.
  auto r = run_flowtrain("train -c " + source_path("tests/configs/tiny_t2i.yaml") + " --set run.out_dir=" +
                         scratch_dir("t2i_bad1") + " --set data.source=fashion_mnist --set data.path=" +
                         fashion_mnist_dir() + " --set model.in_channels=1 --set model.image_size=28");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("'model.arch' flux is conditioned on text"), std::string::npos) << r.output;
  r = run_flowtrain("train -c " + source_path("tests/configs/tiny_fashion.yaml") + " --set run.out_dir=" +
                    scratch_dir("t2i_bad2") + " --set data.source=compositions --set data.path=" + t2i_data() +
                    " --set model.in_channels=3 --set model.image_size=56");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("data.source 'compositions' has captions"), std::string::npos) << r.output;
  // Precomputed embeddings that are not there, then of the wrong width.
  r = train_t2i(scratch_dir("t2i_bad3"), {"model.text_encoder_layers=0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("text_embeddings.safetensors does not exist"), std::string::npos) << r.output;
  // Precomputed embeddings (one row per training caption) train Flux without the encoder; a file
  // of another width fails before training, naming the file, the key and both shapes.
  const std::string precomputed = scratch_dir("t2i_precomputed") + "/set";
  fs::copy(t2i_data(), precomputed);
  const int64_t n = 800;
  flowtrain::data::write_safetensors(precomputed + "/text_embeddings.safetensors",
                                     {{"txt", at::randn({n, 32, 32})}, {"vec", at::randn({n, 32})},
                                      {"txt_mask", at::ones({n, 32}, at::kBool)}});
  auto pre = [&](const std::string& out, std::vector<std::string> sets) {
    std::string args = "train -c " + source_path("tests/configs/tiny_t2i.yaml") + " --set run.out_dir=" + out +
                       " --set data.path=" + precomputed + " --set model.text_encoder_layers=0 --set train.steps=3";
    for (const auto& s : sets) args += " --set " + s;
    return run_flowtrain(args);
  };
  r = pre(scratch_dir("t2i_pre_ok"), {});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string wide = scratch_dir("t2i_pre_wide");
  r = pre(wide, {"model.context_dim=64"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("text_embeddings.safetensors: 'txt' has shape [800, 32, 32], the config needs [800, 32, 64]"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(wide + "/checkpoints"));
  // A vocabulary smaller than the tokenizer's.
  r = train_t2i(scratch_dir("t2i_bad4"), {"model.vocab_size=50"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("'model.vocab_size' is 50 but the tokenizer"), std::string::npos) << r.output;
}

TEST(TextToImage, TheDefaultConfigReportsFluxDevAndSchnellSizes) {
  // The default text-to-image config at the reference sizes: the transformer's count first (the
  // reference's 11.90B / 11.89B; 48 = 3·4·4 input features instead of 64 take 0.1M), the
  // built-in text encoder (width 4096 at these sizes) after it. No model is built.
  for (const auto& [size, count] : {std::pair<std::string, std::string>{"flux-dev", "(11.90B)"}, {"flux-schnell", "(11.89B)"}}) {
    auto r = run_flowtrain("config -c " + source_path("configs/fashion_t2i.yaml") + " --set model.size=" + size);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string first = r.output.substr(r.output.find("# model:"), 120);
    EXPECT_NE(first.find(count), std::string::npos) << first;
    EXPECT_NE(first.find("+ built-in text encoder"), std::string::npos) << first;
  }
}

TEST(TextToImage, TrainsOnMixedShapesFromShardsWithAspectRatioBuckets) {
  REQUIRE_DATA();
  // A folder of captioned PNGs in three shapes, packed; Flux trains on batches of one shape each
  // (its position ids follow the input), from the shards.
  const std::string base = scratch_dir("t2i_buckets");
  fs::create_directories(base + "/images");
  const int64_t shapes[3][2] = {{56, 56}, {44, 64}, {64, 44}};
  for (int i = 0; i < 24; ++i) {
    const auto* hw = shapes[i % 3];
    const std::string stem = base + "/images/" + std::to_string(100 + i);
    flowtrain::data::write_png(stem + ".png", at::randint(0, 256, {hw[0], hw[1], 3}, at::kByte));
    write_file(stem + ".txt", "a red sneaker in the top left");
  }
  auto packed = run_flowtrain("data pack --from folder:" + base + "/images --out " + base + "/shards --max-count 8");
  ASSERT_EQ(packed.exit_code, 0) << packed.output;
  const std::string run = base + "/run";
  auto r = train_t2i(run, {"data.source=shards", "data.shards=" + base + "/shards/train-{000000..000002}.tar",
                           "'data.buckets=[56x56, 44x64, 64x44]'", "data.batch_size=4", "data.workers=1",
                           "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(run);
  ASSERT_EQ(rows.size(), 6u);
  for (const auto& row : rows) EXPECT_TRUE(std::isfinite(row.at("loss").get<double>()));
  // DiT's positional embedding is fixed: buckets are refused for it, naming the key.
  auto dit = run_flowtrain("train -c " + source_path("tests/configs/tiny_fashion.yaml") + " --set run.out_dir=" + base +
                           "/dit --set data.source=shards --set data.shards=" + base +
                           "/shards/train-000000.tar --set 'data.buckets=[28x28]'");
  EXPECT_NE(dit.exit_code, 0);
  EXPECT_NE(dit.output.find("'data.buckets' needs a model whose position ids follow the image shape"),
            std::string::npos)
      << dit.output;
}
