// kiln.Error: Kiln's Error as a Python exception whose message names the user's Python line
// (docs/PYTHON.md, "Errors"), not a line of Kiln's C++.
#include <string>
#include <string_view>

#include "bindings.h"
// After Python.h, which bindings.h includes through pybind11.
#include <frameobject.h>

namespace kiln::python {

std::string repr_of(py::handle v) { return py::repr(v).cast<std::string>(); }

namespace {

// The folder of the kiln package, with a trailing slash: frames in it are Kiln's, not the
// user's. Read on first use: __file__ is set only after the module's initialisation.
const std::string& package_dir() {
  static const std::string dir =
      py::module_::import("os.path")
          .attr("dirname")(py::module_::import("kiln._kiln").attr("__file__"))
          .cast<std::string>() +
      "/";
  return dir;
}

// The message without a trailing " (at file.cpp:line)" that names Kiln's own C++.
std::string without_cpp_location(std::string message) {
  const std::size_t at = message.rfind(" (at ");
  if (at == std::string::npos || message.back() != ')') return message;
  const std::string_view where(message.data() + at + 5, message.size() - at - 6);
  const std::size_t colon = where.rfind(':');
  const std::string_view file = where.substr(0, colon);
  if (file.ends_with(".cpp") || file.ends_with(".h")) message.erase(at);
  return message;
}

// " (at file.py:line)" for the innermost frame outside the kiln package, "" when there is none.
std::string python_location() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::string out;
  while (frame) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const std::string file = py::reinterpret_borrow<py::str>(code->co_filename).cast<std::string>();
    Py_DECREF(code);
    if (!file.starts_with(package_dir())) {
      out = " (at " + file + ":" + std::to_string(PyFrame_GetLineNumber(frame)) + ")";
      Py_DECREF(frame);
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return out;
}

}  // namespace

std::string python_message(const Error& e) {
  // C++ names read as Python's: "use kiln::cond" -> "use kiln.cond".
  std::string message = without_cpp_location(e.what());
  for (std::size_t at = message.find("kiln::"); at != std::string::npos;
       at = message.find("kiln::", at))
    message.replace(at, 6, "kiln.");
  return message + python_location();
}

void bind_errors(py::module_& m) {
  static py::exception<Error> error(m, "Error", PyExc_Exception);
  error.doc() = "Kiln's error: '[op] what went wrong: got ..., expected ...' and the Python line.";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object exc = py::handle(error.ptr())(python_message(e));
      exc.attr("op") = e.op();
      PyErr_SetObject(error.ptr(), exc.ptr());
    }
  });
}

}  // namespace kiln::python
