// make_host: the selector dispatch over build<backend::host, S>, instantiated one selector
// per translation unit (scripts/binding_units.py); method_names.
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../compressors.hpp"

namespace gradcomp_py {

#define GRADCOMP_PY_EXTERN(S) GRADCOMP_PY_BUILD(extern template, gc::backend::host, S)
GRADCOMP_SELECTORS(GRADCOMP_PY_EXTERN)
#undef GRADCOMP_PY_EXTERN

std::vector<std::string> method_names() {
#define GRADCOMP_PY_NAME(M, S, DESCRIPTION) #M,
  return {GRADCOMP_PRESETS(GRADCOMP_PY_NAME) "compose"};
#undef GRADCOMP_PY_NAME
}

std::vector<std::pair<std::string, std::vector<std::pair<std::string, options::value>>>> preset_settings() {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, options::value>>>> all;
  const auto add = [&](const char* method, const auto& defaults) {
    auto& settings = all.emplace_back(method, std::vector<std::pair<std::string, options::value>>{}).second;
    gc::for_each_setting(defaults, [&](const char* name, const auto& value) {
      using T = std::remove_cvref_t<decltype(value)>;
      if constexpr (std::is_same_v<T, bool>) {
        settings.emplace_back(name, value);
      } else if constexpr (std::is_floating_point_v<T>) {
        settings.emplace_back(name, static_cast<double>(value));
      } else {
        settings.emplace_back(name, static_cast<std::int64_t>(value));
      }
    });
  };
#define GRADCOMP_PY_SETTINGS(M, S, DESCRIPTION) add(#M, gc::presets::M##_options{});
  GRADCOMP_PRESETS(GRADCOMP_PY_SETTINGS)
#undef GRADCOMP_PY_SETTINGS
  return all;
}

std::unique_ptr<any_compressor> make_host(std::size_t n, const std::string& method, options& o) {
  return make(gc::backend::host{}, n, method, o);
}

}  // namespace gradcomp_py
