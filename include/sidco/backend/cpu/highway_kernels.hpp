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

template <class D, class T>
HWY_INLINE auto load(D d, const plain_source<T, memory::host>& s, std::size_t i) {
  return hn::LoadU(d, s.gradient + i);
}
template <class D, class T>
HWY_INLINE auto load(D d, const feedback_source<T, memory::host>& s, std::size_t i) {
  return hn::Add(hn::LoadU(d, s.gradient + i), hn::LoadU(d, s.residual + i));
}

// Leaves v in the residual, or +0 where sent.
template <bool Final, class D, class V, class M, class Source>
HWY_INLINE void settle(D d, const Source& s, std::size_t i, V v, M sent) {
  if constexpr (Source::has_state) hn::StoreU(Final ? hn::IfThenZeroElse(sent, v) : v, d, s.residual + i);
}

// |v| > t for above = threshold_key(t), never for NaN: integer compares on the magnitude bits.
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
  const hn::ScalableTag<typename Source::value_type> d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = lo, n = 0;
  for (; i + lanes <= hi; i += lanes) n += hn::CountTrue(d, exceeds(d, load(d, s, i), above));
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
  const hn::ScalableTag<T> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const std::size_t lanes = hn::Lanes(d);
  const compressor_for<decltype(d)> compress_values;
  const compressor_for<decltype(du)> compress_indices;
  std::size_t i = lo;
  for (; i + lanes <= hi && at + lanes <= end; i += lanes) {
    const auto v = load(d, s, i);
    const auto keep = exceeds(d, v, above);
    settle<Final>(d, s, i, v, keep);
    if (hn::AllFalse(d, keep)) continue;
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

/// Fills out's lanes with [i, i + block) of s: moments of |x| and, for each probe, the
/// count above it and the sums of the excesses (ln of them when TailLog), summed in the
/// lanes' Sum type. block is a multiple of the lane count, which is at most 64 bytes' worth.
template <bool Log, bool TailLog, std::size_t Probes, class Source, class Sum, class T = typename Source::value_type>
void block_statistics(const Source& s, std::size_t i, std::size_t block, const cpu_detail::probe_at<T>* probes,
                      cpu_detail::lane_statistics<T, Probes, Sum>& out) {
  const hn::ScalableTag<T> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::RebindToSigned<decltype(d)> di;
  using V = decltype(hn::Zero(d));
  using VU = decltype(hn::Zero(du));
  using Key = magnitude_key_t<T>;
  const auto infinity = hn::Set(du, float_traits<T>::infinity);
  const auto one_key = hn::Set(du, magnitude_key(T(1)));
  const auto no_sign = hn::Set(du, ~Key(0) >> 1);
  lane_sums<decltype(d), Sum> sums;
  V sum_log = hn::Zero(d);
  VU zeros = hn::Zero(du), nonfinite = hn::Zero(du), low = infinity, high = hn::Zero(du);
  // C arrays: std::array's constructor, compiled without the target's attributes, could
  // not inline lane_sums' (always_inline, target-specific).
  constexpr std::size_t tails = Probes == 0 ? 1 : Probes;
  lane_sums<decltype(d), Sum> tail_sums[tails];
  V tail_log[tails];
  VU tail_count[tails];
  for (std::size_t p = 0; p < Probes; ++p) {
    tail_log[p] = hn::Zero(d);
    tail_count[p] = hn::Zero(du);
  }
  // Values above no probe skip the tails' work: at small densities, nearly every vector.
  auto lowest = std::numeric_limits<hn::TFromD<decltype(di)>>::max();
  for (std::size_t p = 0; p < Probes; ++p) lowest = std::min(lowest, probes[p].key);
  const auto lowest_probe = hn::Set(di, lowest);
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t b = 0; b < block; b += lanes) {
    const auto key = hn::And(hn::BitCast(du, load(d, s, i + b)), no_sign);
    const auto finite = hn::Lt(key, infinity);
    const auto zero = hn::Eq(key, hn::Zero(du));
    const auto positive = hn::AndNot(zero, finite);
    const auto kept = hn::IfThenElseZero(positive, key);
    const auto x = hn::BitCast(d, kept);
    zeros = hn::Sub(zeros, hn::VecFromMask(du, hn::And(finite, zero)));
    nonfinite = hn::Sub(nonfinite, hn::VecFromMask(du, hn::Not(finite)));
    sums.add(x);
    if constexpr (Log)
      sum_log = hn::Add(sum_log, fast_log(d, hn::BitCast(d, hn::IfThenElse(positive, key, one_key))));
    low = hn::Min(low, hn::IfThenElse(positive, key, infinity));
    high = hn::Max(high, kept);
    // Tails: the finite non-zeros above each probe (kept is 0 elsewhere, below any probe).
    if (Probes == 0 || hn::AllFalse(d, hn::RebindMask(d, hn::Gt(hn::BitCast(di, kept), lowest_probe)))) continue;
    for (std::size_t p = 0; p < Probes; ++p) {
      const auto above = hn::Gt(hn::BitCast(di, kept), hn::Set(di, probes[p].key));
      const auto excess = hn::IfThenElseZero(hn::RebindMask(d, above), hn::Sub(x, hn::Set(d, probes[p].value)));
      tail_count[p] = hn::Sub(tail_count[p], hn::VecFromMask(du, hn::RebindMask(du, above)));
      tail_sums[p].add(excess);
      if constexpr (TailLog) {
        const auto safe = hn::IfThenElse(hn::RebindMask(d, above), excess, hn::Set(d, T(1)));
        tail_log[p] = hn::Add(tail_log[p], fast_log(d, safe));
      }
    }
  }
  out.lanes = lanes;
  sums.store(out.sum, out.sum_sq);
  hn::Store(sum_log, d, out.sum_log);
  hn::Store(zeros, du, out.zeros);
  hn::Store(nonfinite, du, out.nonfinite);
  hn::Store(low, du, out.low);
  hn::Store(high, du, out.high);
  for (std::size_t p = 0; p < Probes; ++p) {
    tail_sums[p].store(out.tails[p].sum, out.tails[p].sum_sq);
    hn::Store(tail_log[p], d, out.tails[p].sum_log);
    hn::Store(tail_count[p], du, out.tails[p].count);
  }
}

/// The lane count for T: whole vectors below it are left to scalar code.
template <class T>
std::size_t lanes() {
  return hn::Lanes(hn::ScalableTag<T>());
}

#endif  // a SIMD target
}  // namespace HWY_NAMESPACE
}  // namespace sidco::backend::simd
HWY_AFTER_NAMESPACE();

#endif  // SIDCO_HIGHWAY_KERNELS_PASS
