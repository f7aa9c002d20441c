// A policy's name (`static constexpr const char* name`): what reports, errors and the method
// registry call it by. Distribution models, estimators and selections all carry one.
#pragma once

#include <concepts>
#include <string_view>

namespace sidco {

template <class Policy>
concept named_policy = requires {
  { Policy::name } -> std::convertible_to<std::string_view>;
};

}  // namespace sidco
