// lockstep._C: the library's ops for Python. Tensors cross as DLPack arrays (any framework, no
// torch C++ ABI); every lockstep::Error becomes lockstep.Error (a RuntimeError) carrying the
// library's message. The torch layer (python/lockstep/torch.py) builds on these functions.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "core/thread_pool.h"
#include "lockstep/contract.h"
#include "lockstep/error.h"
#include "python/bindings.h"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  using lockstep::ContractConfig;
  m.doc() = "lockstep's bitwise-reproducible ops (the CPU reference backend; CUDA when built)";
  nb::exception<lockstep::Error>(m, "Error", PyExc_RuntimeError);

  m.attr("contract_version") = lockstep::kContractVersion;
#ifdef LOCKSTEP_PYTHON_CUDA
  m.attr("cuda_build") = true;
#else
  m.attr("cuda_build") = false;
#endif
  m.def("num_threads", &lockstep::num_threads, "Threads of the CPU ops' pool.");
  m.def("set_num_threads", &lockstep::set_num_threads, nb::arg("n"),
        "Threads of the CPU ops' pool (bits never depend on it).");

  nb::class_<ContractConfig>(m, "ContractConfig",
                             "Every deployment setting that can change bits (docs/contract.md).")
      .def(
          "__init__",
          [](ContractConfig* c, int gemm_segments, int kv_chunk, int vocab_tile,
             int vocab_segments) {
            new (c) ContractConfig{gemm_segments, kv_chunk, vocab_tile, vocab_segments};
          },
          nb::arg("gemm_segments") = 1, nb::arg("kv_chunk") = 1024, nb::arg("vocab_tile") = 256,
          nb::arg("vocab_segments") = 1)
      .def_rw("gemm_segments", &ContractConfig::gemm_segments)
      .def_rw("kv_chunk", &ContractConfig::kv_chunk)
      .def_rw("vocab_tile", &ContractConfig::vocab_tile)
      .def_rw("vocab_segments", &ContractConfig::vocab_segments)
      .def("validate", &ContractConfig::validate)
      .def("__repr__", &ContractConfig::to_string);

  lockstep::python::bind_forward(m);
  lockstep::python::bind_backward(m);
  lockstep::python::bind_engine(m);
}
