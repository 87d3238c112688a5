// One interface for the four kinds of model-quality evaluation, chosen once per run from its
// task: training's periodic evaluation (eval.every) and `flowtrain eval` both ask make_evaluator.
//
//   a family with its own objective  reconstruction of the held-out split (reconstruction.cpp)
//   data.source compositions        prompt following (trainer/eval/prompt_following.h)
//   a video model (model.frames > 1) motion following (trainer/eval/motion_following.h)
//   otherwise                        class-conditional quality on Fashion-MNIST (evaluate.h)
#pragma once

#include "models/model.h"
#include "trainer/config/config.h"

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <string>

namespace flowtrain::trainer {

struct EvalScores {
  std::map<std::string, double> metrics;  // "eval_*" values for metrics.jsonl and TensorBoard
  std::string summary;  // the log line's body: "FD 12.345 (real-vs-real floor 1.234) | …"
  int64_t num = 0;      // samples scored
  std::string unit;     // what each sample is of: "samples" | "prompts"
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual std::string name() const = 0;  // "class-conditional quality", "prompt following", …
  // Throws ConfigError (naming the file and key) when this run's model and data cannot be judged
  // this way: the trainer calls it on every rank before training when eval.every > 0.
  virtual void check(const Config& config, const models::DiffusionModel& model) const = 0;
  // Training's periodic evaluation: the scores of generate_eval_samples' eval.num samples.
  virtual EvalScores score(const at::Tensor& samples, const models::DiffusionModel& model, const Config& config,
                           const c10::Device& device) const = 0;
  // `flowtrain eval`: judges a checkpoint's EMA weights (raw without EMA or with `raw`) on eval.num
  // samples (num_override > 0: that many) plus its held-out loss where the task has one (not motion
  // following), writes the report atomically beside the checkpoint and returns it as JSON.
  virtual std::string evaluate_checkpoint(const Config& config, const std::string& checkpoint_dir,
                                          int64_t num_override, bool raw) const = 0;
};

// The evaluation of `config`'s task (the table above: the one place that decides it).
std::unique_ptr<Evaluator> make_evaluator(const Config& config);

// The four, for make_evaluator (each defined beside its metrics).
std::unique_ptr<Evaluator> make_class_conditional_evaluator();
std::unique_ptr<Evaluator> make_prompt_following_evaluator();
std::unique_ptr<Evaluator> make_motion_following_evaluator();
std::unique_ptr<Evaluator> make_reconstruction_evaluator();

}  // namespace flowtrain::trainer
