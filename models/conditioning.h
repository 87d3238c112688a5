// What a batch is conditioned on, by name — produced by the data path, consumed by the model;
// the objective and the samplers carry it without knowing what is inside.
//
//   "labels"    int64 [B]          class labels (DiT)
//   "txt"       float [B, L, D]    text token embeddings, with "txt_mask" bool [B, L] (Flux)
//   "vec"       float [B, D']      pooled text vector (Flux)
//   "guidance"  float [B]          distilled guidance strength (flux-dev)
//
// Every tensor has the batch on dim 0, so taking rows, moving to a device and stacking the
// conditional and unconditional halves of classifier-free guidance are the same for all.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

namespace flowtrain::models {

class Conditioning {
 public:
  Conditioning() = default;
  Conditioning(std::initializer_list<std::pair<const std::string, at::Tensor>> items);

  void set(const std::string& name, at::Tensor tensor);  // checks the batch size against the others
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // Throws std::invalid_argument naming the missing entry and the ones present.
  const at::Tensor& at(const std::string& name) const;
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }
  int64_t batch() const;  // 0 when empty

  Conditioning rows(int64_t first, int64_t count) const;        // narrow on dim 0
  Conditioning index_select(const at::Tensor& index) const;     // rows by index (int64 [N])
  Conditioning to(const c10::Device& device, bool non_blocking = false) const;
  // Row-wise concatenation: a's rows, then b's (the same names in both).
  static Conditioning cat(const Conditioning& a, const Conditioning& b);

 private:
  std::map<std::string, at::Tensor> tensors_;
};

}  // namespace flowtrain::models
