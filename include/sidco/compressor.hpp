// The composition every method is built from: estimator, selection, backend.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "sidco/backend/concept.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/single_user.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/models/concept.hpp"
#include "sidco/estimate/concept.hpp"
#include "sidco/estimate/none.hpp"
#include "sidco/feedback/momentum.hpp"
#include "sidco/feedback/residual.hpp"
#include "sidco/pipeline/front_end.hpp"
#include "sidco/pipeline/input.hpp"
#include "sidco/pipeline/report.hpp"
#include "sidco/pipeline/run.hpp"
#include "sidco/pipeline/scratch.hpp"
#include "sidco/pipeline/tensor_state.hpp"
#include "sidco/select/concept.hpp"
#include "sidco/policy_checks.hpp"
#include "sidco/select/above_threshold.hpp"

namespace sidco {

namespace backend {
// The default backend, defined in sidco/backend/cpu.hpp (presets.hpp and sidco.hpp include
// it): this header stays free of OpenMP and Highway for users of other backends.
class cpu;
}  // namespace backend

namespace detail {

// The memory space of a backend, or host memory for a type that is not one (so that a
// type given on the wrong axis fails on the axis check alone).
template <class B>
struct memory_of {
  using type = memory::host;
};
template <class B>
  requires requires { typename B::memory; }
struct memory_of<B> {
  using type = typename B::memory;
};

}  // namespace detail

/// compressor<Estimator, Selection, Backend>: a moments pass (which also rejects bad input
/// before anything is written, and measures the tails the estimator probes), the
/// estimator's threshold (with whatever passes of its own it asks for), then the selection.
/// All policy choice is at compile time. One compressor per tensor: estimators such as
/// adaptive stages and selections such as Random-k keep state. Buffers (output, residual)
/// live in the backend's memory space.
template <class Estimator, class Selection = select::above_threshold,
          class Backend = backend::cpu>
class compressor : public pipeline::front_end<compressor<Estimator, Selection, Backend>,
                                              typename detail::memory_of<Backend>::type> {
  static_assert(!detail::backend_like<Selection>,
                "compressor<Estimator, Selection, Backend>: a backend was given as the "
                "Selection, which comes second: compressor<estimate::none, select::top_k, "
                "backend::serial>; a preset takes the backend alone: presets::sidco_e<backend::serial>");
  static_assert(detail::selection_policy<Selection> || detail::backend_like<Selection> ||
                    select::selection_like<Selection>,
                "compressor<Estimator, Selection, Backend>: Selection must be a selection policy "
                "(select::above_threshold, exact_k, trimmed<P>, top_k or random_k)");
  static_assert(!select::selection_like<Selection> || select::diagnose<Selection>());
  // statistical<...> is completed first, so that its own sentences (a policy in its wrong
  // slot) come with the shortest context; other types are read as they are. These checks are
  // immediately called lambdas because `if constexpr` skips what does not apply, and a named
  // function or concept in their place adds notes to clang's error (19 lines where
  // tests/compile_errors.sh allows 15).
  static_assert([] {
    if constexpr (detail::is_statistical<Estimator>)
      return sizeof(Estimator) > 0;
    else
      return true;
  }());
  static constexpr bool model_as_estimator = [] {
    if constexpr (detail::is_statistical<Estimator>)
      return false;
    else
      return models::model_like<Estimator>;
  }();
  static_assert(!model_as_estimator,
                "compressor<Estimator, Selection, Backend>: a distribution model was given as the Estimator; "
                "wrap it in an estimator: compressor<estimate::statistical<models::gamma>> (or a preset, "
                "presets::sidco_e)");
  static_assert([] {
    if constexpr (detail::is_statistical<Estimator> || model_as_estimator)
      return true;
    else
      return detail::estimator_policy<Estimator>;
  }(),
                "compressor<Estimator, Selection, Backend>: Estimator must be an estimator "
                "(estimate::statistical<...>, sampled, gaussian_k, redsync or none)");
  static_assert([] {  // the estimator's own checks only when it is one
    if constexpr (detail::estimator_policy<Estimator>)
      return estimate::diagnose<Estimator>();
    else
      return true;
  }());
  static_assert(!detail::selection_policy<Backend>,
                "compressor<Estimator, Selection, Backend>: a selection was given as the "
                "Backend (backend::cpu, backend::serial or backend::cuda); a preset takes the "
                "backend alone: another selection is presets::with_selection<methods::sidco_e, "
                "select::exact_k>");
  static_assert(detail::selection_policy<Backend> || backend::diagnose<Backend>());
  static_assert(!detail::needs_threshold<Selection>() || detail::provides_threshold<Estimator>() ||
                    !detail::estimator_policy<Estimator>,
                "this selection keeps values above a threshold: pair it with an estimator "
                "that provides one (estimate::statistical, sampled, gaussian_k, redsync)");
  static_assert(!detail::selection_policy<Selection> || detail::needs_threshold<Selection>() ||
                    std::is_same_v<Estimator, estimate::none>,
                "top_k and random_k select without a threshold: use estimate::none");

  using memory = typename detail::memory_of<Backend>::type;

 public:
  using estimator_type = Estimator;
  using selection_type = Selection;
  using backend_type = Backend;
  using memory_space = memory;
  using state_type = pipeline::tensor_state<Estimator, Selection>;
  /// Most tails an estimator may ask the moments pass to measure.
  static constexpr std::size_t max_probes = state_type::max_probes;

  compressor() = default;
  explicit compressor(Estimator estimator, Selection selection = {}, Backend backend = {})
      : state_(std::move(estimator), std::move(selection)), backend_(std::move(backend)) {}

  // compress(gradient, delta, out[, residual or momentum]): pipeline/front_end.hpp.

  /// Bytes this compressor keeps between calls besides its output.
  std::size_t workspace_bytes() const {
    std::size_t bytes = state_.workspace_bytes();
    if constexpr (requires { backend_.workspace_bytes(); }) bytes += backend_.workspace_bytes();
    return bytes;
  }

  /// What this compressor keeps between calls besides buffers (adaptive stages, where the
  /// next call probes, generators' positions), for a checkpoint: load_state of what
  /// save_state wrote makes every later call give the same bits as this compressor's would.
  /// A state of another method, or a damaged one, is refused and nothing changes.
  void save_state(state_writer& out) const { state_.save_state(out); }
  void load_state(state_reader& in) { state_.load_state(in); }

  Estimator& estimator() { return state_.estimator(); }
  const Estimator& estimator() const { return state_.estimator(); }
  Selection& selection() { return state_.selection(); }
  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }
  /// The estimator and selection with their state: what segmented keeps per segment.
  const state_type& tensor_state() const { return state_; }

 private:
  friend pipeline::front_end<compressor, memory>;

  template <class T, class Index>
  static void check_call(std::size_t size, double delta, const sparse_vector<T, Index, memory>& out) {
    pipeline::check_call(size, delta, out);
  }

  template <class Source>
  compress_report run(const pipeline::input<Source>& in, double delta, auto& out) {
    const detail::single_user::scope in_use(user_, "compressor::compress");
    const segment whole{0, in.source.size};
    const pipeline::scratch work = scratch_.view(state_.probe_count(pipeline::probe_limit<Source>));
    pipeline::run<typename Estimator::statistics, Selection>(
        backend_, std::span<state_type>(&state_, 1), std::span<const segment>(&whole, 1), in.source, in.what, out,
        work, [delta](const pipeline::scratch& w) { w.densities[0] = delta; });
    return work.reports[0];
  }

  state_type state_{};
  Backend backend_{};
  pipeline::single_scratch<state_type::max_probes> scratch_;
  [[no_unique_address]] detail::single_user user_;
};

}  // namespace sidco
