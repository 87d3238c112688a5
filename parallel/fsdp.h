// FSDP-style sharding (ZeRO-3 semantics) of a torch::nn::Module, in the way PyTorch's FSDP
// works mechanically (docs/design/parallel.md):
//
//  • A unit is a set of parameters: the stem (what runs before the first block: embedders), one
//    unit per transformer block, and the head (what runs after the last block: final layer).
//    Its trainable parameters are flattened, in registration order, into one buffer padded to a
//    multiple of the shard-group size N; rank r owns the fp32 master slice [r·S, (r+1)·S),
//    S = padded / N. The AdamW state and the EMA exist only for that slice.
//  • The module's parameters stay the module's own leaf tensors (so autograd, hooks and the
//    model code are unchanged), but their data are views into the unit's unsharded buffer
//    `full` in the compute dtype. Resharding releases that buffer's storage (the views and any
//    tensors autograd saved from them keep pointing at the same storage object); gathering
//    allocates it again and all-gathers the shards into it. This is FSDP1's storage-resize trick.
//  • Forward: the stem's and block 0's gathers are issued together; the stem is released when
//    block 0 starts (the embedders have run). Block i is gathered (usually already in flight),
//    block i+1's gather is issued, block i runs and is released (reshard_after_forward). The
//    head's gather is issued when the last block starts and waited for when it ends.
//  • Backward: a hook on block i's output fires when its gradient arrives, i.e. right before
//    block i's backward: re-gather block i, issue block i−1's gather (block 0 prefetches the
//    stem, which a hook on block 0's inputs waits for before the embedders' backward). A
//    post-accumulate-grad hook counts a unit's gradients; when the last one lands the unit is
//    released and its gradients are flattened (reduce dtype) and reduce-scattered (average over
//    the shard group) while the next unit's backward runs. At most kMaxReducesInFlight flat
//    gradient buffers exist at once: before a unit's buffer is made, the oldest reduction is
//    finished (waited for, its buffer freed) and its reduced shard starts its all-reduce over
//    the replicate group (HSDP), asynchronous too. On CUDA the host also waits for device
//    events so that no more buffers than that are still in use on the GPU (a rate limiter).
//    finish_backward() waits for what is still in flight and accumulates into the shards' .grad.
//
// Parameters with requires_grad = false (DiT's fixed pos_embed) are not sharded: every rank
// keeps its own copy, as a buffer would be.
//
// fp8 all-gather (FsdpOptions::fp8_weights; torchao's float8 all-gather): the weights of a unit
// that its fp8 linears read pre-cast form a sibling unit "<unit>.fp8", gathered, released and
// prefetched with its unit, reduced on its own (its gradients are ordinary). begin_forward
// computes one scale per such weight from its amax over every shard (one all-reduce MAX over
// the shard group for the whole model: every rank casts with the same scale, the one the
// unsharded weight would get); each gather casts the rank's fp32 master slice to e4m3 with those
// scales and all-gathers the bytes — a quarter of fp32's traffic, half of bf16's — into the
// linears' PrecastWeight slots. The parameters of those weights hold no data at all.
#pragma once

#include "models/linear.h"
#include "models/model.h"
#include "parallel/comm.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StorageImpl.h>
#include <torch/nn/module.h>

#include <deque>
#include <map>
#include <memory>
#include "parallel/reduction_fault.h"

#include <string>
#include <vector>

namespace flowtrain::parallel {


struct FsdpOptions {
  bool reshard_after_forward = true;
  bool prefetch = true;
  at::ScalarType compute_dtype = at::kFloat;  // dtype of the gathered weights
  at::ScalarType reduce_dtype = at::kFloat;   // dtype of the gradient reduce-scatter
  bool reduce_every_micro_batch = false;      // see set_gradient_sync
  // Context-parallel ranks in the shard group (parallel.cp). They saw different tokens of the
  // same samples, so their gradients are partial sums of one sample slice's gradient: summed,
  // while data-parallel ranks' gradients (other samples) are averaged. The reduce-scatter
  // averages over all dp_shard · cp members, then multiplies by cp.
  int64_t context_parallel = 1;
  ReductionFault fault = ReductionFault::None;
  // fp8 all-gather: parameter name ("blocks.3.attn.qkv.weight") → the slot its linear reads the
  // gathered fp8 weight from (models/fp8/fp8_linear.h gather_weight_in_fp8). Empty = off.
  std::map<std::string, std::shared_ptr<models::PrecastWeight>> fp8_weights;
};

// Where each parameter lives in its unit's flat buffer (also the checkpoint's layout record).
struct FsdpParamLayout {
  std::string name;             // full dotted name: blocks.3.attn.qkv.weight
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
};
struct FsdpUnitLayout {
  std::string name;  // "stem" | "blocks.3" | "head" (| "blocks.3.fp8": fp8 all-gather)
  int64_t numel = 0, padded_numel = 0, shard_numel = 0;
  std::vector<FsdpParamLayout> params;
};

// The elements of parameter `param` that shard `rank` of `unit` holds: [begin, begin + count) of
// that shard, the parameter's elements [begin + rank·shard_numel − offset, …); count is 0 when
// the shard misses the parameter.
struct ShardPart {
  int64_t begin = 0, count = 0;
};
ShardPart shard_part(const FsdpUnitLayout& unit, const FsdpParamLayout& param, int64_t rank);

class FullyShardedModule {
 public:
  // Flat gradient buffers (one unit's unsharded gradient each) alive at once during backward.
  static constexpr size_t kMaxReducesInFlight = 2;
  // CUDA: released gathers the device may still be using before a new gather waits for it.
  static constexpr size_t kMaxGathersAhead = 2;

  // `replicate` may be null (no HSDP). The module's current weights must be identical on every
  // rank (same seed); each rank keeps its slice. Throws std::invalid_argument naming a trainable
  // parameter that no prefix of the plan (or more than one) covers.
  FullyShardedModule(torch::nn::Module& module, const models::UnitPlan& plan, Comm& shard, Comm* replicate,
                     FsdpOptions options);
  ~FullyShardedModule();
  FullyShardedModule(const FullyShardedModule&) = delete;
  FullyShardedModule& operator=(const FullyShardedModule&) = delete;

  // --- the training step -------------------------------------------------------------------
  // Before every forward of the model (training or sampling), on every rank of the shard group:
  // fp8 all-gather's scales from the current shards (a collective), then gathers the stem and
  // starts block 0's gather.
  void begin_forward();
  // Runs block unit `index` (the model's UnitRunner calls this around each block); `inputs`
  // are the block's tensor inputs (block 0's are hooked to wait for the stem's re-gather).
  models::Tensors run_unit(int64_t index, const models::Tensors& inputs,
                           const std::function<models::Tensors()>& call);
  // false on all but the last micro-batch of a gradient-accumulation step: gradients then
  // accumulate unsharded and are reduced once (unless reduce_every_micro_batch).
  void set_gradient_sync(bool sync) { sync_ = sync; }
  // After loss.backward(): reduces what is pending, waits, fills the shards' .grad (fp32).
  void finish_backward();
  // Releases every gathered buffer (after sampling under no-grad, before swapping shards).
  void reshard_all();
  // The sum of every gradient element this rank fed to its reduce-scatters since the last call
  // (a device scalar; undefined when none): non-finite iff one of this rank's own gradients was,
  // before the reduction mixed them with the other ranks' — how a health report names the rank.
  at::Tensor take_local_gradient_sum();

  // --- the sharded state -------------------------------------------------------------------
  // In execution order: stem, blocks, head.
  const std::vector<FsdpUnitLayout>& layout() const { return layouts_; }
  // One fp32 master shard per unit (leaf tensors with .grad after finish_backward), for the
  // optimizer and the checkpoint; named by unit, in layout() order.
  std::vector<std::pair<std::string, at::Tensor>> named_shards() const;
  // Temporarily read weights from other shards (e.g. the EMA's) in forward; `shards` must match
  // named_shards() in order and shape. Swapping twice restores.
  void swap_shards(std::vector<at::Tensor>& shards);
  // Bytes this rank holds persistently: master shards + their gradients (not the transient
  // gathered buffers). For the memory report.
  int64_t shard_bytes() const;

  // Instrumentation for the overlap test: when set, events are appended in the order they
  // happen ("gather_issue blocks.3", "release stem", "forward_begin blocks.2", "forward_end
  // blocks.2", "backward_begin blocks.5", "reduce_issue blocks.5", "reduce_done blocks.5",
  // "backward_end").
  void set_event_log(std::vector<std::string>* log) { events_ = log; }

 private:
  struct Unit;
  // CPU: released unit buffers are kept by size and handed to the next gather of that size
  // instead of going back to malloc. Freed between activations, unit-sized blocks fragment
  // glibc's heap: at dp_shard 4 on DiT-S/2 the heap grew to 2.2× the live bytes without it
  // (docs/distributed.md). On CUDA the caching allocator already recycles by stream.
  at::DataPtr take_buffer(c10::StorageImpl& storage, size_t bytes);
  void keep_buffer(at::DataPtr buffer, size_t bytes);
  at::Tensor reduce_buffer(int64_t numel);  // a zeroed flat gradient buffer from the reduce slots
  // A unit with its fp8 sibling (the schedule's view) …
  void start_gather(Unit& u);
  void wait_gather(Unit& u);
  void release(Unit& u);
  // … and one flat buffer alone.
  void start_gather_one(Unit& u);
  void wait_gather_one(Unit& u);
  bool release_one(Unit& u);  // true when it was gathered
  // fp8 all-gather: every fp8 unit's per-weight scales from the shards' amaxes (all-reduce MAX),
  // and the e4m3 bytes of this rank's slice that a gather sends.
  void refresh_fp8_scales();
  at::Tensor fp8_gather_input(const Unit& u) const;
  void pre_backward(int64_t index);
  void on_grad_ready(Unit& u);
  void start_reduce(Unit& u);
  void finish_reduces(size_t max_in_flight);
  // CUDA: an event on the current stream at a buffer's last use, and the host-side wait that
  // keeps at most `keep` such buffers possibly still in use by the device. No-ops on the CPU.
  static void mark_device(std::deque<c10::Event>& marks, const c10::Device& device);
  static void wait_device_marks(std::deque<c10::Event>& marks, size_t keep);
  void finish_reduce(Unit& u);
  void accumulate_shard_grad(Unit& u, const at::Tensor& reduced);
  void event(const std::string& what);

  torch::nn::Module& module_;
  Comm& shard_;
  Comm* replicate_;
  FsdpOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;  // execution order: stem, blocks, head
  std::vector<Unit*> blocks_;
  Unit* stem_ = nullptr;  // null when the plan has no stem parameters
  Unit* head_ = nullptr;
  at::Tensor local_gradient_sum_;  // see take_local_gradient_sum()
  std::vector<FsdpUnitLayout> layouts_;
  std::deque<Unit*> reducing_;  // reduce-scatters in flight, oldest first
  std::deque<c10::Event> released_marks_, reduced_marks_;  // CUDA: see mark_device
  std::multimap<size_t, at::DataPtr> spare_buffers_;  // CPU: released gathered buffers, by bytes
  std::vector<at::Tensor> reduce_slots_;  // CPU: max_reduces_in_flight_ flat buffers of the largest unit
  size_t max_reduces_in_flight_ = kMaxReducesInFlight;  // doubled when units have fp8 siblings
  bool stem_backward_waited_ = false;  // block 0's input hooks have waited for the stem this backward
  size_t next_reduce_slot_ = 0;
  bool sync_ = true;
  std::vector<std::string>* events_ = nullptr;
};

}  // namespace flowtrain::parallel
