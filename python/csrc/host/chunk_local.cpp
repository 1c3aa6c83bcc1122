// build<backend::host, select::chunk_local>, in a translation unit of its own (see compressors.hpp).
#include "../compressors.hpp"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::host, chunk_local)
}  // namespace gradcomp_py
