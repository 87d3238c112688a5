#include "trainer/family.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace flowtrain::trainer {

std::vector<FamilySpec> builtin_families();  // trainer/families/registry.cpp

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<const FamilySpec>> families;  // stable addresses: specs are handed out by reference
};

Registry& registry() {
  static Registry* r = [] {
    auto* fresh = new Registry;  // never destroyed: specs may be looked up from static destructors
    for (FamilySpec& spec : builtin_families()) fresh->families.push_back(std::make_unique<FamilySpec>(std::move(spec)));
    return fresh;
  }();
  return *r;
}

}  // namespace

void register_family(FamilySpec spec) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& f : r.families)
    if (f->arch == spec.arch) throw std::invalid_argument("register_family: model.arch '" + spec.arch + "' is taken");
  if (!spec.preset || !spec.validate || !spec.build || !spec.cost || !spec.image_tokens || !spec.parallelize ||
      !spec.class_conditioning != !spec.classes ||
      (spec.objective ? spec.class_conditioning || spec.text_conditioning || !spec.objective->loss
                      : !spec.class_conditioning == !spec.text_conditioning))
    throw std::invalid_argument("register_family: '" + spec.arch +
                                "' needs preset, validate, build, cost, image_tokens, parallelize and exactly one of "
                                "class_conditioning (with classes) / text_conditioning, or an objective of its own "
                                "and neither");
  r.families.push_back(std::make_unique<FamilySpec>(std::move(spec)));
}

void unregister_family(const std::string& arch) {
  for (const FamilySpec& builtin : builtin_families())
    if (builtin.arch == arch) throw std::invalid_argument("unregister_family: '" + arch + "' is built in");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = std::find_if(r.families.begin(), r.families.end(), [&](const auto& f) { return f->arch == arch; });
  if (it == r.families.end()) throw std::invalid_argument("unregister_family: '" + arch + "' is not registered");
  r.families.erase(it);
}

std::vector<std::string> arch_names_where(const std::function<bool(const FamilySpec&)>& has) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& f : r.families)
    if (has(*f)) names.push_back(f->arch);
  return names;
}

std::vector<std::string> model_arch_names() {
  return arch_names_where([](const FamilySpec&) { return true; });
}

std::vector<std::string> model_size_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& f : r.families)
    for (const auto& size : f->sizes)
      if (std::find(names.begin(), names.end(), size) == names.end()) names.push_back(size);
  return names;
}

const FamilySpec& model_family(const std::string& arch) {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& f : r.families)
      if (f->arch == arch) return *f;
  }
  throw ConfigError(fmt::format("'model.arch' must be one of {}, got '{}'", fmt::join(model_arch_names(), "|"), arch));
}

ModelPreset model_preset(const ModelConfig& model) { return model_family(model.arch).preset(model.size); }

std::shared_ptr<models::DiffusionModel> build_model(const ModelConfig& model) {
  return model_family(model.arch).build(model);
}

std::vector<std::string> exported_parts(const ModelConfig& model) {
  const FamilySpec& family = model_family(model.arch);
  return family.exported_parts ? family.exported_parts(model) : std::vector<std::string>{""};
}

int64_t class_count(const ModelConfig& model) {
  const FamilySpec& family = model_family(model.arch);
  return family.classes ? family.classes(model) : 0;
}

bool reads_caption_tokens(const ModelConfig& model) {
  const FamilySpec& family = model_family(model.arch);
  return family.text_conditioning && family.text_conditioning(model).input == TextInput::Tokens;
}

TextConditioning text_conditioning(const ModelConfig& model) {
  const FamilySpec& family = model_family(model.arch);
  if (!family.text_conditioning)
    throw ConfigError(fmt::format("'model.arch' {} is {}: it reads no text (text-conditioned: {})", model.arch,
                                  family.class_conditioning ? "class-conditional" : "unconditioned",
                                  fmt::join(arch_names_where([](const FamilySpec& f) { return bool(f.text_conditioning); }),
                                            "|")));
  return family.text_conditioning(model);
}

}  // namespace flowtrain::trainer
