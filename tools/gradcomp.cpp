// gradcomp: the command-line tool. `gradcomp eval` runs every available compressor over
// a gradient stream and reports what each achieves.
#include <gradcomp/gradcomp.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "methods.hpp"
#include "npy.hpp"
#include "synthetic.hpp"

namespace {

constexpr const char* usage = R"(usage: gradcomp eval [options]
       gradcomp methods
       gradcomp --version

eval: compress a gradient stream with every method and print, per method, the density
achieved, bytes per step, compression ratio, relative error of the aggregate against
the dense sum after all steps, and compression throughput.

options:
  --input FILE     float32 .npy of shape [steps, n] or [n] (default: an embedded
                   synthetic heavy-tailed stream)
  --steps S        steps of the synthetic stream (default 20)
  --n N            elements of the synthetic stream (default 1048576)
  --density D      target density for every method (default 0.001)
  --methods A,B    only these methods (default: all; see `gradcomp methods`)
  --dump DIR       write DIR/<method>/step_<t>_indices.npy and _values.npy
)";

struct options {
  std::string input;
  std::size_t steps = 20;
  std::size_t n = std::size_t{1} << 20;
  double density = 1e-3;
  std::vector<std::string> methods;
  std::string dump;
};

[[noreturn]] void bad_usage(const std::string& why) {
  std::cerr << "gradcomp: " << why << "\n\n" << usage;
  std::exit(2);
}

template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  std::istringstream in(text);
  T value{};
  in >> value;
  if (!in || !in.eof()) bad_usage(flag + " expects a number, got '" + text + "'");
  return value;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_usage(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--input") {
      o.input = value();
    } else if (flag == "--steps") {
      o.steps = parse_number<std::size_t>(flag, value());
    } else if (flag == "--n") {
      o.n = parse_number<std::size_t>(flag, value());
    } else if (flag == "--density") {
      o.density = parse_number<double>(flag, value());
    } else if (flag == "--methods") {
      std::stringstream list(value());
      for (std::string m; std::getline(list, m, ',');) o.methods.push_back(m);
    } else if (flag == "--dump") {
      o.dump = value();
    } else {
      bad_usage("unknown option " + flag);
    }
  }
  if (o.steps == 0) bad_usage("--steps must be at least 1");
  if (o.n == 0) bad_usage("--n must be at least 1");
  return o;
}

// The gradient stream: steps x n floats, from a file or generated.
struct stream {
  std::size_t steps = 0;
  std::size_t n = 0;
  std::vector<float> data;
  std::string source;
  [[nodiscard]] std::span<const float> step(std::size_t t) const { return std::span(data).subspan(t * n, n); }
};

stream load(const options& o) {
  stream s;
  if (!o.input.empty()) {
    npy::array a = npy::read_f32(o.input);
    s.steps = a.shape.size() == 2 ? a.shape[0] : 1;
    s.n = a.shape.back();
    s.data = std::move(a.data);
    s.source = o.input;
    return s;
  }
  s.steps = o.steps;
  s.n = o.n;
  s.data.reserve(o.steps * o.n);
  for (std::size_t t = 0; t < o.steps; ++t) {
    const auto g = synthetic::gradient(o.n, t);
    s.data.insert(s.data.end(), g.begin(), g.end());
  }
  s.source = "synthetic heavy-tailed stream (Student-t 3, log-normal scales)";
  return s;
}

int eval(const options& o) {
  const stream s = load(o);
  // The dense aggregate a method should approach: sum of g_t, or for methods that fold
  // momentum into their messages, dense momentum SGD's sum of u_t.
  auto dense_reference = [&](float momentum) {
    std::vector<double> sum(s.n, 0.0), u(s.n, 0.0);
    for (std::size_t t = 0; t < s.steps; ++t) {
      const auto g = s.step(t);
      for (std::size_t i = 0; i < s.n; ++i) {
        u[i] = momentum * u[i] + g[i];
        sum[i] += u[i];
      }
    }
    double norm = 0.0;
    for (const double v : sum) norm += v * v;
    return std::pair{sum, std::sqrt(norm)};
  };

  std::printf("gradcomp %d.%d.%d eval: %zu steps x %zu elements, target density %g\n", GRADCOMP_VERSION_MAJOR,
              GRADCOMP_VERSION_MINOR, GRADCOMP_VERSION_PATCH, s.steps, s.n, o.density);
  std::printf("input: %s\n\n", s.source.c_str());
  std::printf("%-13s %10s %14s %10s %12s %14s\n", "method", "density", "bytes/step", "ratio", "rel.error",
              "Melem/s");

  for (const auto& m : cli::methods()) {
    if (!o.methods.empty() && std::find(o.methods.begin(), o.methods.end(), m.name) == o.methods.end()) continue;
    const auto [dense_sum, dense_norm] = dense_reference(m.momentum);
    auto r = m.make(s.n, o.density, s.step(0));
    std::vector<std::byte> buf(r->max_message_bytes());
    std::vector<float> aggregate(s.n, 0.0f);
    std::size_t total_count = 0;
    std::size_t total_bytes = 0;
    double seconds = 0.0;
    const std::filesystem::path dir = o.dump.empty() ? std::filesystem::path{} : std::filesystem::path(o.dump) / m.name;
    if (!o.dump.empty()) std::filesystem::create_directories(dir);
    for (std::size_t t = 0; t < s.steps; ++t) {
      const auto start = std::chrono::steady_clock::now();
      const gradcomp::message msg = r->compress(s.step(t), buf);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      total_count += msg.count();
      total_bytes += msg.bytes().size();
      gradcomp::accumulate(gradcomp::backend::host{}, msg.bytes(), aggregate, 1.0f);
      if (!o.dump.empty()) {
        const auto sv = gradcomp::decode(msg.bytes());
        char stem[32];
        std::snprintf(stem, sizeof stem, "step_%04zu", t);
        npy::write((dir / (std::string(stem) + "_indices.npy")).string(), sv.indices);
        npy::write((dir / (std::string(stem) + "_values.npy")).string(), sv.values);
      }
    }
    double err = 0.0;
    for (std::size_t i = 0; i < s.n; ++i) {
      const double d = static_cast<double>(aggregate[i]) - dense_sum[i];
      err += d * d;
    }
    const double steps = static_cast<double>(s.steps);
    const double bytes_per_step = static_cast<double>(total_bytes) / steps;
    std::printf("%-13s %10.6f %14.0f %10.1f %12.4f %14.1f\n", m.name.c_str(),
                static_cast<double>(total_count) / (steps * static_cast<double>(s.n)), bytes_per_step,
                4.0 * static_cast<double>(s.n) / bytes_per_step, dense_norm > 0 ? std::sqrt(err) / dense_norm : 0.0,
                steps * static_cast<double>(s.n) / seconds / 1e6);
  }
  std::printf("\nrel.error = |sum of decoded messages - dense aggregate| / |dense aggregate| after all steps;\n"
              "the dense aggregate is the sum of gradients, or of momentum SGD's updates for dgc.\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) bad_usage("no command");
  const std::string command = argv[1];
  try {
    if (command == "eval") return eval(parse(argc, argv));
    if (command == "methods") {
      for (const auto& m : cli::methods()) std::printf("%-13s %s\n", m.name.c_str(), m.description.c_str());
      return 0;
    }
    if (command == "--version") {
      std::printf("gradcomp %d.%d.%d\n", GRADCOMP_VERSION_MAJOR, GRADCOMP_VERSION_MINOR, GRADCOMP_VERSION_PATCH);
      return 0;
    }
    if (command == "--help" || command == "-h") {
      std::cout << usage;
      return 0;
    }
  } catch (const gradcomp::error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gradcomp: " << e.what() << "\n";
    return 1;
  }
  bad_usage("unknown command " + command);
}
