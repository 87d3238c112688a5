// Config loading: every kind of bad input must produce a message that names where (file and
// line, or the --set), which key, and what was allowed; good input round-trips through to_yaml.
#include "trainer/builders.h"
#include "trainer/eval/sample_grid.h"
#include "trainer/family.h"
#include "trainer/run_conditioning.h"
#include "trainer/config/config.h"
#include "trainer/families/dit/dit_config.h"
#include "trainer/families/flux/flux_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace flowtrain::trainer {
namespace {

// gmock is not linked into the test binaries, so no HasSubstr: this prints both strings too.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// The ConfigError message of `fn`, failing the test if it does not throw one.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(yaml, "cfg.yaml", overrides); });
}

// Writes `yaml` to a scratch file and returns its path.
std::string config_file(const std::string& yaml) {
  const std::string path = test::scratch_dir("config") + "/run.yaml";
  test::write_file(path, yaml);
  return path;
}

std::string validate_error(const Config& c) {
  return error_of([&] { c.validate(); });
}

// ------------------------------------------------------------------------------------------
// Good input.

TEST(ConfigTest, EmptyFileGivesDefaults) {
  const std::string path = config_file("");
  const Config c = load_config(path);
  EXPECT_TRUE(diff_keys(c, Config{}).empty());
  EXPECT_EQ(c.source_path, path);
  EXPECT_EQ(c.optim.lr, 1e-4);
  EXPECT_EQ(c.train.steps, 1000);
  EXPECT_EQ(c.model.size, "S");
}

TEST(ConfigTest, CommentsAndEmptySectionsKeepDefaults) {
  const Config c = parse_config("# nothing set\noptim:\ntrain: {}\n", "cfg.yaml");
  EXPECT_TRUE(diff_keys(c, Config{}).empty());
}

TEST(ConfigTest, ReadsEveryTypeFromFile) {
  const Config c = load_config(config_file(
      "run:\n  name: mnist\n  device: cpu\n"
      "model:\n  size: tiny\n  learn_sigma: true\n  class_dropout: 0.25\n"
      "optim:\n  lr: 3e-4\n  warmup_steps: 100\n"
      "train:\n  steps: 20\n"));
  EXPECT_EQ(c.run.name, "mnist");
  EXPECT_EQ(c.run.device, DeviceChoice::cpu);
  EXPECT_EQ(c.model.size, "tiny");
  EXPECT_TRUE(c.model.family<families::DiTConfig>().learn_sigma);
  EXPECT_EQ(c.model.family<families::DiTConfig>().class_dropout, 0.25);
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.warmup_steps, 100);
  EXPECT_EQ(c.train.steps, 20);
  // Untouched keys keep their defaults.
  EXPECT_EQ(c.optim.beta2, 0.999);
  EXPECT_EQ(diff_keys(c, Config{}),
            (std::vector<std::string>{"run.name", "run.device", "model.size", "model.class_dropout", "model.learn_sigma",
                                      "optim.lr", "optim.warmup_steps", "train.steps"}));
}

TEST(ConfigTest, AllKeysListsEverySettingInFileOrder) {
  const std::vector<std::string> expected = {
      "run.name", "run.out_dir", "run.seed", "run.device",
      "model.arch", "model.size", "model.hidden", "model.depth", "model.heads", "model.mlp_ratio", "model.patch",
      "model.image_size", "model.frames", "model.in_channels", "model.autoencoder", "model.text_encoders.t5",
      "model.text_encoders.t5_tokenizer", "model.text_encoders.t5_max_length", "model.text_encoders.clip",
      "model.text_encoders.clip_tokenizer",
      // The families' own keys, in registration order (dit, flux, vae).
      "model.num_classes", "model.class_dropout", "model.learn_sigma",
      "model.depth_single", "model.context_dim", "model.vec_dim", "model.axes_dim", "model.theta", "model.text_len",
      "model.text_dropout", "model.text_encoder_layers", "model.text_encoder_heads", "model.vocab_size", "model.patch_t",
      "model.guidance", "model.ch_mult", "model.z_channels", "model.norm_groups", "model.kl_weight",
      "flow.timesteps", "flow.logit_mean", "flow.logit_std", "flow.shift", "flow.resolution_shift",
      "data.source", "data.path", "data.batch_size", "data.workers", "data.prefetch", "data.shards",
      "data.shard_list", "data.shard_index", "data.streams", "data.image_member", "data.text_member", "data.buckets", "data.video.frames", "data.video.fps",
      "data.shuffle_buffer",
      "data.on_error", "data.max_skip_fraction", "data.record_keys", "data.skip_batches", "data.fetch_retries", "data.fetch_timeout_s",
      "optim.lr", "optim.beta1", "optim.beta2", "optim.eps", "optim.weight_decay", "optim.warmup_steps",
      "optim.schedule", "optim.min_lr_ratio", "optim.grad_clip",
      "train.steps", "train.grad_accum", "train.precision", "train.ema_decay", "train.ema_warmup", "train.log_every", "train.threads",
      "train.tensorboard", "train.activation_checkpointing", "train.activation_checkpointing_every", "train.tf32",
      "train.init_from", "fp8.recipe", "fp8.emulate", "fp8.include", "fp8.exclude", "fp8.min_dim",
      "fp8.amax_history_len", "fp8.amax_reduce", "fp8.all_gather", "sample.every", "sample.num", "sample.steps", "sample.sampler", "sample.cfg_scale", "sample.seed",
      "checkpoint.every", "checkpoint.keep", "checkpoint.resume", "checkpoint.async", "checkpoint.on_error",
      "eval.every", "eval.num", "eval.steps", "eval.sampler", "eval.cfg_scale", "eval.seed", "eval.classifier_dir",
      "profile.enabled", "profile.start_step", "profile.num_steps", "profile.record_shapes", "profile.memory",
      "parallel.dp_replicate", "parallel.dp_shard", "parallel.cp", "parallel.cp_attention", "parallel.cp_ulysses",
      "parallel.fsdp",
      "parallel.reshard_after_forward",
      "parallel.prefetch", "parallel.reduce_dtype", "parallel.reduce_every_micro_batch", "parallel.backend",
      "parallel.timeout_s",
      "health.nonfinite", "health.max_skips", "health.spike", "health.spike_threshold", "health.spike_ratio",
      "health.spike_window", "health.warmup_steps", "health.straggler_ratio", "health.memory_growth_mib_per_1k",
      "health.memory_window", "health.throughput_drop", "health.throughput_patience", "health.telemetry_every",
      "debug.allow_inject", "debug.inject.nan_grad_step", "debug.inject.nan_grad_rank", "debug.inject.nan_grad_param",
      "debug.inject.spike_step", "debug.inject.spike_factor", "debug.inject.slow_rank", "debug.inject.slow_seconds",
      "debug.inject.slow_worker_seconds", "debug.inject.slow_from_step", "debug.inject.leak_mib_per_step", "debug.inject.reduction", "debug.inject.encode_kill_after",
      "debug.inject.checkpoint_pause"};
  EXPECT_EQ(all_keys(), expected);
}

// ------------------------------------------------------------------------------------------
// File-level errors.

TEST(ConfigTest, MissingFileNamesThePath) {
  const std::string path = test::scratch_dir("config") + "/nope.yaml";
  const std::string msg = error_of([&] { load_config(path); });
  EXPECT_TRUE(Contains(msg, path));
  EXPECT_TRUE(Contains(msg, "not found"));
}

TEST(ConfigTest, DirectoryInsteadOfFileIsAnError) {
  const std::string dir = test::scratch_dir("config");
  EXPECT_TRUE(Contains(error_of([&] { load_config(dir); }), dir));
}

TEST(ConfigTest, YamlSyntaxErrorHasFileLineAndColumn) {
  const std::string path = config_file("optim:\n  lr: [1, 2\ntrain:\n  steps: 3\n");
  const std::string msg = error_of([&] { load_config(path); });
  EXPECT_TRUE(Contains(msg, path + ":"));
  EXPECT_TRUE(Contains(msg, "YAML syntax error"));
  // "path:LINE:COL:" — a line and a column, both numbers.
  const std::string rest = msg.substr(path.size() + 1);
  ASSERT_FALSE(rest.empty());
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(rest[0]))) << msg;
  EXPECT_NE(rest.find(':'), std::string::npos);
}

TEST(ConfigTest, TopLevelMustBeAMap) {
  const std::string msg = parse_error("- run\n- model\n");
  EXPECT_TRUE(Contains(msg, "cfg.yaml:1: the top level must be a map of sections"));
  EXPECT_TRUE(Contains(msg, "got a list"));
}

TEST(ConfigTest, SectionMustBeAMap) {
  EXPECT_EQ(parse_error("run:\n  name: a\noptim: 5\n"), "cfg.yaml:3: 'optim' must be a map of keys, got '5'");
}

// ------------------------------------------------------------------------------------------
// Unknown keys.

TEST(ConfigTest, UnknownKeyNamesFileLineAndSuggestsNearest) {
  const std::string path = config_file("run:\n  name: x\noptim:\n  beta1: 0.9\n  lrr: 0.001\n");
  EXPECT_EQ(error_of([&] { load_config(path); }),
            path + ":5: unknown key 'optim.lrr' (did you mean 'optim.lr'?)");
}

TEST(ConfigTest, UnknownKeySuggestionHandlesSwappedLetters) {
  EXPECT_EQ(parse_error("optim:\n  weight_decya: 0\n"),
            "cfg.yaml:2: unknown key 'optim.weight_decya' (did you mean 'optim.weight_decay'?)");
}

TEST(ConfigTest, UnknownSectionSuggestsNearestSection) {
  EXPECT_EQ(parse_error("train:\n  steps: 3\noptm:\n  lr: 0.1\n"),
            "cfg.yaml:3: unknown key 'optm' (did you mean 'optim'?)");
}

TEST(ConfigTest, MisplacedKeySuggestsTheSectionThatHasIt) {
  EXPECT_EQ(parse_error("optim:\n  grad_accum: 2\n"),
            "cfg.yaml:2: unknown key 'optim.grad_accum' (did you mean 'train.grad_accum'?)");
}

TEST(ConfigTest, UnknownKeyFarFromEverythingListsTheSectionKeys) {
  const std::string msg = parse_error("flow:\n  completely_unrelated_setting: 1\n");
  EXPECT_TRUE(Contains(msg, "cfg.yaml:2: unknown key 'flow.completely_unrelated_setting'"));
  EXPECT_TRUE(Contains(msg, "timesteps, logit_mean, logit_std, shift"));
}

TEST(ConfigTest, DuplicateKeyIsRejected) {
  EXPECT_EQ(parse_error("optim:\n  lr: 0.1\n  lr: 0.2\n"),
            "cfg.yaml:3: duplicate key 'optim.lr' (first at line 2)");
  EXPECT_EQ(parse_error("optim:\n  lr: 0.1\noptim:\n  eps: 0.2\n"),
            "cfg.yaml:3: duplicate section 'optim' (first at line 1)");
}

// ------------------------------------------------------------------------------------------
// Wrong types.

TEST(ConfigTest, IntegerKeyRejectsWords) {
  const std::string path = config_file("train:\n  grad_accum: 1\n  steps: ten\n");
  EXPECT_EQ(error_of([&] { load_config(path); }),
            path + ":3: 'train.steps' must be an integer >= 1, got 'ten'");
}

TEST(ConfigTest, IntegerKeyRejectsFractions) {
  EXPECT_EQ(parse_error("data:\n  batch_size: 1.5\n"),
            "cfg.yaml:2: 'data.batch_size' must be an integer >= 1, got '1.5'");
}

TEST(ConfigTest, NumberKeyRejectsWords) {
  EXPECT_EQ(parse_error("optim:\n  lr: fast\n"), "cfg.yaml:2: 'optim.lr' must be a number in (0, 1], got 'fast'");
  EXPECT_TRUE(Contains(parse_error("optim:\n  lr: .nan\n"), "'optim.lr' must be a number"));
}

TEST(ConfigTest, BoolKeyAcceptsOnlyTrueOrFalse) {
  EXPECT_EQ(parse_error("model:\n  learn_sigma: yes\n"),
            "cfg.yaml:2: 'model.learn_sigma' must be true or false, got 'yes'");
  EXPECT_EQ(parse_error("model:\n  learn_sigma: 1\n"),
            "cfg.yaml:2: 'model.learn_sigma' must be true or false, got '1'");
}

TEST(ConfigTest, ListOrMapWhereScalarExpected) {
  EXPECT_EQ(parse_error("train:\n  steps: [1, 2]\n"), "cfg.yaml:2: 'train.steps' must be an integer >= 1, got a list");
  EXPECT_EQ(parse_error("run:\n  name:\n    a: 1\n"), "cfg.yaml:2: 'run.name' must be a non-empty string, got a map");
}

TEST(ConfigTest, NullValueIsAnError) {
  EXPECT_EQ(parse_error("train:\n  steps:\n"), "cfg.yaml:2: 'train.steps' must be an integer >= 1, got null");
}

// ------------------------------------------------------------------------------------------
// Out of range / not among the choices.

TEST(ConfigTest, OutOfRangeStatesTheAllowedRange) {
  EXPECT_EQ(parse_error("optim:\n  lr: 5\n"), "cfg.yaml:2: 'optim.lr' must be in (0, 1], got 5");
  EXPECT_EQ(parse_error("optim:\n  lr: 0\n"), "cfg.yaml:2: 'optim.lr' must be in (0, 1], got 0");
}

TEST(ConfigTest, RangesOfEveryShape) {
  struct Case {
    std::string yaml, expected;
  };
  const std::vector<Case> cases = {
      {"train:\n  steps: 0\n", "'train.steps' must be >= 1, got 0"},
      {"run:\n  seed: -1\n", "'run.seed' must be >= 0, got -1"},
      {"model:\n  class_dropout: 1\n", "'model.class_dropout' must be in [0, 1), got 1"},
      {"model:\n  mlp_ratio: 0\n", "'model.mlp_ratio' must be > 0, got 0"},
      {"flow:\n  logit_std: -0.5\n", "'flow.logit_std' must be > 0, got -0.5"},
      {"optim:\n  min_lr_ratio: 1.5\n", "'optim.min_lr_ratio' must be in [0, 1], got 1.5"},
      {"optim:\n  beta2: 1\n", "'optim.beta2' must be in [0, 1), got 1"},
      {"train:\n  ema_decay: 1.0\n", "'train.ema_decay' must be in [0, 1), got 1.0"},
      {"data:\n  workers: -2\n", "'data.workers' must be >= 0, got -2"},
      {"sample:\n  cfg_scale: -1\n", "'sample.cfg_scale' must be >= 0, got -1"},
      {"checkpoint:\n  keep: -1\n", "'checkpoint.keep' must be >= 0, got -1"},
  };
  for (const auto& c : cases) EXPECT_EQ(parse_error(c.yaml), "cfg.yaml:2: " + c.expected) << c.yaml;
}

TEST(ConfigTest, EnumStringsAreCheckedAgainstTheirChoices) {
  EXPECT_EQ(parse_error("flow:\n  timesteps: gauss\n"),
            "cfg.yaml:2: 'flow.timesteps' must be one of uniform|logit_normal, got 'gauss'");
  EXPECT_EQ(parse_error("sample:\n  sampler: rk4\n"), "cfg.yaml:2: 'sample.sampler' must be one of euler|heun, got 'rk4'");
  EXPECT_EQ(parse_error("train:\n  precision: fp16\n"),
            "cfg.yaml:2: 'train.precision' must be one of fp32|bf16, got 'fp16'");
  EXPECT_EQ(parse_error("optim:\n  schedule: linear\n"),
            "cfg.yaml:2: 'optim.schedule' must be one of constant|cosine, got 'linear'");
}

TEST(ConfigTest, RequiredStringsMustNotBeEmpty) {
  EXPECT_EQ(parse_error("run:\n  name: ''\n"), "cfg.yaml:2: 'run.name' must be a non-empty string, got ''");
}

// ------------------------------------------------------------------------------------------
// --set overrides.

TEST(ConfigTest, OverridesSetNumbersBoolsAndStrings) {
  const Config c = load_config(config_file("optim:\n  lr: 0.001\n"),
                               {"optim.lr=3e-4", "model.learn_sigma=true", "run.name=sweep-7", "train.steps=42",
                                "flow.timesteps=uniform", "run.out_dir='runs/with space'"});
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_TRUE(c.model.family<families::DiTConfig>().learn_sigma);
  EXPECT_EQ(c.run.name, "sweep-7");
  EXPECT_EQ(c.train.steps, 42);
  EXPECT_EQ(c.flow.timesteps, models::TimestepDistribution::Uniform);
  EXPECT_EQ(c.run.out_dir, "runs/with space");
}

TEST(ConfigTest, LaterOverrideWins) {
  const Config c = parse_config("", "cfg.yaml", {"train.steps=5", "train.steps=7"});
  EXPECT_EQ(c.train.steps, 7);
}

TEST(ConfigTest, OverrideIntoNullSection) {
  const Config c = parse_config("optim:\n", "cfg.yaml", {"optim.eps=1e-6"});
  EXPECT_EQ(c.optim.eps, 1e-6);
}

TEST(ConfigTest, OverrideUnknownKeySuggestsNearest) {
  EXPECT_EQ(parse_error("", {"optim.lrr=1"}), "--set optim.lrr=1: unknown key 'optim.lrr' (did you mean 'optim.lr'?)");
  EXPECT_EQ(parse_error("", {"optm.lr=1"}), "--set optm.lr=1: unknown key 'optm.lr' (did you mean 'optim.lr'?)");
}

TEST(ConfigTest, OverrideTypeAndRangeErrorsNameTheSet) {
  // The file value is fine; the override's is not, so the message must point at the --set.
  EXPECT_EQ(parse_error("train:\n  steps: 10\n", {"train.steps=ten"}),
            "--set train.steps=ten: 'train.steps' must be an integer >= 1, got 'ten'");
  EXPECT_EQ(parse_error("", {"optim.lr=5"}), "--set optim.lr=5: 'optim.lr' must be in (0, 1], got 5");
  EXPECT_EQ(parse_error("", {"model.learn_sigma=maybe"}),
            "--set model.learn_sigma=maybe: 'model.learn_sigma' must be true or false, got 'maybe'");
}

// A family's keys belong to the model section of configs of that family: set under another
// family they would do nothing, so they are an error naming whose key it is — except at the
// family's default, which resolved configs written before families had keys of their own carry.
TEST(ConfigTest, AFamilysKeysBelongToConfigsOfThatFamily) {
  EXPECT_EQ(parse_error("", {"model.text_len=7"}),
            "--set model.text_len=7: 'model.text_len' is a key of model.arch flux; this config's model.arch is dit");
  EXPECT_EQ(parse_error("model:\n  arch: flux\n  size: flux-tiny\n  num_classes: 10\n"),
            "cfg.yaml:4: 'model.num_classes' is a key of model.arch dit; this config's model.arch is flux");
  // model.arch decides, wherever it stands in the section and whether a file or --set gives it.
  const Config flux = parse_config("model:\n  text_len: 7\n  size: flux-tiny\n", "cfg.yaml", {"model.arch=flux"});
  EXPECT_EQ(flux.model.family<families::FluxConfig>().text_len, 7);
  EXPECT_EQ(flux.model.family<families::DiTConfig>().num_classes, 1000);  // the DiT's section untouched
  // At its family's default, a foreign key changes nothing and is accepted.
  const Config dit = parse_config("model:\n  text_len: 512\n  patch_t: 1\n", "cfg.yaml");
  EXPECT_TRUE(diff_keys(dit, Config{}).empty());
  // A family key is range-checked like any other, and a typo finds it.
  EXPECT_EQ(parse_error("", {"model.class_dropout=1"}),
            "--set model.class_dropout=1: 'model.class_dropout' must be in [0, 1), got 1");
  EXPECT_EQ(parse_error("", {"model.text_lne=7"}),
            "--set model.text_lne=7: unknown key 'model.text_lne' (did you mean 'model.text_len'?)");
}

TEST(ConfigTest, MalformedOverride) {
  EXPECT_EQ(parse_error("", {"optim.lr"}), "--set optim.lr: malformed override, expected section.key=value");
  EXPECT_EQ(parse_error("", {"lr=0.1"}), "--set lr=0.1: malformed override, expected section.key=value");
  EXPECT_EQ(parse_error("", {".lr=0.1"}), "--set .lr=0.1: malformed override, expected section.key=value");
  EXPECT_TRUE(Contains(parse_error("", {"run.name=[oops"}), "--set run.name=[oops: cannot parse the value"));
}

// ------------------------------------------------------------------------------------------
// to_yaml.

// Every field of a config of model.arch `arch` set to something other than its default, so a key
// that to_yaml forgot (or wrote but did not read back) shows up as a difference. For dit, all
// but model.arch and model.frames (a DiT is an image model); for flux, all but model.arch.
Config everything_changed(const std::string& arch = "dit") {
  Config c;
  c.run = {"r2", "/tmp/out dir", 7, DeviceChoice::cpu};
  c.model.arch = arch;
  c.model.hidden = 256;
  c.model.depth = 3;
  c.model.heads = 8;
  c.model.patch = 4;
  c.model.image_size = 28;
  c.model.in_channels = 1;
  c.model.mlp_ratio = 2.5;
  c.model.autoencoder = "/w/ae.safetensors";
  if (arch != "dit") {  // text encoders serve text-conditioned families only
    c.model.t5_encoder = "/w/text_encoder_2";
    c.model.t5_tokenizer = "/w/tokenizer_2/spiece.model";
    c.model.t5_max_length = 256;
    c.model.clip_encoder = "/w/text_encoder";
    c.model.clip_tokenizer = "/w/tokenizer";
  }
  if (arch == "dit") {
    c.model.size = "tiny";
    auto& dit = c.model.family<families::DiTConfig>();
    dit.num_classes = 10;
    dit.class_dropout = 0.15;
    dit.learn_sigma = true;
  } else {
    c.model.size = "flux-tiny";
    c.model.frames = 8;
    auto& flux = c.model.family<families::FluxConfig>();
    flux.patch_t = 2;
    flux.depth_single = 3;
    flux.context_dim = 48;
    flux.vec_dim = 24;
    flux.axes_dim = "8,12,12";
    flux.theta = 500;
    flux.text_len = 7;
    flux.text_dropout = 0.2;
    flux.text_encoder_layers = 3;
    flux.text_encoder_heads = 2;
    flux.vocab_size = 512;
    flux.guidance = 4.0;
  }
  c.flow = {models::TimestepDistribution::Uniform, -0.3, 0.7, 3.0, true};
  c.data = {DataSource::synthetic, "", 96, 0, 2, {"/d/a-{0..3}.tar", "pipe:cat /d/b.tar"}, "/d/list.txt", "/d/index.json",
            8, ImageMember::latent, TextMember::caption, {"56x56", "48x64"}, 16, 4.0, 64, DamagePolicy::fail, 0.25, true, {"7", "9-11"}, 2, 5.5};
  c.optim = {3e-4, 0.8, 0.95, 1e-6, 0.01, 50, ScheduleKind::cosine, 0.1, 0.0};
  c.train = {12345, 3, Precision::bf16, 0.999, false, 5, 2, false, parallel::RecomputePolicy::full, 2, false,
             "/tmp/init.safetensors"};
  c.fp8 = {models::fp8::Recipe::rowwise_gw_hp, true, {"blocks.*", "x.*"}, {"*.fc2"}, 64, 32,
           models::fp8::AmaxReduce::most_recent, true};
  c.sample = {0, 16, 20, models::SamplerKind::Heun, 4.0, 99};
  c.checkpoint = {100, 0, "never", /*async=*/false, SaveFailurePolicy::warn};
  c.eval = {250, 500, 10, models::SamplerKind::Euler, 2.0, 7, "/tmp/classifiers"};
  c.profile = {true, 4, 2, true, true};
  c.parallel = {2, 4, 4, CpAttentionChoice::hybrid, 2, FsdpChoice::on, false, false, Precision::bf16, true,
                BackendChoice::gloo, 30.5};
  c.health = {NonfinitePolicy::rollback, 3, SpikePolicy::skip, 5.0, 3.0, 50, 20, 2.0, 100, 500, 0.5, 2, 25};
  c.debug = {true, 7, 1, "blocks.0.mlp.fc1.weight", 9, 4.0, 1, 0.5, 0.25, 3, 1.5, parallel::ReductionFault::NoContextSum,
             "10:5:torn", 2};
  return c;
}

TEST(ConfigTest, ToYamlRoundTripsEveryField) {
  for (const Config& c : {Config{}, everything_changed("dit"), everything_changed("flux")}) {
    const std::string text = to_yaml(c);
    const Config back = parse_config(text, "resolved.yaml");
    EXPECT_EQ(diff_keys(c, back), std::vector<std::string>{}) << text;
    EXPECT_EQ(to_yaml(back), text);
  }
  // And every field of everything_changed() really differs from the defaults of its family.
  for (const std::string arch : {"dit", "flux"}) {
    Config defaults;
    defaults.model.arch = arch;
    const Config changed = everything_changed(arch);
    // model.arch stays; the DiT also keeps model.frames and the five text-encoder keys (they serve
    // text-conditioned families only).
    EXPECT_EQ(diff_keys(defaults, changed).size(), keys_of(changed).size() - (arch == "dit" ? 2 + 5 : 1)) << arch;
  }
  // Between families, a key of one family only is a difference.
  const std::vector<std::string> across = diff_keys(everything_changed("dit"), everything_changed("flux"));
  EXPECT_NE(std::find(across.begin(), across.end(), "model.num_classes"), across.end());
  EXPECT_NE(std::find(across.begin(), across.end(), "model.text_len"), across.end());
}

TEST(ConfigTest, ToYamlRoundTripsAwkwardValues) {
  Config c;
  c.run.name = "true";  // must stay a string, not turn into a bool
  c.run.out_dir = "123";
  c.data.path = "";
  c.checkpoint.resume = "null";
  c.optim.lr = 0.1 + 0.2;  // not exactly representable in few digits
  c.optim.eps = 1e-300;
  c.flow.logit_mean = -1.0 / 3.0;
  const Config back = parse_config(to_yaml(c), "resolved.yaml");
  EXPECT_EQ(diff_keys(c, back), std::vector<std::string>{}) << to_yaml(c);
  EXPECT_EQ(back.optim.lr, 0.1 + 0.2);
}

TEST(ConfigTest, ToYamlWritesEveryKeyWithHelp) {
  const std::string text = to_yaml(Config{});
  for (const auto& key : keys_of(Config{})) {
    const std::string name = key.substr(key.find('.') + 1);
    EXPECT_TRUE(Contains(text, "  " + name + ": ")) << key;
  }
  // Of the model section, a config has its own family's keys and no other's.
  EXPECT_TRUE(Contains(text, "  num_classes: 1000  # class labels (plus one null class)\n"));
  EXPECT_FALSE(Contains(text, "  text_len: "));
  Config flux;
  flux.model.arch = "flux";
  const std::string flux_text = to_yaml(flux);
  EXPECT_TRUE(Contains(flux_text, "  text_len: 512  # text tokens per sample\n"));
  EXPECT_FALSE(Contains(flux_text, "  num_classes: "));
  EXPECT_TRUE(Contains(text, "  lr: 1.0e-04  # peak learning rate\n"));
  EXPECT_TRUE(Contains(text, "# width; 0 = from size (resolves to 384)"));
}

TEST(ConfigTest, ToYamlOutputLoadsFromDisk) {
  for (const std::string arch : {"dit", "flux"}) {
    const std::string path = config_file(to_yaml(everything_changed(arch)));
    EXPECT_TRUE(diff_keys(load_config(path), everything_changed(arch)).empty()) << arch;
  }
}

// ------------------------------------------------------------------------------------------
// Size resolution.

TEST(ConfigTest, SizePresetsResolve) {
  struct Case {
    std::string size;
    int64_t depth, hidden, heads;
  };
  for (const Case& s : std::vector<Case>{{"tiny", 4, 128, 4}, {"S", 12, 384, 6}, {"B", 12, 768, 12},
                                         {"L", 24, 1024, 16}, {"XL", 28, 1152, 16}}) {
    const Config c = parse_config("model:\n  size: " + s.size + "\n", "cfg.yaml");
    EXPECT_EQ(c.model.resolved_depth(), s.depth) << s.size;
    EXPECT_EQ(c.model.resolved_hidden(), s.hidden) << s.size;
    EXPECT_EQ(c.model.resolved_heads(), s.heads) << s.size;
  }
}

TEST(ConfigTest, ExplicitDimensionsOverrideTheSize) {
  const Config c = parse_config("model:\n  size: B\n  hidden: 96\n  depth: 2\n", "cfg.yaml");
  EXPECT_EQ(c.model.resolved_hidden(), 96);
  EXPECT_EQ(c.model.resolved_depth(), 2);
  EXPECT_EQ(c.model.resolved_heads(), 12);  // still from B
}

TEST(ConfigTest, UnknownSizeIsRejected) {
  EXPECT_EQ(parse_error("model:\n  size: M\n"), "cfg.yaml:2: 'model.size' must be one of tiny|S|B|L|XL|flux-dev|flux-schnell|flux-small|flux-tiny|flux-ae|ae-small|ae-tiny, got 'M'");
  // A size of another family: the family's own check names it.
  EXPECT_EQ(parse_error("model:\n  size: flux-dev\n"),
            "cfg.yaml: 'model.size' 'flux-dev' is not a DiT size (one of tiny|S|B|L|XL)");
}

// ------------------------------------------------------------------------------------------
// Cross-field validation (Config::validate), both on a Config built in code and through a file.

TEST(ConfigValidateTest, DefaultsAreValid) { EXPECT_NO_THROW(Config{}.validate()); }

TEST(ConfigValidateTest, HiddenMustBeDivisibleByHeads) {
  Config c;
  c.model.heads = 5;  // S: hidden 384
  EXPECT_EQ(validate_error(c), "'model.hidden' (384, from model.size) must be divisible by 'model.heads' (5)");
  c.model.hidden = 100;
  c.model.heads = 0;
  EXPECT_EQ(validate_error(c), "'model.hidden' (100) must be divisible by 'model.heads' (6, from model.size)");
}

TEST(ConfigValidateTest, HiddenMustBeDivisibleByFour) {
  Config c;
  c.model.hidden = 6;
  c.model.heads = 3;
  c.model.patch = 1;  // 1×1×4 values a patch: narrower than hidden 6
  EXPECT_TRUE(Contains(validate_error(c), "'model.hidden' (6) must be divisible by 4"));
}

TEST(ConfigValidateTest, HiddenMustHoldAPatch) {
  // 14×14 RGB patches are 588 values: a hidden width of 192 leaves 396 dimensions of noise unseen.
  Config c;
  c.model.arch = "flux";
  c.model.size = "flux-small";
  c.model.image_size = 56;
  c.model.in_channels = 3;
  c.model.patch = 14;
  EXPECT_EQ(validate_error(c), "'model.hidden' (192, from model.size) is narrower than a patch's 588 values "
                               "('model.patch' 14² × 'model.in_channels' 3): the model could never remove the noise "
                               "in the other 396 dimensions; use a wider model.hidden or a smaller model.patch");
  c.model.patch = 7;  // 147 values: the default config's
  EXPECT_NO_THROW(c.validate());
}

TEST(ConfigValidateTest, ImageSizeMustBeDivisibleByPatch) {
  Config c;
  c.model.image_size = 30;
  c.model.patch = 4;
  EXPECT_EQ(validate_error(c), "'model.image_size' (30) must be divisible by 'model.patch' (4)");
}

TEST(ConfigValidateTest, BatchSizeMustBeDivisibleByGradAccum) {
  Config c;
  c.data.batch_size = 10;
  c.train.grad_accum = 4;
  EXPECT_EQ(validate_error(c), "'data.batch_size' (10) must be divisible by 'train.grad_accum' (4)");
}

TEST(ConfigValidateTest, SampleNumMustBePositive) {
  Config c;
  c.sample.every = 100;
  c.sample.num = 0;
  EXPECT_EQ(validate_error(c), "'sample.num' must be >= 1, got 0");
}

TEST(ConfigValidateTest, ResumeMustBeAutoNeverOrAPath) {
  Config c;
  c.checkpoint.resume = "";
  EXPECT_EQ(validate_error(c), "'checkpoint.resume' must be a non-empty string, got ''");
  c.checkpoint.resume = "runs/a/ckpt-000100";
  EXPECT_NO_THROW(c.validate());
}

TEST(ConfigValidateTest, ChoicesAreCheckedForConfigsBuiltInCode) {
  Config c;
  // A word key is an enum: only a cast can put another value there, and the check names it.
  c.run.device = static_cast<DeviceChoice>(7);
  EXPECT_EQ(validate_error(c), "'run.device' must be one of auto|cpu|cuda, got enumerator 7");
  c = Config{};
  c.model.arch = "unet";
  EXPECT_EQ(validate_error(c), "'model.arch' must be one of dit|flux|vae, got 'unet'");
  c = Config{};
  c.data.source = static_cast<DataSource>(4);
  EXPECT_EQ(validate_error(c), "'data.source' must be one of fashion_mnist|compositions|synthetic|shards, got enumerator 4");
  c = Config{};
  c.model.size = "M";
  EXPECT_EQ(validate_error(c), "'model.size' must be one of tiny|S|B|L|XL|flux-dev|flux-schnell|flux-small|flux-tiny|flux-ae|ae-small|ae-tiny, got 'M'");
  c = Config{};
  c.optim.lr = 2;
  EXPECT_EQ(validate_error(c), "'optim.lr' must be in (0, 1], got 2.0");
}

TEST(ConfigValidateTest, CrossFieldErrorsFromAFileNameTheFile) {
  const std::string path = config_file("data:\n  batch_size: 10\ntrain:\n  grad_accum: 3\n");
  EXPECT_EQ(error_of([&] { load_config(path); }),
            path + ": 'data.batch_size' (10) must be divisible by 'train.grad_accum' (3)");
  // An override can create the inconsistency too.
  EXPECT_TRUE(Contains(error_of([&] { load_config(path, {"train.grad_accum=4"}); }), "'train.grad_accum' (4)"));
  EXPECT_NO_THROW(load_config(path, {"train.grad_accum=2"}));
}

TEST(ConfigTest, ContextParallelAttentionFollowsTheModelsTokensAndHeads) {
  // 2 heads; 32/2 = 16² = 256 tokens.
  auto kind = [](std::vector<std::string> sets) {
    sets.insert(sets.end(), {"model.size=tiny", "model.heads=2", "model.image_size=32", "model.patch=2"});
    const Config c = parse_config("", "cfg.yaml", sets);
    return std::string(parallel::name(context_attention_kind(c, *build_model(c.model))));
  };
  EXPECT_EQ(kind({"parallel.cp=2"}), "ulysses");  // 2 heads split over 2
  EXPECT_EQ(kind({"parallel.cp=4"}), "ring");     // …but not over 4
  EXPECT_EQ(kind({"parallel.cp=2", "parallel.cp_attention=ring"}), "ring");
  const std::string ulysses = error_of([&] { kind({"parallel.cp=4", "parallel.cp_attention=ulysses"}); });
  EXPECT_NE(ulysses.find("'parallel.cp_attention' ulysses needs the 2 heads to split over 'parallel.cp' 4"),
            std::string::npos)
      << ulysses;
  // 28/4 = 7² = 49 tokens do not split over 2.
  const std::string tokens = error_of([&] {
    const Config c = parse_config("", "cfg.yaml", {"model.image_size=28", "model.patch=4", "parallel.cp=2"});
    context_attention_kind(c, *build_model(c.model));
  });
  EXPECT_NE(tokens.find("'parallel.cp' 2 does not split the model's 49 tokens"), std::string::npos) << tokens;
  // Flux splits text and image on their own: 15 text + 49 image = 64 tokens split over 2 in
  // total, but neither stream does.
  const std::string streams = error_of([&] {
    const Config c = parse_config("", "cfg.yaml",
                                  {"model.arch=flux", "model.size=flux-tiny", "model.image_size=14", "model.patch=2",
                                   "model.in_channels=4", "model.text_len=15", "parallel.cp=2"});
    context_attention_kind(c, *build_model(c.model));
  });
  EXPECT_NE(streams.find("does not split the model's 64 tokens"), std::string::npos) << streams;
  EXPECT_NE(streams.find("each stream (15 + 49) is split on its own"), std::string::npos) << streams;
  // Hybrid: Ulysses over cp_ulysses adjacent ranks needs only the heads to split over those.
  EXPECT_EQ(kind({"parallel.cp=4", "parallel.cp_attention=hybrid", "parallel.cp_ulysses=2"}), "hybrid");
  const std::string hybrid_heads = error_of([&] {
    const Config c = parse_config("", "cfg.yaml",
                                  {"model.size=tiny", "model.heads=3", "model.hidden=48", "model.image_size=32",
                                   "model.patch=2", "parallel.cp=4", "parallel.cp_attention=hybrid",
                                   "parallel.cp_ulysses=2"});
    context_attention_kind(c, *build_model(c.model));
  });
  EXPECT_NE(hybrid_heads.find("hybrid needs the 3 heads to split over 'parallel.cp_ulysses' 2"), std::string::npos)
      << hybrid_heads;
}

TEST(ConfigTest, HybridContextParallelismNeedsAUlyssesDegreeBetweenOneAndCp) {
  const std::string unset = error_of([] { parse_config("", "cfg.yaml", {"parallel.cp=4", "parallel.cp_attention=hybrid"}); });
  EXPECT_TRUE(Contains(unset, "'parallel.cp_attention' hybrid needs 'parallel.cp_ulysses' to be a divisor of "
                              "'parallel.cp' 4 strictly between 1 and 4")) << unset;
  EXPECT_TRUE(Contains(error_of([] {
                         parse_config("", "cfg.yaml",
                                      {"parallel.cp=4", "parallel.cp_attention=hybrid", "parallel.cp_ulysses=4"});
                       }),
                       "got 4"));
  EXPECT_TRUE(Contains(error_of([] {
                         parse_config("", "cfg.yaml",
                                      {"parallel.cp=6", "parallel.cp_attention=hybrid", "parallel.cp_ulysses=4"});
                       }),
                       "got 4"));
  const std::string stray = error_of([] { parse_config("", "cfg.yaml", {"parallel.cp=4", "parallel.cp_ulysses=2"}); });
  EXPECT_TRUE(Contains(stray, "'parallel.cp_ulysses' 2 applies to 'parallel.cp_attention' hybrid only (it is 'auto')"))
      << stray;
  EXPECT_NO_THROW(
      parse_config("", "cfg.yaml", {"parallel.cp=4", "parallel.cp_attention=hybrid", "parallel.cp_ulysses=2"}));
}

TEST(ConfigTest, FluxSizesReportTheirCostWithoutBuildingAndNeedTextData) {
  // `flowtrain config` reports FLUX.1's size from the config alone (flux-dev is 47 GB in fp32).
  const Config dev = parse_config("", "cfg.yaml",
                                  {"model.arch=flux", "model.size=flux-dev", "model.in_channels=16", "model.patch=2",
                                   "model.image_size=64", "model.hidden=0", "model.depth=0", "model.heads=0"});
  const ModelCost cost = model_family("flux").cost(dev.model);
  EXPECT_EQ(cost.parameters, 11901408320);                  // the reference's count (tests/unit/test_flux.cpp)
  EXPECT_EQ(cost.tokens_per_sample, (64 / 2) * (64 / 2) + 512);  // image + text tokens
  // The axes must split the head dim: flux-tiny's head dim 32 is not 16+56+56.
  EXPECT_NE(error_of([] {
              parse_config("", "cfg.yaml", {"model.arch=flux", "model.size=flux-tiny", "model.axes_dim=16,56,56"});
            }).find("'model.axes_dim' (16,56,56) must sum to the head dim 32"),
            std::string::npos);
  // A text-conditioned family on a labelled data set: one error naming both keys.
  const std::string text = error_of([&] { run_conditioning(dev, nullptr); });
  EXPECT_NE(text.find("'model.arch' flux is conditioned on text, and data.source 'fashion_mnist'"), std::string::npos)
      << text;
}

}  // namespace

TEST(ConfigTest, NestedMapsSpellDottedKeys) {
  using namespace flowtrain::trainer;
  // data.video.frames as a nested map in a file, as a dotted key in a file, and in --set.
  EXPECT_EQ(parse_config("data:\n  video:\n    frames: 8\n    fps: 4\n", "cfg.yaml").data.video_frames, 8);
  EXPECT_EQ(parse_config("data:\n  video.frames: 6\n", "cfg.yaml").data.video_frames, 6);
  EXPECT_EQ(parse_config("", "cfg.yaml", {"data.video.fps=2.5"}).data.video_fps, 2.5);
  // Sample videos play at the rate the training clips were read at; the set's own rate is not
  // known here, so 0 plays at make-moving-fashion's 8.
  EXPECT_EQ(sample_video_fps(parse_config("", "cfg.yaml", {"data.video.fps=2"})), 2);
  EXPECT_EQ(sample_video_fps(parse_config("", "cfg.yaml", {"data.video.fps=0.4"})), 1);
  EXPECT_EQ(sample_video_fps(parse_config("", "cfg.yaml")), kDefaultSampleFps);
  EXPECT_EQ(parse_error("data:\n  video:\n    frame: 8\n"),
            "cfg.yaml:3: unknown key 'data.video.frame' (did you mean 'data.video.frames'?)");
}

TEST(ConfigTest, EveryShippedConfigLoadsAndValidates) {
  // configs/*.yaml and configs/bench/*.yaml are what users start from: each must parse, carry
  // only known keys and pass the cross-key checks (a video config's model.frames must equal its
  // data.video.frames, checked here directly since that check runs with the data).
  namespace fs = std::filesystem;
  int64_t checked = 0;
  for (const char* dir : {"configs", "configs/bench"}) {
    for (const auto& entry : fs::directory_iterator(fs::path(FLOWTRAIN_SOURCE_DIR) / dir)) {
      if (entry.path().extension() != ".yaml") continue;
      SCOPED_TRACE(entry.path().string());
      flowtrain::trainer::Config c;
      EXPECT_NO_THROW(c = flowtrain::trainer::load_config(entry.path().string()));
      if (c.model.frames > 1 && c.data.source == DataSource::shards) {
        EXPECT_EQ(c.data.video_frames, c.model.frames);
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 9);  // 5 in configs/, 4 in configs/bench/ when this was written
}

// The README's config reference is the schema's own output: to_yaml of the defaults, as
// `flowtrain config` prints it for an empty file, then each other family's model keys. Regenerate
// the blocks with
//   build/flowtrain config -c /dev/null | sed -e '/^#/d' -e '${/^$/d}'
//   build/flowtrain config -c /dev/null --set model.arch=flux --set model.size=flux-tiny
//   (the keys after model.in_channels)
// when a key is added, renamed or re-documented.
TEST(ConfigTest, TheReadmesConfigReferenceIsTheSchemasOutput) {
  const std::string readme = flowtrain::test::read_file(flowtrain::test::source_path("README.md"));
  const size_t section = readme.find("## Config reference");
  ASSERT_NE(section, std::string::npos) << "README.md has no '## Config reference' section";
  const std::string fence = "```yaml\n";
  const size_t begin = readme.find(fence, section);
  ASSERT_NE(begin, std::string::npos) << "no ```yaml block after '## Config reference'";
  const size_t end = readme.find("```", begin + fence.size());
  ASSERT_NE(end, std::string::npos);
  std::string yaml = flowtrain::trainer::to_yaml(flowtrain::trainer::Config{});
  while (yaml.rfind("#", 0) == 0) yaml.erase(0, yaml.find('\n') + 1);  // its title comment: the README has its own
  EXPECT_EQ(readme.substr(begin + fence.size(), end - begin - fence.size()), yaml);

  // Each other built-in family's own model keys, a block of their own after it, as `flowtrain
  // config` prints them for a config of that family (model: arch: ARCH).
  for (const std::string& arch : model_arch_names()) {
    if (arch == Config{}.model.arch) continue;
    Config c;
    c.model.arch = arch;
    const std::string resolved = to_yaml(c);
    std::string expected = fence + "model:\n  arch: " + arch + "  # model family\n";
    for (const auto& key : model_family(arch).keys) {
      const size_t at = resolved.find("\n  " + key.name + ": ");
      ASSERT_NE(at, std::string::npos) << key.name;
      expected += resolved.substr(at + 1, resolved.find('\n', at + 1) - at);
    }
    expected += "```";
    EXPECT_NE(readme.find(expected, end), std::string::npos)
        << "README.md's config reference lacks, or has another, block of model.arch " << arch << "'s keys:\n"
        << expected;
  }
}
}  // namespace flowtrain::trainer

namespace flowtrain::trainer {
TEST(ConfigTest, FrozenTextEncodersComeWithTheirTokenizersAndServeTextFamilies) {
  const std::string lone = parse_error("model:\n  arch: flux\n  size: flux-tiny\n  text_encoders:\n    t5: /w/t5\n");
  EXPECT_NE(lone.find("'model.text_encoders.t5' and 'model.text_encoders.t5_tokenizer' go together"), std::string::npos)
      << lone;
  const std::string dit =
      parse_error("model:\n  text_encoders:\n    clip: /w/clip\n    clip_tokenizer: /w/tokenizer\n");
  EXPECT_NE(dit.find("model.arch dit reads no text; text encoders serve flux"), std::string::npos) << dit;
  // The autoencoder serves any family (a DiT on latents).
  EXPECT_EQ(parse_config("model:\n  autoencoder: /w/ae.safetensors\n", "cfg.yaml").model.autoencoder, "/w/ae.safetensors");
}
}  // namespace flowtrain::trainer
