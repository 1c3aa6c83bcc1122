// build<backend::host, select::exact_topk>, in a translation unit of its own (see compressors.hpp).
#include "../compressors.hpp"

namespace gradcomp_py {
template std::unique_ptr<any_compressor> build<gc::backend::host, gc::select::exact_topk>(const gc::backend::host&,
                                                                                     std::size_t, const std::string&,
                                                                                     options&);
}  // namespace gradcomp_py
