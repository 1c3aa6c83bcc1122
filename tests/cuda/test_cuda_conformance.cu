// The conformance grid (support/conformance.hpp) on backend::cuda: the same selector x
// corrector x value coding list as on the host and Kokkos, against the same reference.
// Needs a GPU (exit 77 without one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/gradcomp.hpp>

#include <span>
#include <string>
#include <vector>

#include "../support/conformance.hpp"

namespace {

// Device memory: the test's vectors are copied in, the messages copied out.
struct target {
  static std::vector<gradcomp::backend::cuda> backends() { return {gradcomp::backend::cuda{}}; }
  static std::string name_of(const gradcomp::backend::cuda&) { return "cuda"; }
  template <class T>
  static thrust::device_vector<T> copy_of(const std::vector<T>& v) {
    return device::copy_of(v);
  }
  template <class T>
  static std::span<T> span(thrust::device_vector<T>& v) {
    return device::span_of(v);
  }
  static std::vector<std::byte> host_copy(std::span<const std::byte> bytes) { return device::host_copy(bytes); }
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("cuda: every selector x corrector x value coding matches its reference", Selector, grid) {
  conformance::run_grid_for_every_corrector<target, Selector>();
}
TEST_CASE_TEMPLATE_INVOKE(grid, GRADCOMP_CONFORMANCE_SELECTORS);

int main(int argc, char** argv) { return device::run_tests(argc, argv); }
