#include "parallel/fsdp.h"

#include "models/fp8/quantize.h"

#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace flowtrain::parallel {

struct FullyShardedModule::Unit {
  FsdpUnitLayout layout;
  std::vector<at::Tensor> params;  // the module's own parameters, in layout order
  at::Tensor shard;                // fp32 master slice [shard_numel], a leaf for the optimizer
  at::Tensor full;                 // [padded_numel] in the compute dtype; storage released when resharded
  bool gathered = false;
  WorkHandle gather_work;
  at::Tensor gather_input;
  WorkHandle reduce_work;
  at::Tensor reduce_input, reduce_output;  // the flat unsharded gradient and this rank's reduced slice
  WorkHandle replica_work;                 // HSDP all-reduce of `reduced`
  at::Tensor reduced;
  int64_t grads_ready = 0;
  bool backward_started = false;  // pre_backward has run since the unit's forward
  // fp8 all-gather. On an fp8 unit: `full` holds e4m3 bytes; one slot per parameter, and the
  // scales of the last begin_forward ([params] fp32). On the unit it belongs to: the sibling.
  bool fp8 = false;
  std::vector<std::shared_ptr<models::PrecastWeight>> slots;
  at::Tensor fp8_scales;
  Unit* fp8_sibling = nullptr;  // on the unit the fp8 weights belong to
  Unit* fp8_owner = nullptr;    // on the sibling: that unit
};

ShardPart shard_part(const FsdpUnitLayout& unit, const FsdpParamLayout& param, int64_t rank) {
  const int64_t first = rank * unit.shard_numel;
  const int64_t begin = std::max(first, param.offset), stop = std::min(first + unit.shard_numel, param.offset + param.numel);
  return begin < stop ? ShardPart{begin - first, stop - begin} : ShardPart{};
}

namespace {

// Fires after AccumulateGrad has written a parameter's .grad.
struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  explicit GradReadyHook(std::function<void()> fn) : fn(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
  std::function<void()> fn;
};

bool under(const std::string& name, const std::string& prefix) {
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.';
}

}  // namespace

FullyShardedModule::FullyShardedModule(torch::nn::Module& module, const models::UnitPlan& plan, Comm& shard,
                                       Comm* replicate, FsdpOptions options)
    : module_(module), shard_(shard), replicate_(replicate), options_(options) {
  const int64_t n = shard.size(), r = shard.rank();
  // Candidate units in execution order; the stem and head are dropped below if nothing falls in them.
  struct Candidate {
    std::string name;
    std::vector<std::string> prefixes;
  };
  std::vector<Candidate> candidates;
  candidates.push_back({"stem", plan.stem});
  for (const auto& b : plan.blocks) candidates.push_back({b, {b}});
  candidates.push_back({"head", plan.head});
  std::vector<std::unique_ptr<Unit>> all(candidates.size()), fp8_all(candidates.size());
  for (size_t i = 0; i < all.size(); ++i) {
    all[i] = std::make_unique<Unit>();
    all[i]->layout.name = candidates[i].name;
    fp8_all[i] = std::make_unique<Unit>();
    fp8_all[i]->layout.name = candidates[i].name + ".fp8";
    fp8_all[i]->fp8 = true;
  }
  size_t fp8_found = 0;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;  // fixed tables stay replicated
    int64_t owner = -1;
    for (size_t i = 0; i < candidates.size(); ++i)
      for (const auto& prefix : candidates[i].prefixes) {
        if (!under(item.key(), prefix)) continue;
        if (owner >= 0 && owner != static_cast<int64_t>(i))
          throw std::invalid_argument(fmt::format("FSDP: parameter '{}' falls in two units ('{}' and '{}')", item.key(),
                                                  candidates[owner].name, candidates[i].name));
        owner = static_cast<int64_t>(i);
      }
    if (owner < 0)
      throw std::invalid_argument(fmt::format("FSDP: parameter '{}' belongs to no unit (stem [{}], head [{}], {} blocks)",
                                              item.key(), fmt::join(plan.stem, ", "), fmt::join(plan.head, ", "),
                                              plan.blocks.size()));
    const auto fp8_slot = options_.fp8_weights.find(item.key());
    Unit& u = fp8_slot != options_.fp8_weights.end() ? *fp8_all[owner] : *all[owner];
    if (u.fp8) {
      u.slots.push_back(fp8_slot->second);
      ++fp8_found;
    }
    const at::Tensor& p = item.value();
    u.layout.params.push_back({item.key(), p.sizes().vec(), u.layout.numel, p.numel()});
    u.layout.numel += p.numel();
    u.params.push_back(p);
  }
  if (fp8_found != options_.fp8_weights.size())
    for (const auto& [name, slot] : options_.fp8_weights) {
      bool found = false;
      for (const auto& u : fp8_all)
        for (const auto& p : u->layout.params) found = found || p.name == name;
      if (!found) throw std::invalid_argument("FSDP: fp8 all-gather weight '" + name + "' is no trainable parameter");
    }
  for (size_t i = 0; i < all.size(); ++i) {
    const bool is_block = i > 0 && i + 1 < all.size();
    // A unit whose every weight is gathered in fp8 is its fp8 unit alone.
    if (all[i]->params.empty()) std::swap(all[i], fp8_all[i]);
    if (all[i]->params.empty()) {
      if (is_block) throw std::invalid_argument("FSDP unit '" + candidates[i].name + "' has no trainable parameters");
      continue;
    }
    if (is_block) blocks_.push_back(all[i].get());
    else if (i == 0) stem_ = all[i].get();
    else head_ = all[i].get();
    if (!fp8_all[i]->params.empty()) {
      all[i]->fp8_sibling = fp8_all[i].get();
      fp8_all[i]->fp8_owner = all[i].get();
      // A unit's gradients now take two flat buffers: keep as many units' worth in flight.
      max_reduces_in_flight_ = 2 * kMaxReducesInFlight;
    }
    units_.push_back(std::move(all[i]));
    if (!fp8_all[i]->params.empty()) units_.push_back(std::move(fp8_all[i]));
  }

  at::NoGradGuard no_grad;
  for (auto& u : units_) {
    FsdpUnitLayout& l = u->layout;
    l.padded_numel = (l.numel + n - 1) / n * n;
    l.shard_numel = l.padded_numel / n;
    const auto device = u->params.front().device();
    at::Tensor flat = at::zeros({l.padded_numel}, at::TensorOptions().dtype(at::kFloat).device(device));
    for (size_t k = 0; k < l.params.size(); ++k)
      flat.narrow(0, l.params[k].offset, l.params[k].numel).copy_(u->params[k].reshape(-1));
    u->shard = flat.narrow(0, r * l.shard_numel, l.shard_numel).clone().set_requires_grad(true);
    const auto compute = at::TensorOptions().dtype(options_.compute_dtype).device(device);
    u->full = at::empty({l.padded_numel}, u->fp8 ? compute.dtype(at::kByte) : compute);
    // fp8 weights' parameters only carry shape, dtype and gradient: their data would be a
    // buffer never gathered, released below once the views exist (a read, or a new view of
    // them, fails loudly: ATen checks a view's bounds against the empty storage).
    at::Tensor data_of_params = u->fp8 ? at::empty({l.padded_numel}, compute) : u->full;
    for (size_t k = 0; k < l.params.size(); ++k) {
      // The parameter keeps its identity (autograd meta, hooks, the module's handle) and now
      // reads its data from the unit's gathered buffer.
      u->params[k].set_data(data_of_params.narrow(0, l.params[k].offset, l.params[k].numel).view(l.params[k].shape));
      Unit* unit = u.get();
      torch::autograd::impl::set_post_acc_grad_hooks(
          u->params[k], std::make_unique<GradReadyHook>([this, unit] { on_grad_ready(*unit); }));
    }
    if (u->fp8) {
      c10::StorageImpl* none = data_of_params.storage().unsafeGetStorageImpl();
      none->set_data_ptr_noswap(at::DataPtr(nullptr, device));
      none->set_nbytes(0);
    }
    u->gathered = true;
    release_one(*u);
    layouts_.push_back(l);
    spare_buffers_.clear();  // the construction-time buffers: a gather allocates what it needs
  }
}

FullyShardedModule::~FullyShardedModule() {
  for (auto& u : units_)
    for (auto& p : u->params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void FullyShardedModule::event(const std::string& what) {
  if (events_) events_->push_back(what);
}

at::DataPtr FullyShardedModule::take_buffer(c10::StorageImpl& storage, size_t bytes) {
  auto it = spare_buffers_.find(bytes);
  if (it == spare_buffers_.end()) return storage.allocator()->allocate(bytes);
  at::DataPtr buffer = std::move(it->second);
  spare_buffers_.erase(it);
  return buffer;
}

void FullyShardedModule::keep_buffer(at::DataPtr buffer, size_t bytes) {
  // Only as many buffers of a size as were ever gathered at once exist, so this stays bounded
  // by the schedule's peak (a few units), which the memory report counts as live.
  if (buffer.device().is_cpu() && buffer.get()) spare_buffers_.emplace(bytes, std::move(buffer));
}

at::Tensor FullyShardedModule::reduce_buffer(int64_t numel) {
  const auto opts = units_.front()->shard.options().dtype(options_.reduce_dtype);
  if (!opts.device().is_cpu()) return at::zeros({numel}, opts);
  if (reduce_slots_.empty()) {
    int64_t largest = 0;
    for (const auto& u : units_) largest = std::max(largest, u->layout.padded_numel);
    for (size_t i = 0; i < max_reduces_in_flight_; ++i) reduce_slots_.push_back(at::empty({largest}, opts));
  }
  // Slots are used round-robin; finish_reduces keeps fewer than max_reduces_in_flight_ in flight
  // before a new one is taken, and reductions finish in issue order, so the slot is free.
  at::Tensor slot = reduce_slots_[next_reduce_slot_++ % reduce_slots_.size()].narrow(0, 0, numel);
  return slot.zero_();
}

void FullyShardedModule::release(Unit& u) {
  bool released = release_one(u);
  if (u.fp8_sibling) released = release_one(*u.fp8_sibling) || released;
  // One mark per unit, its sibling included: kMaxGathersAhead counts units.
  if (released) mark_device(released_marks_, u.full.device());
}

bool FullyShardedModule::release_one(Unit& u) {
  if (!u.gathered) return false;
  for (auto& slot : u.slots) slot->data = at::Tensor();  // a linear run now fails rather than read freed bytes
  event("release " + u.layout.name);
  c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
  const size_t bytes = storage->nbytes();
  keep_buffer(storage->set_data_ptr(at::DataPtr(nullptr, u.full.device())), bytes);
  storage->set_nbytes(0);
  u.gathered = false;
  return true;
}

void FullyShardedModule::mark_device(std::deque<c10::Event>& marks, const c10::Device& device) {
  if (!device.is_cuda()) return;  // on the CPU, work is done when the host moves on
  marks.emplace_back(device.type());
  marks.back().record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
}

void FullyShardedModule::wait_device_marks(std::deque<c10::Event>& marks, size_t keep) {
  // The host may run ahead of the GPU by many units; memory freed on the host is only reusable
  // once the device has passed its last use (the caching allocator waits on the streams that
  // used it). Waiting here for the mark `keep` releases back bounds what is alive on the device
  // to the same few buffers as on the host — what FSDP1's limit_all_gathers does.
  while (marks.size() > keep) {
    RECORD_USER_SCOPE("fsdp.wait_device");
    marks.front().synchronize();
    marks.pop_front();
  }
}

void FullyShardedModule::start_gather(Unit& u) {
  start_gather_one(u);
  if (u.fp8_sibling) start_gather_one(*u.fp8_sibling);
}

void FullyShardedModule::wait_gather(Unit& u) {
  wait_gather_one(u);
  if (u.fp8_sibling) wait_gather_one(*u.fp8_sibling);
}

void FullyShardedModule::start_gather_one(Unit& u) {
  if (u.gathered || u.gather_work) return;
  RECORD_USER_SCOPE("fsdp.all_gather");
  event("gather_issue " + u.layout.name);
  wait_device_marks(released_marks_, kMaxGathersAhead);
  c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(u.layout.padded_numel) * u.full.element_size();
  storage->set_data_ptr_noswap(take_buffer(*storage, bytes));
  storage->set_nbytes(bytes);
  at::NoGradGuard no_grad;
  u.gather_input = u.fp8 ? fp8_gather_input(u) : u.shard.detach().to(options_.compute_dtype);
  u.gather_work = shard_.all_gather(u.full, u.gather_input);
}

void FullyShardedModule::wait_gather_one(Unit& u) {
  start_gather_one(u);
  if (!u.gather_work) return;
  RECORD_USER_SCOPE("fsdp.wait_all_gather");
  u.gather_work->wait();
  u.gather_work.reset();
  u.gather_input.reset();
  u.gathered = true;
  for (size_t k = 0; k < u.slots.size(); ++k) {
    const FsdpParamLayout& p = u.layout.params[k];
    u.slots[k]->data = u.full.narrow(0, p.offset, p.numel).view(p.shape).view(at::kFloat8_e4m3fn);
  }
}

void FullyShardedModule::refresh_fp8_scales() {
  RECORD_USER_SCOPE("fsdp.fp8_scales");
  at::NoGradGuard no_grad;
  // This rank's slice of each fp8 weight: its amax (0 where the slice misses the weight); the
  // MAX over the group is the whole weight's amax, exactly (a max does not round).
  std::vector<at::Tensor> amaxes;
  for (const auto& u : units_) {
    if (!u->fp8) continue;
    for (const auto& p : u->layout.params) {
      const ShardPart part = shard_part(u->layout, p, shard_.rank());
      amaxes.push_back(part.count > 0 ? models::fp8::abs_max(u->shard.detach().narrow(0, part.begin, part.count))
                                      : at::zeros({}, u->shard.options().requires_grad(false)));
    }
  }
  if (amaxes.empty()) return;
  at::Tensor amax = at::stack(amaxes);
  shard_.all_reduce(amax, ReduceOp::Max)->wait();
  int64_t at = 0;
  for (auto& u : units_) {
    if (!u->fp8) continue;
    const auto count = static_cast<int64_t>(u->layout.params.size());
    // A new tensor each time: forwards still to run backward keep the scales they were given.
    u->fp8_scales = models::fp8::tensor_scale(amax.narrow(0, at, count), models::fp8::Format::e4m3);
    const at::Tensor inverse = u->fp8_scales.reciprocal();
    for (int64_t k = 0; k < count; ++k) u->slots[k]->inv_scale = inverse[k];
    at += count;
  }
}

at::Tensor FullyShardedModule::fp8_gather_input(const Unit& u) const {
  TORCH_CHECK(u.fp8_scales.defined(), "FSDP fp8 all-gather: ", u.layout.name, " gathered before begin_forward");
  const at::Tensor shard = u.shard.detach();
  at::Tensor out = at::zeros({u.layout.shard_numel}, shard.options().dtype(at::kByte));  // padding: +0
  for (size_t k = 0; k < u.layout.params.size(); ++k) {
    const ShardPart part = shard_part(u.layout, u.layout.params[k], shard_.rank());
    if (part.count == 0) continue;
    // The cast the linear would apply to the gathered weight (quantize_tensor: saturating, RNE),
    // element by element, so the bytes are those of the unsharded weight's cast.
    const at::Tensor slice = shard.narrow(0, part.begin, part.count).view({1, -1});
    const models::fp8::Quantized q =
        models::fp8::quantize_tensor(slice, models::fp8::Format::e4m3, u.fp8_scales[static_cast<int64_t>(k)]);
    out.narrow(0, part.begin, part.count).copy_(q.data.view(at::kByte).view({-1}));
  }
  return out;
}

void FullyShardedModule::begin_forward() {
  if (!options_.fp8_weights.empty()) refresh_fp8_scales();
  // The stem is needed at once; block 0's gather travels with it.
  if (stem_) start_gather(*stem_);
  if (!blocks_.empty() && options_.prefetch) start_gather(*blocks_.front());
  if (stem_) wait_gather(*stem_);
  if (blocks_.empty() && head_) wait_gather(*head_);
}

models::Tensors FullyShardedModule::run_unit(int64_t index, const models::Tensors& inputs,
                                             const std::function<models::Tensors()>& call) {
  const int64_t count = static_cast<int64_t>(blocks_.size());
  TORCH_CHECK(index >= 0 && index < count, "FSDP: no block unit ", index);
  Unit& u = *blocks_[index];
  const bool training = at::GradMode::is_enabled();
  const bool last = index == count - 1;
  wait_gather(u);
  // The stem's modules ran before block 0: its weights can go (backward gathers them again).
  if (index == 0 && stem_ && options_.reshard_after_forward) release(*stem_);
  if (options_.prefetch) {
    if (!last) start_gather(*blocks_[index + 1]);
    else if (head_) start_gather(*head_);  // the final layer runs right after this block
  }
  event("forward_begin " + u.layout.name);
  models::Tensors outputs = call();
  event("forward_end " + u.layout.name);
  if (last && head_) wait_gather(*head_);
  // The last block's backward comes first: keep it rather than free and re-gather at once.
  if (options_.reshard_after_forward && !(training && last)) release(u);
  // The first output gradient to arrive starts the unit's backward (a unit with several outputs
  // — Flux's double block — hooks each; pre_backward acts once per backward).
  u.backward_started = false;
  if (training)
    for (auto& out : outputs)
      if (out.defined() && out.requires_grad())
        out.register_hook([this, index](const at::TensorBase&) { pre_backward(index); });
  if (training && index == 0 && stem_) {
    // Block 0's inputs get their gradients when its backward is done, just before the stem's
    // modules run backward: the stem (prefetched by pre_backward(0)) must be here by then.
    for (const auto& input : inputs)
      if (input.defined() && input.requires_grad())
        const_cast<at::Tensor&>(input).register_hook([this](const at::TensorBase&) {
          // Once per backward: a later input's hook may come after the stem (or its fp8
          // sibling) finished its backward and was released — gathering it again would be waste.
          if (stem_backward_waited_) return;
          stem_backward_waited_ = true;
          wait_gather(*stem_);
        });
    stem_backward_waited_ = false;
  }
  return outputs;
}

void FullyShardedModule::pre_backward(int64_t index) {
  Unit& u = *blocks_[index];
  if (u.backward_started) return;
  u.backward_started = true;
  event("backward_begin " + u.layout.name);
  wait_gather(u);
  if (options_.prefetch) {
    if (index > 0) start_gather(*blocks_[index - 1]);
    else if (stem_) start_gather(*stem_);
  }
}

void FullyShardedModule::on_grad_ready(Unit& u) {
  if (++u.grads_ready < static_cast<int64_t>(u.params.size())) return;
  u.grads_ready = 0;
  // Every gradient of the unit is in: its backward is over, so the gathered weights can go,
  // and the reduction can start while the next unit's backward computes. (Only this flat
  // buffer: its fp8 sibling, or the unit it is the sibling of, may still be computing; the
  // device mark waits until both are released, so that it counts units.)
  if (release_one(u)) {
    const Unit* partner = u.fp8_sibling ? u.fp8_sibling : u.fp8_owner;
    if (!partner || !partner->gathered) mark_device(released_marks_, u.full.device());
  }
  if (sync_ || options_.reduce_every_micro_batch) start_reduce(u);
}

void FullyShardedModule::start_reduce(Unit& u) {
  bool any = false;
  for (const auto& p : u.params) any = any || p.grad().defined();
  if (!any || u.reduce_work) return;
  // Make room first: this unit's flat gradient is about to be allocated.
  finish_reduces(max_reduces_in_flight_ - 1);
  wait_device_marks(reduced_marks_, max_reduces_in_flight_ - 1);
  RECORD_USER_SCOPE("fsdp.reduce_scatter");
  event("reduce_issue " + u.layout.name);
  at::NoGradGuard no_grad;
  const auto opts = u.shard.options().dtype(options_.reduce_dtype);
  u.reduce_input = reduce_buffer(u.layout.padded_numel);
  for (size_t k = 0; k < u.params.size(); ++k) {
    at::Tensor& p = u.params[k];
    if (!p.grad().defined()) continue;
    u.reduce_input.narrow(0, u.layout.params[k].offset, u.layout.params[k].numel).copy_(p.grad().reshape(-1));
    p.mutable_grad() = at::Tensor();  // the unsharded gradient is no longer needed
  }
  // One reduction over the buffer about to be sent: the health check's evidence of this rank's
  // own gradients (a NaN is summed into the owners' shards by the reduce-scatter).
  const at::Tensor local_sum = u.reduce_input.sum().to(at::kFloat);
  local_gradient_sum_ = local_gradient_sum_.defined() ? local_gradient_sum_ + local_sum : local_sum;
  u.reduce_output = at::empty({u.layout.shard_numel}, opts);
  const ReduceOp op = options_.fault == ReductionFault::SumOverShardGroup ? ReduceOp::Sum : ReduceOp::Avg;
  u.reduce_work = shard_.reduce_scatter(u.reduce_output, u.reduce_input, op);
  reducing_.push_back(&u);
}

void FullyShardedModule::finish_reduces(size_t max_in_flight) {
  // Oldest first, and only at points fixed by the schedule (never "whatever has completed"), so
  // every rank issues the replicate group's all-reduces at the same place among the shard
  // group's collectives: NCCL needs one issue order across communicators on all ranks.
  while (reducing_.size() > max_in_flight) {
    Unit& u = *reducing_.front();
    reducing_.pop_front();
    finish_reduce(u);
  }
}

void FullyShardedModule::finish_reduce(Unit& u) {
  {
    RECORD_USER_SCOPE("fsdp.wait_reduce_scatter");
    u.reduce_work->wait();  // CUDA: the compute stream now waits for the reduction
  }
  mark_device(reduced_marks_, u.reduce_input.device());  // passed once the reduction is done on the device
  event("reduce_done " + u.layout.name);
  at::NoGradGuard no_grad;
  at::Tensor reduced = u.reduce_output.to(at::kFloat);
  u.reduce_work.reset();
  u.reduce_input.reset();  // the unit's flat unsharded gradient (a reduce slot on the CPU) is free again
  u.reduce_output.reset();
  if (options_.context_parallel > 1 && options_.fault != ReductionFault::NoContextSum)
    reduced.mul_(static_cast<double>(options_.context_parallel));
  if (replicate_ && replicate_->size() > 1) {
    RECORD_USER_SCOPE("fsdp.all_reduce_replicas");
    const ReduceOp op = options_.fault == ReductionFault::SumOverReplicas ? ReduceOp::Sum : ReduceOp::Avg;
    u.reduced = reduced;
    u.replica_work = replicate_->all_reduce(u.reduced, op);
    return;
  }
  accumulate_shard_grad(u, reduced);
}

void FullyShardedModule::accumulate_shard_grad(Unit& u, const at::Tensor& reduced) {
  if (u.shard.grad().defined()) u.shard.mutable_grad().add_(reduced);
  else u.shard.mutable_grad() = reduced;
}

at::Tensor FullyShardedModule::take_local_gradient_sum() {
  at::Tensor out = local_gradient_sum_;
  local_gradient_sum_ = at::Tensor();
  return out;
}

void FullyShardedModule::finish_backward() {
  if (sync_ || options_.reduce_every_micro_batch)
    for (auto& u : units_) start_reduce(*u);  // units whose gradients did not all arrive
  finish_reduces(0);
  at::NoGradGuard no_grad;
  for (auto& u : units_) {
    u->grads_ready = 0;
    if (!u->replica_work) continue;
    {
      RECORD_USER_SCOPE("fsdp.wait_all_reduce_replicas");
      u->replica_work->wait();
    }
    accumulate_shard_grad(*u, u->reduced);
    u->replica_work.reset();
    u->reduced.reset();
  }
  event("backward_end");
  reshard_all();
  reduced_marks_.clear();  // the optimizer waits on the stream anyway
}

void FullyShardedModule::reshard_all() {
  for (auto& u : units_) {
    if (u->gather_work) wait_gather_one(*u);  // never free a buffer a collective is writing into
  }
  for (auto& u : units_)
    if (!u->fp8_owner) release(*u);  // with its sibling
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedModule::named_shards() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& u : units_) out.emplace_back(u->layout.name, u->shard);
  return out;
}

void FullyShardedModule::swap_shards(std::vector<at::Tensor>& shards) {
  TORCH_CHECK(shards.size() == units_.size(), "FSDP swap_shards: expected ", units_.size(), " shards");
  reshard_all();
  for (size_t i = 0; i < units_.size(); ++i) {
    TORCH_CHECK(shards[i].sizes() == units_[i]->shard.sizes(), "FSDP swap_shards: shape mismatch for ",
                units_[i]->layout.name);
    std::swap(units_[i]->shard, shards[i]);
  }
}

int64_t FullyShardedModule::shard_bytes() const {
  int64_t bytes = 0;
  for (const auto& u : units_) {
    bytes += u->shard.numel() * u->shard.element_size();
    if (u->shard.grad().defined()) bytes += u->shard.grad().numel() * u->shard.grad().element_size();
  }
  return bytes;
}

}  // namespace flowtrain::parallel
