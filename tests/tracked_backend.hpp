// A backend over instrumented host memory, to prove that everything outside a backend goes
// through the contract: its pointers count every element access, as inside a backend member
// (a scope is open) or outside; its views and buffers have no element access at all, so
// code that indexes them, or assumes std::vector or std::span, does not compile.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <sidco/backend/serial.hpp>

namespace sidco::test::tracked {

inline thread_local int depth = 0;
inline std::atomic<long> inside{0}, outside{0};

/// Open while a backend member (or a memory-space operation) runs.
struct scope {
  scope() { ++depth; }
  ~scope() { --depth; }
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;
};

inline void touch() { (depth > 0 ? inside : outside).fetch_add(1, std::memory_order_relaxed); }

template <class T>
class pointer {
 public:
  pointer() = default;
  explicit pointer(T* p) : p_(p) {}
  template <class U>
    requires std::is_same_v<const U, T>
  pointer(pointer<U> other) : p_(other.raw()) {}  // to const

  T& operator[](std::size_t i) const {
    touch();
    return p_[i];
  }
  pointer operator+(std::size_t n) const { return pointer(p_ + n); }
  /// The address, counted as an access (backends call it once per buffer).
  T* address() const {
    touch();
    return p_;
  }
  T* raw() const { return p_; }  // not an element access: for conversions only

 private:
  T* p_ = nullptr;
};

template <class T>
class view {
 public:
  view() = default;
  view(pointer<T> data, std::size_t size) : data_(data), size_(size) {}
  template <class U>
    requires std::is_same_v<const U, T>
  view(view<U> other) : data_(other.data()), size_(other.size()) {}  // to const, as std::span
  pointer<T> data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  pointer<T> data_{};
  std::size_t size_ = 0;
};

template <class T>
class buffer {
 public:
  pointer<T> data() { return pointer<T>(values_.data()); }
  pointer<const T> data() const { return pointer<const T>(values_.data()); }
  std::size_t size() const { return values_.size(); }
  std::size_t capacity() const { return values_.capacity(); }
  void resize(std::size_t n) { values_.resize(n); }
  void reserve(std::size_t n) { values_.reserve(n); }
  void clear() { values_.clear(); }
  void swap(buffer& other) noexcept { values_.swap(other.values_); }

 private:
  std::vector<T> values_;
};

struct memory {
  static constexpr const char* name = "tracked host";
  template <class T>
  using buffer = tracked::buffer<T>;
  template <class T>
  using pointer = tracked::pointer<T>;
  template <class T>
  using view = tracked::view<T>;

  template <class T>
  static T* address(pointer<T> p) {
    return p.address();
  }
  template <class T>
  static void zero(view<T> v) {
    scope in;
    std::fill(v.data().address(), v.data().address() + v.size(), T(0));
  }
  template <class T>
  static void copy_to_host(view<const T> from, std::span<T> to) {
    scope in;
    std::copy(from.data().address(), from.data().address() + from.size(), to.begin());
  }
  template <class T>
  static void copy_from_host(std::span<const T> from, view<T> to) {
    scope in;
    std::copy(from.begin(), from.end(), to.data().address());
  }
};

/// backend::serial over tracked memory, every member inside a scope.
struct backend {
  using memory = tracked::memory;
  static constexpr const char* name = "tracked";
  sidco::backend::basic_serial<memory> inner;

  template <class Stats, class Source>
  void analyze(const Source& s, std::span<const segment> layout, std::span<const double> probes, std::span<moments> out) {
    scope in;
    inner.template analyze<Stats>(s, layout, probes, out);
  }
  template <bool Log, class Source>
  moments tail(const Source& s, double t) {
    scope in;
    return inner.template tail<Log>(s, t);
  }
  template <class Source>
  std::size_t count_above(const Source& s, double t) {
    scope in;
    return inner.count_above(s, t);
  }
  template <class Source>
  void coarse_histograms(const Source& s, std::span<const segment> layout, std::span<moments> counts) {
    scope in;
    inner.coarse_histograms(s, layout, counts);
  }
  void kth_largest_bins(std::span<const std::size_t> targets, std::span<sidco::key_bin> out) {
    scope in;
    inner.kth_largest_bins(targets, out);
  }
  template <class Source>
  sidco::backend::nonfinite_value first_nonfinite(const Source& s) {
    scope in;
    return inner.first_nonfinite(s);
  }
  template <bool Final, class Source, class Out>
  void select_above(const Source& s, std::span<const segment> layout, std::span<const double> t, Out& out,
                    std::size_t hint, std::span<std::size_t> kept) {
    scope in;
    inner.template select_above<Final>(s, layout, t, out, hint, kept);
  }
  template <class Source, class Out>
  void select_band(const Source& s, double low, double high, Out& out) {
    scope in;
    inner.select_band(s, low, high, out);
  }
  template <class Source, class Out>
  void select_random(const Source& s, std::size_t k, std::uint64_t state, Out& out) {
    scope in;
    inner.select_random(s, k, state, out);
  }
  template <class Source>
  void sample_magnitudes(const Source& s, std::uint64_t state, std::span<double> out) {
    scope in;
    inner.sample_magnitudes(s, state, out);
  }
  template <class Out>
  void keep_top_k(Out& out, std::size_t begin, std::span<const std::size_t> run_sizes,
                  std::span<const std::size_t> keep) {
    scope in;
    inner.keep_top_k(out, begin, run_sizes, keep);
  }
  template <class Out>
  void merge_runs(Out& out, std::size_t begin, std::span<const std::size_t> run_starts) {
    scope in;
    inner.merge_runs(out, begin, run_starts);
  }
  template <class Source, class Out>
  void mark_sent(const Source& s, const Out& out, std::size_t begin) {
    scope in;
    inner.mark_sent(s, out, begin);
  }
  template <class Out, class T>
  void scatter_add(const Out& in_vector, view<T> dense, T scale) {
    scope in;
    inner.scatter_add(in_vector, dense, scale);
  }
};

}  // namespace sidco::test::tracked
