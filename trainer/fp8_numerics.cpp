#include "trainer/fp8_numerics.h"

#include "models/fp8/convert.h"
#include "models/fp8/scaled_gemm.h"
#include "models/linear.h"
#include "trainer/fp8_setup.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>

namespace flowtrain::trainer {

namespace fp8 = models::fp8;

namespace {

// The fp32 pass: at::linear, keeping the layer's input and, through a hook, its output gradient.
class RecordingLinear : public models::LinearCompute {
 public:
  at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) override {
    x_ = x.detach();
    at::Tensor y = at::linear(x, weight, bias);
    if (y.requires_grad()) y.register_hook([this](const at::Tensor& grad) { dy_ = grad.detach(); });
    return y;
  }
  std::string describe() const override { return "fp32 (recording)"; }
  at::Tensor x_, dy_;
};

// SQNR against a reference; a zero reference (an untrained adaLN-Zero block passes no
// gradient) has no meaningful ratio: NaN.
double sqnr_or_nan(const at::Tensor& ref, const at::Tensor& test) {
  if (ref.abs().max().item<double>() == 0) return std::numeric_limits<double>::quiet_NaN();
  return fp8::sqnr_db(ref, test);
}

struct Counts {
  double saturated = 0, underflow = 0, numel = 0;
  void add(const at::Tensor& value, const fp8::OperandCast& cast, const at::Tensor& scale) {
    if (!cast.fp8) return;
    const at::Tensor v = fp8::pad_contracted(value, cast.scaling == fp8::Scaling::block32 ? fp8::kMxBlock : 1);
    const fp8::CastStats s = fp8::cast_stats(v, fp8::quantize(v, cast, scale));
    saturated += s.saturated * s.numel;  // counts: the padding zeros neither clip nor underflow
    underflow += s.underflow * s.numel;
    numel += value.numel();              // so they are left out of the denominator too
  }
};

LayerNumerics layer_numerics(const std::string& name, fp8::Recipe recipe, bool emulate, models::LinearImpl& layer,
                             const RecordingLinear& rec) {
  const at::Tensor x = rec.x_.reshape({-1, rec.x_.size(-1)}).to(at::kFloat);
  const at::Tensor dy = rec.dy_.reshape({-1, rec.dy_.size(-1)}).to(at::kFloat);
  const at::Tensor w = layer.weight.detach();
  const at::Tensor b = layer.bias.defined() ? layer.bias.detach() : at::Tensor();
  LayerNumerics out;
  out.name = name;
  {  // float64 references from the recorded tensors
    const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble), dyd = dy.to(at::kDouble);
    const at::Tensor y_ref = at::linear(xd, wd, b.defined() ? b.to(at::kDouble) : at::Tensor());
    const at::Tensor gx_ref = at::matmul(dyd, wd), gw_ref = at::matmul(dyd.t(), xd);
    at::Tensor xv = x.clone().requires_grad_(true), wv = w.clone().requires_grad_(true);
    fp8::Fp8Linear compute(recipe, emulate);
    at::Tensor y = compute.linear(xv, wv, b);
    y.backward(dy);
    out.sqnr_out_db = sqnr_or_nan(y_ref, y.detach());
    out.sqnr_grad_input_db = sqnr_or_nan(gx_ref, xv.grad());
    out.sqnr_grad_weight_db = sqnr_or_nan(gw_ref, wv.grad());
  }
  out.amax = x.abs().max().item<double>();
  // The casts of the three GEMMs as the recipe makes them (tensor scales: dynamic, from each
  // operand's own amax; on one batch delayed scaling's history is this batch's amax, the same).
  const fp8::RecipePlan p = fp8::plan(recipe);
  Counts c;
  c.add(x, p.output.a, {});
  c.add(w, p.output.b, {});
  c.add(dy, p.grad_input.a, {});
  c.add(w.t(), p.grad_input.b, {});
  c.add(dy.t(), p.grad_weight.a, {});
  c.add(x.t(), p.grad_weight.b, {});
  out.saturated = c.numel > 0 ? c.saturated / c.numel : 0;
  out.underflow = c.numel > 0 ? c.underflow / c.numel : 0;
  return out;
}

struct PassResult {
  double loss = 0, grad_norm = 0;
  std::vector<at::Tensor> grads;  // every parameter's gradient (undefined where none), fp32
};
PassResult forward_backward(models::DiffusionModel& model, const FirstMicroBatch& batch, const c10::Device& device) {
  model.zero_grad();
  models::FlowMatchingDraw draw = batch.draw;
  draw.t = draw.t.to(device);
  draw.noise = draw.noise.to(device);
  draw.cond = draw.cond.to(device);
  models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& cond) {
    return model.forward(x, t, cond);
  };
  at::Tensor loss = models::flow_matching_loss(velocity, batch.x0.to(device), draw).loss;
  loss.backward();
  PassResult r;
  r.loss = loss.item<double>();
  double sq = 0;
  for (const auto& p : model.parameters()) {
    r.grads.push_back(p.grad().defined() ? p.grad().detach().clone() : at::Tensor());
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  r.grad_norm = std::sqrt(sq);
  return r;
}

// cos∠(a, b) of the whole-model gradients: whether fp8 moves the step's direction or only its noise.
double gradient_cosine(const PassResult& a, const PassResult& b) {
  double dot = 0;
  for (size_t i = 0; i < a.grads.size(); ++i)
    if (a.grads[i].defined() && b.grads[i].defined())
      dot += (a.grads[i].to(at::kDouble) * b.grads[i].to(at::kDouble)).sum().item<double>();
  return a.grad_norm > 0 && b.grad_norm > 0 ? dot / (a.grad_norm * b.grad_norm) : std::nan("");
}

double rel_diff(double a, double ref) { return ref == 0 ? std::abs(a) : std::abs(a - ref) / std::abs(ref); }

}  // namespace

NumericsReport fp8_numerics(const Config& config, models::DiffusionModel& model, const FirstMicroBatch& batch,
                            const std::vector<std::string>& recipes, const c10::Device& device) {
  // The layers: the config's choice, found by converting once with a placeholder recipe.
  Config probe = config;
  probe.fp8.recipe = fp8::Recipe::tensorwise;
  const fp8::Fp8Options options = fp8_options(probe, device);
  const fp8::Fp8Conversion chosen = apply_fp8(model, probe, device);
  std::map<std::string, models::LinearImpl*> layers;
  for (const auto& item : model.named_modules("", false))
    if (auto* l = item.value()->as<models::Linear>(); l != nullptr && l->compute() != nullptr) layers[item.key()] = l;

  NumericsReport report;
  report.device = device.str();
  report.emulated = options.emulate;
  std::map<std::string, std::shared_ptr<RecordingLinear>> recorders;
  for (const auto& name : chosen.converted) {
    recorders[name] = std::make_shared<RecordingLinear>();
    layers.at(name)->set_compute(recorders[name]);
  }
  const PassResult fp32 = forward_backward(model, batch, device);
  report.loss = fp32.loss;
  report.grad_norm = fp32.grad_norm;

  for (const std::string& recipe_name : recipes) {
    const fp8::Recipe recipe = fp8::parse_recipe(recipe_name);
    if (recipe == fp8::Recipe::none) throw ConfigError("numerics: recipe none has nothing to measure");
    Config with = config;
    with.fp8.recipe = recipe;
    const bool emulate = fp8_options(with, device).emulate;  // errors here name the device
    RecipeNumerics r;
    r.recipe = recipe_name;
    for (const auto& name : chosen.converted)
      r.layers.push_back(layer_numerics(name, recipe, emulate, *layers.at(name), *recorders.at(name)));
    for (const auto& name : chosen.converted) layers.at(name)->set_compute(std::make_shared<fp8::Fp8Linear>(recipe, emulate));
    const PassResult pass = forward_backward(model, batch, device);
    r.loss = pass.loss;
    r.grad_norm = pass.grad_norm;
    r.loss_rel_diff = rel_diff(pass.loss, fp32.loss);
    r.grad_norm_rel_diff = rel_diff(pass.grad_norm, fp32.grad_norm);
    r.grad_cosine = gradient_cosine(pass, fp32);
    report.recipes.push_back(std::move(r));
  }
  for (const auto& [name, layer] : layers) layer->set_compute(nullptr);
  model.zero_grad();
  return report;
}

std::string NumericsReport::to_json() const {
  auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json j;
  j["device"] = device;
  j["emulated"] = emulated;
  j["fp32"] = {{"loss", loss}, {"grad_norm", grad_norm}};
  j["recipes"] = nlohmann::json::object();
  for (const auto& r : recipes) {
    nlohmann::json layers_json = nlohmann::json::array();
    for (const auto& l : r.layers)
      layers_json.push_back({{"name", l.name},
                             {"sqnr_out_db", number(l.sqnr_out_db)},
                             {"sqnr_grad_input_db", number(l.sqnr_grad_input_db)},
                             {"sqnr_grad_weight_db", number(l.sqnr_grad_weight_db)},
                             {"amax", number(l.amax)},
                             {"saturated", number(l.saturated)},
                             {"underflow", number(l.underflow)}});
    j["recipes"][r.recipe] = {{"layers", layers_json},
                              {"loss", number(r.loss)},
                              {"grad_norm", number(r.grad_norm)},
                              {"loss_rel_diff", number(r.loss_rel_diff)},
                              {"grad_norm_rel_diff", number(r.grad_norm_rel_diff)},
                              {"grad_cosine", number(r.grad_cosine)}};
  }
  return j.dump(1);
}

std::string NumericsReport::to_table() const {
  std::string out = fmt::format("fp32: loss {:.6f}, grad norm {:.6f} ({}{})\n", loss, grad_norm, device,
                                emulated ? ", fp8 emulated" : "");
  for (const auto& r : recipes) {
    out += fmt::format("\n{}\n{:<32} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}\n", r.recipe, "layer", "out dB", "dx dB",
                       "dW dB", "amax", "sat %", "uflow %");
    for (const auto& l : r.layers)
      out += fmt::format("{:<32} {:>8.1f} {:>8.1f} {:>8.1f} {:>9.3g} {:>9.4f} {:>9.4f}\n", l.name, l.sqnr_out_db,
                         l.sqnr_grad_input_db, l.sqnr_grad_weight_db, l.amax, 100 * l.saturated, 100 * l.underflow);
    out += fmt::format("whole model: loss {:.6f} (rel diff {:.2e}), grad norm {:.6f} (rel diff {:.2e}), "
                       "cos(grad, fp32 grad) {:.4f}\n",
                       r.loss, r.loss_rel_diff, r.grad_norm, r.grad_norm_rel_diff, r.grad_cosine);
  }
  return out;
}

}  // namespace flowtrain::trainer
