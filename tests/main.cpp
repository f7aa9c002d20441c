// The one doctest main every test program links (each main costs ~10 s to compile). A program
// holds several test files and each test runs one file's cases (--source-file), so a run whose
// filters match no test case fails rather than passing with nothing checked. Built with
// SIDCO_TEST_MPI for the MPI tests (tests/mpi): every rank runs the cases, rank 0 reports, and
// every rank exits with the same status, failed where any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#ifdef SIDCO_TEST_MPI
#include <mpi.h>
#endif

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
#ifdef SIDCO_TEST_MPI
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#endif
  doctest::Context context(argc, argv);
#ifdef SIDCO_TEST_MPI
  context.setOption("no-colors", true);
  if (rank != 0) context.setOption("out", "/dev/null");  // one rank reports
#endif
  int status = context.run();
  if (status == 0 && !queried && cases_matched == 0) {
    std::fprintf(stderr, "no test case matched the filters: nothing was checked\n");
    status = 1;
  }
#ifdef SIDCO_TEST_MPI
  int any_failed = 0;
  MPI_Allreduce(&status, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  status = any_failed;
#endif
  return status;
}
