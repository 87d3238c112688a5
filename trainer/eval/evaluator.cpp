#include "trainer/eval/evaluator.h"

#include "trainer/family.h"

namespace flowtrain::trainer {

std::unique_ptr<Evaluator> make_evaluator(const Config& c) {
  if (model_family(c.model.arch).objective) return make_reconstruction_evaluator();
  if (c.data.source == DataSource::compositions) return make_prompt_following_evaluator();
  if (c.model.frames > 1) return make_motion_following_evaluator();
  return make_class_conditional_evaluator();
}

}  // namespace flowtrain::trainer
