// gradcomp_py::options: keyword arguments read by name, with errors that name them.
#include "api.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <string>

namespace gradcomp_py {

namespace {
const char* type_of(const options::value& v) {
  switch (v.index()) {
    case 0:
      return "bool";
    case 1:
      return "int";
    case 2:
      return "float";
    default:
      return "str";
  }
}
}  // namespace

const options::value* options::take(const std::string& name) {
  const auto it = values_.find(name);
  if (it == values_.end()) return nullptr;
  taken_.insert(name);
  return &it->second;
}

double options::number(const std::string& name, double fallback) {
  const value* v = take(name);
  if (v == nullptr) return fallback;
  if (const auto* d = std::get_if<double>(v)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(v)) return static_cast<double>(*i);
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, "option ", name, " must be a number, got a ", type_of(*v));
}

std::int64_t options::integer(const std::string& name, std::int64_t fallback) {
  const value* v = take(name);
  if (v == nullptr) return fallback;
  if (const auto* i = std::get_if<std::int64_t>(v)) {
    gradcomp::detail::require(*i >= std::numeric_limits<int>::min() && *i <= std::numeric_limits<int>::max(),
                              gradcomp::errc::invalid_argument, "option ", name, " = ", *i, " is out of range");
    return *i;
  }
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, "option ", name, " must be an int, got a ", type_of(*v));
}

std::size_t options::size(const std::string& name, std::size_t fallback) {
  const value* v = take(name);
  if (v == nullptr) return fallback;
  if (const auto* i = std::get_if<std::int64_t>(v)) {
    gradcomp::detail::require(*i >= 0, gradcomp::errc::invalid_argument, "option ", name, " must be >= 0, got ", *i);
    return static_cast<std::size_t>(*i);
  }
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, "option ", name, " must be an int, got a ", type_of(*v));
}

bool options::flag(const std::string& name, bool fallback) {
  const value* v = take(name);
  if (v == nullptr) return fallback;
  if (const auto* b = std::get_if<bool>(v)) return *b;
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, "option ", name, " must be a bool, got a ", type_of(*v));
}

std::string options::text(const std::string& name, const std::string& fallback) {
  const value* v = take(name);
  if (v == nullptr) return fallback;
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, "option ", name, " must be a str, got a ", type_of(*v));
}

std::uint64_t options::seed(const std::string& role, std::uint64_t fallback) {
  const std::string qualified = role + ".seed";
  const std::string name = has(qualified) || taken_.count("seed") != 0 ? qualified : "seed";
  return size(name, fallback);  // a seed is read like a size: a non-negative int
}

gradcomp::index_coding options::index_coding(const std::string& name, gradcomp::index_coding fallback) {
  if (!has(name)) return fallback;
  const std::string s = text(name, "");
  for (const auto c : {gradcomp::index_coding::automatic, gradcomp::index_coding::raw32,
                       gradcomp::index_coding::delta_bitpack, gradcomp::index_coding::bitmap}) {
    if (s == gradcomp::to_string(c)) return c;
  }
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, "option ", name,
                         " must be one of auto, raw32, delta_bitpack, bitmap; got '", s, "'");
}

gradcomp::value_coding options::value_coding(const std::string& name, gradcomp::value_coding fallback) {
  if (!has(name)) return fallback;
  const std::string s = text(name, "");
  std::optional<gradcomp::value_coding> found;
  std::string all;
  gradcomp::for_each_value_coding([&](gradcomp::value_coding c) {
    if (s == gradcomp::to_string(c)) found = c;
    all += (all.empty() ? "" : ", ") + std::string(gradcomp::to_string(c));
  });
  if (found) return *found;
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, "option ", name, " must be one of ", all, "; got '", s, "'");
}

void options::finish(const std::string& method) const {
  for (const auto& [name, v] : values_) {
    (void)v;
    gradcomp::detail::require(taken_.count(name) != 0, gradcomp::errc::invalid_argument, "option ", name,
                              " is not a parameter of method ", method);
  }
}

}  // namespace gradcomp_py
