// The T5 v1.1 encoder against transformers' own T5EncoderModel: golden files written by
// tests/reference/make_golden.py (section t5).
#include "models/t5/t5.h"

#include "data/safetensors.h"
#include "reference_golden.h"
#include "test_util.h"
#include "trainer/checkpoint/state_dict.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace flowtrain {
namespace {

using models::T5Encoder;
using models::T5Options;

T5Options tiny_t5_options() {
  T5Options o;
  o.vocab_size = 64;
  o.d_model = 32;
  o.d_kv = 8;
  o.d_ff = 48;
  o.num_layers = 2;
  o.num_heads = 4;
  return o;
}

TEST(T5, XxlHasTheReferenceKeysShapesAndOrder) {
  // t5_xxl_keys.txt: T5EncoderModel's state_dict for google/t5-v1_1-xxl (meta device). Its
  // `encoder.embed_tokens.weight` is `shared.weight` tied: save_pretrained writes the one tensor
  // once, as shared.weight (t5_tiny.safetensors holds no other), so the module has only that.
  std::vector<std::string> expected;
  for (const std::string& line : test::golden_lines("t5_xxl_keys.txt"))
    if (line.rfind("encoder.embed_tokens.weight ", 0) != 0) expected.push_back(line);
  // 4.76B parameters: the shapes, not the tensors (built once per test run would be 19 GB).
  T5Options xxl = models::t5_xxl_options();
  EXPECT_EQ(models::t5_encoder_parameter_count(xxl), 4762310656);
  // The key list of a 2-layer model of XXL's widths per layer is the same pattern; check names and
  // shapes of the full model's first block, the stack's last keys and the layer count instead.
  xxl.num_layers = 1;
  xxl.vocab_size = 8;  // the embedding's rows are checked from the list below
  const T5Encoder one(xxl);
  const std::vector<std::string> actual = test::key_shape_lines(*one);
  ASSERT_EQ(actual.size(), 12u);
  EXPECT_EQ(actual[0], "shared.weight 8,4096");
  EXPECT_EQ(expected[0], "shared.weight 32128,4096");
  for (size_t i = 1; i + 1 < actual.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << i;  // block 0
  EXPECT_EQ(actual.back(), expected.back());  // encoder.final_layer_norm.weight
  EXPECT_EQ(expected.size(), 1 + 24 * 9 + 1 + 1);  // shared, 24 blocks of 9 (+ block 0's bias), final norm
}

TEST(T5, RelativePositionBucketsAreTheReferences) {
  // transformers' _relative_position_bucket(bidirectional=True, 32, 128) at these distances.
  const at::Tensor relative = at::tensor({-200, -128, -127, -20, -8, -7, -1, 0, 1, 7, 8, 20, 127, 128, 200}, at::kLong);
  const at::Tensor buckets = models::t5_relative_position_bucket(relative, 32, 128);
  const std::vector<int64_t> expected = {15, 15, 15, 10, 8, 7, 1, 0, 17, 23, 24, 26, 31, 31, 31};
  EXPECT_EQ(std::vector<int64_t>(buckets.data_ptr<int64_t>(), buckets.data_ptr<int64_t>() + buckets.numel()), expected);
}

TEST(T5, EncodesAsTheReferenceWithAndWithoutThePaddingMask) {
  T5Encoder t5(tiny_t5_options());
  trainer::load_weights_file(*t5, test::golden_path("t5_tiny.safetensors"), "");  // as save_pretrained wrote it
  const data::SafetensorsReader io(test::golden_path("t5_tiny_io.safetensors"));
  at::NoGradGuard no_grad;
  const at::Tensor ids = io.get("ids"), mask = io.get("mask");
  // Tolerance: fp32 both sides, the same GEMMs and softmax but possibly another summation order
  // (and the reference's GELU-tanh spelled out against ATen's): ~1e-7 relative per op over two
  // blocks. A missing bias, scaling, mask or norm is O(1) off.
  constexpr double kTolerance = 1e-5;
  EXPECT_LT(test::relative_max_error(t5(ids), io.get("hidden")), kTolerance);           // FLUX's: no mask
  EXPECT_LT(test::relative_max_error(t5(ids, mask), io.get("hidden_masked")), kTolerance);
  // The mask matters for the padded row only.
  EXPECT_GT(test::relative_max_error(t5(ids)[1], io.get("hidden_masked")[1]), 1e-3);
}

// The forms a T5 checkpoint comes in: save_pretrained's single file (the golden one), a file that
// also holds the tied copy of the embedding (or only it), and a sharded index as T5-XXL ships.
TEST(T5, LoadsTiedCopiesAndShardedCheckpoints) {
  const data::NamedTensors golden = data::read_safetensors(test::golden_path("t5_tiny.safetensors"));
  const data::SafetensorsReader io(test::golden_path("t5_tiny_io.safetensors"));
  const std::string dir = test::scratch_dir("t5_forms");
  const std::map<std::string, std::string> tied = {{models::kT5TiedEmbedding, "shared.weight"}};
  auto encodes_as_the_reference = [&](const std::string& path) {
    T5Encoder t5(tiny_t5_options());
    trainer::load_weights_file(*t5, path, "", tied);
    at::NoGradGuard no_grad;
    return test::relative_max_error(t5(io.get("ids")), io.get("hidden")) < 1e-5;
  };
  at::Tensor shared;
  for (const auto& [name, t] : golden)
    if (name == "shared.weight") shared = t;

  data::NamedTensors both = golden;
  both.emplace_back(models::kT5TiedEmbedding, shared.clone());
  data::write_safetensors(dir + "/both.safetensors", both);
  EXPECT_TRUE(encodes_as_the_reference(dir + "/both.safetensors"));
  T5Encoder untied(tiny_t5_options());  // without the tie, the copy is an unexpected key
  EXPECT_THROW(trainer::load_weights_file(*untied, dir + "/both.safetensors", ""), trainer::CheckpointError);

  data::NamedTensors only_copy;
  for (const auto& [name, t] : golden) only_copy.emplace_back(name == "shared.weight" ? models::kT5TiedEmbedding : name, t);
  data::write_safetensors(dir + "/only_copy.safetensors", only_copy);
  EXPECT_TRUE(encodes_as_the_reference(dir + "/only_copy.safetensors"));

  // Two shards and their index: block 0 and the embedding in one, the rest in the other.
  data::NamedTensors first, second;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [name, t] : golden) {
    const bool in_first = name == "shared.weight" || name.rfind("encoder.block.0.", 0) == 0;
    (in_first ? first : second).emplace_back(name, t);
    map[name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  data::write_safetensors(dir + "/model-00001-of-00002.safetensors", first);
  data::write_safetensors(dir + "/model-00002-of-00002.safetensors", second);
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump();
  EXPECT_TRUE(encodes_as_the_reference(dir + "/model.safetensors.index.json"));

  // A shard gone: one error naming it.
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  T5Encoder t5(tiny_t5_options());
  try {
    trainer::load_weights_file(*t5, dir + "/model.safetensors.index.json", "", tied);
    FAIL() << "loaded an index whose shard is missing";
  } catch (const trainer::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors does not exist"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flowtrain
