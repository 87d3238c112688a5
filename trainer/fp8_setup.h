// The fp8.* section applied to a run: options checked against the device, the model's chosen
// linears converted, one log line saying what happened (models/fp8/convert.h does the work).
#pragma once

#include "models/fp8/convert.h"
#include "models/model.h"
#include "parallel/comm.h"
#include "trainer/config/config.h"

#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// The conversion options of `config` on `device`. The CPU has no fp8 GEMM: emulation is implied
// there (said once in the log by apply_fp8). On CUDA, fp8 GEMMs need compute capability ≥ 8.9,
// and mxfp8's block-scaled GEMMs (Blackwell) are not called by this build: either without
// fp8.emulate: true is a ConfigError naming the device.
models::fp8::Fp8Options fp8_options(const Config& config, const c10::Device& device);

// Converts `model`'s linears as fp8.* says (nothing for recipe none); an empty fp8.include means
// the model's transformer blocks (UnitPlan::blocks). A ConfigError when no linear was chosen.
models::fp8::Fp8Conversion apply_fp8(models::DiffusionModel& model, const Config& config, const c10::Device& device);
// What the run log says of it (empty for recipe none): the emulation note once, the summary.
std::vector<std::string> fp8_log_lines(const models::fp8::Fp8Conversion& conversion, const Config& config,
                                       const c10::Device& device);

// `fp8.all_gather`: the converted linears' weights that FSDP gathers in fp8 (parameter name →
// the slot each linear reads its gathered weight from), switched on in the layers; empty when
// off. A ConfigError unless the recipe is tensorwise and the run is sharded (`sharded`: FSDP).
std::map<std::string, std::shared_ptr<models::PrecastWeight>> fp8_all_gather_weights(
    const models::fp8::Fp8Conversion& conversion, const Config& config, bool sharded);

// Once per optimizer step: delayed scaling's amaxes reduced (max) over `group` — every rank
// sharing the model — and committed to the histories. `group` may be null (one process).
void commit_fp8_amax(const models::fp8::Fp8Conversion& conversion, parallel::Comm* group);

}  // namespace flowtrain::trainer
