// The sequence split of context parallelism (split_sequence / gather_sequence), the hybrid of the
// two attentions and the choice among them (context_attention). Ulysses and ring attention live
// in context_ulysses.cpp and context_ring.cpp.
#include "parallel/context.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fmt/format.h>

#include <stdexcept>

namespace flowtrain::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: all-gather the chunks along `dim`. Backward: this rank's chunk of the gradient.
struct GatherSequenceFn : torch::autograd::Function<GatherSequenceFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* group, int64_t dim) {
    RECORD_USER_SCOPE("cp.gather_sequence");
    const int64_t members = group->size(), n = x.size(dim);
    ctx->saved_data["rank"] = group->rank();
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["n"] = n;
    at::Tensor mine = x.movedim(dim, 0).contiguous();  // [n, …]: all_gather concatenates along dim 0
    std::vector<int64_t> sizes = mine.sizes().vec();
    sizes[0] = members * n;
    at::Tensor all = at::empty(sizes, mine.options());
    group->all_gather(all, mine)->wait();
    return all.movedim(0, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t rank = ctx->saved_data["rank"].toInt(), dim = ctx->saved_data["dim"].toInt(),
                  n = ctx->saved_data["n"].toInt();
    return {grads[0].narrow(dim, rank * n, n).contiguous(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor split_sequence(const at::Tensor& x, Comm& group, int64_t dim) {
  if (group.size() == 1) return x;
  TORCH_CHECK(x.size(dim) % group.size() == 0, "split_sequence: ", x.size(dim), " tokens do not split evenly over ",
              group.size(), " context-parallel ranks");
  const int64_t n = x.size(dim) / group.size();
  return x.narrow(dim, group.rank() * n, n);  // narrow's backward scatters into zeros: a partial gradient
}

at::Tensor gather_sequence(const at::Tensor& x, Comm& group, int64_t dim) {
  if (group.size() == 1) return x;
  return GatherSequenceFn::apply(x, &group, dim);
}

at::Tensor hybrid_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& ulysses, Comm& ring) {
  return ulysses_attention(q, k, v, ulysses, [&ring](const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh) {
    return ring_attention(qh, kh, vh, ring);
  });
}

const char* name(ContextAttention kind) {
  switch (kind) {
    case ContextAttention::Ulysses: return "ulysses";
    case ContextAttention::Ring: return "ring";
    case ContextAttention::Hybrid: return "hybrid";
  }
  return "?";
}

LocalAttention context_attention(ContextAttention kind, Runtime& runtime, LocalAttention local) {
  // A group's first operation must be a collective of all its members: NCCL creates the group's
  // communicator there, which the ring's grouped send/recv then use (a first P2P operation would
  // set up per-pair communicators, each waiting for its peer: a cycle).
  Comm& group = runtime.context_group();
  group.barrier();
  if (kind == ContextAttention::Ulysses)
    return [&group, local = std::move(local)](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return ulysses_attention(q, k, v, group, local);
    };
  if (kind == ContextAttention::Ring)
    return [&group](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return ring_attention(q, k, v, group);
    };
  Comm& ulysses = runtime.context_ulysses_group();
  Comm& ring = runtime.context_ring_group();
  ulysses.barrier();
  ring.barrier();
  return [&ulysses, &ring](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return hybrid_attention(q, k, v, ulysses, ring);
  };
}

}  // namespace flowtrain::parallel
