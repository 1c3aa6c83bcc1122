// gradcomp: the command-line tool. `gradcomp eval` runs every available compressor over
// a gradient stream and reports what each achieves.
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "methods.hpp"
#include "npy.hpp"
#include "synthetic.hpp"

namespace {

constexpr const char* usage = R"(usage: gradcomp eval [FILE.npy] [options]
       gradcomp methods
       gradcomp help [eval]
       gradcomp --version

eval: compress a gradient stream with every method and print, per method, the density
achieved, bytes per step, compression ratio, relative error of the aggregate against
the dense sum after all steps, and compression throughput.

options:
  FILE.npy, --input FILE
                   float32 .npy of shape [steps, n] or [n] (default: an embedded
                   synthetic heavy-tailed stream). Convert other dtypes with
                   np.save(path, np.asarray(a, np.float32)).
  --steps S        steps of the synthetic stream (default 20); with a file, its first S
  --n N            elements of the synthetic stream (default 1048576)
  --density D      target density for every method, in (0, 1] (default 0.001)
  --methods A,B    only these methods (default: all; see `gradcomp methods`)
  --dump DIR       write DIR/<method>/step_<t>_indices.npy and _values.npy
  -h, --help       this text
)";

struct options {
  std::string input;
  std::size_t steps = 20;
  bool steps_given = false;
  std::size_t n = std::size_t{1} << 20;
  bool n_given = false;
  double density = 1e-3;
  std::vector<std::string> methods;
  std::string dump;
};

[[noreturn]] void bad_usage(const std::string& why) {
  std::cerr << "gradcomp: " << why << "\n(gradcomp help eval lists the options)\n";
  std::exit(2);
}

// A whole positive integer (no sign, no fraction, no trailing text).
std::size_t parse_count(const std::string& flag, const std::string& text) {
  std::size_t value = 0;
  std::size_t used = 0;
  try {
    if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))) value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value == 0)
    bad_usage(flag + " expects a positive integer, got '" + text + "'");
  return value;
}

double parse_density(const std::string& text) {
  double value = 0.0;
  std::size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) bad_usage("--density expects a number, got '" + text + "'");
  if (!(value > 0.0 && value <= 1.0)) bad_usage("--density must be in (0, 1], got " + text);
  return value;
}

options parse(int argc, char** argv) {
  options o;
  const auto known = cli::methods();
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_usage(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (flag == "--input") {
      o.input = value();
    } else if (flag == "--steps") {
      o.steps = parse_count(flag, value());
      o.steps_given = true;
    } else if (flag == "--n") {
      o.n = parse_count(flag, value());
      o.n_given = true;
    } else if (flag == "--density") {
      o.density = parse_density(value());
    } else if (flag == "--methods") {
      std::stringstream list(value());
      for (std::string m; std::getline(list, m, ',');) {
        const bool exists = std::any_of(known.begin(), known.end(), [&](const cli::method& k) { return k.name == m; });
        if (!exists) bad_usage("unknown method '" + m + "' (gradcomp methods lists them)");
        o.methods.push_back(m);
      }
      if (o.methods.empty()) bad_usage("--methods needs at least one method");
    } else if (flag == "--dump") {
      o.dump = value();
    } else if (!flag.starts_with("-") && o.input.empty()) {
      o.input = flag;  // the positional input file
    } else {
      bad_usage("unknown option " + flag);
    }
  }
  if (!o.input.empty() && o.n_given) bad_usage("--n sets the synthetic stream's size; a file has its own");
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
    if (o.steps_given) {  // the file's first S steps
      gradcomp::detail::require(o.steps <= s.steps, gradcomp::errc::invalid_argument, o.input, " holds ", s.steps,
                                " steps, --steps asks for ", o.steps);
      s.steps = o.steps;
      a.data.resize(s.steps * s.n);
    }
    s.data = std::move(a.data);
    for (std::size_t j = 0; j < s.data.size(); ++j) {
      gradcomp::detail::require(std::isfinite(s.data[j]), gradcomp::errc::non_finite, o.input, ": element [", j / s.n,
                                ", ", j % s.n, "] = ", s.data[j], " is not finite");
    }
    s.source = o.input;
    return s;
  }
  s.steps = o.steps;
  s.n = o.n;
  gradcomp::detail::require(o.n <= gradcomp::message_header::max_n, gradcomp::errc::invalid_argument,
                            "--n must be at most ", gradcomp::message_header::max_n, ", got ", o.n);
  s.data.reserve(o.steps * o.n);
  for (std::size_t t = 0; t < o.steps; ++t) {
    const auto g = synthetic::gradient(o.n, t);
    s.data.insert(s.data.end(), g.begin(), g.end());
  }
  s.source = "synthetic heavy-tailed stream (Student-t 3, log-normal scales)";
  return s;
}

// Below this many steps, error feedback has not had the time to pay off.
constexpr std::size_t few_steps = 10;

int eval(const options& o) {
  const stream s = load(o);  // every check of the input before any output
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

  // Progress on stderr, only where someone watches it.
  const bool progress = isatty(STDERR_FILENO) != 0 && s.steps * s.n >= (std::size_t{1} << 24);
  std::printf("gradcomp %d.%d.%d eval: %zu steps x %zu elements, target density %g\n", GRADCOMP_VERSION_MAJOR,
              GRADCOMP_VERSION_MINOR, GRADCOMP_VERSION_PATCH, s.steps, s.n, o.density);
  std::printf("input: %s\n\n", s.source.c_str());
  std::printf("%-13s %10s %14s %10s %12s %14s\n", "method", "density", "bytes/step", "ratio", "rel.error", "Melem/s");

  for (const auto& m : cli::methods()) {
    if (!o.methods.empty() && std::find(o.methods.begin(), o.methods.end(), m.name) == o.methods.end()) continue;
    const auto [dense_sum, dense_norm] = dense_reference(m.momentum);
    auto r = m.make(s.n, o.density, s.step(0));
    std::vector<std::byte> buf(r.max_message_bytes);
    std::vector<float> aggregate(s.n, 0.0f);
    std::size_t total_count = 0;
    std::size_t total_bytes = 0;
    double seconds = 0.0;
    const std::filesystem::path dir = o.dump.empty() ? std::filesystem::path{} : std::filesystem::path(o.dump) / m.name;
    if (!o.dump.empty()) std::filesystem::create_directories(dir);
    for (std::size_t t = 0; t < s.steps; ++t) {
      if (progress) std::fprintf(stderr, "\r%-13s step %zu/%zu ", m.name.c_str(), t + 1, s.steps);
      const auto start = std::chrono::steady_clock::now();
      const gradcomp::message msg = r.compress(s.step(t), buf);
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
  if (progress) std::fprintf(stderr, "\r%40s\r", "");
  std::printf(
      "\nrel.error = |sum of decoded messages - dense aggregate| / |dense aggregate| after all steps;\n"
      "the dense aggregate is the sum of gradients, or of momentum SGD's updates for dgc.\n");
  if (s.steps < few_steps) {
    std::printf(
        "note: only %zu step%s. Error feedback sends what it holds back in later steps, so the rel.error\n"
        "of the *_ef methods, dgc and adacomp falls as steps accumulate; run %zu or more steps to see it\n"
        "(--steps, or a file with more rows).\n",
        s.steps, s.steps == 1 ? "" : "s", few_steps);
  }
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
    if (command == "--help" || command == "-h" || command == "help") {
      if (argc > 3 || (argc == 3 && std::string(argv[2]) != "eval")) bad_usage("help takes at most the command 'eval'");
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
