// make_host: the selector dispatch over build<backend::host, S>, instantiated one selector
// per translation unit (generated from names.hpp).
#include "../compressors.hpp"

namespace gradcomp_py {

#define GRADCOMP_PY_EXTERN(S) GRADCOMP_PY_BUILD(extern template, gc::backend::host, S)
GRADCOMP_PY_SELECTORS(GRADCOMP_PY_EXTERN)
#undef GRADCOMP_PY_EXTERN

std::unique_ptr<any_compressor> make_host(std::size_t n, const std::string& method, options& o) {
  return make(gc::backend::host{}, n, method, o);
}

}  // namespace gradcomp_py
