// The pieces of the config schema that code outside config.cpp declares keys with: what a key
// allows (Allowed), where its value lives (Ref) and a builder that lists a struct's keys
// (KeyList). config.cpp declares the sections with them; a model family declares the keys it
// adds to the `model:` section (trainer/family.h FamilySpec::keys) with them, so that its keys
// are parsed, checked, written and diffed by the same code as every other key.
#pragma once

#include "trainer/config/config.h"

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace flowtrain::trainer {

// Allowed values of a key. Numeric bounds apply to int and real keys, choices/non_empty to
// strings. describe() is the text used in every error message about the key.
struct Allowed {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  std::vector<std::string> choices;  // empty = any string
  // Choices known only when asked (the registered model families: a test may add one).
  std::function<std::vector<std::string>()> choices_now;
  bool non_empty = false;

  std::string describe() const;
  bool admits(double v) const;
  bool admits(const std::string& v) const;
};

Allowed any_value();
Allowed at_least(double lo);
Allowed above(double lo);
Allowed range(const char* brackets, double lo, double hi);  // range("[)", 0, 1) is [0, 1)
Allowed one_of(std::vector<std::string> choices);
Allowed one_of_registered(std::function<std::vector<std::string>()> choices);
Allowed non_empty();

using StringList = std::vector<std::string>;
// An enum member seen through its words (enum_words): read and written as an index.
struct EnumRef {
  const std::vector<std::string>* words = nullptr;
  std::function<size_t()> get;
  std::function<void(size_t)> set;
  const std::string& word() const { return words->at(get()); }
};
// Where one key's value lives.
using Ref = std::variant<int64_t*, double*, bool*, std::string*, StringList*, EnumRef>;

// One key of an object of type Owner (Config for the sections, ModelConfig for a family's keys).
template <class Owner>
struct Key {
  std::string name;  // within its section: "lr", "video.frames"
  Allowed allowed;
  std::string help;  // the comment to_yaml writes beside it
  std::function<Ref(Owner&)> at;
};

// The keys of a struct S that `reach` finds inside an Owner, one add() per key:
//   KeyList<ModelConfig, FluxConfig>(reach).add("theta", &FluxConfig::theta, above(0), "RoPE base")
template <class Owner, class S>
struct KeyList {
  std::function<S&(Owner&)> reach;
  std::vector<Key<Owner>> keys;

  explicit KeyList(std::function<S&(Owner&)> reach_s) : reach(std::move(reach_s)) {}

  template <class T>
  KeyList& add(const char* name, T S::*field, Allowed allowed, const char* help) {
    static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                  std::is_same_v<T, std::string> || std::is_same_v<T, StringList>);
    keys.push_back(Key<Owner>{name, std::move(allowed), help,
                              [r = reach, field](Owner& o) -> Ref { return &(r(o).*field); }});
    return *this;
  }

  // A key of fixed words: the enum's (enum_words), parsed once by the schema.
  template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  KeyList& add(const char* name, E S::*field, const char* help) {
    keys.push_back(Key<Owner>{name, one_of(enum_words<E>()), help, [r = reach, field](Owner& o) -> Ref {
                                E* value = &(r(o).*field);
                                return EnumRef{&enum_words<E>(), [value] { return static_cast<size_t>(*value); },
                                               [value](size_t i) { *value = static_cast<E>(i); }};
                              }});
    return *this;
  }
};

// A model family's keys: those of its section struct S, kept in ModelConfig::family<S>().
template <class S>
KeyList<ModelConfig, S> family_keys() {
  return KeyList<ModelConfig, S>([](ModelConfig& m) -> S& { return m.family<S>(); });
}

}  // namespace flowtrain::trainer
