#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "doctest.hpp"
#include <sidco/io/npy.hpp>

#include "support.hpp"

namespace {
std::atomic<std::size_t> largest_allocation{0};
// What reading any file may allocate beyond its own size: the error message (the file's
// path and the reason), never anything a header claims. The file stream is unbuffered.
constexpr std::size_t message_allowance = 1024;
}

// The largest single heap allocation, for the test that a hostile file allocates nothing
// beyond its own size. Not inlined: GCC would otherwise pair the inlined free() with other
// allocators and warn.
[[gnu::noinline]] void* operator new(std::size_t size) {
  std::size_t seen = largest_allocation.load();
  while (size > seen && !largest_allocation.compare_exchange_weak(seen, size)) {
  }
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

std::string write_npy(const std::string& name, const std::string& header_dict,
                      const std::string& payload, int version = 1) {
  const auto path = (std::filesystem::temp_directory_path() / ("sidco_npy_" + name)).string();
  std::string header = header_dict;
  const std::size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY", 6);
  out.put(char(version));
  out.put(0);
  const std::size_t n = header.size();
  out.put(char(n & 0xff));
  out.put(char((n >> 8) & 0xff));
  if (version != 1) {
    out.put(0);
    out.put(0);
  }
  out << header << payload;
  return path;
}

std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// What reading path as float32 throws, or "(no error)".
std::string load_error(const std::string& path) {
  try {
    sidco::io::load_npy<float>(path);
  } catch (const sidco::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("npy: float32 and float64, versions 1 and 2, converted to either type") {
  const auto f4 = write_npy("f4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                            floats({1.5f, -2.f, 0.f}));
  CHECK(sidco::io::load_npy<float>(f4) == std::vector<float>{1.5f, -2.f, 0.f});
  CHECK(sidco::io::load_npy<double>(f4) == std::vector<double>{1.5, -2, 0});
  const std::vector<double> d = {0.25, 1e300};
  const auto f8 = write_npy("f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                            std::string(reinterpret_cast<const char*>(d.data()), 16), 2);
  CHECK(sidco::io::load_npy<double>(f8) == d);
}

TEST_CASE("npy: float64 that float32 cannot hold is refused, naming the value and index") {
  auto f8 = [](const std::string& name, const std::vector<double>& d) {
    return write_npy(name, "{'descr': '<f8', 'fortran_order': False, 'shape': (" + std::to_string(d.size()) + ",), }",
                     std::string(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(double)));
  };
  // Before: 1e300 became inf (reported later as a non-finite gradient), 1e-300 became 0.
  CHECK(load_error(f8("huge.npy", {0.5, 1e300})) ==
        "sidco: npy file '" + (std::filesystem::temp_directory_path() / "sidco_npy_huge.npy").string() +
            "': value 1e+300 at index 1 overflows float32; read the file as float64 (load_npy<double>)");
  CHECK(load_error(f8("tiny.npy", {0.5, 0, -1e-300})).find("value -1e-300 at index 2 underflows to 0 in float32") !=
        std::string::npos);
  // Rounding that keeps a finite non-zero is conversion, not loss: denormals and 0 are fine.
  CHECK(sidco::io::load_npy<float>(f8("ok.npy", {1e-40, 0, -0.1, 3e38})) ==
        std::vector<float>{float(1e-40), 0.f, float(-0.1), float(3e38)});
  CHECK(sidco::io::load_npy<double>(f8("huge_as_double.npy", {1e300, 1e-300})) == std::vector<double>{1e300, 1e-300});
}

TEST_CASE("npy: the bundled real gradients load with the sizes the manifest gives") {
  CHECK(sidco::test::load_gradient("ffn_it10.npy").size() == 301066);
  CHECK(sidco::test::load_gradient("cnn_it200.npy").size() == 900490);
  CHECK(sidco::test::load_gradient("lstm_it10.npy").size() == 3689196);
}

TEST_CASE("npy: missing or malformed files are clear errors") {
  CHECK(load_error("/nonexistent/x.npy").find("cannot open") != std::string::npos);
  const auto directory = std::filesystem::temp_directory_path().string();
  CHECK(load_error(directory) == "sidco: npy file '" + directory + "': is a directory, not a .npy file");
  const auto text = (std::filesystem::temp_directory_path() / "sidco_npy_text.npy").string();
  std::ofstream(text) << "hello, this is not numpy";
  CHECK(load_error(text).find("bad magic") != std::string::npos);
  CHECK(load_error(write_npy("i4.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }",
                          "abcd"))
            .find("dtype '<i4'") != std::string::npos);
  CHECK(load_error(write_npy("2d.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }",
                          floats({1, 2, 3, 4})))
            .find("is not 1-D") != std::string::npos);
  CHECK(load_error(write_npy("short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }",
                          floats({1, 2})))
            .find("truncated data (expected 5 values, 8 bytes are present)") != std::string::npos);
  CHECK(load_error(write_npy("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
                          floats({1})))
            .find("Fortran") != std::string::npos);
}

// Files an adversary writes (and a fuzzer found): every one a sidco::error with its
// message, and never a crash, a hang or a huge allocation.
TEST_CASE("npy: hostile headers are refused, each with its reason") {
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  const struct {
    const char* name;
    std::string header;
    std::string payload;
    const char* expected;
  } cases[] = {
      {"claims 1e9", f4 + "(1000000000,), }", floats({1, 2}), "truncated data (expected 1000000000 values, 8 bytes"},
      {"claims 1e15", f4 + "(1000000000000000,), }", "", "truncated data (expected 1000000000000000 values"},
      {"claims 2^62", f4 + "(4611686018427387904,), }", "", "truncated data (expected 4611686018427387904 values"},
      {"claims 1e30", f4 + "(1000000000000000000000000000000,), }", "", "does not fit in 64 bits"},
      {"negative", f4 + "(-10,), }", floats({1}), "has a negative dimension"},
      {"no tuple", f4 + "(10), }", floats({1}), "is not a tuple (1-D is written (N,))"},
      {"empty tuple", f4 + "(), }", "", "is not 1-D"},
      {"two dimensions", f4 + "(2, 2), }", floats({1, 2, 3, 4}), "is not 1-D"},
      {"duplicate key", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats({1}),
       "has the key 'descr' twice"},
      {"unbalanced", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), ", floats({1}), "expected a key"},
      {"unbalanced shape", f4 + "(1,, }", floats({1}), "is not a tuple of integers"},
      {"trailing text", f4 + "(1,), } x", floats({1}), "unexpected text after the dict"},
      {"unknown key", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", floats({1}), "unknown key 'x'"},
      {"missing shape", "{'descr': '<f4', 'fortran_order': False}", floats({1}), "has no 'shape' field"},
      {"not a bool", "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", floats({1}), "is not True or False"},
      {"extra bytes", f4 + "(1,), }", floats({1, 2}), "the header claims 1 values but 8 bytes follow it"},
      {"big-endian", "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", floats({1}), "dtype '>f4'"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const auto path = write_npy(std::string(c.name) + ".npy", c.header, c.payload);
    largest_allocation = 0;  // writing the file is not the reader's cost
    const auto got = load_error(path);
    INFO(got);
    CHECK(got.find(c.expected) != std::string::npos);
    CHECK(got.find(path) != std::string::npos);  // names the file
    CHECK(largest_allocation.load() <= std::filesystem::file_size(path) + message_allowance);
  }
  CHECK(sidco::io::load_npy<float>(write_npy("zero.npy", f4 + "(0,), }", "")).empty());
}

TEST_CASE("npy: a header length of 0xFFFFFFF0 or one longer than the file is refused unread") {
  const auto path = (std::filesystem::temp_directory_path() / "sidco_npy_long_header.npy").string();
  {
    std::ofstream out(path, std::ios::binary);
    out.write("\x93NUMPY\x02\x00\xf0\xff\xff\xff{}", 14);
  }
  largest_allocation = 0;
  CHECK_THROWS_WITH_AS(sidco::io::load_npy<float>(path), doctest::Contains("exceeds the 1048576-byte limit"),
                       sidco::error);
  CHECK(largest_allocation.load() <= message_allowance);
  {
    std::ofstream out(path, std::ios::binary);
    out.write("\x93NUMPY\x02\x00\x00\x10\x00\x00{}", 14);  // 4 KiB claimed, 2 bytes present
  }
  CHECK_THROWS_WITH_AS(sidco::io::load_npy<float>(path), doctest::Contains("truncated header"), sidco::error);
}

TEST_CASE("npy: a file claiming 10^12 values allocates nothing beyond its own size") {
  const auto path = write_npy("claims_1e12.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }",
                              std::string(64, '\0'));
  largest_allocation = 0;  // writing the file is not the reader's cost
  CHECK_THROWS_AS(sidco::io::load_npy<double>(path), sidco::error);
  CHECK(largest_allocation.load() <= message_allowance);
}
