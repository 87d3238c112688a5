// A module's parameters and buffers as named tensors (the PyTorch state_dict), and loading them
// back with errors that name the offending tensor and file.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace flowtrain::trainer {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parameters then buffers, in registration order, detached (shares storage with the module).
NamedTensors state_dict(const torch::nn::Module& module);

// Copies `tensors` into the module (dtype/device converted). Every module tensor must be present
// with the same shape and no extra names may appear; otherwise throws CheckpointError naming the
// tensor and `source` (a file path, for the message).
void load_state_dict(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source);

// `train --init-from FILE`: loads a weights file (safetensors, e.g. a reference checkpoint) into
// the module's tensors whose names start with `prefix` ("" = all), strictly: each must be in the
// file under its name without the prefix and with its shape, and the file may hold nothing else.
// Every problem is collected first, so one CheckpointError names the file and each missing,
// unexpected and mis-shaped key (with both shapes); nothing is copied unless all fit.
// `path` is one .safetensors file or a Hugging Face sharded checkpoint's *.safetensors.index.json
// (data/weight_files.h). `tied` maps a file key that is a saved copy of a tied tensor to that
// tensor's key (T5's encoder.embed_tokens.weight -> shared.weight): the copy is read when the
// tensor is absent and ignored when both are there.
void load_weights_file(torch::nn::Module& module, const std::string& path, const std::string& prefix,
                       const std::map<std::string, std::string>& tied = {});

}  // namespace flowtrain::trainer
