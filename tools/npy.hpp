// Minimal reading and writing of NumPy .npy files (format versions 1-3), little-endian
// float32 and uint32 arrays in C order: what `gradcomp eval` consumes and dumps.
#pragma once

#include <gradcomp/error.hpp>

#include <cerrno>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace npy {

struct array {
  std::vector<std::size_t> shape;
  std::vector<float> data;
};

inline std::string field(const std::string& header, const std::string& key) {
  const auto at = header.find("'" + key + "'");
  if (at == std::string::npos) return {};
  const auto colon = header.find(':', at);
  if (colon == std::string::npos) return {};
  const auto value = header.find_first_not_of(' ', colon + 1);
  return value == std::string::npos ? std::string{} : header.substr(value);
}

/// Reads a float32 array of one or two dimensions.
/// \throws gradcomp::error naming the file and what is wrong with it.
inline array read_f32(const std::string& path) {
  using gradcomp::errc;
  using gradcomp::detail::require;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int reason = errno;  // the OS's reason (no such file, permission denied, ...)
    gradcomp::detail::fail(errc::io, path, ": cannot open for reading: ", std::strerror(reason));
  }
  char magic[8] = {};
  in.read(magic, 8);
  require(in.gcount() == 8 && std::memcmp(magic, "\x93NUMPY", 6) == 0, errc::io, path, ": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  require(major >= 1 && major <= 3, errc::io, path, ": unsupported .npy version ", major);
  std::uint32_t header_len = 0;
  unsigned char len_bytes[4] = {};
  in.read(reinterpret_cast<char*>(len_bytes), major == 1 ? 2 : 4);
  header_len = len_bytes[0] | (len_bytes[1] << 8) | (static_cast<std::uint32_t>(len_bytes[2]) << 16) |
               (static_cast<std::uint32_t>(len_bytes[3]) << 24);
  require(static_cast<bool>(in) && header_len < (1u << 20), errc::io, path, ": truncated or oversized header");
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  require(static_cast<bool>(in), errc::io, path, ": truncated header");

  const std::string descr = field(header, "descr");
  require(descr.find("'<f4'") != std::string::npos || descr.find("'|f4'") != std::string::npos, errc::io, path,
          ": dtype ", descr.substr(0, descr.find(',')), " is not little-endian float32 ('<f4')",
          descr.find("f8") != std::string::npos || descr.find("f2") != std::string::npos
              ? "; convert it with np.save(path, np.asarray(a, np.float32))"
              : "");
  require(field(header, "fortran_order").find("False") != std::string::npos, errc::io, path,
          ": Fortran-ordered arrays are not supported");
  const std::string shape_text = field(header, "shape");
  const auto open = shape_text.find('(');
  const auto close = shape_text.find(')');
  require(open != std::string::npos && close != std::string::npos, errc::io, path, ": no shape in header");
  array out;
  std::size_t pos = open + 1;
  while (pos < close) {
    while (pos < close && (shape_text[pos] == ' ' || shape_text[pos] == ',')) ++pos;
    if (pos >= close) break;
    std::size_t used = 0;
    const unsigned long long dim = std::stoull(shape_text.substr(pos, close - pos), &used);
    out.shape.push_back(static_cast<std::size_t>(dim));
    pos += used;
  }
  require(out.shape.size() == 1 || out.shape.size() == 2, errc::io, path, ": shape has ", out.shape.size(),
          " dimensions, expected [n] or [steps, n]");
  std::size_t total = 1;
  for (const auto d : out.shape) {
    require(d > 0 && total <= (std::size_t{1} << 40) / d, errc::io, path, ": shape dimension ", d, " is unusable");
    total *= d;
  }
  out.data.resize(total);
  in.read(reinterpret_cast<char*>(out.data.data()), static_cast<std::streamsize>(total * sizeof(float)));
  require(in.gcount() == static_cast<std::streamsize>(total * sizeof(float)), errc::io, path, ": holds ",
          in.gcount() / 4, " floats, the shape needs ", total);
  return out;
}

/// Writes a one-dimensional array; T is float or std::uint32_t.
template <class T>
void write(const std::string& path, const std::vector<T>& values) {
  static_assert(sizeof(T) == 4);
  const char* descr = std::is_same_v<T, float> ? "<f4" : "<u4";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" +
                       std::to_string(values.size()) + ",), }";
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  gradcomp::detail::require(static_cast<bool>(out), gradcomp::errc::io, path, ": cannot open for writing");
  out.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xFF), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out << header;
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
  gradcomp::detail::require(static_cast<bool>(out), gradcomp::errc::io, path, ": write failed");
}

}  // namespace npy
