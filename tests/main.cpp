// The one doctest main every test program links (each main costs ~10 s to compile). A program
// holds several test files and each test runs one file's cases (--source-file), so a run whose
// filters match no test case fails rather than passing with nothing checked.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

int cases_matched = -1;  // -1: no run ended
bool queried = false;    // --count, --list-test-cases: nothing is meant to run

struct count_matched_cases : doctest::IReporter {
  explicit count_matched_cases(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override { queried = true; }
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    cases_matched = int(stats.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

DOCTEST_REGISTER_LISTENER("count_matched_cases", 1, count_matched_cases);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (status == 0 && !queried && cases_matched == 0) {
    std::fprintf(stderr, "no test case matched the filters: nothing was checked\n");
    return 1;
  }
  return status;
}
