#!/usr/bin/env bash
# Device mistakes that must not compile, each with the sentence its error must contain: host
# memory (a std::span or vector) given as the gradient of a compressor, or of a segmented,
# on backend::cuda; a host sparse_vector as its output. Arguments: nvcc, then its flags (include paths, -std=c++20).
set -uo pipefail
compiler=$1
shift
source "$(dirname "$0")/../expect_compile_error.sh"
prelude='#include <sidco/backend/cuda.cuh>
#include <sidco/sidco.hpp>
#include <vector>
using namespace sidco;
using on_device = presets::sidco_e<backend::cuda>;'

printf '%s\n' "$prelude" > "$tmp/prelude.cu"
shared=$(shared_key "$tmp/prelude.cu" "$compiler" "$@")

compile() {  # name, body, flags: the exit status of compiling the prelude and body
  local name=$1 body=$2
  shift 2
  printf '%s\n%s\n' "$prelude" "$body" > "$tmp/$name.cu"
  remembered "$name" "$shared" "$tmp/$name.cu" "$compiler" "$@" -c "$tmp/$name.cu" -o "$tmp/$name.o"
}

# The control: a device view compiles, through the same harness.
expect_control '
int main() {
  memory::device_buffer<float> g(10);
  sparse_vector<float, std::uint32_t, memory::device> out;
  on_device c;
  segmented<on_device> s({{0, 4}, {4, 6}});
  c.compress<float>(g.view(), 0.1, out);
  s.compress<float>(memory::device::view<const float>(g.data(), g.size()), 0.1, out);
}' "$@"
echo "ok   control: a device view compiles"

sentence='the gradient is host memory (a std::span or vector)'
expect_error host_span_to_device_compressor "$sentence" '
int main() {
  std::vector<float> g(10);
  sparse_vector<float, std::uint32_t, memory::device> out;
  on_device c;
  c.compress<float>(std::span<const float>(g), 0.1, out);
}' "$@"

expect_error host_vector_to_device_segmented "$sentence" '
int main() {
  std::vector<float> g(10);
  sparse_vector<float, std::uint32_t, memory::device> out;
  feedback::residual<float, memory::device> residual(10);
  segmented<on_device> s({{0, 4}, {4, 6}});
  s.compress<float>(g, 0.1, out, residual);
}' "$@"

expect_short_error host_output_from_device_compressor "the output sparse_vector is in another memory space" '
int main() {
  memory::device_buffer<float> g(10);
  sparse_vector<float> out;
  on_device c;
  c.compress(g.view(), 0.1, out);
}' "$@"

expect_short_error host_vector_deduced "$sentence" '
int main() {
  std::vector<float> g(10);
  sparse_vector<float, std::uint32_t, memory::device> out;
  on_device c;
  c.compress(g, 0.1, out);
}' "$@"

say_remembered
exit $failed
