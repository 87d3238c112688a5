// Ulysses attention (DeepSpeed-Ulysses, Jacobs et al. 2023): trade the sequence split for a head
// split with one all-to-all, attend locally over the whole sequence, trade back.
#include "parallel/context.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

namespace flowtrain::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [B, H, N/P, Dh] (my tokens, all heads) → [B, H/P, N, Dh] (all tokens, my heads).
at::Tensor tokens_to_heads(const at::Tensor& x, Comm& group) {
  RECORD_USER_SCOPE("cp.all_to_all_tokens_to_heads");
  const int64_t P = group.size(), B = x.size(0), H = x.size(1), n = x.size(2), Dh = x.size(3);
  // Chunk j (heads of group j) goes to member j; chunk i received = member i's tokens.
  at::Tensor send = x.reshape({B, P, H / P, n, Dh}).permute({1, 0, 2, 3, 4}).contiguous();
  at::Tensor recv = at::empty_like(send);
  group.all_to_all(recv, send)->wait();
  return recv.permute({1, 2, 0, 3, 4}).reshape({B, H / P, P * n, Dh});
}

// The inverse: [B, H/P, N, Dh] → [B, H, N/P, Dh].
at::Tensor heads_to_tokens(const at::Tensor& y, Comm& group) {
  RECORD_USER_SCOPE("cp.all_to_all_heads_to_tokens");
  const int64_t P = group.size(), B = y.size(0), h = y.size(1), N = y.size(2), Dh = y.size(3);
  // Chunk j (tokens of member j) goes to member j; chunk i received = head group i.
  at::Tensor send = y.reshape({B, h, P, N / P, Dh}).permute({2, 0, 1, 3, 4}).contiguous();
  at::Tensor recv = at::empty_like(send);
  group.all_to_all(recv, send)->wait();
  return recv.permute({1, 0, 2, 3, 4}).reshape({B, P * h, N / P, Dh});
}

// One all-to-all whose backward is the opposite all-to-all (each is the other's adjoint: they
// only move elements).
struct AllToAllFn : torch::autograd::Function<AllToAllFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* group, bool to_heads) {
    ctx->saved_data["to_heads"] = to_heads;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return to_heads ? tokens_to_heads(x, *group) : heads_to_tokens(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Comm& group = *reinterpret_cast<Comm*>(ctx->saved_data["group"].toInt());
    const at::Tensor g = grads[0].contiguous();
    return {ctx->saved_data["to_heads"].toBool() ? heads_to_tokens(g, group) : tokens_to_heads(g, group), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& group,
                             const LocalAttention& local) {
  const int64_t P = group.size();
  if (P == 1) return local(q, k, v);
  TORCH_CHECK(q.size(1) % P == 0, "Ulysses attention: ", q.size(1), " heads do not split over ", P,
              " context-parallel ranks (use parallel.cp_attention: ring)");
  const int64_t B = q.size(0);
  // q, k and v travel in one message: stacked along the batch dimension.
  at::Tensor qkv = AllToAllFn::apply(at::cat({q, k, v}, 0), &group, /*to_heads=*/true);
  at::Tensor out = local(qkv.narrow(0, 0, B), qkv.narrow(0, B, B), qkv.narrow(0, 2 * B, B));
  return AllToAllFn::apply(out, &group, /*to_heads=*/false);
}

}  // namespace flowtrain::parallel
