// build<backend::host, select::random_k>, in a translation unit of its own (see compressors.hpp).
#include "../compressors.hpp"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::host, random_k)
}  // namespace gradcomp_py
