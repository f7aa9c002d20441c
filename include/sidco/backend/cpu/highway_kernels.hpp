// backend::cpu's Highway kernels for one target. Not a normal header: highway.hpp includes
// it once per target it compiles (through hwy/foreach_target.h, which re-includes it with
// each target's HWY_NAMESPACE and compiler attributes) and once more for the static target.
// Include highway.hpp, never this file.
// The guard: once when highway.hpp compiles the static target alone, else Highway's
// per-target toggle.
#if defined(SIDCO_HIGHWAY_STATIC_ONLY)
#ifndef SIDCO_BACKEND_CPU_HIGHWAY_KERNELS_STATIC_
#define SIDCO_BACKEND_CPU_HIGHWAY_KERNELS_STATIC_
#define SIDCO_HIGHWAY_KERNELS_PASS 1
#endif
#elif defined(SIDCO_BACKEND_CPU_HIGHWAY_KERNELS_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIDCO_BACKEND_CPU_HIGHWAY_KERNELS_
#undef SIDCO_BACKEND_CPU_HIGHWAY_KERNELS_
#else
#define SIDCO_BACKEND_CPU_HIGHWAY_KERNELS_
#endif
#define SIDCO_HIGHWAY_KERNELS_PASS 1
#endif

#if defined(SIDCO_HIGHWAY_KERNELS_PASS)
#undef SIDCO_HIGHWAY_KERNELS_PASS

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace sidco::backend::simd {
namespace HWY_NAMESPACE {
// Scalar and 128-bit emulation targets get no kernels: the portable loops are as good.
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128

namespace hn = hwy::HWY_NAMESPACE;

// 16-bit values live in float lanes (cpu_detail::lane_t): widened exactly, and rounded back
// as core/half.hpp rounds (to nearest even, NaN to the quiet NaN of its sign). F16C's
// instructions where the target has them (Highway's emulation elsewhere takes infinities
// for finite values), the same steps as core/half.hpp's on integer lanes otherwise.
#if HWY_ARCH_X86 && HWY_TARGET < HWY_SSE4 && !defined(HWY_DISABLE_F16C)
#define SIDCO_HIGHWAY_F16C 1
#endif

using cpu_detail::is_16_bit;

// 16-bit values' bits (u16 lanes, one per lane of d) as d's float lanes.
template <class T, class D, class V16>
HWY_INLINE auto widen(D d, V16 bits) {
  const hn::RebindToUnsigned<D> du;
  if constexpr (std::is_same_v<T, bfloat16>) {
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, bits)));
  } else {
#if defined(SIDCO_HIGHWAY_F16C)
    return hn::PromoteTo(d, hn::BitCast(hn::Rebind<hwy::float16_t, D>(), bits));
#else
    const hn::RebindToSigned<D> di;
    const auto h = hn::PromoteTo(du, bits);
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    const auto magnitude = hn::And(h, hn::Set(du, 0x7fffu));
    const auto exponent = hn::ShiftRight<10>(magnitude);
    const auto normal = hn::Add(hn::ShiftLeft<13>(magnitude), hn::Set(du, 112u << 23));
    const auto not_finite =
        hn::Or(hn::Set(du, 0x7f800000u), hn::ShiftLeft<13>(hn::And(magnitude, hn::Set(du, 0x3ffu))));
    // Zero and subnormals: the mantissa times 2^-24, exact in float.
    const auto subnormal = hn::BitCast(du, hn::Mul(hn::ConvertTo(d, hn::BitCast(di, magnitude)), hn::Set(d, 0x1p-24f)));
    auto out = hn::IfThenElse(hn::Eq(exponent, hn::Zero(du)), subnormal, normal);
    out = hn::IfThenElse(hn::Eq(exponent, hn::Set(du, 0x1fu)), not_finite, out);
    return hn::BitCast(d, hn::Or(sign, out));
#endif
  }
}

// d's float lanes rounded to T: u16 lanes of bits.
template <class T, class D, class V>
HWY_INLINE auto narrow(D d, V v) {
  const hn::Rebind<std::uint16_t, D> d16;
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto x = hn::BitCast(du, v);
  const auto magnitude = hn::And(x, hn::Set(du, 0x7fffffffu));
  const auto nan = hn::Gt(magnitude, hn::Set(du, 0x7f800000u));
  if constexpr (std::is_same_v<T, bfloat16>) {
    const auto odd = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(x, hn::Set(du, 0x7fffu)), odd));
    const auto bits = hn::IfThenElse(nan, hn::Or(hn::ShiftRight<16>(x), hn::Set(du, 0x40u)), rounded);
    return hn::DemoteTo(d16, hn::BitCast(di, bits));
  } else {
#if defined(SIDCO_HIGHWAY_F16C)
    // F16C keeps a NaN's payload: give it the quiet NaN of the lane's sign instead.
    const auto quiet = hn::Or(hn::And(x, hn::Set(du, 0x80000000u)), hn::Set(du, 0x7fc00000u));
    const auto h = hn::DemoteTo(hn::Rebind<hwy::float16_t, D>(), hn::BitCast(d, hn::IfThenElse(nan, quiet, x)));
    return hn::BitCast(d16, h);
#else
    const auto sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 0x8000u));
    const auto odd = hn::And(hn::ShiftRight<13>(magnitude), hn::Set(du, 1u));
    const auto normal =
        hn::ShiftRight<13>(hn::Sub(hn::Add(hn::Add(magnitude, hn::Set(du, 0xfffu)), odd), hn::Set(du, 0x38000000u)));
    // Below the normals, adding 0.5 rounds to a multiple of 2^-24: the subnormal's bits.
    const auto subnormal =
        hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(d, magnitude), hn::Set(d, 0.5f))), hn::Set(du, 0x3f000000u));
    auto bits = hn::IfThenElse(hn::Gt(magnitude, hn::Set(du, 0x387fffffu)), normal, subnormal);
    bits = hn::IfThenElse(hn::Gt(magnitude, hn::Set(du, 0x477fefffu)), hn::Set(du, 0x7c00u), bits);
    bits = hn::IfThenElse(nan, hn::Set(du, 0x7e00u), bits);
    return hn::DemoteTo(d16, hn::BitCast(di, hn::Or(sign, bits)));
#endif
  }
}

template <class T, class D>
HWY_INLINE auto load_widened(D d, const T* p) {
  return widen<T>(d, hn::LoadU(hn::Rebind<std::uint16_t, D>(), reinterpret_cast<const std::uint16_t*>(p)));
}

template <class T, class D, class V>
HWY_INLINE void store_narrowed(D d, V v, T* p) {
  hn::StoreU(narrow<T>(d, v), hn::Rebind<std::uint16_t, D>(), reinterpret_cast<std::uint16_t*>(p));
}

template <class D, class T>
HWY_INLINE auto load(D d, const plain_source<T, memory::host>& s, std::size_t i) {
  if constexpr (is_16_bit<T>)
    return load_widened(d, s.gradient + i);
  else
    return hn::LoadU(d, s.gradient + i);
}
template <class D, class T>
HWY_INLINE auto load(D d, const feedback_source<T, memory::host>& s, std::size_t i) {
  if constexpr (is_16_bit<T>) {
    // g + r rounded to T once, as the source's value(i) rounds it.
    return widen<T>(d, narrow<T>(d, hn::Add(load_widened(d, s.gradient + i), load_widened(d, s.residual + i))));
  } else {
    return hn::Add(hn::LoadU(d, s.gradient + i), hn::LoadU(d, s.residual + i));
  }
}

// Leaves v in the residual, or +0 where sent.
template <bool Final, class D, class V, class M, class Source>
HWY_INLINE void settle(D d, const Source& s, std::size_t i, V v, M sent) {
  if constexpr (Source::has_state) {
    const V left = Final ? hn::IfThenZeroElse(sent, v) : v;
    if constexpr (is_16_bit<typename Source::value_type>)
      store_narrowed(d, left, s.residual + i);
    else
      hn::StoreU(left, d, s.residual + i);
  }
}

// |v| > t for above = the lane key of threshold_key(t), never for NaN: integer compares on
// the magnitude bits.
template <class D, class V, class S>
HWY_INLINE auto exceeds(D d, V v, S above) {
  const hn::RebindToSigned<D> di;
  constexpr S infinity = sizeof(S) == 4 ? S(0x7f800000) : S(0x7ff0000000000000ll);
  const auto key = hn::And(hn::BitCast(di, v), hn::Set(di, std::numeric_limits<S>::max()));
  return hn::RebindMask(d, hn::And(hn::Gt(key, hn::Set(di, above)),
                                   hn::Lt(key, hn::Set(di, S(infinity + 1)))));
}

/// How many |x_i| > t in [lo, hi) over whole vectors; returns where it stopped.
template <class Source, class S>
std::size_t count_above(const Source& s, std::size_t lo, std::size_t hi, S above,
                        std::size_t& count) {
  using T = typename Source::value_type;
  const hn::ScalableTag<cpu_detail::lane_t<T>> d;
  const auto lane_above = cpu_detail::lane_key<T>(above);
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = lo, n = 0;
  for (; i + lanes <= hi; i += lanes) n += hn::CountTrue(d, exceeds(d, load(d, s, i), lane_above));
  count += n;
  return i;
}


// The lanes of keep moved to the front, in order (the rest: scratch).
template <class D>
class compressor_for {
 public:
  static constexpr bool table = hn::MaxLanes(D()) == 8 && sizeof(hn::TFromD<D>) == 4;

  // Written out: an implicit constructor would lack the target's attributes.
  HWY_INLINE compressor_for() : shifts_(hn::ShiftLeft<2>(hn::Iota(hn::RebindToUnsigned<D>(), 0))) {}

  template <class V, class M>
  HWY_INLINE V operator()(D d, V v, M keep) const {
    if constexpr (table) {
      const hn::RebindToUnsigned<D> du;
      std::uint8_t mask = 0;
      hn::StoreMaskBits(d, keep, &mask);
      const auto lanes = hn::And(hn::Set(du, compress8.nibbles[mask]) >> shifts_, hn::Set(du, 7u));
      return hn::TableLookupLanes(v, hn::IndicesFromVec(d, hn::BitCast(hn::RebindToSigned<D>(), lanes)));
    } else {
      return hn::Compress(v, keep);
    }
  }

 private:
  using shift_vector = decltype(hn::Zero(hn::RebindToUnsigned<D>()));
  shift_vector shifts_;
};

/// The selection's inner loop over whole vectors from lo: settles each vector, compresses
/// its kept values and their indices in register and stores them whole at [at, at + lanes)
/// (the store is cheaper than compress-to-memory, which is microcoded on AMD Zen 4/5; the
/// lanes past the kept count are scratch). Stops before a vector when fewer than lanes slots
/// remain below end; returns where it stopped.
template <bool Final, class Source, class S, class T, class Index>
std::size_t write_above(const Source& s, std::size_t lo, std::size_t hi, S above,
                        Index* indices, T* values, std::size_t& at, std::size_t end) {
  const hn::ScalableTag<cpu_detail::lane_t<T>> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const auto lane_above = cpu_detail::lane_key<T>(above);
  const std::size_t lanes = hn::Lanes(d);
  const compressor_for<decltype(d)> compress_values;
  const compressor_for<decltype(du)> compress_indices;
  std::size_t i = lo;
  for (; i + lanes <= hi && at + lanes <= end; i += lanes) {
    const auto v = load(d, s, i);
    const auto keep = exceeds(d, v, lane_above);
    settle<Final>(d, s, i, v, keep);
    if (hn::AllFalse(d, keep)) continue;
    if constexpr (is_16_bit<T>)
      store_narrowed(d, compress_values(d, v, keep), values + at);  // exact: the values are T's
    else
      hn::StoreU(compress_values(d, v, keep), d, values + at);
    const auto position = hn::Iota(du, static_cast<Index>(s.base + i));
    hn::StoreU(compress_indices(du, position, hn::RebindMask(du, keep)), du, indices + at);
    at += hn::CountTrue(d, keep);
  }
  return i;
}

/// fast_log's algorithm on a vector of positive finite values (same constants and steps).
template <class D, class V>
HWY_INLINE V fast_log(D d, V a) {
  using T = hn::TFromD<D>;
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  using I = hn::TFromD<decltype(di)>;
  using C = detail::fast_log_constants<T>;
  constexpr int mantissa_bits = C::mantissa_bits;
  constexpr auto exponent_bias = C::exponent_bias;
  constexpr auto min_normal = C::min_normal;
  const auto tiny = hn::Lt(hn::BitCast(du, a), hn::Set(du, min_normal));
  const auto scale = hn::IfThenElse(tiny, hn::Set(du, (exponent_bias + mantissa_bits) << mantissa_bits),
                                    hn::Set(du, exponent_bias << mantissa_bits));
  const auto bits = hn::BitCast(du, hn::Mul(a, hn::BitCast(d, scale)));
  const auto mantissa = hn::And(bits, hn::Set(du, min_normal - 1));
  const auto high = hn::Gt(mantissa, hn::Set(du, C::sqrt2_mantissa));
  const auto m_exponent = hn::IfThenElse(high, hn::Set(du, exponent_bias - 1), hn::Set(du, exponent_bias));
  const V m = hn::BitCast(d, hn::Or(mantissa, hn::ShiftLeft<mantissa_bits>(m_exponent)));
  auto e = hn::Sub(hn::BitCast(di, hn::ShiftRight<mantissa_bits>(bits)), hn::Set(di, I(exponent_bias)));
  e = hn::Sub(e, hn::BitCast(di, hn::VecFromMask(du, high)));  // + 1 where high
  e = hn::IfThenElse(hn::RebindMask(di, tiny), hn::Sub(e, hn::Set(di, I(mantissa_bits))), e);
  const V one = hn::Set(d, T(1));
  const V s = hn::Div(hn::Sub(m, one), hn::Add(m, one));
  const V s2 = hn::Mul(s, s);
  // Horner from 1/last_odd down to 1, as the scalar form's nested sum.
  V series = hn::Set(d, T(1) / T(C::last_odd));
  for (int odd = C::last_odd - 2; odd >= 1; odd -= 2)
    series = hn::MulAdd(s2, series, hn::Set(d, T(1) / T(odd)));
  return hn::MulAdd(hn::ConvertTo(d, e), hn::Set(d, C::ln2),
                    hn::Mul(hn::Add(s, s), series));
}

// Sums of x and x^2 in lanes of T (Sum = T) or of double (float lanes promoted: the low
// half into [0], the high half into [1]).
template <class D, class Sum>
struct lane_sums {
  using VD = decltype(hn::Zero(hn::Repartition<Sum, D>()));
  static constexpr bool promoted = sizeof(Sum) > sizeof(hn::TFromD<D>);
  VD sum[2], square[2];

  HWY_INLINE lane_sums() {
    const hn::Repartition<Sum, D> ds;
    sum[0] = sum[1] = square[0] = square[1] = hn::Zero(ds);
  }

  template <class V>
  HWY_INLINE void add(V x) {
    if constexpr (promoted) {
      const hn::Repartition<double, D> dd;
      const hn::Half<D> dh;
      const auto low = hn::PromoteTo(dd, hn::LowerHalf(dh, x));
      const auto high = hn::PromoteTo(dd, hn::UpperHalf(dh, x));
      sum[0] = hn::Add(sum[0], low);
      sum[1] = hn::Add(sum[1], high);
      square[0] = hn::MulAdd(low, low, square[0]);
      square[1] = hn::MulAdd(high, high, square[1]);
    } else {
      sum[0] = hn::Add(sum[0], x);
      square[0] = hn::MulAdd(x, x, square[0]);
    }
  }

  // One Sum per T lane, in lane order.
  HWY_INLINE void store(Sum* sums, Sum* squares) const {
    const hn::Repartition<Sum, D> ds;
    hn::Store(sum[0], ds, sums);
    hn::Store(square[0], ds, squares);
    if constexpr (promoted) {
      hn::Store(sum[1], ds, sums + hn::Lanes(ds));
      hn::Store(square[1], ds, squares + hn::Lanes(ds));
    }
  }
};

// A count of a mask's true lanes, stored as lanes that sum to it. Where masks are
// registers of their own (AVX-512), their popcounts run on the scalar ports, idle in the
// moments loop, not on the vector ones it waits for (before/after in docs/RESULTS.md, "The
// moments pass's counts on the scalar ports"). Elsewhere a mask is a vector, one subtract
// counts it, and popcounts were 1.03-1.10x slower (AVX2, 2^25).
template <class D>
class lane_count {
 public:
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  HWY_INLINE lane_count() = default;
  template <class M>
  HWY_INLINE void add(D d, M mask) { count_ += hn::CountTrue(d, mask); }
  HWY_INLINE void store(D d, hn::TFromD<D>* lanes) const {
    hn::Store(hn::Zero(d), d, lanes);
    lanes[0] = static_cast<hn::TFromD<D>>(count_);
  }

 private:
  std::size_t count_ = 0;
#else
  // Written out: an implicit constructor would lack the target's attributes.
  HWY_INLINE lane_count() : count_(hn::Zero(D())) {}
  template <class M>
  HWY_INLINE void add(D d, M mask) { count_ = hn::Sub(count_, hn::VecFromMask(d, mask)); }
  HWY_INLINE void store(D d, hn::TFromD<D>* lanes) const { hn::Store(count_, d, lanes); }

 private:
  decltype(hn::Zero(D())) count_;
#endif
};

/// Fills out's lanes with [i, i + block) of s: moments of |x| and, for each probe, the
/// count above it and the sums of the excesses (ln of them when TailLog), summed in the
/// lanes' Sum type. block is a multiple of the lane count, which is at most 64 bytes' worth.
/// Probes ascend (probe 0 the lowest). Returns how many vectors held a value above probe 0.
/// A vector above none skips the tails' work, unless every_vector: where such vectors are
/// scattered, the skip's branch mispredicts and costs more than the work (which adds zeros:
/// the same sums either way). A vector above probe 0 and none higher skips theirs: values
/// above a higher probe are rarer, so that branch is predicted.
template <bool Log, bool TailLog, std::size_t Probes, class Source, class Sum, class T = typename Source::value_type>
std::size_t block_statistics(const Source& s, std::size_t i, std::size_t block, const cpu_detail::probe_at<T>* probes,
                             cpu_detail::lane_statistics<T, Probes, Sum>& out, bool every_vector) {
  using A = cpu_detail::lane_t<T>;
  const hn::ScalableTag<A> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::RebindToSigned<decltype(d)> di;
  using V = decltype(hn::Zero(d));
  using VU = decltype(hn::Zero(du));
  using Key = magnitude_key_t<A>;
  const auto infinity = hn::Set(du, float_traits<A>::infinity);
  const auto one_key = hn::Set(du, magnitude_key(A(1)));
  const auto no_sign = hn::Set(du, ~Key(0) >> 1);
  lane_sums<decltype(d), Sum> sums;
  V sum_log = hn::Zero(d);
  VU low = infinity, high = hn::Zero(du);
  lane_count<decltype(du)> zeros, nonfinite;
  // C arrays: std::array's constructor, compiled without the target's attributes, could
  // not inline lane_sums' (always_inline, target-specific).
  constexpr std::size_t tails = Probes == 0 ? 1 : Probes;
  lane_sums<decltype(d), Sum> tail_sums[tails];
  V tail_log[tails];
  lane_count<decltype(du)> tail_count[tails];
  for (std::size_t p = 0; p < Probes; ++p) tail_log[p] = hn::Zero(d);
  // Values above no probe skip the tails' work: at small densities, nearly every vector.
  const auto lowest_probe = hn::Set(di, Probes == 0 ? 0 : probes[0].key);
  const std::size_t lanes = hn::Lanes(d);
  std::size_t touched = 0;
  // Two loops, so that the one doing every vector's tail work has no branch in it.
  const auto run = [&]<bool Every>(std::bool_constant<Every>) HWY_ATTR {
    for (std::size_t b = 0; b < block; b += lanes) {
      const auto key = hn::And(hn::BitCast(du, load(d, s, i + b)), no_sign);
      const auto finite = hn::Lt(key, infinity);
      const auto zero = hn::Eq(key, hn::Zero(du));
      const auto positive = hn::AndNot(zero, finite);
      const auto kept = hn::IfThenElseZero(positive, key);
      const auto x = hn::BitCast(d, kept);
      zeros.add(du, zero);  // a zero key is finite
      nonfinite.add(du, hn::Not(finite));
      sums.add(x);
      if constexpr (Log)
        sum_log = hn::Add(sum_log, fast_log(d, hn::BitCast(d, hn::IfThenElse(positive, key, one_key))));
      low = hn::Min(low, hn::IfThenElse(positive, key, infinity));
      high = hn::Max(high, kept);
      // Tails: the finite non-zeros above each probe (kept is 0 elsewhere, below any probe).
      if constexpr (Probes == 0) continue;
      const bool above_any = !hn::AllFalse(d, hn::RebindMask(d, hn::Gt(hn::BitCast(di, kept), lowest_probe)));
      if constexpr (Every) {
        touched += std::size_t(above_any);
      } else {
        if (!above_any) continue;
        ++touched;
      }
      for (std::size_t p = 0; p != Probes; ++p) {  // !=: Probes may be 0
        const auto above = hn::Gt(hn::BitCast(di, kept), hn::Set(di, probes[p].key));
        if (p > 0 && hn::AllFalse(d, hn::RebindMask(d, above))) continue;
        const auto excess = hn::IfThenElseZero(hn::RebindMask(d, above), hn::Sub(x, hn::Set(d, probes[p].value)));
        tail_count[p].add(du, hn::RebindMask(du, above));
        tail_sums[p].add(excess);
        if constexpr (TailLog) {
          const auto safe = hn::IfThenElse(hn::RebindMask(d, above), excess, hn::Set(d, A(1)));
          tail_log[p] = hn::Add(tail_log[p], fast_log(d, safe));
        }
      }
    }
  };
  if (Probes > 0 && every_vector)
    run(std::true_type{});
  else
    run(std::false_type{});
  out.lanes = lanes;
  sums.store(out.sum, out.sum_sq);
  hn::Store(sum_log, d, out.sum_log);
  zeros.store(du, out.zeros);
  nonfinite.store(du, out.nonfinite);
  hn::Store(low, du, out.low);
  hn::Store(high, du, out.high);
  for (std::size_t p = 0; p < Probes; ++p) {
    tail_sums[p].store(out.tails[p].sum, out.tails[p].sum_sq);
    hn::Store(tail_log[p], d, out.tails[p].sum_log);
    tail_count[p].store(du, out.tails[p].count);
  }
  return touched;
}

/// The lane count for T: whole vectors below it are left to scalar code.
template <class T>
std::size_t lanes() {
  return hn::Lanes(hn::ScalableTag<cpu_detail::lane_t<T>>());
}

#endif  // a SIMD target
}  // namespace HWY_NAMESPACE
}  // namespace sidco::backend::simd
HWY_AFTER_NAMESPACE();

#endif  // SIDCO_HIGHWAY_KERNELS_PASS
