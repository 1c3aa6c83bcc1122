/// \file detail/step/state_io.hpp
/// The checkpoint record of a compressor. Not API.
///
/// Little-endian: magic "GCST", u16 version, u16 0, u32 signature length, signature
/// (the policies' names), u64 n, u64 step, f64 density (0 when none), u32 arrays, then
/// per array u64 length and the floats, then the selector's state record (its memory
/// between steps): u32 field count and per field u8 width in bytes and the unsigned
/// value, then a CRC-32C of everything before it. Version 1 had the record's fields as
/// f64 values (u32 count, then the values); it is still read.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/density.hpp>
#include <gradcomp/detail/core/wire.hpp>
#include <gradcomp/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::uint32_t state_magic = 0x54534347u;  // "GCST"
inline constexpr std::uint16_t state_version = 2;

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
  /// The selector's state record (a state_record of concepts.hpp); none for a selector
  /// without state.
  template <class Record>
  void selector_record(Record record) {
    std::uint32_t fields = 0;
    record.fields([&](auto&) { ++fields; });
    put<std::uint32_t>(fields);
    record.fields([&]<class T>(T& value) {
      static_assert(std::is_unsigned_v<T>, "gradcomp: a state record's fields are unsigned integers");
      put<std::uint8_t>(sizeof(T));
      put<T>(value);
    });
  }
  void no_selector_record() { put<std::uint32_t>(0); }
  /// A selector state record as a state_reader read it (selector_fields()).
  template <class Field>
  void selector_fields(std::span<const Field> fields) {
    put<std::uint32_t>(static_cast<std::uint32_t>(fields.size()));
    for (const Field& f : fields) {
      put<std::uint8_t>(f.width);
      switch (f.width) {
        case 1:
          put<std::uint8_t>(static_cast<std::uint8_t>(f.value));
          break;
        case 2:
          put<std::uint16_t>(static_cast<std::uint16_t>(f.value));
          break;
        case 4:
          put<std::uint32_t>(static_cast<std::uint32_t>(f.value));
          break;
        default:
          put<std::uint64_t>(f.value);
      }
    }
  }

  void finish(std::ostream& out) {
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
  /// `record_size`, where the record is all the caller has (not a stream that goes on):
  /// its size, which the record must fill exactly.
  state_reader(std::istream& in, const std::string& signature, std::uint64_t n, std::size_t arrays,
               std::size_t record_size = 0)
      : in_(in) {
    require(get<std::uint32_t>() == state_magic, errc::corrupt_message,
            "load_state: the stream does not start with a gradcomp state record");
    const auto version = get<std::uint16_t>();
    require(version == 1 || version == state_version, errc::corrupt_message, "load_state: state version ", version,
            ", this build reads 1 and ", state_version);
    (void)get<std::uint16_t>();
    const auto length = get<std::uint32_t>();
    require(length <= 4096, errc::corrupt_message, "load_state: signature length ", length, " is implausible");
    std::string saved(length, '\0');
    for (auto& ch : saved) ch = static_cast<char>(get<std::uint8_t>());
    require(saved == signature, errc::corrupt_message, "load_state: the state was saved by a compressor of \"", saved,
            "\", this one is \"", signature, "\"");
    const auto saved_n = get<std::uint64_t>();
    require(saved_n == n, errc::corrupt_message, "load_state: the state is for n = ", saved_n,
            ", this compressor has n = ", n);
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
    const auto fields = get<std::uint32_t>();
    require(fields <= 64, errc::corrupt_message, "load_state: ", fields, " fields of selector state is implausible");
    selector_.resize(fields);
    for (field& f : selector_) {
      if (version == 1) {  // an f64 holding an unsigned integer
        const double v = get<double>();
        require(v >= 0.0 && v < 0x1p64 && v == static_cast<double>(static_cast<std::uint64_t>(v)),
                errc::corrupt_message, "load_state: the selector's saved value ", v, " is not an unsigned integer");
        f = {0, static_cast<std::uint64_t>(v)};
        continue;
      }
      f.width = get<std::uint8_t>();
      switch (f.width) {
        case 1:
          f.value = get<std::uint8_t>();
          break;
        case 2:
          f.value = get<std::uint16_t>();
          break;
        case 4:
          f.value = get<std::uint32_t>();
          break;
        case 8:
          f.value = get<std::uint64_t>();
          break;
        default:
          fail(errc::corrupt_message, "load_state: a field of the selector's state is ", unsigned{f.width},
               " bytes wide");
      }
    }
    const std::uint32_t crc = crc32c(seen_.data(), seen_.size());
    require(get<std::uint32_t>() == crc, errc::corrupt_message, "load_state: the record's checksum does not match");
    require(record_size == 0 || record_size == seen_.size(), errc::corrupt_message,
            "load_state: ", record_size - seen_.size(), " bytes follow the ", seen_.size(), "-byte record");
    // Values compress could have left: the corrector's memory is always finite.
    for (std::size_t a = 0; a < arrays_.size(); ++a) {
      for (std::size_t i = 0; i < arrays_[a].size(); ++i) {
        require(std::isfinite(arrays_[a][i]), errc::corrupt_message, "load_state: the corrector's array ", a, " holds ",
                arrays_[a][i], " at index ", i, "; its memory is always finite");
      }
    }
  }

  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  [[nodiscard]] double density() const noexcept { return density_; }
  /// Whether the record holds selector state.
  [[nodiscard]] bool has_selector_state() const noexcept { return !selector_.empty(); }
  /// The selector's state record, of type `Record` (a state_record): its fields must be
  /// the record's, in number and width, and the record valid.
  /// \throws gradcomp::error (corrupt_message) otherwise, naming `selector`.
  template <class Record>
  [[nodiscard]] Record selector_record(const std::string& selector) const {
    Record record;
    std::size_t at = 0;
    record.fields([&](auto& value) {
      using T = std::remove_reference_t<decltype(value)>;
      require(at < selector_.size(), errc::corrupt_message, "load_state: the saved state of ", selector, " has ",
              selector_.size(), " fields, too few");
      const field& f = selector_[at++];
      require(f.width == 0 || f.width == sizeof(T), errc::corrupt_message, "load_state: field ", at - 1, " of ",
              selector, "'s saved state is ", unsigned{f.width}, " bytes wide, expected ", sizeof(T));
      require(f.value <= std::numeric_limits<T>::max(), errc::corrupt_message, "load_state: field ", at - 1, " of ",
              selector, "'s saved state holds ", f.value, ", above its type's maximum");
      value = static_cast<T>(f.value);
    });
    require(at == selector_.size(), errc::corrupt_message, "load_state: the saved state of ", selector, " has ",
            selector_.size(), " fields, ", selector, " keeps ", at);
    require(record.valid(), errc::corrupt_message, "load_state: the saved state of ", selector, " is invalid");
    return record;
  }
  [[nodiscard]] std::span<const float> array(std::size_t a) const noexcept { return arrays_[a]; }

  /// One field of the selector's state record, as read.
  struct field {
    std::uint8_t width = 0;  ///< bytes; 0: read from a version 1 record (an f64)
    std::uint64_t value = 0;
  };
  /// The selector's state record as read, field by field.
  [[nodiscard]] std::span<const field> selector_fields() const noexcept { return selector_; }

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
  std::vector<field> selector_;
};

/// The policies' names as a record carries them: "selector;corrector;encoder".
template <class Selector, class Corrector, class Encoder>
std::string signature_of(const Selector& s, const Corrector& c, const Encoder& e) {
  return s.name() + ";" + c.name() + ";" + e.name();
}
/// The selector's density as a record carries it: 0 where it has none.
template <class Selector>
double density_of(const Selector& s) {
  if constexpr (requires { s.density; }) {
    return static_cast<double>(s.density);
  } else {
    return 0.0;
  }
}

/// Writes the record of a compressor of `signature` (its policies' names) and n: its
/// step, the selector's density (0 where it has none), the corrector's committed arrays
/// (Arrays of them) and the selector engine's saved state (`selector`: its record, or
/// nullptr where it keeps none).
template <std::size_t Arrays, class CorrectEngine, class SelectorRecord>
void write_state(std::ostream& out, const std::string& signature, std::uint64_t n, std::uint64_t step, double density,
                 const CorrectEngine& correct, const SelectorRecord& selector) {
  state_writer w;
  w.header(signature, n, step, density);
  for (std::size_t a = 0; a != Arrays; ++a) w.array(correct.committed(a));
  if constexpr (!std::is_null_pointer_v<SelectorRecord>) {
    w.selector_record(selector);
  } else {
    w.no_selector_record();
  }
  w.finish(out);
}

/// Record `record` (one whole record of a compressor of `signature`, n and
/// `values.size()` corrector arrays) with its step and its corrector arrays replaced by
/// `step` and `values` (n floats each): what that compressor would save holding that
/// memory. The density and the selector's state stay the record's. The DDP hook moves
/// each parameter's memory into a new compressor this way when DDP regroups the
/// parameters into other buckets.
/// \throws gradcomp::error (corrupt_message) for a record that does not match, a
///         version 1 record, or an array of another size.
inline std::string restated(std::span<const std::byte> record, const std::string& signature, std::uint64_t n,
                            std::uint64_t step, std::span<const std::span<const float>> values) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(record.data()), record.size()));
  const state_reader r(in, signature, n, values.size(), record.size());
  state_writer w;
  w.header(signature, n, step, r.density());
  for (const auto& a : values) {
    require(a.size() == n, errc::corrupt_message, "restated: an array of ", a.size(), " elements, expected ", n);
    w.array(a);
  }
  for (const auto& f : r.selector_fields()) {
    require(f.width != 0, errc::corrupt_message, "restated: a version 1 record");
  }
  w.selector_fields(r.selector_fields());
  std::ostringstream out;
  w.finish(out);
  return out.str();
}

/// The selector that record `r` restores: `current` at the record's density, which must
/// be one compress could have left (in (0, 1], or 0 where the selector has none or
/// counts instead); valid for n.
template <class Selector>
Selector restored_selector(const state_reader& r, const Selector& current, std::size_t n) {
  const double saved = r.density();
  if constexpr (requires(Selector s) { s.density = 1.0; }) {
    require(saved == 0.0 || (saved > 0.0 && saved <= 1.0), errc::corrupt_message, "load_state: the saved density ",
            saved, " is outside (0, 1]");
    const Selector next = saved > 0.0 ? with_density(current, saved) : current;
    next.validate(n);
    return next;
  } else {
    require(saved == 0.0, errc::corrupt_message, "load_state: the saved density ", saved,
            " belongs to no parameter of ", current.name());
    return current;
  }
}

/// The selector engine's state in record `r`, checked (nullptr where `SelectEngine`
/// keeps none, and then the record must hold none).
template <class SelectEngine>
auto restored_selector_state(const state_reader& r, const std::string& selector) {
  if constexpr (engine_restores_state<SelectEngine>) {
    return r.template selector_record<decltype(std::declval<const SelectEngine&>().saved_state())>(selector);
  } else {
    require(!r.has_selector_state(), errc::corrupt_message, "load_state: the record holds selector state, ", selector,
            " keeps none");
    return nullptr;
  }
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
