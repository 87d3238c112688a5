#include "trainer/eval/evaluator.h"

namespace flowtrain::trainer {

std::unique_ptr<Evaluator> make_evaluator(const Config& c) {
  if (c.data.source == DataSource::compositions) return make_prompt_following_evaluator();
  if (c.model.frames > 1) return make_motion_following_evaluator();
  return make_class_conditional_evaluator();
}

}  // namespace flowtrain::trainer
