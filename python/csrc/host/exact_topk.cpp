// build<backend::host, select::exact_topk>, in a translation unit of its own (see compressors.hpp).
#include "../compressors.hpp"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::host, exact_topk)
}  // namespace gradcomp_py
