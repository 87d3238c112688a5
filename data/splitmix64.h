// splitmix64 (Steele, Lea, Flood; Vigna's constants): a tiny, well-mixed generator whose
// sequence is fixed forever (unlike std:: engines' distributions, which differ between standard
// libraries). The data order (data/loader.cpp) and the per-row seeds of the training draws
// (trainer.cpp step_seed) both derive from it, so runs reproduce on any platform.
#pragma once

#include <cstdint>

namespace flowtrain::data {

// The output function: a bijective mix of 64 bits.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;  // the state increment: 2^64 / φ

struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return splitmix64_mix(state += kGoldenGamma); }
  uint64_t below(uint64_t n) { return next() % n; }  // bias < n / 2^64: irrelevant here
};

}  // namespace flowtrain::data
