// A Kokkos application compresses a gradient held in a Kokkos::View with top-k and
// error feedback, then accumulates the message into another View, as the receiving
// side of a data-parallel step would.
#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/gradcomp.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  const std::size_t n = 1 << 20;
  using space = Kokkos::DefaultExecutionSpace;

  Kokkos::View<float*> grad("grad", n);
  Kokkos::parallel_for(
      "fill", n, KOKKOS_LAMBDA(const std::size_t i) { grad(i) = static_cast<float>((i * 7919) % 1000) - 499.5f; });

  const gradcomp::backend::kokkos<space> backend{};
  gradcomp::compressor c{backend, n, gradcomp::select::exact_topk{.density = 1e-3},
                         gradcomp::correct::error_feedback{}};
  std::vector<std::byte> buf(c.max_message_bytes());  // messages live in host memory
  const gradcomp::message m = c.compress(gradcomp::as_span(grad), buf);

  Kokkos::View<float*> dense("dense", n);
  gradcomp::accumulate(backend, m.bytes(), gradcomp::as_span(dense), 1.0f);
  float total = 0.0f;
  Kokkos::parallel_reduce(
      "sum", n, KOKKOS_LAMBDA(const std::size_t i, float& s) { s += dense(i) < 0 ? -dense(i) : dense(i); }, total);

  std::printf("kokkos (%s): sent %zu of %zu entries in %zu bytes (%.0fx smaller); sum |dense| = %.1f\n", space::name(),
              m.count(), n, m.bytes().size(), m.ratio(), static_cast<double>(total));
  // Every sent entry has |g| = 499.5: the sum must be exactly count * 499.5.
  return total == static_cast<float>(m.count()) * 499.5f ? 0 : 1;
}
