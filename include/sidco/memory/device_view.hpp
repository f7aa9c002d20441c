// A view of device memory: (pointer, size) like std::span, but a type of its own, so that a
// host span or vector given where device memory is expected does not compile (and a device
// view cannot be read on the host by mistake: it has no element access).
#pragma once

#include <cstddef>
#include <type_traits>

namespace sidco::memory {

template <class T>
class device_view {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  device_view() = default;
  /// A device address and a count; a host std::span or vector does not convert.
  device_view(T* data, std::size_t size) : data_(data), size_(size) {}
  /// To const, as std::span converts.
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  device_view(device_view<U> other) : data_(other.data()), size_(other.size()) {}

  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t size_bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  device_view subspan(std::size_t offset, std::size_t count) const { return {data_ + offset, count}; }
  device_view first(std::size_t count) const { return {data_, count}; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace sidco::memory
