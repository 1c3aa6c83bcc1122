// build<backend::host, select::threshold>, in a translation unit of its own (see compressors.hpp).
#include "../compressors.hpp"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::host, threshold)
}  // namespace gradcomp_py
