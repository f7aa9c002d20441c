// The torch.ops.sidco library: its classes and the schemas of its ops. The ops'
// implementations are registered per dispatch key (cpu/ops.cpp), so a tensor's device
// picks its kernels.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cxxabi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "added_methods.hpp"
#include "binding.hpp"
#include "classes.hpp"
#include "reduce_codec.hpp"
#include "registration.hpp"

namespace sidco_torch {

sidco::methods::options parse_options(const c10::Dict<std::string, double>& options) {
  sidco::methods::options parsed;
  for (const auto& entry : options) {
    if (entry.key() == "seed") {
      const double seed = entry.value();
      if (!(seed >= 0 && seed < 18446744073709551616.0 && seed == std::floor(seed)))
        sidco::throw_error("option seed = ", seed, " is not a whole number in [0, 2^64)");
      parsed.seed = std::uint64_t(seed);
    } else {
      sidco::throw_error("option '", entry.key(), "' is not known (known: seed)");
    }
  }
  return parsed;
}

namespace {

// The methods extensions added (added_methods.hpp), in the order they were added. Entries are
// never removed, so a pointer to one stays valid.
struct method_registry {
  std::mutex mutex;
  std::vector<std::pair<std::string, std::unique_ptr<added_method>>> methods;
};

// Never destroyed: its entries' code lives in the extensions that added them, which may be
// unloaded before this library's static destructors run at exit.
method_registry& registry() {
  static method_registry* const methods = new method_registry;
  return *methods;
}

// A type as C++ spells it (the mangled name where it cannot be demangled).
std::string demangled(const std::string& name) {
  int status = 0;
  char* const spelled = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || spelled == nullptr) return name;
  std::string text(spelled);
  std::free(spelled);
  return text;
}

// A method name as the registry writes them: 1 to 64 letters, digits, '-' and '_'.
bool method_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return false;
  return true;
}

}  // namespace

// The sources this library was built from, as SIDCO_TORCH_BUILT_AGAINST spells them
// (source_digest.cpp, which meson writes).
extern const char ops_source_digest[];

void add_method_factories(const char* built_against, const std::string& name, added_method method) {
  // An extension compiled against other headers hands over an added_method of another layout:
  // refused before any of it is read. Without the flag ("") nothing is known to compare.
  if (*built_against != '\0' && std::strcmp(built_against, ops_source_digest) != 0)
    sidco::throw_error("add_method: method '", name, "' comes from an extension compiled against other sidco_torch ",
                       "sources (source digest ", std::string_view(built_against).substr(0, 17),
                       "...) than these ops' (", std::string_view(ops_source_digest).substr(0, 17),
                       "...): rebuild the extension with sidco_torch.extension_args()");
  if (!method_name(name))
    sidco::throw_error("add_method: name '", name, "' is not 1 to 64 letters, digits, '-' and '_'");
  if (sidco::methods::all::find(name)) sidco::throw_error("add_method: name '", name, "' is a built-in method's");
  if (!method.float32 || !method.float64 || !method.float16 || !method.bfloat16)
    sidco::throw_error("add_method: method '", name, "' lacks an engine for an element type");
  method_registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.mutex);
  for (const auto& [taken, added] : r.methods)
    if (taken == name) sidco::throw_error("add_method: name '", name, "' was added before (", added->description, ")");
  method.built_against = built_against;
  r.methods.emplace_back(name, std::make_unique<added_method>(std::move(method)));
}

const added_method* find_added_method(const std::string& name) {
  method_registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.mutex);
  for (const auto& [added, method] : r.methods)
    if (added == name) return method.get();
  return nullptr;
}

std::vector<std::pair<std::string, std::string>> added_methods() {
  method_registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.mutex);
  std::vector<std::pair<std::string, std::string>> list;
  for (const auto& [name, method] : r.methods) list.emplace_back(name, method->description);
  return list;
}

namespace {

// Every method name, built-in and added, comma-separated.
std::string method_names() {
  std::string names = sidco::methods::all::names();
  for (const auto& [name, description] : added_methods()) names += ", " + name;
  return names;
}

// Fails at construction, not at the first step, for an unknown method or bad options.
void check_method(const std::string& method, const sidco::methods::options& options) {
  if (find_added_method(method)) return;
  if (!sidco::methods::all::find(method)) sidco::throw_error("method '", method, "' is not one of ", method_names());
  sidco::methods::visit(method, options, [](auto&&) {});
}

// An added method's engines run on the CPU only.
void check_device_for(const std::string& method, const at::Device& device) {
  if (device.is_cuda() && find_added_method(method))
    sidco::throw_error("method '", method, "' was added by an extension for CPU tensors; device ", device,
                       " is a CUDA device");
}

// The object kept for device (cpu, or cuda[index] grown to hold it), made on first use;
// what names the argument in errors. cuda_built: whether a CUDA factory was registered.
template <class T, class MakeCpu, class MakeCuda>
std::unique_ptr<T>& per_device(const at::Device& device, const char* what, bool cuda_built, std::unique_ptr<T>& cpu,
                               std::vector<std::unique_ptr<T>>& cuda, MakeCpu make_cpu, MakeCuda make_cuda) {
  if (device.is_cuda()) {
    if (!cuda_built)
      sidco::throw_error(what, ": device ", device, ": this sidco_torch was built without CUDA (the torch it was ",
                         "built against had none)");
    const auto index = std::size_t(device.has_index() ? device.index() : 0);
    if (cuda.size() <= index) cuda.resize(index + 1);
    if (!cuda[index]) cuda[index] = make_cuda(at::Device(at::kCUDA, at::DeviceIndex(index)));
    return cuda[index];
  }
  if (!device.is_cpu()) sidco::throw_error(what, ": device ", device, " is neither the CPU nor a CUDA device");
  if (!cpu) cpu = make_cpu();
  return cpu;
}

at::Device parse_device(const std::string& name) {
  std::optional<at::Device> device;
  try {
    device = at::Device(name);
  } catch (const std::exception&) {
    sidco::throw_error("device '", name, "' is not a device name (cpu, cuda, cuda:1, ...)");
  }
  if (!device->is_cpu() && !device->is_cuda())
    sidco::throw_error("device '", name, "' is neither the CPU nor a CUDA device");
  return *device;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  sidco::throw_error("dtype '", name, "' is not float32, float64, float16 or bfloat16");
}

std::vector<sidco::segment> parse_layout(const std::vector<std::int64_t>& sizes) {
  std::vector<sidco::segment> layout;
  std::size_t offset = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= 0) sidco::throw_error("layer_sizes: size ", sizes[i], " of layer ", i, " is not positive");
    if (std::uint64_t(sizes[i]) > std::numeric_limits<std::size_t>::max() - offset)
      sidco::throw_error("layer_sizes: the sizes overflow at layer ", i);
    layout.push_back({offset, std::size_t(sizes[i])});
    offset += std::size_t(sizes[i]);
  }
  if (layout.empty()) sidco::throw_error("layer_sizes: no layers");
  return layout;
}

// A saved state's bytes as a uint8 tensor, and a uint8 CPU tensor's bytes to load.
at::Tensor state_tensor(const std::vector<std::byte>& bytes) {
  auto t = at::empty({std::int64_t(bytes.size())}, at::kByte);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::span<const std::byte> state_bytes(const at::Tensor& state) {
  check_cpu_tensor("state", state);
  if (state.scalar_type() != at::kByte) sidco::throw_error("state: dtype ", state.scalar_type(), " is not uint8");
  return bytes_of(state);
}

// A codec's wire=.
sidco::comm::entry_coding coding_of(const std::string& wire) {
  if (wire == "plain") return sidco::comm::entry_coding::plain;
  if (wire == "compact") return sidco::comm::entry_coding::compact;
  if (wire == "compact8") return sidco::comm::entry_coding::compact8;
  sidco::throw_error("wire = '", wire, "' is not 'plain', 'compact' or 'compact8'");
}

// The settings both codecs parse from their constructor's arguments (a bucket addresses
// 2^32 values: 32-bit indices).
codec_settings settings_of(std::string method, const c10::Dict<std::string, double>& options,
                           const std::vector<std::int64_t>& layer_sizes, const std::string& dtype, double density,
                           double slack) {
  codec_settings settings;
  settings.method = std::move(method);
  settings.options = parse_options(options);
  settings.layout = parse_layout(layer_sizes);
  settings.dtype = parse_dtype(dtype);
  settings.density = density;
  settings.slack = slack;
  const std::size_t total = settings.layout.back().end();
  if (total > std::size_t(std::numeric_limits<std::uint32_t>::max()) + 1)
    sidco::throw_error("bucket: ", total, " values; sidco_torch's codec addresses 2^32 (32-bit indices)");
  return settings;
}

}  // namespace

Codec::Codec(std::string method, c10::Dict<std::string, double> options, std::vector<std::int64_t> layer_sizes,
             std::string dtype, double density, double slack, double capacity_density, std::string wire) {
  translated([&] {
    settings_ = settings_of(std::move(method), options, layer_sizes, dtype, density, slack);
    settings_.capacity_density = capacity_density;
    settings_.coding = coding_of(wire);
    plan_ = sidco::comm::plan_capacity(settings_.layout, capacity_density, slack);
    const std::size_t value_bytes = std::size_t(c10::elementSize(settings_.dtype));
    const std::size_t dense_size = settings_.layout.back().end();
    format_ = sidco::comm::is_compact(settings_.coding)
                  ? sidco::comm::compact_format(plan_.total, sizeof(std::uint32_t), value_bytes, dense_size,
                                                settings_.coding)
                  : sidco::comm::wire_format{plan_.total, sizeof(std::uint32_t), value_bytes};
    check_method(settings_.method, settings_.options);
    return 0;
  });
}

namespace {
cuda_codec_factory cuda_codecs = nullptr;

sidco::comm::wire_fields fields_of(const codec_settings& settings, std::int64_t tag, std::int64_t sequence) {
  if (tag < 0 || tag > std::int64_t(UINT32_MAX)) sidco::throw_error("tag = ", tag, " is outside [0, 2^32)");
  if (sequence < 0) sidco::throw_error("sequence = ", sequence, " is negative");
  return {std::uint32_t(tag), std::uint64_t(sequence), settings.density, sidco::comm::reduction::average};
}

}  // namespace

void register_cuda_codec(cuda_codec_factory factory) { cuda_codecs = factory; }

codec_impl& Codec::on(const at::Device& device) const {
  check_device_for(settings_.method, device);
  std::unique_ptr<codec_impl>& slot = per_device(
      device, "bucket", cuda_codecs != nullptr, cpu_, cuda_, [&] { return make_cpu_codec(settings_, format_, plan_); },
      [&](const at::Device& on) { return cuda_codecs(settings_, format_, plan_, on); });
  // The compressors' state follows the bucket from the device it was last on (or loaded into).
  if (current_ && current_ != slot.get())
    for (std::size_t i = 0; i < settings_.layout.size(); ++i) slot->load_layer(i, current_->save_layer(i));
  current_ = slot.get();
  return *current_;
}

codec_impl& Codec::current() const { return current_ ? *current_ : on(at::kCPU); }

std::size_t Codec::layer_index(std::int64_t layer) const {
  if (layer < 0 || std::size_t(layer) >= settings_.layout.size())
    sidco::throw_error("layer ", layer, " is outside [0, ", settings_.layout.size(), ")");
  return std::size_t(layer);
}

std::vector<std::int64_t> Codec::layer_capacities() const {
  return {plan_.per_segment.begin(), plan_.per_segment.end()};
}

c10::Dict<std::string, double> Codec::report() const {
  const auto hold = lock();
  const codec_report& r = current().report();
  c10::Dict<std::string, double> d;
  d.insert("selected", double(r.compress.selected));
  d.insert("candidates", double(r.compress.candidates));
  d.insert("trimmed", double(r.trimmed));
  d.insert("size", double(r.compress.size));
  d.insert("zeros", double(r.compress.zeros));
  d.insert("capacity", double(format_.capacity));
  d.insert("payload_bytes", double(format_.bytes()));
  d.insert("compact", sidco::comm::is_compact(settings_.coding) ? 1.0 : 0.0);
  d.insert("value_bytes", double(format_.value_bytes));
  d.insert("used_bytes", double(r.used_bytes ? r.used_bytes : format_.bytes()));
  d.insert("density", r.compress.density);
  d.insert("target_density", settings_.density);
  d.insert("threshold", r.compress.threshold);
  d.insert("stages", double(r.compress.stages));
  d.insert("fallback", r.compress.fallback ? 1.0 : 0.0);
  d.insert("failed", r.failed ? 1.0 : 0.0);
  d.insert("received_entries", double(r.exchange.entries));
  d.insert("distinct_indices", double(r.exchange.distinct));
  d.insert("trimmed_everywhere", double(r.exchange.trimmed));
  return d;
}

at::Tensor Codec::layer_state(std::int64_t layer) const {
  return translated([&] {
    const auto hold = lock();
    return state_tensor(current().save_layer(layer_index(layer)));
  });
}

void Codec::load_layer_state(std::int64_t layer, const at::Tensor& state) {
  translated([&] {
    const auto bytes = state_bytes(state);
    const auto hold = lock();
    current().load_layer(layer_index(layer), bytes);
    return 0;
  });
}

Compressor::Compressor(std::string method, c10::Dict<std::string, double> options) : method_(std::move(method)) {
  translated([&] {
    options_ = parse_options(options);
    check_method(method_, options_);
    return 0;
  });
}

namespace {
cuda_compressor_factory cuda_factory = nullptr;
}  // namespace

void register_cuda_compressor(cuda_compressor_factory factory) { cuda_factory = factory; }

std::tuple<at::Tensor, at::Tensor> Compressor::compress(const at::Tensor& gradient, double density,
                                                        const std::vector<std::int64_t>& layers,
                                                        const c10::optional<at::Tensor>& residual) {
  const std::lock_guard<std::mutex> hold(mutex_);
  return on(gradient.device()).compress(gradient, density, layers, residual);
}

std::unique_ptr<compressor_impl> Compressor::made_for(const at::Device& device) const {
  check_device_for(method_, device);
  std::unique_ptr<compressor_impl> cpu;
  std::vector<std::unique_ptr<compressor_impl>> cuda;
  return std::move(per_device(
      device, "gradient", cuda_factory != nullptr, cpu, cuda, [&] { return make_cpu_compressor(method_, options_); },
      [&](const at::Device& on) { return cuda_factory(method_, options_, on); }));
}

// One compressor at a time, on the device of the last gradient: a gradient on another device
// gets one made there, which takes the state over (as a tensor moved to another device keeps
// its compressor's adaptation).
compressor_impl& Compressor::on(const at::Device& device) {
  const at::Device where = device.is_cuda() && !device.has_index() ? at::Device(at::kCUDA, 0) : device;
  if (impl_ && device_ == where) return *impl_;
  auto made = made_for(where);
  if (impl_) {
    std::vector<saved_engine> held;
    impl_->save(held);
    for (const saved_engine& saved : held) made->load(saved);
  }
  impl_ = std::move(made);
  device_ = where;
  return *impl_;
}

std::vector<sidco::segment> saved_layout(const saved_engine& saved) {
  std::vector<sidco::segment> layout = parse_layout(saved.layer_sizes);
  if (layout.back().end() > std::size_t(std::numeric_limits<std::uint32_t>::max()) + 1)
    sidco::throw_error("layer_sizes: the layers hold ", layout.back().end(), " values; sidco_torch addresses 2^32 ",
                       "(32-bit indices)");
  return layout;
}

namespace {
std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: sidco::throw_error("state: dtype ", dtype, " is not float32, float64, float16 or bfloat16");
  }
}
}  // namespace

Compressor::saved_form Compressor::state() const {
  return translated([&] {
    const std::lock_guard<std::mutex> hold(mutex_);
    std::vector<saved_engine> engines;
    if (impl_) impl_->save(engines);
    saved_form form;
    for (const saved_engine& e : engines) {
      std::vector<at::Tensor> layers;
      for (const auto& bytes : e.layers) layers.push_back(state_tensor(bytes));
      form.emplace_back(dtype_name(e.dtype), e.layer_sizes, std::move(layers));
    }
    return form;
  });
}

void Compressor::load_state(const saved_form& state) {
  translated([&] {
    const std::lock_guard<std::mutex> hold(mutex_);
    // Loaded into a new compressor on the current device, which replaces the old one only
    // once every engine has loaded: a refusal changes nothing.
    auto loaded = made_for(device_);
    for (std::size_t i = 0; i < state.size(); ++i) {
      const auto& [dtype, layer_sizes, layers] = state[i];
      try {
        saved_engine saved{parse_dtype(dtype), layer_sizes, {}};
        for (const at::Tensor& layer : layers) {
          const auto bytes = state_bytes(layer);
          saved.layers.emplace_back(bytes.begin(), bytes.end());
        }
        loaded->load(saved);
      } catch (const sidco::error& e) {
        std::string_view why = e.what();
        if (why.starts_with("sidco: ")) why.remove_prefix(7);
        sidco::throw_error("engine ", i, " (", dtype, layer_sizes.empty() ? ", whole" : ", per layer", "): ", why);
      }
    }
    impl_ = std::move(loaded);
    return 0;
  });
}

c10::Dict<std::string, double> Compressor::report() const {
  const std::lock_guard<std::mutex> hold(mutex_);
  const sidco::compress_report r = impl_ ? impl_->report() : sidco::compress_report{};
  c10::Dict<std::string, double> d;
  d.insert("threshold", r.threshold);
  d.insert("selected", double(r.selected));
  d.insert("candidates", double(r.candidates));
  d.insert("size", double(r.size));
  d.insert("zeros", double(r.zeros));
  d.insert("target_density", r.target_density);
  d.insert("density", r.density);
  d.insert("stages", double(r.stages));
  d.insert("passes", double(r.passes));
  d.insert("rescans", double(r.rescans));
  d.insert("fallback", r.fallback ? 1.0 : 0.0);
  return d;
}

at::Tensor codec_encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                        const c10::intrusive_ptr<Codec>& codec, std::int64_t tag, std::int64_t sequence) {
  return translated([&] {
    const auto hold = codec->lock();
    return codec->on(gradient.device()).encode(gradient, residual, fields_of(codec->settings(), tag, sequence));
  });
}

at::Tensor codec_encode_failure(const at::Tensor& gradient, const c10::intrusive_ptr<Codec>& codec,
                                std::string message, std::int64_t tag, std::int64_t sequence) {
  return translated([&] {
    const auto hold = codec->lock();
    return codec->on(gradient.device()).encode_failure(message, fields_of(codec->settings(), tag, sequence));
  });
}

at::Tensor codec_decode(const std::vector<at::Tensor>& payloads, const at::Tensor& out,
                        const c10::optional<at::Tensor>& residual, const c10::intrusive_ptr<Codec>& codec) {
  return translated([&] {
    const auto hold = codec->lock();
    codec->on(out.device()).decode(payloads, out, residual);
    return out;
  });
}

namespace {
cuda_reduce_codec_factory cuda_reduce_codecs = nullptr;
}  // namespace

void register_cuda_reduce_codec(cuda_reduce_codec_factory factory) { cuda_reduce_codecs = factory; }

ReduceCodec::ReduceCodec(std::string method, c10::Dict<std::string, double> options,
                         std::vector<std::int64_t> layer_sizes, std::vector<std::int64_t> order, std::string dtype,
                         double density, double slack, std::int64_t ranks, std::int64_t rank, std::string owner,
                         double capacity_density, std::string device, std::string wire) {
  translated([&] {
    if (ranks < 1) sidco::throw_error("ranks = ", ranks, " is not positive");
    if (rank < 0 || rank >= ranks) sidco::throw_error("rank = ", rank, " is outside [0, ", ranks, ")");
    if (owner != sidco::comm::owner_sidco_e::name && owner != sidco::comm::owner_top_k::name)
      sidco::throw_error("owner = '", owner, "' is not ", owner_names);
    settings_ = settings_of(std::move(method), options, layer_sizes, dtype, density, slack);
    settings_.capacity_density = capacity_density;
    settings_.coding = coding_of(wire);
    plan_ = with_value_type(settings_.dtype, "bucket", [&](auto tag) {
      return sidco::comm::plan_reduce<typename decltype(tag)::type, std::uint32_t>(settings_.layout, capacity_density,
                                                                                  slack, std::size_t(ranks));
    });
    check_method(settings_.method, settings_.options);
    const at::Device on = parse_device(device);
    check_device_for(settings_.method, on);
    if (on.is_cuda()) {
      if (cuda_reduce_codecs == nullptr)
        sidco::throw_error("bucket: device ", on, ": this sidco_torch was built without CUDA (the torch it was ",
                           "built against had none)");
      impl_ = cuda_reduce_codecs(settings_, order, std::size_t(ranks), std::size_t(rank), owner,
                                 at::Device(at::kCUDA, on.has_index() ? on.index() : at::DeviceIndex(0)));
    } else {
      impl_ = make_reduce_codec(settings_, order, std::size_t(ranks), std::size_t(rank), owner);
    }
    return 0;
  });
}

std::size_t ReduceCodec::layer_index(std::int64_t layer) const {
  if (layer < 0 || std::size_t(layer) >= settings_.layout.size())
    sidco::throw_error("layer ", layer, " is outside [0, ", settings_.layout.size(), ")");
  return std::size_t(layer);
}

c10::Dict<std::string, double> ReduceCodec::report() const {
  const auto hold = lock();
  const auto& r = impl_->report();
  const auto& c = impl_->compress_report();
  c10::Dict<std::string, double> d;
  d.insert("selected", double(r.sent));
  d.insert("candidates", double(c.candidates));
  d.insert("trimmed", double(r.trimmed));
  d.insert("size", double(plan_.size));
  d.insert("zeros", double(c.zeros));
  d.insert("capacity", double(plan_.capacity * plan_.ranks));  // all its blocks: what a rank may send
  d.insert("payload_bytes", double(plan_.format.bytes()));
  d.insert("density", double(r.sent) / double(plan_.size));
  d.insert("target_density", settings_.density);
  d.insert("threshold", c.threshold);
  d.insert("stages", double(c.stages));
  d.insert("fallback", c.fallback ? 1.0 : 0.0);
  d.insert("failed", impl_->failed() ? 1.0 : 0.0);
  d.insert("received_entries", double(r.received));
  d.insert("union_entries", double(r.union_size));
  d.insert("global_selected", double(r.selected));
  d.insert("returned", double(r.returned));
  d.insert("target", double(r.target));
  d.insert("bytes_sent", double(r.bytes_sent));
  d.insert("bytes_received", double(r.bytes_received));
  d.insert("longest_block", double(r.longest_block));      // the bytes its longest block uses
  d.insert("selection_bytes", double(r.selection_bytes));  // the bytes its selection uses
  return d;
}

at::Tensor ReduceCodec::layer_state(std::int64_t layer) const {
  return translated([&] {
    const auto hold = lock();
    return state_tensor(impl_->save_layer(layer_index(layer)));
  });
}

void ReduceCodec::load_layer_state(std::int64_t layer, const at::Tensor& state) {
  translated([&] {
    const auto bytes = state_bytes(state);
    const auto hold = lock();
    impl_->load_layer(layer_index(layer), bytes);
    return 0;
  });
}

at::Tensor ReduceCodec::exchange_state() const {
  return translated([&] {
    const auto hold = lock();
    return state_tensor(impl_->save_exchange());
  });
}

void ReduceCodec::load_exchange_state(const at::Tensor& state) {
  translated([&] {
    const auto bytes = state_bytes(state);
    const auto hold = lock();
    impl_->load_exchange(bytes);
    return 0;
  });
}

at::Tensor reduce_encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                         const c10::intrusive_ptr<ReduceCodec>& codec, std::int64_t tag, std::int64_t sequence) {
  return translated([&] {
    const auto hold = codec->lock();
    const auto fields = fields_of(codec->settings(), tag, sequence);
    codec->impl().set_step(fields);
    return codec->impl().encode(gradient, residual, fields);
  });
}

at::Tensor reduce_encode_failure(const at::Tensor&, const c10::intrusive_ptr<ReduceCodec>& codec, std::string message,
                                 std::int64_t tag, std::int64_t sequence) {
  return translated([&] {
    const auto hold = codec->lock();
    const auto fields = fields_of(codec->settings(), tag, sequence);
    codec->impl().set_step(fields);
    return codec->impl().encode_failure(message, fields);
  });
}

at::Tensor reduce_select(const at::Tensor& received, const at::Tensor& out, const c10::optional<at::Tensor>& residual,
                         const c10::intrusive_ptr<ReduceCodec>& codec) {
  return translated([&] {
    const auto hold = codec->lock();
    return codec->impl().select(received, out, residual);
  });
}

at::Tensor reduce_decode(const std::vector<at::Tensor>& selections, const at::Tensor& out,
                         const c10::optional<at::Tensor>& residual, const c10::intrusive_ptr<ReduceCodec>& codec) {
  return translated([&] {
    const auto hold = codec->lock();
    codec->impl().decode(selections, out, residual);
    return out;
  });
}

}  // namespace sidco_torch

TORCH_LIBRARY(sidco, m) {
  using namespace sidco_torch;
  m.class_<Compressor>("Compressor")
      .def(torch::init<std::string, c10::Dict<std::string, double>>())
      .def("report", &Compressor::report)
      .def("method", &Compressor::method)
      .def("state", &Compressor::state)
      .def("load_state", &Compressor::load_state);
  m.class_<Codec>("Codec")
      .def(torch::init<std::string, c10::Dict<std::string, double>, std::vector<std::int64_t>, std::string, double,
                       double, double, std::string>())
      .def("payload_bytes", &Codec::payload_bytes)
      .def("capacity", &Codec::capacity)
      .def("layer_capacities", &Codec::layer_capacities)
      .def("report", &Codec::report)
      .def("layer_state", &Codec::layer_state)
      .def("load_layer_state", &Codec::load_layer_state);
  m.class_<ReduceCodec>("ReduceCodec")
      .def(torch::init<std::string, c10::Dict<std::string, double>, std::vector<std::int64_t>,
                       std::vector<std::int64_t>, std::string, double, double, std::int64_t, std::int64_t, std::string,
                       double, std::string, std::string>())
      .def("block_bytes", &ReduceCodec::block_bytes)
      .def("capacity", &ReduceCodec::capacity)
      .def("target", &ReduceCodec::target)
      .def("report", &ReduceCodec::report)
      .def("layer_state", &ReduceCodec::layer_state)
      .def("load_layer_state", &ReduceCodec::load_layer_state)
      .def("exchange_state", &ReduceCodec::exchange_state)
      .def("load_exchange_state", &ReduceCodec::load_exchange_state);
  m.def("reduce_encode(Tensor gradient, Tensor(a!)? residual, __torch__.torch.classes.sidco.ReduceCodec codec, "
        "int tag, int sequence) -> Tensor");
  m.def("reduce_encode_failure(Tensor gradient, __torch__.torch.classes.sidco.ReduceCodec codec, str message, "
        "int tag, int sequence) -> Tensor");
  m.def("reduce_select(Tensor received, Tensor out, Tensor? residual, __torch__.torch.classes.sidco.ReduceCodec codec) "
        "-> Tensor");
  m.def("reduce_decode(Tensor[] selections, Tensor(a!) out, Tensor(b!)? residual, "
        "__torch__.torch.classes.sidco.ReduceCodec codec) -> Tensor(a!)");
  m.def("compress(Tensor gradient, float density, int[] layer_sizes, Tensor(a!)? residual, "
        "__torch__.torch.classes.sidco.Compressor compressor) -> (Tensor, Tensor)");
  m.def("encode(Tensor gradient, Tensor(a!)? residual, __torch__.torch.classes.sidco.Codec codec, int tag, "
        "int sequence) -> Tensor");
  m.def("encode_failure(Tensor gradient, __torch__.torch.classes.sidco.Codec codec, str message, int tag, "
        "int sequence) -> Tensor");
  m.def("decode(Tensor[] payloads, Tensor(a!) out, Tensor(b!)? residual, __torch__.torch.classes.sidco.Codec codec) "
        "-> Tensor(a!)");
  m.def("scatter_add_(Tensor(a!) dense, Tensor indices, Tensor values, float scale=1.0) -> Tensor(a!)");
  m.def("decompress(Tensor indices, Tensor values, int size) -> Tensor");
  // The reduce exchange's payloads as messages at their own size (CPU buckets: the hook's
  // all-to-all at split sizes): [messages, sizes], and back into payload slots.
  m.def("reduce_frames(Tensor payloads, __torch__.torch.classes.sidco.ReduceCodec codec, bool selection) -> Tensor[]",
        [](const at::Tensor& payloads, const c10::intrusive_ptr<ReduceCodec>& codec, bool selection) {
          return translated([&] {
            const auto hold = codec->lock();
            return codec->impl().frames(payloads, selection);
          });
        });
  m.def("reduce_unframe(Tensor frames, int[] sizes, Tensor(a!)[] slots, __torch__.torch.classes.sidco.ReduceCodec "
        "codec, bool selection) -> ()",
        [](const at::Tensor& frames, const std::vector<std::int64_t>& sizes, const std::vector<at::Tensor>& slots,
           const c10::intrusive_ptr<ReduceCodec>& codec, bool selection) {
          translated([&] {
            const auto hold = codec->lock();
            codec->impl().unframe(frames, sizes, slots, selection);
            return 0;
          });
        });
  // The reduce exchange in two hops (comm/reduce/hops.hpp) over the hook's send/recv: each
  // phase's messages [send peers, messages, receive peers, most bytes each], and the round's
  // end into payload slots, returning its bytes [sent, received].
  m.def("reduce_hops_first(Tensor payloads, __torch__.torch.classes.sidco.ReduceCodec codec, bool selection) -> "
        "(int[], Tensor[], int[], int[])",
        [](const at::Tensor& payloads, const c10::intrusive_ptr<ReduceCodec>& codec, bool selection) {
          return translated([&] {
            const auto hold = codec->lock();
            return codec->impl().hops_first(payloads, selection);
          });
        });
  m.def("reduce_hops_second(Tensor[] received, __torch__.torch.classes.sidco.ReduceCodec codec, bool selection) -> "
        "(int[], Tensor[], int[], int[])",
        [](const std::vector<at::Tensor>& received, const c10::intrusive_ptr<ReduceCodec>& codec, bool selection) {
          return translated([&] {
            const auto hold = codec->lock();
            return codec->impl().hops_second(received, selection);
          });
        });
  m.def("reduce_hops_finish(Tensor[] received, Tensor(a!)[] slots, __torch__.torch.classes.sidco.ReduceCodec codec, "
        "bool selection) -> int[]",
        [](const std::vector<at::Tensor>& received, const std::vector<at::Tensor>& slots,
           const c10::intrusive_ptr<ReduceCodec>& codec, bool selection) {
          return translated([&] {
            const auto hold = codec->lock();
            return codec->impl().hops_finish(received, slots, selection);
          });
        });
  // Whether a failed exchange failed only for non-finite input on some ranks (the hook's
  // nonfinite="skip"): the payloads' headers, on the host.
  m.def("nonfinite_only(Tensor[] payloads) -> bool", [](const std::vector<at::Tensor>& payloads) {
    return translated([&] {
      std::vector<std::span<const std::byte>> views;
      for (const at::Tensor& p : payloads) {
        check_cpu_tensor("payload", p);
        if (p.scalar_type() != at::kByte) sidco::throw_error("payload: dtype ", p.scalar_type(), " is not uint8");
        views.push_back(bytes_of(p));
      }
      return sidco::comm::failed_for_nonfinite_input(views);
    });
  });
  // What a saved reduce exchange state says of itself: (format version, ranks, dense size,
  // owner name, as valid UTF-8 for Python's str; version 1 states may not say the last two: 0
  // and "").
  m.def("exchange_state_info(Tensor state) -> (int, int, int, str)", [](const at::Tensor& state) {
    return translated([&] {
      const auto info = sidco::comm::read_reduce_state_info(state_bytes(state));
      return std::make_tuple(std::int64_t(info.version), std::int64_t(info.ranks), std::int64_t(info.size),
                             sidco::detail::printable_name(info.owner));
    });
  });
  // The sources this library was built from ("0x" and their digest), which the package
  // compares with its own Python files' at import.
  m.def("source_digest() -> str", [] { return std::string(sidco_torch::ops_source_digest); });
  // Which CPU kernels run here: a Highway target chosen at load time, or "portable".
  m.def("cpu_kernels() -> str", [] { return std::string(sidco::backend::cpu::kernels()); });
  // The method table (sidco/methods.hpp): [name, description] per method; with added=True,
  // the methods extensions added (added_methods.hpp) instead.
  m.def("methods(bool added=False) -> str[][]", [](bool added) {
    std::vector<std::vector<std::string>> table;
    if (added) {
      for (const auto& [name, description] : added_methods()) table.push_back({name, description});
    } else {
      for (const auto& m : sidco::methods::table) table.push_back({std::string(m.name), std::string(m.description)});
    }
    return table;
  });
  // What an added method is: (its compressor's type, SIDCO_TORCH_SOURCE_DIGEST as its extension
  // was compiled with: "0x" and the digest of the sidco_torch sources, "" without the flag);
  // ("", "") for a built-in one.
  m.def("method_origin(str method) -> (str, str)", [](const std::string& method) {
    const added_method* added = find_added_method(method);
    if (!added) return std::make_tuple(std::string(), std::string());
    return std::make_tuple(demangled(added->composition), added->built_against);
  });
  register_cpu_kernels(m);
  if (&register_cuda_kernels != nullptr) register_cuda_kernels(m);
}
