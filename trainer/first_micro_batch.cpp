#include "trainer/first_micro_batch.h"

#include "trainer/builders.h"
#include "trainer/data_source.h"
#include "trainer/frozen/online_encoding.h"
#include "trainer/run_conditioning.h"
#include "trainer/trainer.h"

namespace flowtrain::trainer {

FirstMicroBatch first_micro_batch(const Config& c, const models::DiffusionModel& model) {
  const c10::Device cpu(c10::kCPU);
  auto dataset = build_dataset(c);
  if (encodes_dataset_once(c)) dataset = encode_dataset_once(c, dataset, cpu);
  const RunConditioning conditioning = run_conditioning(c, dataset);
  // The trainer's source at one rank (batches do not depend on the worker count).
  const auto loader = make_batch_source(c, dataset, 0, 1, cpu, {});
  data::Batch batch = loader->next();
  if (auto online = OnlineEncoder::for_run(c, cpu)) online->encode(batch);  // as the step does
  const int64_t micro = batch.images.size(0) / c.train.grad_accum;
  FirstMicroBatch out;
  out.x0 = batch.images.narrow(0, 0, micro);
  out.draw = draw_step_inputs(c, timestep_sampler(c), model.conditioning_dropout(), out.x0,
                              conditioning.of_batch(batch).rows(0, micro), /*step=*/0, /*first_row=*/0);
  return out;
}

}  // namespace flowtrain::trainer
