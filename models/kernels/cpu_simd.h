#pragma once
// 8-lane fp32 vectors (GCC vector extensions) for the hand-written CPU kernels of models/kernels/cpu_*.cpp.
// Kernels using them are compiled for AVX2 and for the x86-64 baseline and picked at load time
// (target_clones); these helpers are inlined into them, so passing 32-byte vectors between
// functions compiled for different targets (-Wpsabi) never arises. Plain loads and stores lower
// well from a helper; broadcasts do not (FT_SPLAT8). No FMA contraction
// (ISO C++ mode): a·b + c rounds twice, like ATen's non-FMA CPU kernels.
#include <cstdint>
#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"

namespace flowtrain::models::simd {

using v8sf = float __attribute__((vector_size(32)));

inline v8sf load8(const float* p) {
  v8sf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8sf v) { std::memcpy(p, &v, sizeof v); }
}  // namespace flowtrain::models::simd

// f in every lane. A macro, not a function: GCC lowers a helper's vector code for the baseline
// target before inlining it into a target_clones kernel, which turns a broadcast into a chain
// of 8 lane inserts per use; written in the kernel's own body, `f − 0` (exact, −0 included)
// becomes one vbroadcastss.
#define FT_SPLAT8(f) (static_cast<float>(f) - ::flowtrain::models::simd::v8sf{})

namespace flowtrain::models::simd {

// Whether this CPU runs the kernels compiled for x86-64-v3 (AVX2 + FMA) regions; asked once.
inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

inline float hsum8(v8sf v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

}  // namespace flowtrain::models::simd
