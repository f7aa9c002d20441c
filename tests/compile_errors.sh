#!/usr/bin/env bash
# Mistakes that must not compile, each with the sentence its error must contain: a backend
# that lacks one member of the contract, types given on the wrong axis of a compressor, an
# estimator with a misspelt hook, a distribution model missing part of its contract.
# Arguments: the C++ compiler, then its flags (include paths).
set -uo pipefail
compiler=$1
shift
source "$(dirname "$0")/expect_compile_error.sh"

compile() {
  local name=$1 body=$2
  shift 2
  printf '#include <sidco/sidco.hpp>\n%s\n' "$body" > "$tmp/$name.cpp"
  "$compiler" -std=c++20 -fsyntax-only "$@" "$tmp/$name.cpp" > "$tmp/$name.log" 2>&1
}

expect_control '
int main() { sidco::presets::sidco_e<sidco::select::above_threshold, sidco::backend::serial> c; (void)c; }' "$@"

expect_error missing_member "sidco backend: missing count_above(source, t)" '
struct no_count : sidco::backend::serial {
  template <class Source> void count_above(const Source&, double) = delete;
};
int main() { sidco::presets::gaussian_k<sidco::select::above_threshold, no_count> c; (void)c; }' "$@"

expect_error missing_memory "sidco backend: missing \`memory\`" '
struct no_memory { static constexpr const char* name = "none"; };
int main() { sidco::presets::top_k<no_memory> c; (void)c; }' "$@"

expect_error backend_as_selection "a backend was given as the Selection" '
int main() { sidco::presets::sidco_e<sidco::backend::serial> c; (void)c; }' "$@"

expect_error selection_as_backend "a selection was given as the Backend" '
int main() { sidco::compressor<sidco::estimate::none, sidco::select::top_k, sidco::select::top_k> c; (void)c; }' "$@"

expect_error not_an_estimator "Estimator must be an estimator" '
int main() { sidco::compressor<sidco::backend::cpu> c; (void)c; }' "$@"

# An estimator hook is declared by a flag: a misspelt hook, or a hook without its flag,
# would silently switch adaptation off.
estimator_with() {
  printf '%s' "
struct custom {
  static constexpr const char* name = \"custom\";
  static constexpr bool provides_threshold = true;
  using statistics = sidco::backend::pass_statistics<true>;
  template <class Pass>
  sidco::estimate::threshold_estimate estimate(const sidco::moments&, std::span<const sidco::moments>, double, Pass&) {
    return {0.5, 1};
  }
  $1
};
int main() { sidco::compressor<custom, sidco::select::above_threshold, sidco::backend::serial> c; (void)c; }"
}

expect_error misspelt_observe "declares observes = true but has no observe(achieved_density, delta)" \
  "$(estimator_with 'static constexpr bool observes = true; void obsrve(double, double) {}')" "$@"

expect_error undeclared_observe "has observe(achieved_density, delta) but does not declare" \
  "$(estimator_with 'void observe(double, double) {}')" "$@"

expect_error misspelt_probes "declares probes = true but lacks probe_count()" \
  "$(estimator_with 'static constexpr bool probes = true; std::size_t probe_cout() const { return 0; } void probe_thresholds(std::span<double>) const {}')" "$@"

expect_error no_estimate "missing estimate(all, probes, delta, pass)" '
struct no_estimate {
  static constexpr const char* name = "none";
  static constexpr bool provides_threshold = true;
  using statistics = sidco::backend::pass_statistics<true>;
};
int main() { sidco::compressor<no_estimate, sidco::select::above_threshold, sidco::backend::serial> c; (void)c; }' "$@"

# A distribution model is checked against dist/concept.hpp where statistical<First, Tail>
# names it, first or tail.
expect_error model_without_quantile "sidco distribution model: missing double upper_quantile(double rho) const" '
struct no_quantile {
  static constexpr const char* name = "no-quantile";
  static constexpr bool needs_log = false;
  static no_quantile fit(const sidco::moments&) { return {}; }
  double upper_quntile(double) const { return 1; }
};
int main() {
  sidco::presets::sidco_with<sidco::dist::exponential, no_quantile, sidco::stages::adaptive, sidco::fit::zero_aware,
                             sidco::select::above_threshold, sidco::backend::serial> c;
  (void)c;
}' "$@"

expect_error model_without_fit "sidco distribution model: missing static Model fit(const moments&)" '
struct no_fit {
  static constexpr const char* name = "no-fit";
  static constexpr bool needs_log = false;
  double upper_quantile(double) const { return 1; }
};
int main() { sidco::compressor<sidco::estimate::statistical<no_fit>, sidco::select::above_threshold, sidco::backend::serial> c; (void)c; }' "$@"

exit $failed
