// build<backend::cuda, select::exact_topk>, in a translation unit of its own (see compressors.hpp).
#include "compressors_cuda.cuh"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::cuda, exact_topk)
}  // namespace gradcomp_py
