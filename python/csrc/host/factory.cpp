// make_host: the selector dispatch over build<backend::host, S>, instantiated one selector
// per translation unit (host/<selector>.cpp).
#include "../compressors.hpp"

namespace gradcomp_py {

#define GRADCOMP_PY_EXTERN(S)                                                                                       \
  extern template std::unique_ptr<any_compressor> build<gc::backend::host, gc::select::S>(const gc::backend::host&, \
                                                                                           std::size_t,             \
                                                                                           const std::string&, options&);
GRADCOMP_PY_EACH_SELECTOR(GRADCOMP_PY_EXTERN)
#undef GRADCOMP_PY_EXTERN

std::unique_ptr<any_compressor> make_host(std::size_t n, const std::string& method, options& o) {
  return make(gc::backend::host{}, n, method, o);
}

}  // namespace gradcomp_py
