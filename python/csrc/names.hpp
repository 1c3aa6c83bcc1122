// The one list of the binding: every selector that gradcomp.torch builds (its C++ policy
// gradcomp::select::S, instantiated in a translation unit of its own, which setup.py and
// tests/CMakeLists.txt generate from this list), and every preset method with the selector
// it runs. A new selector is one line in GRADCOMP_PY_SELECTORS (and its two library
// headers); a new preset, one line in GRADCOMP_PY_PRESETS and its options in
// compressors.hpp's build(). Kept free of other headers: setup.py and CMake read it as text.
#pragma once

#include <string>
#include <vector>

// clang-format off
#define GRADCOMP_PY_SELECTORS(X) \
  X(exact_topk)                  \
  X(sampled_threshold)           \
  X(chunk_local)                 \
  X(random_k)                    \
  X(threshold)                   \
  X(given_indices)

#define GRADCOMP_PY_PRESETS(X)   \
  X(topk_ef, exact_topk)         \
  X(dgc, sampled_threshold)      \
  X(adacomp, chunk_local)        \
  X(randomk_ef, random_k)        \
  X(threshold_ef, threshold)     \
  X(scalecom, given_indices)
// clang-format on

namespace gradcomp_py {

/// `names` as one text: "a, b, c".
inline std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}
/// The selectors gradcomp.torch builds.
inline std::vector<std::string> selector_names() {
#define GRADCOMP_PY_NAME(S) #S,
  return {GRADCOMP_PY_SELECTORS(GRADCOMP_PY_NAME)};
#undef GRADCOMP_PY_NAME
}
/// The methods of gradcomp.torch.Compressor: the presets, then "compose".
inline std::vector<std::string> method_names() {
#define GRADCOMP_PY_NAME(M, S) #M,
  return {GRADCOMP_PY_PRESETS(GRADCOMP_PY_NAME) "compose"};
#undef GRADCOMP_PY_NAME
}

}  // namespace gradcomp_py
