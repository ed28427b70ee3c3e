// kiln._kiln: Kiln's C++ API as a Python extension module. The package kiln (python/kiln/)
// re-exports it with the parts written in Python; see docs/PYTHON.md.
#include "bindings.h"

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "Kiln's native core; import kiln, not this module.";
  m.attr("__version__") = KILN_VERSION;  // CMake's project version (python/CMakeLists.txt)
  using namespace kiln::python;
  bind_errors(m);
  bind_tensor(m);
  // py-tensor: DLPack, the operations, kiln.random
  bind_dlpack(m);
  bind_ops(m);
  bind_random(m);
  // py-transforms: pytrees, transformations, control flow
  bind_tree(m);
  bind_transforms(m);
  bind_distributed(m);
  bind_control_flow(m);
  // py-nn: nn, optim, data, io
  bind_nn(m);
  bind_optim(m);
  bind_data(m);
  bind_io(m);
  bind_fft(m);
  bind_profile(m);
}
