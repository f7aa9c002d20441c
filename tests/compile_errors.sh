#!/usr/bin/env bash
# Mistakes that must not compile, each with the sentence its error must contain: a backend
# that lacks one member of the contract, types given on the wrong axis of a compressor, an
# estimator with a misspelt hook, a distribution model missing part of its contract.
# Arguments: the C++ compiler's command (a launcher first, such as the ccache Meson puts
# before the compiler when it finds one), then its flags (include paths).
set -uo pipefail
compiler=()
while [ $# -gt 0 ] && [[ $1 != -* ]]; do compiler+=("$1"); shift; done
source "$(dirname "$0")/expect_compile_error.sh"

# sidco.hpp precompiled at the first case compiled (g++ reads NAME.gch, clang++ NAME.pch
# beside an -include'd header): each case then parses only its body, about 1 s instead of 6.
# A compiler that cannot use the file parses the header itself, with the same diagnostics.
# The verdicts' key preprocesses the same text through a header without one beside it.
printf '#include <sidco/sidco.hpp>\n' > "$tmp/sidco_all.hpp"
cp "$tmp/sidco_all.hpp" "$tmp/sidco_text.hpp"
pch=gch
[[ $("${compiler[@]}" --version 2>&1) == *clang* ]] && pch=pch
flags=("$@")
precompiled=0
shared=$(shared_key "$tmp/sidco_text.hpp" "${compiler[@]}" -std=c++20 -P "$@")

syntax_check() {  # FLAGS... FILE
  if [ "$precompiled" = 0 ]; then
    precompiled=1
    "${compiler[@]}" -std=c++20 -x c++-header "${flags[@]}" "$tmp/sidco_all.hpp" -o "$tmp/sidco_all.hpp.$pch" \
      > /dev/null 2>&1 || rm -f "$tmp/sidco_all.hpp.$pch"
  fi
  "${compiler[@]}" -std=c++20 -fsyntax-only "$@"
}

compile() {
  local name=$1 body=$2
  shift 2
  printf '%s\n' "$body" > "$tmp/$name.cpp"
  remembered "$name" "$shared" "$tmp/$name.cpp" syntax_check "$@" -include "$tmp/sidco_all.hpp" "$tmp/$name.cpp"
}

expect_control '
int main() { sidco::presets::sidco_e<sidco::backend::serial> c; (void)c; }' "$@"

expect_error missing_member "sidco backend: missing count_above(source, t)" '
struct no_count : sidco::backend::serial {
  template <class Source> void count_above(const Source&, double) = delete;
};
int main() { sidco::presets::gaussian_k<no_count> c; (void)c; }' "$@"

expect_error missing_memory "sidco backend: missing \`memory\`" '
struct no_memory { static constexpr const char* name = "none"; };
int main() { sidco::presets::top_k<no_memory> c; (void)c; }' "$@"

expect_error backend_as_selection "a backend was given as the Selection" '
int main() { sidco::compressor<sidco::estimate::none, sidco::backend::serial> c; (void)c; }' "$@"

expect_error selection_as_backend "a selection was given as the Backend" '
int main() { sidco::compressor<sidco::estimate::none, sidco::select::top_k, sidco::select::top_k> c; (void)c; }' "$@"

# A preset takes the backend only; another selection goes through with_selection.
expect_error preset_given_selection "a selection was given as the Backend" '
int main() { sidco::presets::sidco_e<sidco::select::exact_k> c; (void)c; }' "$@"

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

# The name is what a checkpoint records: an estimator without one is refused where it is given.
expect_error estimator_without_name "sidco estimator: missing \`static constexpr const char* name\`" '
struct unnamed {
  static constexpr bool provides_threshold = true;
  using statistics = sidco::backend::pass_statistics<true>;
  template <class Pass>
  sidco::estimate::threshold_estimate estimate(const sidco::moments&, std::span<const sidco::moments>, double, Pass&) {
    return {0.5, 1};
  }
};
int main() { sidco::compressor<unnamed, sidco::select::above_threshold, sidco::backend::serial> c; (void)c; }' "$@"

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
  sidco::presets::sidco_with<sidco::models::exponential, no_quantile, sidco::stages::adaptive, sidco::fit::zero_aware,
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

# A selection is checked against select/concept.hpp: its way to select, and its one hook,
# declared by a flag (a misspelt widen would switch exact_k's rescans off).
selection_with() {
  printf '%s' "
struct custom_selection {
  static constexpr const char* name = \"custom\";
  static constexpr bool needs_threshold = true;
  static constexpr bool fuses_layers = false;
  double estimation_density(double delta) const { return delta; }
  $1
};
int main() {
  sidco::compressor<sidco::estimate::statistical<sidco::models::exponential>, custom_selection, sidco::backend::serial> c;
  (void)c;
}"
}

expect_error selection_without_select "neither fuses_layers nor ranks_candidates, so it needs select(" \
  "$(selection_with '')" "$@"

ranking='static constexpr bool ranks_candidates = true;
  template <class B, class S> sidco::select::candidate_start start(B&, const S&, double t, std::size_t k) const { return {t, k}; }
  std::size_t keep(std::size_t k, std::size_t) const { return k; }'

expect_error misspelt_widen "declares widens = true but has no widen(" \
  "$(selection_with "$ranking static constexpr bool widens = true;
  template <class... A> void widdn(A&&...) const {}")" "$@"

expect_error undeclared_widen "has widen(...) but does not declare" \
  "$(selection_with "$ranking template <class... A> void widen(A&&...) const {}")" "$@"

expect_error ranking_without_keep "declares ranks_candidates = true but has no keep(k, candidates)" \
  "$(selection_with 'static constexpr bool ranks_candidates = true;
  template <class B, class S> sidco::select::candidate_start start(B&, const S&, double t, std::size_t k) const { return {t, k}; }')" "$@"

# Wrong calls of compress: one sentence first, in a few lines (pipeline/wrong_call.hpp).
call_with() {
  printf '%s' "
#include <vector>
int main() {
  std::vector<float> g(100);
  sidco::presets::sidco_e<> c;
  sidco::sparse_vector<float> out;
  $1
}"
}
expect_short_error call_double_gradient "the gradient is not a contiguous range of the output's element type" \
  "$(call_with 'std::vector<double> d(100); c.compress(d, 0.1, out);')" "$@"
expect_short_error call_double_residual "the feedback state's element type or memory space is not the output's" \
  "$(call_with 'sidco::feedback::residual<double> r(100); c.compress(g, 0.1, out, r);')" "$@"
expect_short_error call_raw_pointer "a raw pointer carries no size" \
  "$(call_with 'c.compress(g.data(), 0.1, out);')" "$@"
expect_short_error call_dense_output "the third argument must be a sidco::sparse_vector<T>" \
  "$(call_with 'std::vector<float> dense(100); c.compress(g, 0.1, dense);')" "$@"
expect_short_error call_two_states "at most one feedback state follows the output" \
  "$(call_with 'sidco::feedback::residual<float> r(100); c.compress(g, 0.1, out, r, r);')" "$@"
expect_short_error call_not_feedback "the fourth argument must be a feedback::residual<T>" \
  "$(call_with 'int r = 0; c.compress(g, 0.1, out, r);')" "$@"
expect_short_error call_layered_double "the gradient is not a contiguous range of the output's element type" \
  "$(call_with 'std::vector<double> d(100); sidco::segmented<sidco::presets::sidco_e<>> l({{0, 50}, {50, 50}}); l.compress(d, 0.1, out);')" "$@"
expect_short_error selection_short "neither fuses_layers nor ranks_candidates, so it needs select(" \
  "$(selection_with '')" "$@"
expect_short_error call_explicit_t "the gradient is not a contiguous range of the output's element type" \
  "$(call_with 'std::vector<double> d(100); c.compress<float>(d, 0.1, out);')" "$@"
expect_short_error call_explicit_wrong_t "compress<T>(...) names a T that is not the output sparse_vector's element type" \
  "$(call_with 'c.compress<double>(g, 0.1, out);')" "$@"

# Policies in the wrong slot: one sentence, not the cascade of the slot's own checks.
policy_call() {
  printf '%s' "
#include <vector>
int main() {
  std::vector<float> g(100);
  $1 c;
  sidco::sparse_vector<float> out;
  c.compress(g, 0.1, out);
}"
}
expect_short_error stages_as_tail "a stages policy was given as a distribution model" \
  "$(policy_call 'sidco::compressor<sidco::estimate::statistical<sidco::models::exponential, sidco::stages::fixed<3>>>')" "$@"
expect_short_error model_as_estimator "a distribution model was given as the Estimator; wrap it in an estimator" \
  "$(policy_call 'sidco::compressor<sidco::models::gamma>')" "$@"
# A model of one's own with a misspelt member, called: its sentence first, naming the model
# by the first error line, and not the calls into it (20 lines: the concept's notes under
# clang's include chain).
SHORT_ERROR_LINES=20 SHORT_ERROR_NAMES='requirement<mine, false>\|\[with M = mine\]' expect_short_error model_typo_called "sidco distribution model: missing double upper_quantile(double rho) const" '
#include <vector>
struct mine {
  static constexpr const char* name = "mine";
  static constexpr bool needs_log = false;
  static mine fit(const sidco::moments&) { return {}; }
  double upper_quntile(double) const { return 1; }
};
int main() {
  std::vector<float> g(100);
  sidco::presets::sidco_with<mine> c;
  sidco::sparse_vector<float> out;
  c.compress(g, 0.1, out);
}' "$@"

say_remembered
exit $failed
