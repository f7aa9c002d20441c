// Error feedback: what was not sent is kept and added to the next gradient.
#pragma once

#include <cstddef>
#include <utility>

#include "sidco/memory/host.hpp"

namespace sidco {
namespace detail {

/// Storage that is either owned (a Memory buffer) or a view of memory the caller owns, such
/// as a framework tensor: then compress reads and writes it in place, with no copies.
template <class T, class Memory>
class state_storage {
 public:
  using view_type = typename Memory::template view<T>;

  state_storage() = default;
  explicit state_storage(std::size_t size) {
    owned_.resize(size);
    view_ = view_type{owned_.data(), size};
    Memory::zero(view_);
  }
  explicit state_storage(view_type caller_owned) : view_(caller_owned), wraps_(true) {}

  state_storage(const state_storage& other) : owned_(other.owned_), wraps_(other.wraps_) { point(other); }
  state_storage(state_storage&& other) noexcept : owned_(std::move(other.owned_)), wraps_(other.wraps_) { point(other); }
  state_storage& operator=(const state_storage& other) {
    if (this != &other) {
      owned_ = other.owned_;
      wraps_ = other.wraps_;
      point(other);
    }
    return *this;
  }
  state_storage& operator=(state_storage&& other) noexcept {
    owned_ = std::move(other.owned_);
    wraps_ = other.wraps_;
    point(other);
    return *this;
  }

  std::size_t size() const { return view_.size(); }
  view_type view() const { return view_; }
  bool wraps_caller_memory() const { return wraps_; }

 private:
  // A copy of owned storage views its own copy; a wrapped view stays the caller's.
  void point(const state_storage& other) {
    view_ = wraps_ ? other.view_ : view_type{owned_.data(), other.view_.size()};
  }

  typename Memory::template buffer<T> owned_;
  view_type view_{};
  bool wraps_ = false;
};

}  // namespace detail

namespace feedback {

/// The residual r of one tensor. compressor::compress(g, delta, out, r) compresses g + r and
/// leaves in r exactly what it did not send, in the same passes (no extra copy of g).
/// Memory is the compressor's backend's memory space (host by default).
template <class T, class Memory = memory::host>
class residual {
 public:
  using memory_space = Memory;
  using view_type = typename Memory::template view<T>;
  using const_view_type = typename Memory::template view<const T>;

  residual() = default;
  /// An owned residual of size zeros.
  explicit residual(std::size_t size) : storage_(size) {}
  /// The residual lives in caller_owned (e.g. a framework tensor's memory), which must
  /// outlive this object and is used as it is (not cleared).
  explicit residual(view_type caller_owned) : storage_(caller_owned) {}

  std::size_t size() const { return storage_.size(); }
  const_view_type values() const { return {storage_.view().data(), size()}; }
  view_type values() { return storage_.view(); }
  typename Memory::template pointer<T> data() { return storage_.view().data(); }
  bool wraps_caller_memory() const { return storage_.wraps_caller_memory(); }

  /// Forget what was accumulated (e.g. after a model reset).
  void reset() { Memory::zero(storage_.view()); }

 private:
  detail::state_storage<T, Memory> storage_;
};

}  // namespace feedback
}  // namespace sidco
