// The choices of flow matching that a config names (flow.timesteps, sample.sampler,
// eval.sampler), apart from models/flow_matching.h so that the config can hold them without
// including ATen. The YAML words of each, in enumerator order, are in trainer/config/config.cpp.
#pragma once

namespace flowtrain::models {

enum class TimestepDistribution { Uniform, LogitNormal };  // uniform | logit_normal
enum class SamplerKind { Euler, Heun };                    // euler | heun

}  // namespace flowtrain::models
