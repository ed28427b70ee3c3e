// kiln.data: the native data pipeline (include/kiln/data.h) from Python. Samples and batches
// are dicts of kiln.Tensor. Native stages run on C++ threads without the GIL; a Python map or
// filter function takes the GIL for its call, and every wait on the pipeline (next, destruction)
// releases it, so workers calling Python cannot deadlock against the consumer
// (docs/PYTHON.md, "nn, optim, data and io").
#include "kiln/data.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bindings.h"

namespace kiln::python {
namespace {

py::dict to_dict(const data::Sample& s) {
  py::dict out;
  for (const auto& [name, t] : s) out[py::str(name)] = t;
  return out;
}

data::Sample to_sample(py::handle value, const char* who) {
  if (!py::isinstance<py::dict>(value))
    fail(who, "a Python function must return a sample: got a ",
         py::str(value.get_type().attr("__name__")).cast<std::string>(),
         ", expected a dict of tensors");
  data::Sample s;
  for (auto [name, t] : py::reinterpret_borrow<py::dict>(value))
    s.set(py::str(name).cast<std::string>(), to_tensor(t));
  return s;
}

// A Python callable shared by worker threads: copies of the handle never touch the reference
// count, and the last one drops the callable with the GIL held.
struct PyCallable {
  py::object fn;
  ~PyCallable() {
    if (!Py_IsInitialized()) {
      fn.release();  // the interpreter is gone: nothing to drop
      return;
    }
    py::gil_scoped_acquire gil;
    fn = py::object();
  }
};

// The GIL for a call into Python from a pipeline thread. A thread Python did not start keeps its
// Python thread state from its first call to its exit: gil_scoped_acquire alone would create
// and delete one on every call, which made up most of a Python map's cost on a worker.
class PythonCall {
 public:
  PythonCall() {
    if (foreign_) {
      thread_local StateKeeper keeper;  // constructed once per thread, with the GIL held
    }
  }

 private:
  struct StateKeeper {
    PyThreadState* state = PyThreadState_Get();
    StateKeeper() { ++state->gilstate_counter; }
    ~StateKeeper() {
      if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // the interpreter cleans up
      py::gil_scoped_acquire gil;  // finds `state`; its release drops the last count
      --state->gilstate_counter;
    }
  };
  // Whether this thread had no Python thread state before its first call (asked before
  // acquiring the GIL, which creates one).
  static bool foreign_thread() {
    thread_local const bool foreign = PyGILState_GetThisThreadState() == nullptr;
    return foreign;
  }
  bool foreign_ = foreign_thread();
  py::gil_scoped_acquire gil_;
};

// Positional parameters `fn` takes (2 for map(fn(sample, rng))).
int positional_count(py::handle fn) {
  py::object inspect = py::module_::import("inspect");
  int n = 0;
  for (py::handle p : inspect.attr("signature")(fn).attr("parameters").attr("values")()) {
    const std::string kind = py::str(p.attr("kind").attr("name"));
    if (kind == "VAR_POSITIONAL") return 2;
    if (kind == "POSITIONAL_ONLY" || kind == "POSITIONAL_OR_KEYWORD") ++n;
  }
  return n;
}

data::OnError to_on_error(const std::string& name) {
  if (name == "raise") return data::OnError::raise;
  if (name == "skip") return data::OnError::skip;
  fail("data", "unknown on_error policy: got \"", name, "\", expected \"raise\" or \"skip\"");
}

struct PyPipeline;

// The pipelines alive, so that they can be stopped before the interpreter finalises: a worker
// that asks for the GIL after that is ended by Python, from inside Kiln's C++.
struct LivePipelines {
  std::mutex mutex;
  std::unordered_set<PyPipeline*> set;
};
LivePipelines& live_pipelines() {
  static auto* live = new LivePipelines;  // never destroyed: pipelines may outlive statics
  return *live;
}

// A Pipeline whose destruction (which joins its worker threads) releases the GIL, so workers
// blocked on the GIL in a Python map can finish. Its iteration runs without the GIL, so
// `busy` keeps two Python threads from advancing it at once (taken after releasing the GIL).
struct PyPipeline {
  std::unique_ptr<data::Pipeline> pipeline;
  std::unique_ptr<std::mutex> busy = std::make_unique<std::mutex>();

  explicit PyPipeline(data::Pipeline p) : pipeline(std::make_unique<data::Pipeline>(std::move(p))) {
    enlist();
  }
  PyPipeline(PyPipeline&& other) noexcept
      : pipeline(std::move(other.pipeline)), busy(std::move(other.busy)) {
    enlist();
  }
  PyPipeline& operator=(PyPipeline&&) = delete;
  ~PyPipeline() {
    {
      std::lock_guard lock(live_pipelines().mutex);
      live_pipelines().set.erase(this);
    }
    stop();
  }
  // Joins the workers and drops the pipeline (the GIL released when this thread holds it).
  void stop() {
    if (!pipeline) return;
    std::optional<py::gil_scoped_release> release;
    if (Py_IsInitialized() && PyGILState_Check()) release.emplace();
    std::lock_guard lock(*busy);  // another Python thread may be advancing it
    pipeline.reset();
  }
  data::Pipeline& operator*() const { return *get(); }
  data::Pipeline* operator->() const { return get(); }

 private:
  void enlist() {
    std::lock_guard lock(live_pipelines().mutex);
    live_pipelines().set.insert(this);
  }
  data::Pipeline* get() const {
    if (!pipeline)
      fail("data.Pipeline",
           "the pipeline was stopped: got a pipeline used after the interpreter "
           "began to exit, expected one used before");
    return pipeline.get();
  }
};

// Stops every pipeline (atexit, before the interpreter finalises).
void stop_all_pipelines() {
  std::vector<PyPipeline*> all;
  {
    std::lock_guard lock(live_pipelines().mutex);
    all.assign(live_pipelines().set.begin(), live_pipelines().set.end());
  }
  for (PyPipeline* p : all) p->stop();
}

PyPipeline map_python(const PyPipeline& p, py::handle fn, const data::MapOptions& options) {
  const bool with_rng = positional_count(fn) >= 2;
  auto callable =
      std::shared_ptr<PyCallable>(new PyCallable{py::reinterpret_borrow<py::object>(fn)});
  return PyPipeline(p->map(
      [callable, with_rng](data::Sample s, data::Rng& rng) {
        const PythonCall call;
        py::object result =
            with_rng ? callable->fn(to_dict(s), py::cast(&rng, py::return_value_policy::reference))
                     : callable->fn(to_dict(s));
        return to_sample(result, "data.map");
      },
      options));
}

void bind_pipeline(py::module_& data) {
  py::class_<data::Rng>(data, "Rng",
                        "The random stream of one sample, a pure function of (seed, epoch, "
                        "index): handed to map functions that take two arguments.")
      .def("uniform", &data::Rng::uniform, "A float in [0, 1).")
      .def("uniform_int", &data::Rng::uniform_int, py::arg("lo"), py::arg("hi"),
           "An int in [lo, hi).")
      .def("bernoulli", &data::Rng::bernoulli, py::arg("p"), "True with probability p.")
      .def("next_u64", &data::Rng::next_u64, "The next 64 random bits.");

  py::class_<data::ImageTransform> transform(
      data, "ImageTransform",
      "A chain of image operations on one field ([H, W] or [H, W, C], uint8 or float32); chained "
      "transforms fuse into one pass per sample. Pass it to Pipeline.map.");
  transform.def("then", &data::ImageTransform::then, py::arg("next"),
                "This chain followed by `next`.");
  transform.def("on", &data::ImageTransform::on, py::arg("field"),
                "The same chain acting on another field.");
  transform.def_property_readonly("field", &data::ImageTransform::field);
  transform.def("__repr__", &data::ImageTransform::describe);
  transform.def(
      "__call__",
      [](const data::ImageTransform& t, py::handle image, int64_t epoch, int64_t index) {
        return t(to_tensor(image), epoch, index);
      },
      py::arg("image"), py::arg("epoch") = 0, py::arg("index") = 0,
      "The chain on one image, with the randomness of sample `index` in `epoch`.");

  py::module_ image = data.def_submodule("image", "Image transforms for Pipeline.map.");
  py::enum_<data::image::Interpolation>(image, "Interpolation")
      .value("nearest", data::image::Interpolation::nearest)
      .value("bilinear", data::image::Interpolation::bilinear);
  image.def("normalize", &data::image::normalize, py::arg("mean"), py::arg("std"),
            py::arg("scale") = py::none(),
            "To float32: (x * scale - mean[c]) / std[c]; scale is 1/255 for uint8 input.");
  image.def("random_crop", &data::image::random_crop, py::arg("height"), py::arg("width"),
            py::arg("padding") = 0, py::arg("seed") = 1,
            "Zero-pads each side by padding, then crops at a random place.");
  image.def("random_horizontal_flip", &data::image::random_horizontal_flip, py::arg("p") = 0.5,
            py::arg("seed") = 2, "Mirrors left-right with probability p.");
  image.def("resize", &data::image::resize, py::arg("height"), py::arg("width"),
            py::arg("interpolation") = data::image::Interpolation::bilinear, "Resizes.");
  image.def("center_crop", &data::image::center_crop, py::arg("height"), py::arg("width"),
            "Crops the centre.");
  image.def("to_chw", &data::image::to_chw, "[H, W, C] to [C, H, W]; last in a chain.");

  py::class_<PyPipeline> pipeline(
      data, "Pipeline",
      "A dataset description built by chaining (each call returns a new pipeline) plus its "
      "iteration position. `for batch in p:` runs the rest of the current epoch; the next loop "
      "runs the next epoch. Elements are dicts of kiln.Tensor.");
  pipeline.def(
      "map",
      [](const PyPipeline& p, py::handle fn, int num_threads, bool ordered, uint64_t seed,
         int chunk_size) {
        const data::MapOptions options{
            .num_threads = num_threads, .ordered = ordered, .seed = seed, .chunk_size = chunk_size};
        if (py::isinstance<data::ImageTransform>(fn))
          return PyPipeline(p->map(fn.cast<const data::ImageTransform&>(), options));
        return map_python(p, fn, options);
      },
      py::arg("fn"), py::kw_only(), py::arg("num_threads") = 0, py::arg("ordered") = true,
      py::arg("seed") = 0, py::arg("chunk_size") = 32,
      "Applies an ImageTransform (native, no GIL) or a Python function fn(sample) -> sample or "
      "fn(sample, rng) -> sample (holds the GIL for each call, so Python maps on several threads "
      "run one at a time; see docs/PYTHON.md) on num_threads workers (0: the consuming thread).");
  pipeline.def(
      "filter",
      [](const PyPipeline& p, py::handle fn) {
        auto callable =
            std::shared_ptr<PyCallable>(new PyCallable{py::reinterpret_borrow<py::object>(fn)});
        return PyPipeline(p->filter([callable](const data::Sample& s) {
          const PythonCall call;
          return py::bool_(callable->fn(to_dict(s))).cast<bool>();
        }));
      },
      py::arg("predicate"), "Keeps the samples for which predicate(sample) is true.");
  pipeline.def(
      "shuffle",
      [](const PyPipeline& p, uint64_t seed, int64_t buffer_size) {
        return PyPipeline(p->shuffle(seed, {.buffer_size = buffer_size}));
      },
      py::arg("seed"), py::arg("buffer_size") = 10000,
      "A permutation per epoch (a reservoir of buffer_size for streams).");
  pipeline.def(
      "batch",
      [](const PyPipeline& p, int64_t size, bool drop_remainder,
         std::vector<std::pair<std::string, double>> pad) {
        return PyPipeline(
            p->batch(size, {.drop_remainder = drop_remainder, .pad = std::move(pad)}));
      },
      py::arg("size"), py::arg("drop_remainder") = false,
      py::arg("pad") = std::vector<std::pair<std::string, double>>{},
      "Stacks `size` samples; pad lists (field, value) pairs for fields whose shapes vary.");
  pipeline.def(
      "prefetch", [](const PyPipeline& p, int64_t n) { return PyPipeline(p->prefetch(n)); },
      py::arg("n"), "Runs the upstream on a background thread, keeping up to n elements ready.");
  pipeline.def(
      "repeat",
      [](const PyPipeline& p, std::optional<int64_t> count) {
        return PyPipeline(p->repeat(count));
      },
      py::arg("count") = py::none(), "Repeats the upstream count times (None: forever).");
  pipeline.def(
      "take", [](const PyPipeline& p, int64_t n) { return PyPipeline(p->take(n)); }, py::arg("n"));
  pipeline.def(
      "skip", [](const PyPipeline& p, int64_t n) { return PyPipeline(p->skip(n)); }, py::arg("n"));
  pipeline.def(
      "zip",
      [](const PyPipeline& p, const PyPipeline& other) { return PyPipeline(p->zip(*other)); },
      py::arg("other"), "Pairs elements (field names must not collide).");
  pipeline.def(
      "shard",
      [](const PyPipeline& p, int64_t count, int64_t index) {
        return PyPipeline(p->shard(count, index));
      },
      py::arg("count"), py::arg("index"));
  pipeline.def(
      "on_error",
      [](const PyPipeline& p, const std::string& policy) {
        return PyPipeline(p->on_error(to_on_error(policy)));
      },
      py::arg("policy"), "\"skip\": drop and count upstream elements that raised.");
  pipeline.def(
      "size", [](const PyPipeline& p) { return p->size(); },
      "Elements per epoch when known without iterating, else None.");
  pipeline.def_property_readonly("random_access",
                                 [](const PyPipeline& p) { return p->random_access(); });
  pipeline.def("describe", [](const PyPipeline& p) { return p->describe(); });
  pipeline.def("__repr__", [](const PyPipeline& p) { return "Pipeline(" + p->describe() + ")"; });
  pipeline.def(
      "get",
      [](const PyPipeline& p, int64_t index) {
        data::Sample s;
        {
          py::gil_scoped_release release;
          std::lock_guard lock(*p.busy);
          s = p->get(index);
        }
        return to_dict(s);
      },
      py::arg("index"), "Element `index` of the current epoch (needs random access).");
  pipeline.def("__iter__", [](py::handle self) { return self; });
  pipeline.def("__next__", [](PyPipeline& p) {
    std::optional<data::Sample> s;
    {
      py::gil_scoped_release release;  // workers may need it to run Python functions
      std::lock_guard lock(*p.busy);
      s = p->next();
    }
    if (!s) throw py::stop_iteration();
    return to_dict(*s);
  });
  pipeline.def_property(
      "epoch", [](const PyPipeline& p) { return p->epoch(); },
      [](PyPipeline& p, int64_t epoch) {
        py::gil_scoped_release release;
        std::lock_guard lock(*p.busy);
        p->set_epoch(epoch);
      },
      "The current epoch; setting it starts that epoch from its beginning.");
  pipeline.def(
      "state", [](const PyPipeline& p) { return p->state().to_string(); },
      "Where the iteration stands, as text for a checkpoint.");
  pipeline.def(
      "restore",
      [](PyPipeline& p, const std::string& state) {
        const data::PipelineState s = data::PipelineState::parse(state);
        py::gil_scoped_release release;
        std::lock_guard lock(*p.busy);
        p->restore(s);
      },
      py::arg("state"), "Continues from a state() of an identically built pipeline.");
  pipeline.def(
      "stats", [](const PyPipeline& p) { return p->stats().to_string(); },
      "A one-line summary of throughput, waiting and skipped records.");
  pipeline.def("reset_stats", [](PyPipeline& p) { p->reset_stats(); });

  data.def(
      "zip",
      [](const std::vector<const PyPipeline*>& pipelines) {
        std::vector<data::Pipeline> ps;
        for (const PyPipeline* p : pipelines) ps.push_back(**p);
        return PyPipeline(data::zip(ps));
      },
      py::arg("pipelines"), "Pairs the elements of several pipelines.");
}

void bind_sources(py::module_& data) {
  data.def(
      "from_tensors",
      [](const py::dict& fields) {
        std::vector<std::pair<std::string, Tensor>> f;
        for (auto [name, t] : fields)
          f.emplace_back(py::str(name).cast<std::string>(), to_tensor(t));
        return PyPipeline(data::from_tensors(std::move(f)));
      },
      py::arg("fields"),
      "Samples are slices along the leading axis of each tensor of {name: array} (views).");
  data.def(
      "from_idx",
      [](const std::string& images, std::optional<std::string> labels, const std::string& on_error,
         int64_t max_bytes) {
        py::gil_scoped_release release;
        return PyPipeline(
            data::from_idx(images, std::move(labels),
                           {.on_error = to_on_error(on_error), .max_bytes = max_bytes}));
      },
      py::arg("images"), py::arg("labels") = py::none(), py::arg("on_error") = "raise",
      py::arg("max_bytes") = int64_t{1} << 31,
      "MNIST-format IDX files, raw or gzip'd: fields image (uint8 [rows, cols]) and label.");
  data.def(
      "from_csv",
      [](const std::string& path, char delimiter, std::vector<std::string> select,
         const std::map<std::string, py::object>& types, std::vector<std::string> text_columns,
         const std::string& on_error) {
        data::CsvOptions o;
        o.delimiter = delimiter;
        o.select = std::move(select);
        for (const auto& [name, dtype] : types) o.types.emplace_back(name, to_dtype(dtype));
        o.text_columns = std::move(text_columns);
        o.on_error = to_on_error(on_error);
        py::gil_scoped_release release;
        return PyPipeline(data::from_csv(path, o));
      },
      py::arg("path"), py::arg("delimiter") = ',', py::arg("select") = std::vector<std::string>{},
      py::arg("types") = std::map<std::string, py::object>{},
      py::arg("text_columns") = std::vector<std::string>{}, py::arg("on_error") = "raise",
      "CSV with a header line: one scalar field per kept column.");
  data.def("glob", &data::glob, py::arg("pattern"),
           "Sorted paths matching a shell pattern; raises when nothing matches.");
  data.def(
      "from_files",
      [](std::vector<std::string> paths) { return PyPipeline(data::from_files(std::move(paths))); },
      py::arg("paths"), "Each file's bytes: fields data (uint8 [n]) and index.");
  data.def(
      "from_images",
      [](std::vector<std::string> paths, std::vector<int64_t> labels, std::optional<int> channels,
         int64_t max_pixels) {
        return PyPipeline(data::from_images(std::move(paths), std::move(labels),
                                            {.channels = channels, .max_pixels = max_pixels}));
      },
      py::arg("paths"), py::arg("labels") = std::vector<int64_t>{},
      py::arg("channels") = py::none(), py::arg("max_pixels") = int64_t{178956970},
      "PNG or JPEG files, decoded lazily: fields image (uint8 [H, W, C]), index, label.");

  data.def(
      "read_idx",
      [](const std::string& path) {
        py::gil_scoped_release release;
        return data::read_idx(path);
      },
      py::arg("path"), "An IDX file, raw or gzip'd, as a tensor.");
  data.def(
      "read_image",
      [](const std::string& path, std::optional<int> channels) {
        py::gil_scoped_release release;
        return data::read_image(path, {.channels = channels});
      },
      py::arg("path"), py::arg("channels") = py::none(), "A PNG or JPEG file as uint8 [H, W, C].");
  data.def(
      "encode_png",
      [](py::handle image) {
        const std::vector<uint8_t> b = data::encode_png(to_tensor(image));
        return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      },
      py::arg("image"), "uint8 [H, W] or [H, W, C] to PNG bytes.");
  data.def(
      "encode_jpeg",
      [](py::handle image, int quality) {
        const std::vector<uint8_t> b = data::encode_jpeg(to_tensor(image), quality);
        return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      },
      py::arg("image"), py::arg("quality") = 90, "uint8 [H, W] or [H, W, C] to JPEG bytes.");
  data.def(
      "write_file",
      [](const std::string& path, py::bytes bytes) {
        const std::string_view v = bytes;
        data::write_file(path, std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
      },
      py::arg("path"), py::arg("data"), "Replaces the file atomically.");
}

}  // namespace

void bind_data(py::module_& m) {
  py::module_ data = m.def_submodule("_data", "Kiln's native data pipeline.");
  py::module_::import("atexit").attr("register")(py::cpp_function(&stop_all_pipelines));
  data.attr("__name__") = "kiln.data";  // where its classes say they live
  bind_pipeline(data);
  bind_sources(data);
  bind_tokenizer(data);
}

}  // namespace kiln::python
