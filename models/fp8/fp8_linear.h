// The fp8 compute backend of a Linear (models/linear.h): y = x·Wᵀ + b with the three GEMMs of
// forward and backward cast as the recipe says (recipe.h), the fp32 master weight untouched.
//
// Scales: dynamic recipes derive them from the tensor at hand, so an activation-checkpointing
// recompute (same inputs) re-derives exactly the forward's scales. `delayed` takes them from an
// amax history that only changes in commit_amax() — once per optimizer step, after the amaxes
// were reduced over the ranks — so the recompute sees the forward's scales there too (an operand
// whose history amax is 0 is scaled by its own amax: the same tensor, the same scale). Only
// passes with grad enabled (training) record amaxes.
#pragma once

#include "models/fp8/recipe.h"
#include "models/linear.h"

#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <string>

namespace flowtrain::models::fp8 {

struct DelayedOptions {
  int64_t history_len = 16;  // steps of amax kept per operand
  AmaxReduce reduce = AmaxReduce::max;  // how the history becomes the amax of a scale
};

class Fp8Linear : public LinearCompute {
 public:
  Fp8Linear(Recipe recipe, bool emulate, DelayedOptions delayed = {});
  at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) override;
  std::string describe() const override;
  Recipe recipe() const { return recipe_; }
  bool emulated() const { return emulate_; }

  // Delayed scaling. The amaxes of (input, weight, grad_output) seen since the last commit, [3]
  // fp32 (zeros before the first call); commit_amax appends `reduced` (the same, after a
  // cross-rank max) to the history and clears them.
  at::Tensor pending_amax() const { return pending_; }
  void commit_amax(const at::Tensor& reduced);
  at::Tensor amax_history() const { return history_; }  // [history_len, 3], newest first
  int64_t amax_commits() const { return commits_; }      // steps committed so far
  // Puts back a history that amax_history()/amax_commits() gave (a checkpoint), so a resumed run
  // scales its first step as the uninterrupted run would. At another history length, the newest
  // rows that fit. Throws std::invalid_argument for a tensor that is not [rows, 3].
  void restore_amax_history(const at::Tensor& history, int64_t commits);

  // FSDP's fp8 all-gather (tensorwise only): from now on the weight arrives cast, through the
  // returned slot (models/linear.h PrecastWeight), which the gatherer fills. Throws
  // std::invalid_argument for another recipe: rowwise and MX scales run along the contracted
  // axis, which differs between the forward and the backward GEMMs, and delayed scales come
  // from the layer's own history.
  std::shared_ptr<PrecastWeight> gather_weight_in_fp8();
  const std::shared_ptr<PrecastWeight>& precast_weight() const { return precast_; }

 private:
  // The (input, weight, grad_output) amaxes the history gives this call ([3]; max or newest of
  // the committed rows), undefined before the first commit (= dynamic scales). Allocates the
  // state on `device` on first use.
  at::Tensor history_amax(const c10::Device& device);

  Recipe recipe_;
  bool emulate_;
  DelayedOptions delayed_;
  at::Tensor history_, pending_;
  int64_t commits_ = 0;
  std::shared_ptr<PrecastWeight> precast_;
};

}  // namespace flowtrain::models::fp8
