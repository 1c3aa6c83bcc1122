// gradcomp._C, the Python module: what gradcomp.torch calls (the compressor and ScaleCom's
// exchange: compressor_handle.hpp; decode and accumulate: messages.cpp; the DDP hook's
// steps: ddp_steps.hpp; Leader SGD's exchange: leader.hpp), the schedules, and the translation of every
// gradcomp::error into the Python exception of its code (gradcomp.errors), with the same
// message.
#include <torch/extension.h>

#include <gradcomp/schedule/ratio_plan.hpp>
#include <gradcomp/schedule/warmup.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compressor_handle.hpp"
#include "ddp_steps.hpp"
#include "leader.hpp"
#include "messages.hpp"
#include "process_group.hpp"
#include "torch_cuda.hpp"

namespace py = pybind11;
namespace gc = gradcomp;
using gradcomp_py::compressor_handle;
using gradcomp_py::cyclic_handle;
using gradcomp_py::sparse_handle;

namespace {

// -- errors ------------------------------------------------------------------------------------

const char* error_class(gc::errc code) {
  switch (code) {
    case gc::errc::invalid_argument:
      return "InvalidArgumentError";
    case gc::errc::buffer_too_small:
      return "BufferTooSmallError";
    case gc::errc::non_finite:
      return "NonFiniteError";
    case gc::errc::corrupt_message:
      return "CorruptMessageError";
    case gc::errc::io:
      return "StateIOError";
    case gc::errc::device:
      return "DeviceError";
  }
  return "Error";
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gradcomp's compressors on torch tensors (use gradcomp.torch)";
  m.attr("cuda") = py::bool_(
#if defined(GRADCOMP_PY_CUDA)
      true
#else
      false
#endif
  );
#if defined(GRADCOMP_PY_CUDA)
  gc::backend::set_device_allocator(std::make_shared<gradcomp_py::torch_allocator>());
#endif
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gc::error& e) {
      const py::object cls = py::module_::import("gradcomp.errors").attr(error_class(e.code()));
      // A message may quote bytes of a damaged record that are not UTF-8: escaped, not lost.
      const std::string_view what = e.what();
      const py::object text = py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(what.data(), static_cast<Py_ssize_t>(what.size()), "backslashreplace"));
      PyErr_SetObject(cls.ptr(), text.ptr());
    }
  });

  py::class_<compressor_handle, std::shared_ptr<compressor_handle>>(m, "Compressor")
      .def(py::init<std::int64_t, const std::string&, const py::dict&, const torch::Device&>(), py::arg("numel"),
           py::arg("method"), py::arg("options"), py::arg("device"))
      .def_property_readonly("numel", &compressor_handle::numel)
      .def_property_readonly("max_message_bytes", &compressor_handle::max_message_bytes)
      .def_property_readonly("step", &compressor_handle::step)
      .def_property_readonly("signature", &compressor_handle::signature)
      .def_property_readonly("device", &compressor_handle::device)
      .def("memory_bytes", &compressor_handle::memory_bytes)
      .def("release_workspace", &compressor_handle::release_workspace)
      .def_property_readonly("density", &compressor_handle::density)
      .def_property_readonly("state_arrays", &compressor_handle::state_arrays)
      .def("compress", [](compressor_handle& c, const torch::Tensor& g) { return c.compress(g, false); })
      .def("stage", [](compressor_handle& c, const torch::Tensor& g) { return c.compress(g, true); })
      .def("accept_staged", &compressor_handle::accept_staged)
      .def_property_readonly("has_staged", &compressor_handle::has_staged)
      .def("preview", &compressor_handle::preview)
      .def("set_density", &compressor_handle::set_density)
      .def("set_indices", &compressor_handle::set_indices)
      .def("save_state", &compressor_handle::save_state)
      .def("load_state", &compressor_handle::load_state)
      .def("corrector_state", &compressor_handle::corrector_state)
      .def("load_memory", &compressor_handle::load_memory, py::arg("step"), py::arg("arrays"));

  py::class_<cyclic_handle, std::shared_ptr<cyclic_handle>>(m, "CyclicExchange")
      .def(py::init<compressor_handle&, const py::object&, double>(), py::keep_alive<1, 2>())
      .def("step", &cyclic_handle::step)
      .def("memory_bytes", &cyclic_handle::memory_bytes)
      .def_property_readonly("bytes_sent", &cyclic_handle::bytes_sent)
      .def_property_readonly("bytes_received", &cyclic_handle::bytes_received);

  py::class_<sparse_handle, std::shared_ptr<sparse_handle>>(m, "SparseAllreduce")
      .def(py::init<compressor_handle&, const py::object&, std::size_t>(), py::keep_alive<1, 2>())
      .def("step", &sparse_handle::step)
      .def("reduce_scatter", &sparse_handle::reduce_scatter)
      .def("queue_reduce_scatter", &sparse_handle::queue_reduce_scatter)
      .def("queue_step", &sparse_handle::queue_step)
      .def("settle", &sparse_handle::settle_read)
      .def("drop", &sparse_handle::drop)
      .def_property_readonly("sizes_agreed", &sparse_handle::sizes_agreed)
      .def_property_readonly("collectives", &sparse_handle::collectives)
      .def_property_readonly("k", &sparse_handle::k)
      .def_property_readonly("entries", &sparse_handle::entries)
      .def("memory_bytes", &sparse_handle::memory_bytes)
      .def("release_workspace", &sparse_handle::release_workspace)
      .def_property_readonly("bytes_sent", &sparse_handle::bytes_sent)
      .def_property_readonly("bytes_received", &sparse_handle::bytes_received);

  py::class_<gradcomp_py::hook_steps>(m, "HookSteps")
      .def(py::init<const py::object&, const py::object&, bool>(), py::arg("group"), py::arg("ddp_group"),
           py::arg("skip_non_finite") = false)
      .def("dense", &gradcomp_py::hook_steps::dense, py::arg("bucket"), py::arg("settings"), py::arg("error"),
           py::arg("last"))
      .def("compressed", &gradcomp_py::hook_steps::compressed, py::arg("index"), py::arg("compressor"),
           py::arg("aggregation"), py::arg("exchange"), py::arg("bucket"), py::arg("settings"), py::arg("error"),
           py::arg("last"))
      .def_static("no_counts", [] { return gradcomp_py::hook_counts{}.to_dict(); })
      .def("totals", [](const gradcomp_py::hook_steps& s) { return s.totals().to_dict(); })
      .def("last_step", [](const gradcomp_py::hook_steps& s) { return s.last_step().to_dict(); });

  gradcomp_py::bind_leader(m);

  m.def("methods", &gradcomp_py::method_names, "The methods a Compressor takes (gradcomp/registry.hpp)");
  m.def("preset_settings", &gradcomp_py::preset_settings,
        "Each preset's options with their defaults, by method (the options structs' settings())");
  m.def("decode", &gradcomp_py::decode, py::arg("message"));
  m.def("accumulate", &gradcomp_py::accumulate, py::arg("message"), py::arg("dense"), py::arg("scale") = 1.0);

  m.def(
      "warmup_by_epoch",
      [](double start, double factor, double final_density, std::uint64_t epoch) {
        return gc::schedule::warmup{.start = start, .factor = factor, .final_density = final_density}.by_epoch(epoch);
      },
      py::arg("start"), py::arg("factor"), py::arg("final_density"), py::arg("epoch"));
  m.def(
      "warmup_by_step",
      [](double start, double factor, double final_density, std::uint64_t step, std::uint64_t steps_per_epoch) {
        return gc::schedule::warmup{.start = start, .factor = factor, .final_density = final_density}.by_step(
            step, steps_per_epoch);
      },
      py::arg("start"), py::arg("factor"), py::arg("final_density"), py::arg("step"), py::arg("steps_per_epoch"));
  m.def(
      "ratio_plan",
      [](const std::vector<double>& volumes, double mean_density, double min_density) {
        return gc::schedule::ratio_plan(volumes, mean_density, min_density);
      },
      py::arg("volumes"), py::arg("mean_density"), py::arg("min_density"));
}
