// Methods of one's own for sidco_torch's ops and DDP hook: an extension composes a compressor
// from sidco's policies and adds it by name (add_method<Compressor>); sidco_torch.Compressor,
// State and the hook then take that name as they take a built-in method's, on CPU tensors.
// The registry lives in libsidco_torch_ops.so, which such an extension links
// (sidco_torch.extension_args() links it), so every extension of one process adds to one table.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <sidco/core/half.hpp>
#include <sidco/memory/host.hpp>

#include "engine.hpp"

namespace sidco_torch {

/// Makes an added method's engine of element type T: whole (layout empty) or per layer.
template <class T>
using engine_factory = std::function<std::unique_ptr<engine<T, std::uint32_t>>(
    const sidco::methods::options& options, std::vector<sidco::segment> layout, layer_budget budget)>;

// The sources of the sidco_torch build an extension was compiled against:
// sidco_torch.extension_args() defines SIDCO_TORCH_SOURCE_DIGEST as 0x<its digest> (a number, so
// no shell or ninja quoting can change it); "" without that flag.
#define SIDCO_TORCH_DETAIL_TEXT(x) #x
#define SIDCO_TORCH_DETAIL_EXPANDED_TEXT(x) SIDCO_TORCH_DETAIL_TEXT(x)
#ifdef SIDCO_TORCH_SOURCE_DIGEST
#define SIDCO_TORCH_BUILT_AGAINST SIDCO_TORCH_DETAIL_EXPANDED_TEXT(SIDCO_TORCH_SOURCE_DIGEST)
#else
#define SIDCO_TORCH_BUILT_AGAINST ""
#endif

/// A method added by an extension: its description, what it is (the compressor's type, as
/// typeid names it, and SIDCO_TORCH_BUILT_AGAINST, which the registry records from
/// add_method_factories' first argument), which the ops and every rank compare, and its
/// engines, one per element type.
struct added_method {
  std::string description;
  std::string composition;
  std::string built_against;
  engine_factory<float> float32;
  engine_factory<double> float64;
  engine_factory<sidco::float16> float16;
  engine_factory<sidco::bfloat16> bfloat16;

  template <class T>
  const engine_factory<T>& factory() const {
    if constexpr (std::is_same_v<T, float>)
      return float32;
    else if constexpr (std::is_same_v<T, double>)
      return float64;
    else if constexpr (std::is_same_v<T, sidco::float16>)
      return float16;
    else
      return bfloat16;
  }
};

/// The registry (defined in libsidco_torch_ops.so). add_method_factories refuses (sidco::error)
/// a method whose built_against (SIDCO_TORCH_BUILT_AGAINST, passed first and apart, since
/// `method`'s layout is the extension's headers') names other sources than the library's,
/// before it reads `method`, then a name that is not a method name or is taken, by a built-in
/// method or an added one; find_added_method gives nullptr for a name never added;
/// added_methods lists (name, description) in the order they were added.
void add_method_factories(const char* built_against, const std::string& name, added_method method);
const added_method* find_added_method(const std::string& name);
std::vector<std::pair<std::string, std::string>> added_methods();

/// Adds Compressor (a sidco compressor on host memory: backend::cpu or backend::serial) as
/// method `name`, each engine's prototype made by make(options) (options: the method's
/// options, e.g. its seed).
template <class Compressor, class Make>
void add_method(const std::string& name, const std::string& description, Make make) {
  static_assert(std::is_same_v<typename Compressor::memory_space, sidco::memory::host>,
                "sidco_torch::add_method: the hook's added methods run on the CPU; compose the compressor "
                "with backend::cpu (or backend::serial)");
  added_method method;
  method.description = description;
  method.composition = typeid(Compressor).name();
  const auto set = [&]<class T>(engine_factory<T>& slot) {
    slot = [make](const sidco::methods::options& options, std::vector<sidco::segment> layout, layer_budget budget) {
      return engine_of<T, std::uint32_t>(Compressor(make(options)), std::move(layout), budget);
    };
  };
  set(method.float32);
  set(method.float64);
  set(method.float16);
  set(method.bfloat16);
  add_method_factories(SIDCO_TORCH_BUILT_AGAINST, name, std::move(method));
}

/// The same with every prototype default-constructed (the options are not read).
template <class Compressor>
void add_method(const std::string& name, const std::string& description) {
  add_method<Compressor>(name, description, [](const sidco::methods::options&) { return Compressor{}; });
}

}  // namespace sidco_torch
