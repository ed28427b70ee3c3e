// kiln.profile, kiln.machine_peak (include/kiln/profile.h).
#include "bindings.h"

namespace kiln::python {
namespace {

// `with kiln.profile() as p:` records the compiled functions run in the block; afterwards p
// holds the Profile.
struct ProfileScope {
  std::optional<Profile> result;
  const Profile& get() const {
    if (!result)
      fail("profile",
           "no result yet: got a profile whose with-block has not ended, expected "
           "one read after it");
    return *result;
  }
};

}  // namespace

void bind_profile(py::module_& m) {
  py::class_<MachinePeak>(m, "MachinePeak",
                          "The machine's float32 FMA peak (GFLOP/s) and streaming copy bandwidth "
                          "(GB/s, read plus written) on `threads` cores, measured by running.")
      .def_readonly("isa", &MachinePeak::isa)
      .def_readonly("threads", &MachinePeak::threads)
      .def_readonly("fma_gflops", &MachinePeak::fma_gflops)
      .def_readonly("copy_gbps", &MachinePeak::copy_gbps)
      .def("__repr__", [](const MachinePeak& p) {
        return "MachinePeak(isa='" + p.isa + "', threads=" + std::to_string(p.threads) +
               ", fma_gflops=" + std::to_string(p.fma_gflops) +
               ", copy_gbps=" + std::to_string(p.copy_gbps) + ")";
      });
  m.def(
      "machine_peak",
      [](std::optional<int> threads) { return machine_peak(threads.value_or(num_threads())); },
      py::arg("threads") = py::none(), py::call_guard<py::gil_scoped_release>(),
      "The FMA peak and copy bandwidth of `threads` cores at once (default: num_threads()), "
      "measured on first request (about 0.3 s) and cached.");
  py::class_<ProfileRow>(
      m, "ProfileRow",
      "One step of one compiled function over the profiled calls: function, "
      "step, fused, what, calls, seconds (total), first_seconds (the first call the profile "
      "recorded, part of seconds), later_calls and later_seconds (the calls after it, or the "
      "one call), flops and bytes (per call).")
      .def_readonly("function", &ProfileRow::function)
      .def_readonly("step", &ProfileRow::step)
      .def_readonly("fused", &ProfileRow::fused)
      .def_readonly("what", &ProfileRow::what)
      .def_readonly("calls", &ProfileRow::calls)
      .def_readonly("seconds", &ProfileRow::seconds)
      .def_readonly("first_seconds", &ProfileRow::first_seconds)
      .def_property_readonly("later_calls", &ProfileRow::later_calls)
      .def_property_readonly("later_seconds", &ProfileRow::later_seconds)
      .def_readonly("flops", &ProfileRow::flops)
      .def_readonly("bytes", &ProfileRow::bytes)
      .def("__repr__", [](const ProfileRow& r) {
        return "ProfileRow(function='" + r.function + "', step=" + std::to_string(r.step) +
               ", what='" + r.what + "', calls=" + std::to_string(r.calls) +
               ", seconds=" + std::to_string(r.seconds) +
               ", first_seconds=" + std::to_string(r.first_seconds) + ")";
      });
  py::class_<ProfileScope>(m, "profile", R"doc(
Where compiled functions spend their time: `with kiln.profile() as p: step(...)`, then
`print(p)` (or p.table()) shows each compiled function's steps, fused loop nests and library
calls, with ms per call, GFLOP/s and GB/s and their share of the machine's measured FMA peak and
copy bandwidth over the calls after each step's first, and the first call's ms apart (it pays
one-time costs); p.rows holds them as ProfileRow, p.peak the MachinePeak. KILN_PROFILE=1
profiles a whole process and prints the table at exit (docs/PERFORMANCE.md).)doc")
      .def(py::init<>())
      .def(
          "__enter__",
          [](ProfileScope& s) -> ProfileScope& {
            s.result.reset();
            start_profile();
            return s;
          },
          py::return_value_policy::reference_internal)
      .def("__exit__",
           [](ProfileScope& s, const py::args&) {
             py::gil_scoped_release release;
             s.result = stop_profile();
             return false;
           })
      .def_property_readonly("rows", [](const ProfileScope& s) { return s.get().rows; })
      .def_property_readonly("peak", [](const ProfileScope& s) { return s.get().peak; })
      .def("table", [](const ProfileScope& s) { return s.get().table(); })
      .def("__str__", [](const ProfileScope& s) { return s.get().table(); });
}

}  // namespace kiln::python
