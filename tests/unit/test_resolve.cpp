// resolve(config, environment): what each "auto", 0 and −1 becomes where a run starts, and the
// rules that tie the config to the world, the GPUs and the cores, each failing with one error
// naming its keys and the environment.
#include "trainer/config/resolve.h"

#include <gtest/gtest.h>

#include <string>

namespace flowtrain::trainer {
namespace {

std::string resolve_error(const Config& c, const RunEnvironment& env) {
  try {
    resolve(c, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

RunEnvironment machines(int64_t world, int64_t ranks_per_node, int64_t gpus, int64_t cores) {
  RunEnvironment env;
  env.world = world;
  env.ranks_per_node = ranks_per_node;
  env.cuda_devices = gpus;
  env.cpu_cores = cores;
  return env;
}

TEST(Resolve, OneProcessOnTheCpuIsUnshardedAndUsesEveryCore) {
  const Config c = parse_config("data:\n  batch_size: 64\nmodel:\n  size: S\n", "cfg.yaml");
  const ResolvedRun r = resolve(c, machines(1, 1, 0, 8));
  EXPECT_EQ(r.device, c10::kCPU);
  EXPECT_FALSE(r.sharded);
  EXPECT_EQ(r.backend, "");
  EXPECT_EQ(r.mesh.dp_shard, 1);
  EXPECT_EQ(r.data_parallel, 1);
  EXPECT_EQ(r.micro_batch, 64);
  EXPECT_EQ(r.threads, 8);
  EXPECT_EQ(r.model.hidden, 384);  // DiT-S
  EXPECT_EQ(r.model.depth, 12);
  EXPECT_EQ(r.model.heads, 6);
  // parallel.fsdp on shards a one-rank run too (traces, tests)
  EXPECT_TRUE(resolve(parse_config("", "cfg.yaml", {"parallel.fsdp=on"}), machines(1, 1, 0, 8)).sharded);
}

TEST(Resolve, AWorldFillsTheMeshSplitsTheBatchAndSharesTheCores) {
  const Config c = parse_config("", "cfg.yaml",
                                {"data.batch_size=64", "train.grad_accum=2", "parallel.dp_replicate=2", "parallel.cp=2"});
  const ResolvedRun r = resolve(c, machines(8, 4, 0, 16));
  EXPECT_EQ(r.mesh.dp_shard, 2);  // −1: 8 / (2 replicas × cp 2)
  EXPECT_EQ(r.data_parallel, 4);
  EXPECT_TRUE(r.sharded);
  EXPECT_EQ(r.backend, "gloo");
  EXPECT_EQ(r.micro_batch, 8);  // 64 / (4 ranks × 2 micro-batches)
  EXPECT_EQ(r.threads, 4);      // 16 cores over 4 ranks a machine
  // train.threads, when given, is used as it is
  EXPECT_EQ(resolve(parse_config("", "cfg.yaml", {"train.threads=3"}), machines(8, 4, 0, 16)).threads, 3);
}

TEST(Resolve, GpusPickTheDeviceAndNccl) {
  const ResolvedRun r = resolve(parse_config("", "cfg.yaml"), machines(2, 2, 2, 16));
  EXPECT_EQ(r.device, c10::kCUDA);
  EXPECT_EQ(r.backend, "nccl");
  EXPECT_EQ(r.threads, 16);  // a GPU rank's CPU threads are not split
  EXPECT_EQ(resolve(parse_config("", "cfg.yaml", {"run.device=cpu"}), machines(2, 2, 2, 16)).backend, "gloo");
}

TEST(Resolve, EachBrokenRuleIsOneErrorNamingItsKeys) {
  EXPECT_EQ(resolve_error(parse_config("", "cfg.yaml", {"run.device=cuda"}), machines(1, 1, 0, 2)),
            "'run.device' is cuda but no CUDA device is available (use cpu or auto)");
  EXPECT_EQ(resolve_error(parse_config("", "cfg.yaml", {"parallel.backend=nccl"}), machines(2, 2, 0, 2)),
            "'parallel.backend' nccl needs CUDA tensors, but the run is on the CPU ('run.device' auto); use gloo or auto");
  EXPECT_EQ(resolve_error(parse_config("", "cfg.yaml", {"data.batch_size=10", "train.grad_accum=1"}), machines(4, 4, 0, 8)),
            "'data.batch_size' (10) must be divisible by 4 data-parallel ranks × 'train.grad_accum' (1)");
  EXPECT_EQ(resolve_error(parse_config("", "cfg.yaml", {"parallel.cp=4"}), machines(6, 1, 0, 8)),
            "world size 6 is not divisible by parallel.dp_replicate 1 × parallel.cp 4 (world 6 (1 per machine), 0 GPUs "
            "and 8 CPU cores a machine)");
  // At load time the world is unknown: the batch rule is checked at one data-parallel rank.
  EXPECT_THROW(parse_config("", "cfg.yaml", {"data.batch_size=10", "train.grad_accum=4"}), ConfigError);
}

}  // namespace
}  // namespace flowtrain::trainer
