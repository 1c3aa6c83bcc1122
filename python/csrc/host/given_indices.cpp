// build<backend::host, select::given_indices>, in a translation unit of its own (see compressors.hpp).
#include "../compressors.hpp"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::host, given_indices)
}  // namespace gradcomp_py
