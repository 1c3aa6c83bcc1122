// Shared pieces of the benchmark suites: gradient-like data, the streaming-read bound,
// and a reporter that prints each benchmark's ratio to the read and to a baseline.
#pragma once

#include <benchmark/benchmark.h>
#include <gradcomp/detail/core/random.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace bench {

/// Heavy-tailed, gradient-like values: a normal times a log-normal scale (sigma 1.5),
/// from a counter-based generator so that every run and thread count sees the same data.
/// Cached per size: generating 10^8 values takes seconds.
inline const std::vector<float>& gradient(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<std::vector<float>>> cache;
  auto& slot = cache[n];
  if (!slot) {
    slot = std::make_unique<std::vector<float>>(n);
    float* g = slot->data();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
      const auto u = static_cast<std::uint64_t>(i);
      const double u1 = 1.0 - gradcomp::detail::random_unit(7, 0, u);
      const double u2 = gradcomp::detail::random_unit(7, 1, u);
      const double u3 = 1.0 - gradcomp::detail::random_unit(7, 2, u);
      const double u4 = gradcomp::detail::random_unit(7, 3, u);
      const double z1 = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      const double z2 = std::sqrt(-2.0 * std::log(u3)) * std::cos(6.283185307179586 * u4);
      g[i] = static_cast<float>(1e-3 * z1 * std::exp(1.5 * z2));
    }
  }
  return *slot;
}

/// The memory bound: one streaming read of the array with all threads, summed so the
/// compiler cannot drop it. The sum runs in eight independent 4-float vectors (GCC and
/// Clang vector extensions, any target): with a single accumulator the loop is bound by
/// the latency of the add, not by memory (on the 2-core VM of docs/benchmarks.md that
/// read took 1.35x as long), and every ratio against it would flatter the code measured.
inline float streaming_read(const std::vector<float>& x) {
  using vec = float __attribute__((vector_size(16)));
  constexpr std::int64_t vecs = 8;
  constexpr std::int64_t block = vecs * 4;
  const float* p = x.data();
  const auto n = static_cast<std::int64_t>(x.size());
  const std::int64_t blocks = n / block;
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    vec acc[vecs] = {};
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      for (std::int64_t v = 0; v < vecs; ++v) {
        vec x4;
        std::memcpy(&x4, p + b * block + v * 4, sizeof x4);
        acc[v] += x4;
      }
    }
    for (const vec& a : acc) total += (a[0] + a[1]) + (a[2] + a[3]);
  }
  for (std::int64_t i = blocks * block; i < n; ++i) total += p[i];
  return total;
}

inline void BM_read(benchmark::State& state) {
  const auto& g = gradient(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(streaming_read(g));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) * 4);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

/// Console output as usual, then a table: every benchmark's time over the read's time
/// at the same N, and the baseline's time over its own (speed-up over the baseline).
/// Benchmarks are matched by their arguments: "family/N/..." with the read as "read/N".
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  explicit ratio_reporter(std::string baseline) : baseline_(std::move(baseline)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      times_.push_back({r.benchmark_name(), r.GetAdjustedRealTime()});
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::map<std::string, double> read, base;
    for (const auto& [name, t] : times_) {
      const auto [family, args] = split(name);
      if (family == "read") read[n_of(args)] = t;
      if (family == baseline_) base[args] = t;
    }
    auto& out = GetOutputStream();
    out << "\nratios (same run): time / streaming read of N floats, and " << baseline_ << " time / time\n";
    out << "benchmark                                        x read   speed-up vs " << baseline_ << "\n";
    for (const auto& [name, t] : times_) {
      const auto [family, args] = split(name);
      if (family == "read") continue;
      char line[256];
      const auto r = read.find(n_of(args));
      const auto b = base.find(args);
      std::snprintf(line, sizeof line, "%-46s %8.2f %12.2f\n", name.c_str(), r == read.end() ? NAN : t / r->second,
                    b == base.end() ? NAN : b->second / t);
      out << line;
    }
  }

 private:
  // "family/arg/arg/min_time:0.3/real_time" -> {"family", "arg/arg"}: options dropped.
  static std::pair<std::string, std::string> split(const std::string& name) {
    const auto slash = name.find('/');
    std::string args;
    std::size_t at = slash;
    while (at != std::string::npos) {
      const auto next = name.find('/', at + 1);
      const std::string part = name.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
      const bool option = part == "real_time" || part.rfind("min_time:", 0) == 0 || part.rfind("threads:", 0) == 0 ||
                          part.rfind("iterations:", 0) == 0;
      if (!option) args += (args.empty() ? "" : "/") + part;
      at = next;
    }
    return {name.substr(0, slash), args};
  }
  static std::string n_of(const std::string& args) { return args.substr(0, args.find('/')); }

  std::string baseline_;
  std::vector<std::pair<std::string, double>> times_;
};

/// The usual benchmark main, with the ratio table.
inline int run_main(int argc, char** argv, const std::string& baseline) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ratio_reporter reporter(baseline);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace bench
