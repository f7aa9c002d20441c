// backend::cpu's inner loops through Google Highway. Define SIDCO_HIGHWAY=1 and link libhwy
// to use them (our Meson dependency does both when libhwy is found).
//
// Dispatch: by default the kernels are compiled for every x86 target from SSSE3 to
// AVX-512 (or NEON on Arm) that Highway can reach from the including program's flags, and
// the best one the CPU has is chosen at run time (Highway's foreach_target mechanism), so a
// program built without -march=native still runs AVX2 or AVX-512 loops. A program built
// for its own machine defines HWY_COMPILE_ONLY_STATIC (our -Dnative=true does) and gets
// only the static target, called directly. Without Highway, or where the best target is
// Highway's scalar or 128-bit emulation, backend::cpu runs its portable loops instead.
// Results are those of the serial oracle: selections and counts exactly, sums to the lanes'
// rounding (so bit-identical across builds that run the same target).
//
// Highway's foreach_target.h works once per translation unit and only before any other
// Highway header, so dynamic dispatch needs this header to be the unit's first Highway
// include, and the program's own foreach_target code to live in other units. Where Highway
// was included first, the kernels are compiled for the static target alone
// (simd::dynamic_dispatch is false).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "sidco/backend/cpu/lanes.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/fast_log.hpp"
#include "sidco/core/half.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/memory/host.hpp"

#if defined(SIDCO_HIGHWAY) && SIDCO_HIGHWAY
// Highway 1.0.3 refuses -march=native on AVX-512 VNNI/VBMI2 CPUs without this; it also
// adds AVX3_DL to the dispatched targets.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif
#define SIDCO_HIGHWAY_KERNELS 1
#endif

namespace sidco::backend::simd {

#if defined(SIDCO_HIGHWAY_KERNELS)
// Highway 1.0's Compress for eight 32-bit lanes (AVX2) keeps its 1 KiB index table in a
// non-static local array, which GCC 12 copies onto the stack on every call: a third of the
// selection pass at δ = 0.1. The same permutation from a static table: entry m holds, in
// nibble j, the lane of the j-th set bit of m.
struct compress8_table {
  std::array<std::uint32_t, 256> nibbles{};
  constexpr compress8_table() {
    for (std::uint32_t mask = 0; mask < 256; ++mask) {
      std::uint32_t word = 0, out = 0;
      for (std::uint32_t lane = 0; lane < 8; ++lane)
        if (mask >> lane & 1) word |= lane << (4 * out++);
      nibbles[mask] = word;
    }
  }
};
inline constexpr compress8_table compress8{};
}  // namespace sidco::backend::simd

// foreach_target.h works once per translation unit, and only before highway.h: take it
// when it is free, else compile the kernels for the static target alone.
#if !defined(HWY_HIGHWAY_INCLUDED) && !defined(HIGHWAY_HWY_FOREACH_TARGET_H_)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sidco/backend/cpu/highway_kernels.hpp"
#include <hwy/foreach_target.h>  // the kernels for each dispatched target
#else
#define SIDCO_HIGHWAY_STATIC_ONLY 1
#endif
#include "sidco/backend/cpu/highway_kernels.hpp"  // and for the static one

namespace sidco::backend::simd {

// The targets with kernels: Highway's compiled targets that we name below, and the static
// target, less scalar and emulation. Highway orders targets best first by bit (lowest bit
// best).
#define SIDCO_SIMD_NAMED_TARGETS (HWY_AVX3_DL | HWY_AVX3 | HWY_AVX2 | HWY_SSE4 | HWY_SSSE3 | HWY_NEON)
#if defined(SIDCO_HIGHWAY_STATIC_ONLY)
#define SIDCO_SIMD_TARGETS (HWY_STATIC_TARGET & ~(HWY_SCALAR | HWY_EMU128))
#else
#define SIDCO_SIMD_TARGETS \
  ((HWY_TARGETS & SIDCO_SIMD_NAMED_TARGETS) | (HWY_STATIC_TARGET & ~(HWY_SCALAR | HWY_EMU128)))
#endif

/// The target the kernels run: the best of SIDCO_SIMD_TARGETS the CPU has, 0 for none (the
/// portable loops run). Chosen once per program, from hwy::SupportedTargets().
inline std::int64_t chosen_target() {
  if constexpr (SIDCO_SIMD_TARGETS == HWY_STATIC_TARGET) {
    return HWY_STATIC_TARGET;  // compiled for this CPU only
  } else {
    static const std::int64_t chosen = [] {
      const std::int64_t usable = hwy::SupportedTargets() & SIDCO_SIMD_TARGETS;
      return usable & -usable;
    }();
    return chosen;
  }
}

/// Whether the Highway kernels run (else the portable loops).
inline bool active() { return chosen_target() != 0; }

/// The instruction set the kernels run, or "portable".
inline const char* target_name() {
  switch (chosen_target()) {
    case 0: return "portable";
#if HWY_ARCH_X86
    case HWY_AVX3_DL: return "Highway AVX3_DL (AVX-512)";
    case HWY_AVX3: return "Highway AVX3 (AVX-512)";
    case HWY_AVX2: return "Highway AVX2";
    case HWY_SSE4: return "Highway SSE4";
    case HWY_SSSE3: return "Highway SSSE3";
#endif
    default: return "Highway";
  }
}

/// Whether the kernels were compiled for more than one target (chosen at run time).
inline constexpr bool dynamic_dispatch = SIDCO_SIMD_TARGETS != HWY_STATIC_TARGET;

// One case per named target compiled: calls that target's kernel.
#define SIDCO_SIMD_CASE(TARGET, ...) \
  case HWY_##TARGET:                 \
    return N_##TARGET::__VA_ARGS__;
#if (SIDCO_SIMD_TARGETS & HWY_AVX3_DL) && HWY_STATIC_TARGET != HWY_AVX3_DL
#define SIDCO_SIMD_CASE_AVX3_DL(...) SIDCO_SIMD_CASE(AVX3_DL, __VA_ARGS__)
#else
#define SIDCO_SIMD_CASE_AVX3_DL(...)
#endif
#if (SIDCO_SIMD_TARGETS & HWY_AVX3) && HWY_STATIC_TARGET != HWY_AVX3
#define SIDCO_SIMD_CASE_AVX3(...) SIDCO_SIMD_CASE(AVX3, __VA_ARGS__)
#else
#define SIDCO_SIMD_CASE_AVX3(...)
#endif
#if (SIDCO_SIMD_TARGETS & HWY_AVX2) && HWY_STATIC_TARGET != HWY_AVX2
#define SIDCO_SIMD_CASE_AVX2(...) SIDCO_SIMD_CASE(AVX2, __VA_ARGS__)
#else
#define SIDCO_SIMD_CASE_AVX2(...)
#endif
#if (SIDCO_SIMD_TARGETS & HWY_SSE4) && HWY_STATIC_TARGET != HWY_SSE4
#define SIDCO_SIMD_CASE_SSE4(...) SIDCO_SIMD_CASE(SSE4, __VA_ARGS__)
#else
#define SIDCO_SIMD_CASE_SSE4(...)
#endif
#if (SIDCO_SIMD_TARGETS & HWY_SSSE3) && HWY_STATIC_TARGET != HWY_SSSE3
#define SIDCO_SIMD_CASE_SSSE3(...) SIDCO_SIMD_CASE(SSSE3, __VA_ARGS__)
#else
#define SIDCO_SIMD_CASE_SSSE3(...)
#endif
#if (SIDCO_SIMD_TARGETS & HWY_NEON) && HWY_STATIC_TARGET != HWY_NEON
#define SIDCO_SIMD_CASE_NEON(...) SIDCO_SIMD_CASE(NEON, __VA_ARGS__)
#else
#define SIDCO_SIMD_CASE_NEON(...)
#endif

#if HWY_STATIC_TARGET & SIDCO_SIMD_TARGETS
#define SIDCO_SIMD_CASE_STATIC(...) \
  if (target == HWY_STATIC_TARGET) return HWY_NAMESPACE::__VA_ARGS__;
#else
#define SIDCO_SIMD_CASE_STATIC(...)
#endif

// Calls the chosen target's kernel; the static target's directly (inlinable when it is
// the only one). Callers check active() first: the default case is never taken then.
#define SIDCO_SIMD_DISPATCH(...)                                                              \
  do {                                                                                        \
    [[maybe_unused]] const std::int64_t target = chosen_target();                             \
    SIDCO_SIMD_CASE_STATIC(__VA_ARGS__)                                                       \
    switch (target) {                                                                         \
      SIDCO_SIMD_CASE_AVX3_DL(__VA_ARGS__) SIDCO_SIMD_CASE_AVX3(__VA_ARGS__)                  \
      SIDCO_SIMD_CASE_AVX2(__VA_ARGS__) SIDCO_SIMD_CASE_SSE4(__VA_ARGS__)                     \
      SIDCO_SIMD_CASE_SSSE3(__VA_ARGS__) SIDCO_SIMD_CASE_NEON(__VA_ARGS__) default : break;   \
    }                                                                                         \
    __builtin_unreachable();                                                                  \
  } while (false)

template <class T>
inline constexpr bool kernel_type =
    std::is_same_v<T, float> || std::is_same_v<T, double> || cpu_detail::is_16_bit<T>;
template <class Source>
struct loads : std::false_type {};
template <class T>
struct loads<plain_source<T, memory::host>> : std::bool_constant<kernel_type<T>> {};
template <class T>
struct loads<feedback_source<T, memory::host>> : std::bool_constant<kernel_type<T>> {};

/// Sources the kernels read whole vectors from: float, double and the 16-bit types (in
/// float lanes). The momentum source is left to the portable loops (its fused
/// multiply-add must round exactly as the oracle's does).
template <class Source>
inline constexpr bool handles = loads<Source>::value;

/// Selections also need an index lane per value lane.
template <class Source, class Index>
inline constexpr bool selects =
    handles<Source> && sizeof(Index) == sizeof(cpu_detail::lane_t<typename Source::value_type>);

// The wrappers' parameters are [[maybe_unused]]: a build whose targets have no kernels
// (HWY_COMPILE_ONLY_STATIC without -march on x86) dispatches to none of them.

/// How many |x_i| > t in [lo, hi) over whole vectors; returns where it stopped (lo when
/// the kernels do not run).
template <class Source, class S>
std::size_t count_above([[maybe_unused]] const Source& s, std::size_t lo, [[maybe_unused]] std::size_t hi,
                        [[maybe_unused]] S above, [[maybe_unused]] std::size_t& count) {
  if (!active()) return lo;
  SIDCO_SIMD_DISPATCH(count_above(s, lo, hi, above, count));
}

/// The selection's inner loop over whole vectors (see the kernel); returns where it stopped
/// (lo when the kernels do not run).
template <bool Final, class Source, class S, class T, class Index>
std::size_t write_above([[maybe_unused]] const Source& s, std::size_t lo, [[maybe_unused]] std::size_t hi,
                        [[maybe_unused]] S above, [[maybe_unused]] Index* indices, [[maybe_unused]] T* values,
                        [[maybe_unused]] std::size_t& at, [[maybe_unused]] std::size_t end) {
  if (!active()) return lo;
  SIDCO_SIMD_DISPATCH(write_above<Final>(s, lo, hi, above, indices, values, at, end));
}

/// A block's lane statistics (see the kernel). Only when active().
template <bool Log, bool TailLog, std::size_t Probes, class Source, class Sum, class T = typename Source::value_type>
std::size_t block_statistics([[maybe_unused]] const Source& s, [[maybe_unused]] std::size_t i,
                             [[maybe_unused]] std::size_t block, [[maybe_unused]] const cpu_detail::probe_at<T>* probes,
                             [[maybe_unused]] cpu_detail::lane_statistics<T, Probes, Sum>& out,
                             [[maybe_unused]] bool every_vector) {
  SIDCO_SIMD_DISPATCH(block_statistics<Log, TailLog, Probes>(s, i, block, probes, out, every_vector));
}

/// The chosen target's lane count for T. Only when active().
template <class T>
std::size_t lanes() {
  SIDCO_SIMD_DISPATCH(lanes<T>());
}

#undef SIDCO_SIMD_DISPATCH
#undef SIDCO_SIMD_CASE_STATIC
#undef SIDCO_SIMD_CASE_AVX3_DL
#undef SIDCO_SIMD_CASE_AVX3
#undef SIDCO_SIMD_CASE_AVX2
#undef SIDCO_SIMD_CASE_SSE4
#undef SIDCO_SIMD_CASE_SSSE3
#undef SIDCO_SIMD_CASE_NEON
#undef SIDCO_SIMD_CASE

#else
inline constexpr bool dynamic_dispatch = false;
inline std::int64_t chosen_target() { return 0; }
inline bool active() { return false; }
inline const char* target_name() { return "portable"; }
template <class Source>
inline constexpr bool handles = false;
template <class Source, class Index>
inline constexpr bool selects = false;
// Named by backend::cpu in branches it discards when the kernels are absent.
template <bool Log, bool TailLog, std::size_t Probes, class... Args>
std::size_t block_statistics(Args&&...) = delete;
template <bool Final, class... Args>
std::size_t write_above(Args&&...) = delete;
template <class... Args>
std::size_t count_above(Args&&...) = delete;
template <class T>
std::size_t lanes() = delete;
#endif

}  // namespace sidco::backend::simd
