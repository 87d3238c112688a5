// Fashion compositions (data/compositions.h) and the tokenizer made with them (data/tokenizer.h).
#include "data/compositions.h"
#include "data/fashion_mnist.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <filesystem>
#include <set>

namespace flowtrain::data {
namespace {

namespace fs = std::filesystem;

// One small data set for the whole binary: made once (about a second), read by every test.
const std::string& small_set() {
  static const std::string dir = [] {
    const std::string d = test::scratch_dir("compositions_small") + "/set";
    CompositionsOptions o;
    o.fashion_dir = test::fashion_mnist_dir();
    o.out_dir = d;
    o.num_train = 2000;
    o.num_eval = 200;
    o.seed = 7;
    make_compositions(o);
    return d;
  }();
  return dir;
}

TEST(Compositions, RenderTintsEachGarmentInItsSlotAndLeavesTheRestBlack) {
  const at::Tensor a = at::arange(28 * 28, at::kInt).remainder(256).to(at::kByte).reshape({28, 28});
  const at::Tensor b = at::full({28, 28}, 200, at::kByte);
  // An orange garment top right (slot 1), a cyan one bottom left (slot 2).
  const at::Tensor canvas = render_composition({{0, 7, 1}, {3, 5, 2}}, {a, b});
  ASSERT_EQ(canvas.sizes(), (std::vector<int64_t>{3, 56, 56}));
  const at::Tensor top_right = canvas.narrow(1, 0, 28).narrow(2, 28, 28).to(at::kFloat);
  EXPECT_TRUE(top_right[0].equal(a.to(at::kFloat)));                                  // R = grey × 1
  EXPECT_TRUE(top_right[1].equal(a.to(at::kFloat).mul(0.5).round()));                 // G = grey × 0.5, rounded
  EXPECT_EQ(top_right[2].abs().sum().item<float>(), 0.0f);                            // B = 0
  const at::Tensor bottom_left = canvas.narrow(1, 28, 28).narrow(2, 0, 28);
  EXPECT_EQ(bottom_left[0].sum().item<int64_t>(), 0);
  EXPECT_TRUE(bottom_left[1].equal(b));
  EXPECT_TRUE(bottom_left[2].equal(b));
  // The two other slots stay black.
  EXPECT_EQ(canvas.narrow(1, 0, 28).narrow(2, 0, 28).sum().item<int64_t>(), 0);
  EXPECT_EQ(canvas.narrow(1, 28, 28).narrow(2, 28, 28).sum().item<int64_t>(), 0);
}

TEST(Compositions, JsonRoundTripsAndNamesTheLineOnBadInput) {
  Composition c;
  c.caption = "a red sneaker in the top left";
  c.objects = {{7, 0, 0, 12}};
  c.heldout = true;
  const std::string line = composition_json(c);
  EXPECT_NE(line.find(R"("class":"sneaker","class_id":7,"color":"red","slot":"top_left")"), std::string::npos) << line;
  const Composition back = parse_composition(line, "x.jsonl:1");
  EXPECT_EQ(back.caption, c.caption);
  EXPECT_TRUE(back.heldout);
  ASSERT_EQ(back.objects.size(), 1u);
  EXPECT_EQ(back.objects[0].class_id, 7);
  EXPECT_EQ(back.objects[0].source_index, 12);
  EXPECT_DATA_ERROR(parse_composition(R"({"caption":"x","objects":[{"class_id":1,"color":"mauve","slot":"top_left"}]})",
                                      "x.jsonl:3"),
                    "x.jsonl:3: unknown color 'mauve'");
  EXPECT_DATA_ERROR(parse_composition("{not json", "x.jsonl:4"), "x.jsonl:4: malformed composition JSON");
}

TEST(Compositions, TheDataSetIsDeterministicConsistentAndKeepsHeldOutPairsOutOfTraining) {
  REQUIRE_DATA();
  const CompositionSet train = load_compositions(small_set(), "train");
  const CompositionSet eval = load_compositions(small_set(), "eval");
  ASSERT_EQ(train.images.size(0), 2000);
  ASSERT_EQ(eval.images.size(0), 200);
  const ImageDataset fashion_train = load_fashion_mnist(test::fashion_mnist_dir(), "train");
  int64_t two_objects = 0;
  for (size_t i = 0; i < train.items.size(); ++i) {
    const auto& item = train.items[i];
    ASSERT_TRUE(item.objects.size() == 1 || item.objects.size() == 2);
    two_objects += item.objects.size() == 2;
    std::vector<at::Tensor> garments;
    for (const auto& o : item.objects) {
      EXPECT_FALSE(is_held_out(o.class_id, o.color)) << item.caption;
      EXPECT_EQ(fashion_train.labels[o.source_index].item<int64_t>(), o.class_id);  // the garment is of its class
      // The caption names the colour (a palette word) of every object.
      EXPECT_NE(item.caption.find(composition_color_names()[o.color]), std::string::npos) << item.caption;
      garments.push_back(fashion_train.images[o.source_index][0]);
    }
    if (item.objects.size() == 2) {
      EXPECT_NE(item.objects[0].slot, item.objects[1].slot);
    }
    if (i < 50) {
      EXPECT_TRUE(train.images[i].equal(render_composition(item.objects, garments))) << i;
    }
  }
  EXPECT_GT(two_objects, 800);  // about half
  EXPECT_LT(two_objects, 1200);
  // Every 4th evaluation prompt holds a held-out pair; the others none.
  for (size_t i = 0; i < eval.items.size(); ++i) {
    bool has = false;
    for (const auto& o : eval.items[i].objects) has = has || is_held_out(o.class_id, o.color);
    EXPECT_EQ(has, i % 4 == 3) << eval.items[i].caption;
    EXPECT_EQ(eval.items[i].heldout, i % 4 == 3);
  }
  // eval_prompts.txt: the same captions, one a line.
  const std::string txt = test::read_file(small_set() + "/eval_prompts.txt");
  EXPECT_EQ(txt.substr(0, txt.find('\n')), eval.items[0].caption);

  // The same options make the same files.
  const std::string again = test::scratch_dir("compositions_again") + "/set";
  make_compositions({test::fashion_mnist_dir(), again, 2000, 200, 7, 256});
  for (const char* f : {"train.jsonl", "eval_prompts.jsonl", "train_images.safetensors", "tokenizer.model"})
    EXPECT_EQ(test::read_file(small_set() + "/" + f), test::read_file(again + "/" + f)) << f;
}

TEST(Compositions, AnExistingOutputIsRefusedAndNothingIsLeftBehind) {
  REQUIRE_DATA();
  const std::string dir = test::scratch_dir("compositions_exists");
  EXPECT_DATA_ERROR(make_compositions({test::fashion_mnist_dir(), dir, 10, 10, 0, 256}), "already exists");
  // A missing Fashion-MNIST directory fails before anything is written.
  const std::string out = test::scratch_dir("compositions_nodata") + "/set";
  EXPECT_DATA_ERROR(make_compositions({"/nonexistent/fashion", out, 10, 10, 0, 256}), "/nonexistent/fashion");
  EXPECT_FALSE(fs::exists(out));
  // "DIR/" is DIR: staged beside it and renamed, nothing else left in the parent.
  make_compositions({test::fashion_mnist_dir(), out + "/", 10, 10, 0, 256});
  EXPECT_TRUE(fs::exists(out + "/manifest.json"));
  int64_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(fs::path(out).parent_path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Tokenizer, EncodesCaptionsWithEndOfTextPadsMasksAndCuts) {
  REQUIRE_DATA();
  const Tokenizer tok(small_set() + "/tokenizer.model");
  EXPECT_LE(tok.vocab_size(), 256);
  EXPECT_GT(tok.vocab_size(), 40);  // every word of the captions a piece, at least
  const std::vector<int64_t> ids = tok.encode("a red sneaker in the top left");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), Tokenizer::kEosId);
  for (int64_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, tok.vocab_size());
    EXPECT_NE(id, Tokenizer::kUnkId);  // in-vocabulary words
  }
  // Words of the corpus are single pieces (BPE on a small vocabulary): 7 words + end of text.
  EXPECT_EQ(ids.size(), 8u);

  const auto batch = tok.encode_batch({"a red sneaker in the top left", "", "a blue bag"}, 6);
  ASSERT_EQ(batch.tokens.sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(batch.truncated, (std::vector<int64_t>{0}));  // 8 tokens cut to 6
  EXPECT_EQ(batch.mask[0].sum().item<int64_t>(), 6);
  EXPECT_EQ(batch.mask[1].sum().item<int64_t>(), 0);  // the empty prompt: no token at all
  EXPECT_EQ(batch.tokens[1].sum().item<int64_t>(), 0);
  EXPECT_EQ(batch.mask[2].sum().item<int64_t>(), 4);  // 3 words + end of text
  EXPECT_EQ(batch.tokens[2][3].item<int64_t>(), Tokenizer::kEosId);
  EXPECT_EQ(batch.tokens[2][4].item<int64_t>(), Tokenizer::kPadId);

  EXPECT_DATA_ERROR(Tokenizer(small_set() + "/train.jsonl"), "not a SentencePiece tokenizer model");
}

}  // namespace
}  // namespace flowtrain::data
