// The loader's order is a pure function of (seed, epoch); its state (epoch, position) resumes exactly.
#include "data/data_error.h"
#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

using namespace flowtrain::data;

namespace {

std::shared_ptr<const ImageDataset> numbered_dataset(int64_t n) {
  // image i is filled with i % 256 and labelled i, so a batch reveals which samples it holds
  auto d = std::make_shared<ImageDataset>();
  d->images = (at::arange(n, at::kLong) % 256).to(at::kByte).reshape({n, 1, 1, 1}).expand({n, 1, 2, 2}).contiguous();
  d->labels = at::arange(n, at::kLong);
  d->num_classes = n;
  return d;
}

std::vector<int64_t> ids(const Batch& b) {
  return std::vector<int64_t>(b.labels.data_ptr<int64_t>(), b.labels.data_ptr<int64_t>() + b.labels.numel());
}

}  // namespace

TEST(Loader, EpochOrderIsADeterministicPermutation) {
  auto a = epoch_order(1000, 42, 0), b = epoch_order(1000, 42, 0), c = epoch_order(1000, 42, 1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(epoch_order(1000, 43, 0), a);
}

TEST(Loader, WorkersDoNotChangeTheStreamAndEpochsDropTheRemainder) {
  auto data = numbered_dataset(103);
  LoaderOptions o;
  o.global_batch = 10;
  o.seed = 7;
  o.workers = 0;
  Loader sync(data, o);
  o.workers = 3;
  o.prefetch = 2;
  Loader threaded(data, o);
  std::set<int64_t> epoch0;
  for (int i = 0; i < 25; ++i) {
    Batch a = sync.next(), b = threaded.next();
    ASSERT_EQ(ids(a), ids(b)) << "batch " << i;
    if (i < 10) for (int64_t id : ids(a)) epoch0.insert(id);
  }
  EXPECT_EQ(epoch0.size(), 100u);  // 10 full batches, no repeats; 3 samples dropped
  EXPECT_EQ(sync.state(), (LoaderState{2, 50}));
  EXPECT_EQ(threaded.state(), sync.state());
  Batch b = sync.next();  // epoch 2, position 50
  auto order2 = epoch_order(103, 7, 2);
  EXPECT_EQ(ids(b), std::vector<int64_t>(order2.begin() + 50, order2.begin() + 60));
}

TEST(Loader, ResumeFromStateContinuesTheSameStream) {
  auto data = numbered_dataset(64);
  LoaderOptions o;
  o.global_batch = 8;
  o.workers = 2;
  Loader straight(data, o);
  for (int i = 0; i < 11; ++i) straight.next();
  const LoaderState saved = straight.state();
  EXPECT_EQ(saved, (LoaderState{1, 24}));
  Loader resumed(data, o, saved);
  for (int i = 0; i < 9; ++i) ASSERT_EQ(ids(straight.next()), ids(resumed.next()));
}

TEST(Loader, RanksSplitTheGlobalBatch) {
  auto data = numbered_dataset(40);
  LoaderOptions o;
  o.global_batch = 8;
  o.workers = 0;
  Loader whole(data, o);
  o.world = 2;
  o.rank = 0;
  Loader r0(data, o);
  o.rank = 1;
  Loader r1(data, o);
  for (int i = 0; i < 7; ++i) {
    auto all = ids(whole.next()), a = ids(r0.next()), b = ids(r1.next());
    a.insert(a.end(), b.begin(), b.end());
    ASSERT_EQ(all, a);
  }
}

TEST(Loader, ScalesPadsAndRejectsBadSetups) {
  auto data = numbered_dataset(20);
  LoaderOptions o;
  o.global_batch = 4;
  o.workers = 0;
  o.image_size = 4;  // 2×2 -> 4×4, padded with −1
  Loader loader(data, o);
  Batch b = loader.next();
  EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{4, 1, 4, 4}));
  EXPECT_FLOAT_EQ(b.images[0][0][0][0].item<float>(), -1.0f);
  const int64_t id = b.labels[0].item<int64_t>();
  EXPECT_NEAR(b.images[0][0][1][1].item<float>(), (id % 256) / 127.5 - 1.0, 1e-6);
  o.global_batch = 3;
  o.world = 2;
  EXPECT_THROW(Loader(data, o), DataError);
  o.world = 1;
  o.global_batch = 50;
  EXPECT_THROW(Loader(data, o), DataError);
}
