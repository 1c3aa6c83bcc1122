/// \file detail/state_io.hpp
/// The checkpoint record of a compressor. Not API.
///
/// Little-endian: magic "GCST", u16 version, u16 0, u32 signature length, signature
/// (the policies' names), u64 n, u64 step, f64 density (0 when none), u32 arrays, then
/// per array u64 length and the floats, u32 count and the selector's f64 values (its
/// memory between steps), then a CRC-32C of everything before it.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/wire.hpp>
#include <gradcomp/error.hpp>

#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <string>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::uint32_t state_magic = 0x54534347u;  // "GCST"
inline constexpr std::uint16_t state_version = 1;

class state_writer {
 public:
  void header(const std::string& signature, std::uint64_t n, std::uint64_t step, double density) {
    put<std::uint32_t>(state_magic);
    put<std::uint16_t>(state_version);
    put<std::uint16_t>(0);
    put<std::uint32_t>(static_cast<std::uint32_t>(signature.size()));
    for (const char ch : signature) put<std::uint8_t>(static_cast<std::uint8_t>(ch));
    put<std::uint64_t>(n);
    put<std::uint64_t>(step);
    put<double>(density);
    arrays_at_ = bytes_.size();
    put<std::uint32_t>(0);
  }
  void array(std::span<const float> values) {
    put<std::uint64_t>(values.size());
    for (const float v : values) put<float>(v);
    store_le<std::uint32_t>(bytes_.data() + arrays_at_, ++arrays_);
  }
  void finish(std::ostream& out, std::span<const double> selector_state) {
    put<std::uint32_t>(static_cast<std::uint32_t>(selector_state.size()));
    for (const double v : selector_state) put<double>(v);
    put<std::uint32_t>(crc32c(bytes_.data(), bytes_.size()));
    out.write(reinterpret_cast<const char*>(bytes_.data()), static_cast<std::streamsize>(bytes_.size()));
    require(static_cast<bool>(out), errc::io, "save_state: writing ", bytes_.size(), " bytes to the stream failed");
  }

 private:
  template <class T>
  void put(T v) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    store_le<T>(bytes_.data() + at, v);
  }
  std::vector<std::byte> bytes_;
  std::size_t arrays_at_ = 0;
  std::uint32_t arrays_ = 0;
};

/// Reads and checks a whole record in its constructor; nothing of the caller changes
/// until it copies the arrays out.
class state_reader {
 public:
  state_reader(std::istream& in, const std::string& signature, std::uint64_t n, std::size_t arrays) : in_(in) {
    require(get<std::uint32_t>() == state_magic, errc::corrupt_message,
            "load_state: the stream does not start with a gradcomp state record");
    const auto version = get<std::uint16_t>();
    require(version == state_version, errc::corrupt_message, "load_state: state version ", version,
            ", this build reads ", state_version);
    (void)get<std::uint16_t>();
    const auto length = get<std::uint32_t>();
    require(length <= 4096, errc::corrupt_message, "load_state: signature length ", length, " is implausible");
    std::string saved(length, '\0');
    for (auto& ch : saved) ch = static_cast<char>(get<std::uint8_t>());
    require(saved == signature, errc::corrupt_message, "load_state: the state was saved by a compressor of \"",
            saved, "\", this one is \"", signature, "\"");
    const auto saved_n = get<std::uint64_t>();
    require(saved_n == n, errc::corrupt_message, "load_state: the state is for n = ", saved_n, ", this compressor has n = ",
            n);
    step_ = get<std::uint64_t>();
    density_ = get<double>();
    const auto saved_arrays = get<std::uint32_t>();
    require(saved_arrays == arrays, errc::corrupt_message, "load_state: the state holds ", saved_arrays,
            " arrays, the corrector keeps ", arrays);
    arrays_.resize(arrays);
    for (auto& a : arrays_) {
      const auto size = get<std::uint64_t>();
      require(size == n, errc::corrupt_message, "load_state: a state array has ", size, " elements, expected ", n);
      a.resize(static_cast<std::size_t>(size));
      for (auto& v : a) v = get<float>();
    }
    const auto selector_values = get<std::uint32_t>();
    require(selector_values <= 64, errc::corrupt_message, "load_state: ", selector_values,
            " selector values is implausible");
    selector_.resize(selector_values);
    for (auto& v : selector_) v = get<double>();
    const std::uint32_t crc = crc32c(seen_.data(), seen_.size());
    require(get<std::uint32_t>() == crc, errc::corrupt_message, "load_state: the record's checksum does not match");
  }

  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  [[nodiscard]] double density() const noexcept { return density_; }
  [[nodiscard]] std::span<const double> selector_state() const noexcept { return selector_; }
  [[nodiscard]] std::span<const float> array(std::size_t a) const noexcept { return arrays_[a]; }

 private:
  template <class T>
  T get() {
    std::byte raw[sizeof(T)];
    in_.read(reinterpret_cast<char*>(raw), sizeof(T));
    require(in_.gcount() == static_cast<std::streamsize>(sizeof(T)), errc::io,
            "load_state: the stream ended inside the state record");
    seen_.insert(seen_.end(), raw, raw + sizeof(T));
    return load_le<T>(raw);
  }
  std::istream& in_;
  std::vector<std::byte> seen_;
  std::uint64_t step_ = 0;
  double density_ = 0.0;
  std::vector<std::vector<float>> arrays_;
  std::vector<double> selector_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
