// Ring attention (Liu et al. 2023) for non-causal attention: every rank keeps its queries; the
// key/value chunks travel around the context group, one hop per step, the next hop in flight
// while the current chunk is used. Each step's block result (o_j, lse_j) merges into the running
// one by log-sum-exp in fp32 (docs/design/parallel.md):
//
//   lse = logaddexp(lse, lse_j),   out = out·exp(lse_old − lse) + o_j·exp(lse_j − lse)
//
// Backward walks the ring again with the final out and lse (FlashAttention's backward, block by
// block): p = exp(q·kⱼᵀ·s − lse), dvⱼ += pᵀ·do, ds = p ∘ (do·vⱼᵀ − rowsum(do ∘ out)),
// dq += ds·kⱼ·s, dkⱼ += dsᵀ·q·s. The dK/dV accumulators travel with their chunk and take one
// last hop home.
//
// The block kernels: on the CPU, ATen's flash kernel (no [B, H, N/P, N/P] score matrix; its
// backward takes the final out and lse, which is exactly the ring's block backward); elsewhere
// the same math written with matmuls in fp32 (scores materialised per step).
#include "parallel/context.h"

#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

namespace flowtrain::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Message tags: forward K/V, backward K/V, backward dK/dV (the same pair of ranks may have
// more than one message in flight).
constexpr int64_t kTagForward = 0, kTagBackwardKv = 1, kTagBackwardGrad = 2;

at::ScalarType accumulate_type(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Sends `buffer` to the next rank and receives the previous rank's into a new buffer; wait()
// on the result before using it (and before touching `buffer` again).
struct Hop {
  WorkHandle work;
  at::Tensor outgoing, incoming;  // both must live until wait()
  void wait() { work->wait(); }
};
Hop start_hop(Comm& group, const at::Tensor& buffer, int64_t tag) {
  const int64_t P = group.size(), r = group.rank();
  Hop hop;
  hop.outgoing = buffer;
  hop.incoming = at::empty_like(buffer);
  hop.work = group.exchange(buffer, (r + 1) % P, hop.incoming, (r + P - 1) % P, tag);
  return hop;
}

// One block: this rank's queries against one K/V chunk.
struct BlockResult {
  at::Tensor out, lse;  // [B, H, n, Dh] and [B, H, n, 1], accumulate dtype
};
struct BlockGrads {
  at::Tensor dq, dk, dv;
};

bool flash_kernel(RingKernel kernel, const at::Tensor& q) {
  if (kernel == RingKernel::Auto) return q.device().is_cpu();
  return kernel == RingKernel::CpuFlash;
}

BlockResult block_forward(bool flash, const at::Tensor& qf, const at::Tensor& k, const at::Tensor& v, double scale) {
  if (flash) {
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(qf, k.contiguous(), v.contiguous(), 0.0, false,
                                                                      std::nullopt, scale);
    return {out, lse.unsqueeze(-1)};
  }
  at::Tensor s = at::matmul(qf, k.transpose(-2, -1)).mul_(scale);  // [B, H, n, n]
  at::Tensor m = std::get<0>(s.max(-1, /*keepdim=*/true));
  at::Tensor p = s.sub_(m).exp_();
  at::Tensor l = p.sum(-1, /*keepdim=*/true);
  return {at::matmul(p, v).div_(l), m.add_(l.log_())};
}

// The block's share of the gradients given the final out and lse (and delta = rowsum(do ∘ out)).
BlockGrads block_backward(bool flash, const at::Tensor& dout, const at::Tensor& qf, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& delta,
                          double scale) {
  if (flash) {
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        dout, qf, k.contiguous(), v.contiguous(), out, lse.squeeze(-1), 0.0, false, std::nullopt, scale);
    return {dq, dk, dv};
  }
  at::Tensor p = at::matmul(qf, k.transpose(-2, -1)).mul_(scale).sub_(lse).exp_();  // [B, H, n, n]
  at::Tensor dv = at::matmul(p.transpose(-2, -1), dout);
  at::Tensor ds = p.mul_(at::matmul(dout, v.transpose(-2, -1)).sub_(delta));
  return {at::matmul(ds, k).mul_(scale), at::matmul(ds.transpose(-2, -1), qf).mul_(scale), dv};
}

struct RingAttentionFn : torch::autograd::Function<RingAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            Comm* group, RingKernel kernel) {
    RECORD_USER_SCOPE("cp.ring_attention_forward");
    // fp32 block math whatever the autocast state (bf16 scores would cost the merge its precision).
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t P = group->size();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const auto acc = accumulate_type(q);
    const bool flash = flash_kernel(kernel, q);
    const at::Tensor qf = q.to(acc).contiguous();
    at::Tensor kv = at::stack({k, v}).contiguous();  // one message per hop
    at::Tensor out, lse;
    for (int64_t step = 0; step < P; ++step) {
      Hop hop;
      if (step + 1 < P) hop = start_hop(*group, kv, kTagForward);
      BlockResult block = block_forward(flash, qf, kv[0].to(acc), kv[1].to(acc), scale);
      if (step == 0) {
        out = block.out;
        lse = block.lse;
      } else {
        at::Tensor merged = at::logaddexp(lse, block.lse);
        out = out.mul_((lse - merged).exp_()).add_(block.out.mul_((block.lse - merged).exp_()));
        lse = merged;
      }
      if (step + 1 < P) {
        hop.wait();
        kv = hop.incoming;
      }
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["flash"] = flash;
    // A copy, not the saved `out` itself (in fp32 .to() would return it): whatever the caller
    // does to the result in place must not touch what backward reads.
    return out.to(q.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("cp.ring_attention_backward");
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    Comm& group = *reinterpret_cast<Comm*>(ctx->saved_data["group"].toInt());
    const bool flash = ctx->saved_data["flash"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const int64_t P = group.size();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const auto acc = accumulate_type(q);
    const at::Tensor qf = q.to(acc).contiguous(), dout = grads[0].to(acc).contiguous();
    const at::Tensor delta = flash ? at::Tensor() : (dout * out).sum(-1, /*keepdim=*/true);  // rowsum(do ∘ out)
    at::Tensor dq = at::zeros_like(qf);
    at::Tensor kv = at::stack({k, v}).contiguous();
    // At step j this rank holds the K/V chunk of rank (r − j) mod P; the dK/dV accumulated for
    // that chunk by the ranks before arrives from the previous rank during the step (its hop
    // overlaps this step's compute), gets this rank's part added and moves on. After the last
    // step it is one hop from home.
    Hop grad_hop;
    at::Tensor dkv;
    for (int64_t step = 0; step < P; ++step) {
      Hop kv_hop;
      if (step + 1 < P) kv_hop = start_hop(group, kv, kTagBackwardKv);
      BlockGrads g = block_backward(flash, dout, qf, kv[0].to(acc), kv[1].to(acc), out, lse, delta, scale);
      dq.add_(g.dq);
      dkv = at::stack({g.dk, g.dv});
      if (step > 0) {
        grad_hop.wait();
        dkv.add_(grad_hop.incoming);
      }
      if (P > 1) grad_hop = start_hop(group, dkv, kTagBackwardGrad);
      if (step + 1 < P) {
        kv_hop.wait();
        kv = kv_hop.incoming;
      }
    }
    if (P > 1) {
      grad_hop.wait();
      dkv = grad_hop.incoming;  // this rank's own chunk, every rank's part added
    }
    return {dq.to(q.scalar_type()), dkv[0].to(k.scalar_type()), dkv[1].to(v.scalar_type()), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& group,
                          RingKernel kernel) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "ring attention: q, k, v must be [B, H, N/P, Dh] of one shape");
  TORCH_CHECK(kernel != RingKernel::CpuFlash || q.device().is_cpu(), "ring attention: the flash kernel is CPU-only");
  return RingAttentionFn::apply(q, k, v, &group, kernel);
}

}  // namespace flowtrain::parallel
