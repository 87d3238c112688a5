// Context (sequence) parallelism for non-causal attention (docs/design/parallel.md): the token sequence
// of every sample is split into cp contiguous chunks, chunk i on member i of the context group.
// Per-token work stays local; attention is the one place tokens meet, done in one of two ways:
//
//  • Ulysses (DeepSpeed-Ulysses): an all-to-all turns [B, H, N/P, Dh] (my tokens, all heads)
//    into [B, H/P, N, Dh] (all tokens, my heads), any local attention kernel runs, and a second
//    all-to-all turns the result back. Needs heads % P == 0; 2 all-to-alls per layer here (q, k
//    and v travel in one message).
//  • Ring: K/V chunks travel around the group (P2P send/recv, the next chunk in flight while the
//    current one is used); partial results are merged by their log-sum-exp in fp32. Backward
//    re-walks the ring with the final output and log-sum-exp; dK/dV accumulate as they travel and
//    arrive back at their owner. No head constraint; memory per step is one chunk pair (plus the
//    block's scores where no flash kernel is used: see context_ring.cpp).
//  • Hybrid (USP, Fang & Zhao 2024): cp = U × R. An all-to-all among U adjacent ranks turns
//    [B, H, N/cp, Dh] into [B, H/U, N/R, Dh] (the U chunks of that run are contiguous, so this is
//    ring chunk j), then ring attention over the R ranks holding the same head group, then the
//    all-to-all back. Ulysses' cheap all-to-all stays on fast links, the ring's hops cross the
//    slow level, and the head constraint is only heads % U == 0.
//
// Every function here is differentiable (autograd Functions whose backward is the adjoint
// communication) and exact: the result equals the unsplit computation up to summation order.
#pragma once

#include "parallel/comm.h"
#include "parallel/runtime.h"

#include <ATen/ATen.h>

#include <functional>
#include <string>

namespace flowtrain::parallel {

// softmax(q·kᵀ/√Dh)·v on [B, H, N, Dh], the same signature as models::AttentionFn.
using LocalAttention = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

// q, k, v: this rank's tokens [B, H, N/P, Dh]; returns this rank's rows of the attention over the
// whole sequence [B, H, N/P, Dh]. `local` computes attention over [B, H/P, N, Dh].
at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& group,
                             const LocalAttention& local);
// The ring's per-block kernel: Auto = ATen's flash kernel on the CPU, Math elsewhere; the
// others force one (tests compare them).
enum class RingKernel { Auto, Math, CpuFlash };
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& group,
                          RingKernel kernel = RingKernel::Auto);

// Ulysses over `ulysses` (U members) around ring attention over `ring` (R members): this rank's
// [B, H, N/(U·R), Dh] tokens in, the same rows of the whole sequence's attention out.
at::Tensor hybrid_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& ulysses, Comm& ring);

// The context-parallel attentions (config: parallel.cp_attention, auto resolved).
enum class ContextAttention { Ulysses, Ring, Hybrid };
const char* name(ContextAttention kind);  // "ulysses" | "ring" | "hybrid"
// `kind` as an attention function bound to the runtime's context groups (hybrid needs the mesh's
// cp_ulysses split). `local` is the attention Ulysses runs on whole sequences.
LocalAttention context_attention(ContextAttention kind, Runtime& runtime, LocalAttention local);

// The sequence split itself, along `dim` (tokens): this rank's contiguous chunk, and its inverse
// (every member's chunk, concatenated in rank order). gather's backward keeps this rank's chunk
// of the gradient: what follows it (unpatchify, the loss) runs identically on every member, so
// each member's share of the gradient flows back through its own tokens, and the parameters'
// gradients are partial sums that the FSDP reduction adds up (FsdpOptions::context_parallel).
at::Tensor split_sequence(const at::Tensor& x, Comm& group, int64_t dim);
at::Tensor gather_sequence(const at::Tensor& x, Comm& group, int64_t dim);

}  // namespace flowtrain::parallel
