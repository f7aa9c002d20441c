// What every op of the binding shares: sidco's errors as Python exceptions, a tensor's
// element type as a C++ type, and the checks on tensors.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <span>
#include <type_traits>

#include <sidco/core/error.hpp>
#include <sidco/core/half.hpp>

namespace sidco_torch {

/// f(), with sidco::error (an invalid argument) raised in Python as ValueError and
/// sidco::runtime_error (a peer rank, a device) as RuntimeError, each with sidco's message.
template <class F>
auto translated(F&& f) {
  try {
    return f();
  } catch (const sidco::error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const sidco::runtime_error& e) {
    TORCH_CHECK(false, e.what());
  }
}

template <class T>
struct type_tag {
  using type = T;
};

/// The element types sidco_torch compresses, and each one's slot in per-type tables.
inline constexpr std::size_t value_types = 4;
inline std::size_t type_index(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return 0;
    case at::kDouble: return 1;
    case at::kHalf: return 2;
    case at::kBFloat16: return 3;
    default: return value_types;
  }
}
/// The dtype of a slot (type_index's inverse).
inline at::ScalarType dtype_at(std::size_t slot) {
  constexpr at::ScalarType dtypes[value_types] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
  return dtypes[slot];
}

/// f(type_tag<T>{}) for the C++ type of a floating-point tensor dtype sidco compresses
/// (c10::Half and c10::BFloat16 share sidco::float16's and sidco::bfloat16's layout).
template <class F>
decltype(auto) with_value_type(at::ScalarType dtype, const char* what, F&& f) {
  switch (dtype) {
    case at::kFloat: return f(type_tag<float>{});
    case at::kDouble: return f(type_tag<double>{});
    case at::kHalf: return f(type_tag<sidco::float16>{});
    case at::kBFloat16: return f(type_tag<sidco::bfloat16>{});
    default: sidco::throw_error(what, ": dtype ", dtype, " is not float32, float64, float16 or bfloat16");
  }
}

/// A contiguous CPU tensor, or a sidco::error naming what.
inline void check_cpu_tensor(const char* what, const at::Tensor& t) {
  if (!t.device().is_cpu()) sidco::throw_error(what, ": device ", t.device(), " is not the CPU");
  if (!t.is_contiguous()) sidco::throw_error(what, ": tensor is not contiguous");
}

/// A tensor of element type T as a span (after the checks above).
template <class T>
std::span<T> span_of(const at::Tensor& t) {
  return {reinterpret_cast<T*>(t.data_ptr()), std::size_t(t.numel())};
}

inline std::span<std::byte> bytes_of(const at::Tensor& t) {
  return {reinterpret_cast<std::byte*>(t.data_ptr()), std::size_t(t.numel()) * t.element_size()};
}

}  // namespace sidco_torch
