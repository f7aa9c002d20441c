#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <sidco/io/npy.hpp>

#include "support.hpp"

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

TEST_CASE("npy: the bundled real gradients load with the sizes the manifest gives") {
  CHECK(sidco::test::load_gradient("ffn_it10.npy").size() == 301066);
  CHECK(sidco::test::load_gradient("cnn_it200.npy").size() == 900490);
  CHECK(sidco::test::load_gradient("lstm_it10.npy").size() == 3689196);
}

TEST_CASE("npy: missing or malformed files are clear errors") {
  auto message = [](const std::string& path) -> std::string {
    try {
      sidco::io::load_npy<float>(path);
    } catch (const sidco::error& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK(message("/nonexistent/x.npy").find("cannot open") != std::string::npos);
  const auto text = (std::filesystem::temp_directory_path() / "sidco_npy_text.npy").string();
  std::ofstream(text) << "hello, this is not numpy";
  CHECK(message(text).find("bad magic") != std::string::npos);
  CHECK(message(write_npy("i4.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }",
                          "abcd"))
            .find("dtype '<i4'") != std::string::npos);
  CHECK(message(write_npy("2d.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }",
                          floats({1, 2, 3, 4})))
            .find("is not 1-D") != std::string::npos);
  CHECK(message(write_npy("short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }",
                          floats({1, 2})))
            .find("truncated data (expected 5 values)") != std::string::npos);
  CHECK(message(write_npy("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
                          floats({1})))
            .find("Fortran") != std::string::npos);
}
