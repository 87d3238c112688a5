// T5's tokenizer against transformers' own T5Tokenizer: tests/reference/make_golden.py (section
// t5tok) trained a SentencePiece model as T5's was and wrote 2,000 varied captions with the ids
// the reference gives them at max_length 32.
#include "data/t5_tokenizer.h"

#include "test_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace flowtrain {
namespace {

TEST(T5Tokenizer, GivesTheReferencesIdsOnTwoThousandCaptions) {
  const data::T5Tokenizer tokenizer(test::source_path("tests/reference/golden/t5_spiece.model"));
  EXPECT_EQ(tokenizer.pad_id(), 0);
  EXPECT_EQ(tokenizer.eos_id(), 1);
  std::ifstream in(test::source_path("tests/reference/golden/t5_tokenizer_cases.txt"));
  ASSERT_TRUE(in);
  std::string header, caption, ids_line;
  std::getline(in, header);
  constexpr int64_t kMaxLength = 32;  // the golden file's
  std::vector<std::string> captions;
  std::vector<std::vector<int64_t>> expected;
  while (std::getline(in, caption) && std::getline(in, ids_line)) {
    std::vector<int64_t> ids;
    std::stringstream numbers(ids_line);
    for (int64_t id; numbers >> id;) ids.push_back(id);
    captions.push_back(caption);
    expected.push_back(ids);
  }
  ASSERT_EQ(captions.size(), 2000u);
  int64_t mismatches = 0, cut = 0;
  for (size_t i = 0; i < captions.size(); ++i) {
    const std::vector<int64_t> ids = tokenizer.encode(captions[i], kMaxLength);
    if (ids != expected[i] && ++mismatches <= 5) ADD_FAILURE() << "caption " << i << ": \"" << captions[i] << "\"";
    cut += static_cast<int64_t>(expected[i].size()) == kMaxLength;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(cut, 100);  // long captions were cut, the end id kept last

  // The batch pads with 0 and masks the padding; a cut row is reported.
  size_t long_one = 0;
  while (long_one < captions.size() &&
         !(static_cast<int64_t>(expected[long_one].size()) == kMaxLength &&
           tokenizer.encode(captions[long_one], kMaxLength + 1).size() > kMaxLength))
    ++long_one;
  ASSERT_LT(long_one, captions.size());
  const std::vector<size_t> rows = {0, long_one};
  const data::T5Tokenizer::Batch batch = tokenizer.encode_batch({captions[0], captions[long_one]}, kMaxLength);
  for (int64_t row = 0; row < 2; ++row) {
    const std::vector<int64_t>& ids = expected[rows[row]];
    for (int64_t j = 0; j < kMaxLength; ++j) {
      const bool real = j < static_cast<int64_t>(ids.size());
      EXPECT_EQ(batch.ids[row][j].item<int64_t>(), real ? ids[j] : 0);
      EXPECT_EQ(batch.mask[row][j].item<bool>(), real);
    }
  }
  EXPECT_EQ(batch.truncated, (std::vector<int64_t>{1}));
}

TEST(T5Tokenizer, AFileThatIsNotAModelIsOneErrorNamingIt) {
  const std::string path = test::scratch_dir("t5tok_bad") + "/spiece.model";
  std::ofstream(path) << "not a model";
  try {
    data::T5Tokenizer tokenizer(path);
    FAIL() << "loaded a text file as a SentencePiece model";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flowtrain
