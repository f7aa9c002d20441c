// sidco-bench's last screen: every method at one configuration against the baselines of
// the same run (bench/report.py --summary-only prints the same table from a JSON file).
// Runs are named NAME/INPUT/LOG2N/INVERSE; per method: time (the fastest repetition, and
// how much slower their median is), time over the streaming read,
// time over our Top-k and achieved / target density, with densities outside [0.8, 1.25]
// flagged (a method that keeps far fewer entries than asked is not faster, it does less
// work). Methods appear in the suite's order, not ranked.
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <benchmark/benchmark.h>

namespace sidco_bench {

/// The baselines' row names: what the suite registers and the screen divides by.
inline constexpr const char* streaming_read_row = "streaming-read";
inline constexpr const char* nth_element_row = "nth-element-top-k";
inline constexpr const char* feedback_traffic_row = "feedback-traffic";  // the :feedback rows' floor
inline constexpr std::array<const char*, 3> baseline_rows = {streaming_read_row, nth_element_row,
                                                             feedback_traffic_row};

/// A run's configuration: input, log2 N, inverse density.
using configuration = std::tuple<int, int, int>;

/// Splits NAME/INPUT/LOG2N/INVERSE; nothing for other names.
inline std::optional<std::pair<std::string, configuration>> split_run_name(const std::string& full) {
  int parts[3];
  std::size_t end = full.size();
  for (int p = 2; p >= 0; --p) {
    const std::size_t slash = full.rfind('/', end - 1);
    if (slash == std::string::npos || slash + 1 >= end) return std::nullopt;
    const std::string number = full.substr(slash + 1, end - slash - 1);
    if (number.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    parts[p] = std::stoi(number);
    end = slash;
    if (end == 0) return std::nullopt;
  }
  return std::pair{full.substr(0, end), configuration{parts[0], parts[1], parts[2]}};
}

/// "K/L/I" to a configuration; nothing when text is not three numbers.
inline std::optional<configuration> parse_configuration(const std::string& text) {
  const auto split = split_run_name("x/" + text);
  if (!split) return std::nullopt;
  return split->second;
}

/// The console's reporter, which also keeps every run and prints the summary at the end:
/// for `chosen`, or else the largest N on Laplace values (input 1) at the smallest density
/// run, or else the largest configuration run.
class summary_reporter : public benchmark::ConsoleReporter {
 public:
  /// input_name and size_of describe a configuration's input (its name, its N).
  summary_reporter(OutputOptions options, std::optional<configuration> chosen,
                   std::function<std::string(int)> input_name, std::function<std::size_t(const configuration&)> size_of)
      : ConsoleReporter(options), chosen_(chosen), input_name_(std::move(input_name)), size_of_(std::move(size_of)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const auto split = split_run_name(run.run_name.str());
      if (!split || split->first.starts_with("layers/")) continue;
      const auto& [name, config] = *split;
      timing& t = times_[{name, config}];
      const double seconds = run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
      const auto ratio = run.counters.find("density_ratio");
      if (ratio != run.counters.end() && t.density_ratio < 0) t.density_ratio = double(ratio->second);
      // Repetitions: each one's time, or (with --benchmark_report_aggregates_only) the median
      // and standard deviation Google Benchmark computed from them.
      t.repetitions = std::max<std::size_t>(1, std::size_t(run.repetitions));
      if (run.run_type == Run::RT_Aggregate) {
        if (run.aggregate_name == "median") t.median = seconds;
        if (run.aggregate_name == "stddev") t.stddev = seconds;
      } else {
        t.samples.push_back(seconds);
      }
      if (std::find(baseline_rows.begin(), baseline_rows.end(), name) == baseline_rows.end() &&
          seen_.insert(name).second)
        methods_.push_back(name);
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    const auto config = pick();
    if (!config) return;
    std::FILE* out = stdout;
    const auto [input, log2n, inverse] = *config;
    (void)log2n;
    std::fprintf(out, "\nSummary: %s (input %d), N = %zu, delta = %g (--summary=INPUT/LOG2N/INVERSE picks another)\n",
                 input_name_(input).c_str(), input, size_of_(*config), 1.0 / inverse);
    std::fprintf(out, "time over the streaming read and over our Top-k, from this run; achieved / target\n"
                      "density of the call timed; ! outside [0.8, 1.25]: not comparable. Not ranked.\n");
    const auto read = find(streaming_read_row, *config), top = find("top-k", *config);  // the registry's Top-k
    const std::size_t repetitions = read ? read->count() : 1;
    if (repetitions > 1)
      std::fprintf(out, "ms: the fastest of %zu repetitions (load only adds time); +: how much slower their median\n"
                        "is (with only the aggregates reported: their median, +: standard deviation over it).\n",
                   repetitions);
    else
      std::fprintf(out, "ms: one repetition (--benchmark_repetitions=5 gives a median and its spread).\n");
    warn_if_loaded(out);
    std::fprintf(out, "A \"Library was built as DEBUG\" warning above is about Debian's libbenchmark itself (its\n"
                      "timing loop), not the code measured, which this build compiles optimized.\n\n");
    std::fprintf(out, "%-32s %10s %7s %14s %8s %16s\n", "method", "ms", "+", "/ streaming", "/ top-k",
                 "achieved/target");
    std::vector<std::string> rows(baseline_rows.begin(), baseline_rows.end());
    rows.insert(rows.end(), methods_.begin(), methods_.end());
    for (const std::string& name : rows) {
      const auto run = find(name, *config);
      if (!run) continue;
      const double seconds = run->seconds();
      char spread[32] = "-", over_read[32] = "-", over_top[32] = "-", density[32] = "", flag[4] = "";
      if (run->spread() >= 0) std::snprintf(spread, sizeof spread, "%.0f%%", 100 * run->spread());
      if (read) std::snprintf(over_read, sizeof over_read, "%.2f", seconds / read->seconds());
      if (top) std::snprintf(over_top, sizeof over_top, "%.2f", seconds / top->seconds());
      if (run->density_ratio >= 0) {
        std::snprintf(density, sizeof density, "%.2f", run->density_ratio);
        if (run->density_ratio < 0.8 || run->density_ratio > 1.25) std::snprintf(flag, sizeof flag, " !");
      }
      std::fprintf(out, "%-32s %10.3f %7s %14s %8s %16s%s\n", name.c_str(), seconds * 1e3, spread, over_read,
                   over_top, density, flag);
    }
    std::fflush(out);
  }

 private:
  struct timing {
    std::vector<double> samples;  // each repetition's seconds
    double median = -1, stddev = -1;  // Google Benchmark's aggregates, when only they are reported
    double density_ratio = -1;        // -1: no counter (the baselines)
    std::size_t repetitions = 1;

    std::size_t count() const { return repetitions; }
    /// The fastest repetition (a busy machine only adds time), or Google Benchmark's median
    /// when only the aggregates were reported.
    double seconds() const {
      return samples.empty() ? median : *std::min_element(samples.begin(), samples.end());
    }
    /// How far the repetitions spread: (median - fastest) / fastest, or the standard deviation
    /// over the median from the aggregates; -1 for one run.
    double spread() const {
      if (samples.size() >= 2) {
        std::vector<double> sorted = samples;
        std::sort(sorted.begin(), sorted.end());
        const std::size_t n = sorted.size();
        const double middle = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
        return (middle - sorted.front()) / sorted.front();
      }
      return samples.empty() && stddev >= 0 && median > 0 ? stddev / median : -1;
    }
  };

  // Timings taken while more runnable threads than cores compete are inflated, and unevenly.
  static void warn_if_loaded(std::FILE* out) {
    double load = 0;
    if (std::FILE* in = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(in, "%lf", &load) != 1) load = 0;
      std::fclose(in);
    }
    const unsigned cores = std::thread::hardware_concurrency();
    if (cores > 0 && load > double(cores))
      std::fprintf(out, "warning: load average %.1f over %u cores while this ran: times are inflated, unevenly;\n"
                        "rerun on a quiet machine, or with repetitions, before citing them.\n", load, cores);
  }

  std::optional<timing> find(const std::string& name, const configuration& config) const {
    const auto at = times_.find({name, config});
    if (at == times_.end() || (at->second.samples.empty() && at->second.median < 0)) return std::nullopt;
    return at->second;
  }

  std::optional<configuration> pick() const {
    std::optional<configuration> best, best_laplace;
    for (const auto& [key, _] : times_) {
      const configuration& c = key.second;
      // Largest N, then smallest density (largest inverse).
      auto better = [&](const std::optional<configuration>& than) {
        return !than || std::pair(std::get<1>(c), std::get<2>(c)) > std::pair(std::get<1>(*than), std::get<2>(*than));
      };
      if (chosen_ && c == *chosen_) return c;
      if (std::get<0>(c) == 1 && better(best_laplace)) best_laplace = c;
      if (better(best)) best = c;
    }
    if (chosen_) {
      std::fprintf(stdout, "\nSummary: no run at %d/%d/%d (the filter left it out)\n", std::get<0>(*chosen_),
                   std::get<1>(*chosen_), std::get<2>(*chosen_));
      return std::nullopt;
    }
    return best_laplace ? best_laplace : best;
  }

  std::optional<configuration> chosen_;
  std::function<std::string(int)> input_name_;
  std::function<std::size_t(const configuration&)> size_of_;
  std::map<std::pair<std::string, configuration>, timing> times_;
  std::set<std::string> seen_;
  std::vector<std::string> methods_;
};

}  // namespace sidco_bench
