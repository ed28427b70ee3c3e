// Pytrees: Python values flattened in C++ into leaves and a kiln::TreeDef that describes them
// completely (pytree.h), and the kiln.tree module. Flattening is on jit's hot path: builtin
// containers are recognised by their exact type, other types by a registry lookup.
#include <algorithm>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "pytree.h"

namespace kiln::python::pytree {
namespace {

enum class NodeKind : uint8_t { leaf, namedtuple, dataclass, registered, native };

// What flatten does with values of one Python type.
struct TypeInfo {
  NodeKind kind = NodeKind::leaf;
  py::object type;
  std::string type_name;            // "Name#k": k is the index in Registry::types
  std::vector<std::string> fields;  // namedtuple and dataclass fields
  std::vector<bool> static_fields;  // dataclass: field(metadata={"static": True})
  py::object flatten, unflatten;    // kiln.tree.register
  const NativeTree* native = nullptr;
};

struct Registry {
  std::deque<TypeInfo> types;  // a deque: flatten holds references while it adds types
  std::unordered_map<PyObject*, std::size_t> index;
  py::dict interned;  // (type, value) -> index into `values`
  std::vector<py::object> values;
};

// Never destroyed: its Python objects must not be released after the interpreter is gone.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

PyTypeObject* tensor_type() {
  static PyTypeObject* t = reinterpret_cast<PyTypeObject*>(py::type::of<Tensor>().ptr());
  return t;
}

std::string type_name_of(py::handle type) {
  return py::getattr(type, "__qualname__", py::getattr(type, "__name__", py::str("?")))
      .cast<std::string>();
}

const TypeInfo& add_type(py::handle type, TypeInfo info) {
  Registry& r = registry();
  auto it = r.index.find(type.ptr());
  const std::size_t k = it == r.index.end() ? r.types.size() : it->second;
  info.type = py::reinterpret_borrow<py::object>(type);
  info.type_name = type_name_of(type) + "#" + std::to_string(k);
  if (k == r.types.size()) {
    r.types.push_back(std::move(info));
    r.index.emplace(type.ptr(), k);
  } else {
    r.types[k] = std::move(info);
  }
  return r.types[k];
}

// A type seen for the first time: a bound C++ tree, a namedtuple, a dataclass or a leaf.
const TypeInfo& describe(py::handle type) {
  TypeInfo info;
  if (const NativeTree* native = find_native_tree(type)) {
    info.kind = NodeKind::native;
    info.native = native;
  } else if (PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type.ptr()), &PyTuple_Type) &&
             py::hasattr(type, "_fields")) {
    info.kind = NodeKind::namedtuple;
    for (py::handle f : type.attr("_fields")) info.fields.push_back(f.cast<std::string>());
  } else if (py::hasattr(type, "__dataclass_fields__")) {
    info.kind = NodeKind::dataclass;
    for (py::handle f : py::module_::import("dataclasses").attr("fields")(type)) {
      info.fields.push_back(f.attr("name").cast<std::string>());
      info.static_fields.push_back(
          py::bool_(f.attr("metadata").attr("get")("static", false)).cast<bool>());
    }
  }
  return add_type(type, std::move(info));
}

const TypeInfo& info_of(PyTypeObject* type) {
  Registry& r = registry();
  auto it = r.index.find(reinterpret_cast<PyObject*>(type));
  if (it != r.index.end()) return r.types[it->second];
  return describe(py::handle(reinterpret_cast<PyObject*>(type)));
}

// The registry entry of a structure node's type_name "Name#k".
const TypeInfo& info_of(const TreeDef& def) {
  const std::size_t hash = def.type_name.rfind('#');
  Registry& r = registry();
  std::size_t k = r.types.size();
  if (hash != std::string::npos) k = std::stoul(def.type_name.substr(hash + 1));
  if (k >= r.types.size())
    fail("tree.unflatten", "unknown node type: got ", def.type_name,
         ", expected a type flattened by kiln.tree");
  return r.types[k];
}

// Where flatten puts leaves: Python objects as they are, or Tensors. is_leaf says which nodes
// are leaves besides those flatten_node knows (kiln.tree's is_leaf predicate).
struct ObjectSink {
  std::vector<py::object>& leaves;
  py::handle predicate;  // null or None: none
  void leaf(py::handle v) { leaves.push_back(py::reinterpret_borrow<py::object>(v)); }
  void tensor(const Tensor& t) { leaves.push_back(py::cast(t)); }
  bool is_leaf(py::handle v) const {
    if (!predicate || predicate.is_none()) return false;
    const int truth = PyObject_IsTrue(predicate(v).ptr());
    if (truth < 0) throw py::error_already_set();
    return truth == 1;
  }
};
// The transformations' flattening (jit's hot path): no predicate.
struct TensorSink {
  std::vector<Tensor>& leaves;
  static constexpr bool is_leaf(py::handle) { return false; }
  void leaf(py::handle v) { leaves.push_back(to_tensor(v)); }
  void tensor(const Tensor& t) { leaves.push_back(t); }
};

TreeDef node(TreeDef::Kind kind) {
  TreeDef d;
  d.kind = kind;
  return d;
}

// The nodes being flattened, outermost first. Flattening recurses once per level, and so does
// every walk over the TreeDef it makes: past kMaxTreeDepth levels it raises instead of running
// out of stack, and a node met again on its own path is a cycle.
class Path {
 public:
  // Enters `v` for the lifetime of the Step.
  class Step {
   public:
    Step(Path& path, py::handle v) : path_(path) {
      if (path.nodes_.size() >= static_cast<std::size_t>(kMaxTreeDepth)) path.fail_at(v);
      path.nodes_.push_back(v.ptr());
    }
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;
    ~Step() { path_.nodes_.pop_back(); }

   private:
    Path& path_;
  };

 private:
  [[noreturn]] void fail_at(py::handle v) const {
    if (std::find(nodes_.begin(), nodes_.end(), v.ptr()) != nodes_.end())
      fail("tree.flatten", "the tree contains itself: got a ", type_name_of(v.get_type()),
           " that is its own descendant, expected a tree without cycles");
    fail("tree.flatten", "the tree is nested too deeply: got more than ", kMaxTreeDepth,
         " levels, expected at most ", kMaxTreeDepth);
  }
  std::vector<PyObject*> nodes_;
};

template <class Sink>
TreeDef flatten_node(py::handle v, Sink& sink, Path& path);

// A list's or tuple's items. Each is held while it is flattened, and the size is read again
// before each one: a registered type's flatten may shrink a list that holds it.
template <class Sink>
TreeDef flatten_sequence(py::handle v, Sink& sink, Path& path) {
  TreeDef d =
      node(Py_TYPE(v.ptr()) == &PyTuple_Type ? TreeDef::Kind::tuple : TreeDef::Kind::vector);
  const py::ssize_t n = PySequence_Fast_GET_SIZE(v.ptr());
  d.children.reserve(static_cast<std::size_t>(n));
  for (py::ssize_t i = 0; i < n && i < PySequence_Fast_GET_SIZE(v.ptr()); ++i) {
    const auto item = py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(v.ptr(), i));
    d.children.push_back(flatten_node(item, sink, path));
  }
  return d;
}

// A dict's entries in sorted key order. Keys and values are held while the children are
// flattened: a registered type's flatten may change the dict.
template <class Sink>
TreeDef flatten_dict(py::handle v, Sink& sink, Path& path) {
  TreeDef d = node(TreeDef::Kind::map);
  const auto n = static_cast<std::size_t>(PyDict_GET_SIZE(v.ptr()));
  d.names.reserve(n);
  d.children.reserve(n);
  // String keys sorted as views of Python's own UTF-8 (byte order is code point order).
  struct Entry {
    std::string_view name;  // the key's UTF-8, which lives as long as `key`
    py::object key, value;
  };
  std::vector<Entry> items;
  items.reserve(n);
  PyObject *key, *value;
  py::ssize_t pos = 0;
  while (PyDict_Next(v.ptr(), &pos, &key, &value)) {
    py::ssize_t size = 0;
    const char* text = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &size) : nullptr;
    if (!text) {
      PyErr_Clear();
      break;
    }
    items.push_back({std::string_view(text, static_cast<std::size_t>(size)),
                     py::reinterpret_borrow<py::object>(key),
                     py::reinterpret_borrow<py::object>(value)});
  }
  if (items.size() == n) {
    std::sort(items.begin(), items.end(),
              [](const Entry& a, const Entry& b) { return a.name < b.name; });
    for (const Entry& e : items) {
      d.names.emplace_back(e.name);
      d.children.push_back(flatten_node(e.value, sink, path));
    }
    return d;
  }
  // Other keys: Python's sorted order, each key interned and named by its index.
  items.clear();
  for (py::handle k : py::list(py::module_::import("builtins").attr("sorted")(v))) {
    d.names.push_back("\x01" + std::to_string(std::get<int64_t>(static_leaf(k).value)));
    PyObject* found = PyDict_GetItem(v.ptr(), k.ptr());
    if (!found)
      fail("tree.flatten", "a dict changed while it was flattened: got a key ",
           py::repr(k).cast<std::string>(), " that is gone, expected the dict unchanged");
    items.push_back(
        {{}, py::reinterpret_borrow<py::object>(k), py::reinterpret_borrow<py::object>(found)});
  }
  for (const Entry& e : items) d.children.push_back(flatten_node(e.value, sink, path));
  return d;
}

template <class Sink>
TreeDef flatten_node(py::handle v, Sink& sink, Path& path) {
  PyTypeObject* type = Py_TYPE(v.ptr());
  if (sink.is_leaf(v) || type == tensor_type() || type == &PyFloat_Type || type == &PyLong_Type ||
      type == &PyBool_Type) {
    sink.leaf(v);
    return TreeDef{};
  }
  if (v.is_none()) return node(TreeDef::Kind::optional);
  if (type == &PyUnicode_Type) return static_leaf(v);
  const Path::Step step(path, v);
  if (type == &PyTuple_Type || type == &PyList_Type) return flatten_sequence(v, sink, path);
  if (type == &PyDict_Type) return flatten_dict(v, sink, path);

  const TypeInfo& info = info_of(type);
  TreeDef d = node(TreeDef::Kind::structure);
  switch (info.kind) {
    case NodeKind::leaf:
      sink.leaf(v);
      return TreeDef{};
    case NodeKind::namedtuple:
    case NodeKind::dataclass:
      d.type_name = info.type_name;
      d.names = info.fields;
      for (std::size_t i = 0; i < info.fields.size(); ++i) {
        py::object field = info.kind == NodeKind::namedtuple
                               ? py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(v.ptr(), i))
                               : v.attr(info.fields[i].c_str());
        d.children.push_back(!info.static_fields.empty() && info.static_fields[i]
                                 ? static_leaf(field)
                                 : flatten_node(field, sink, path));
      }
      return d;
    case NodeKind::registered: {
      py::object parts = info.flatten(v);
      if (!py::isinstance<py::tuple>(parts) || py::len(parts) != 2)
        fail("tree.flatten", "the flatten function registered for ", type_name_of(info.type),
             " must return (children, aux_data): got ",
             py::repr(parts).template cast<std::string>(), ", expected a tuple of two");
      d.type_name = info.type_name;
      d.names.push_back("aux_data");
      d.children.push_back(static_leaf(parts[py::int_(1)]));
      std::size_t i = 0;
      for (py::handle child : parts[py::int_(0)]) {
        d.names.push_back(std::to_string(i++));
        d.children.push_back(flatten_node(child, sink, path));
      }
      return d;
    }
    case NodeKind::native: {
      detail::FlatTree flat = info.native->flatten(v);
      for (const Tensor& t : flat.leaves) sink.tensor(t);
      // One child: the C++ tree's own TreeDef, which its unflatten expects.
      d.type_name = info.type_name;
      d.names.push_back("");
      d.children.push_back(std::move(flat.def));
      return d;
    }
  }
  return d;
}

// Where unflatten takes leaves from.
struct ObjectSource {
  std::span<const py::object> leaves;
  std::size_t next = 0;
  py::object leaf() { return leaves[next++]; }
  std::vector<Tensor> tensors(std::size_t n) {
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < n; ++i) {
      py::handle v = leaves[next++];
      out.push_back(to_tensor(v));
    }
    return out;
  }
};
struct TensorSource {
  std::span<const Tensor> leaves;
  std::size_t next = 0;
  py::object leaf() { return py::cast(leaves[next++]); }
  std::vector<Tensor> tensors(std::size_t n) {
    std::vector<Tensor> out(leaves.begin() + static_cast<std::ptrdiff_t>(next),
                            leaves.begin() + static_cast<std::ptrdiff_t>(next + n));
    next += n;
    return out;
  }
};

py::object key_of(const std::string& name) {
  if (!name.empty() && name[0] == '\x01')
    return registry().values.at(static_cast<std::size_t>(std::stoll(name.substr(1))));
  return py::str(name);
}

template <class Source>
py::object unflatten_node(const TreeDef& d, Source& src) {
  switch (d.kind) {
    case TreeDef::Kind::leaf:
      return src.leaf();
    case TreeDef::Kind::static_leaf:
      return static_value(d);
    case TreeDef::Kind::optional:
      return d.children.empty() ? py::none() : unflatten_node(d.children[0], src);
    case TreeDef::Kind::vector:
    case TreeDef::Kind::array: {
      py::list out(d.children.size());
      for (std::size_t i = 0; i < d.children.size(); ++i)
        out[i] = unflatten_node(d.children[i], src);
      return py::object(std::move(out));
    }
    case TreeDef::Kind::tuple: {
      py::tuple out(d.children.size());
      for (std::size_t i = 0; i < d.children.size(); ++i)
        out[i] = unflatten_node(d.children[i], src);
      return py::object(std::move(out));
    }
    case TreeDef::Kind::map: {
      py::dict out;
      for (std::size_t i = 0; i < d.children.size(); ++i)
        out[key_of(d.names[i])] = unflatten_node(d.children[i], src);
      return py::object(std::move(out));
    }
    case TreeDef::Kind::structure:
      break;
  }
  const TypeInfo& info = info_of(d);
  switch (info.kind) {
    case NodeKind::namedtuple: {
      py::tuple fields(d.children.size());
      for (std::size_t i = 0; i < d.children.size(); ++i)
        fields[i] = unflatten_node(d.children[i], src);
      return info.type(*fields);
    }
    case NodeKind::dataclass: {
      // Built without __init__ (and __post_init__), as JAX does: the fields are set directly,
      // which also works for frozen dataclasses.
      py::object out = info.type.attr("__new__")(info.type);
      for (std::size_t i = 0; i < d.children.size(); ++i) {
        py::object value = unflatten_node(d.children[i], src);
        if (PyObject_GenericSetAttr(out.ptr(), py::str(d.names[i]).ptr(), value.ptr()) != 0)
          throw py::error_already_set();
      }
      return out;
    }
    case NodeKind::registered: {
      py::tuple children(d.children.size() - 1);
      for (std::size_t i = 1; i < d.children.size(); ++i)
        children[i - 1] = unflatten_node(d.children[i], src);
      return info.unflatten(static_value(d.children[0]), children);
    }
    case NodeKind::native: {
      const std::vector<Tensor> leaves = src.tensors(d.children[0].num_leaves());
      return info.native->unflatten(d.children[0], leaves);
    }
    case NodeKind::leaf:
      break;
  }
  fail("tree.unflatten", "not a node type: got ", d.type_name,
       ", expected a namedtuple, dataclass, registered or native type");
}

// The subtrees of `v` at the leaves of `d`, a prefix of v's structure, appended to `out` (JAX's
// flatten_up_to: how map reads its other trees). v's nodes above them must be d's.
void flatten_up_to(const TreeDef& d, py::handle v, std::vector<py::object>& out,
                   const std::function<void(py::handle, const TreeDef&)>& mismatch) {
  PyTypeObject* type = Py_TYPE(v.ptr());
  auto same_static = [&](const TreeDef& s, py::handle x) {
    if (!(static_leaf(x) == s)) mismatch(x, s);
  };
  switch (d.kind) {
    case TreeDef::Kind::leaf:
      out.push_back(py::reinterpret_borrow<py::object>(v));
      return;
    case TreeDef::Kind::static_leaf:
      same_static(d, v);
      return;
    case TreeDef::Kind::optional:
      if (!v.is_none()) mismatch(v, d);
      return;
    case TreeDef::Kind::tuple:
    case TreeDef::Kind::vector:
    case TreeDef::Kind::array:
      if (type != (d.kind == TreeDef::Kind::tuple ? &PyTuple_Type : &PyList_Type) ||
          static_cast<std::size_t>(PySequence_Fast_GET_SIZE(v.ptr())) != d.children.size())
        mismatch(v, d);
      // Each item held, and the size read again: a registered type's flatten may change v.
      for (std::size_t i = 0; i < d.children.size(); ++i) {
        if (static_cast<std::size_t>(PySequence_Fast_GET_SIZE(v.ptr())) != d.children.size())
          mismatch(v, d);
        const auto item = py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(v.ptr(), i));
        flatten_up_to(d.children[i], item, out, mismatch);
      }
      return;
    case TreeDef::Kind::map:
      if (type != &PyDict_Type ||
          static_cast<std::size_t>(PyDict_GET_SIZE(v.ptr())) != d.names.size())
        mismatch(v, d);
      for (std::size_t i = 0; i < d.children.size(); ++i) {
        PyObject* found = PyDict_GetItem(v.ptr(), key_of(d.names[i]).ptr());
        if (!found) mismatch(v, d);
        const auto child = py::reinterpret_borrow<py::object>(found);
        flatten_up_to(d.children[i], child, out, mismatch);
      }
      return;
    case TreeDef::Kind::structure:
      break;
  }
  const TypeInfo& info = info_of(type);
  if (info.type_name != d.type_name) mismatch(v, d);
  switch (info.kind) {
    case NodeKind::namedtuple:
    case NodeKind::dataclass:
      for (std::size_t i = 0; i < info.fields.size(); ++i) {
        py::object field = info.kind == NodeKind::namedtuple
                               ? py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(v.ptr(), i))
                               : v.attr(info.fields[i].c_str());
        if (!info.static_fields.empty() && info.static_fields[i])
          same_static(d.children[i], field);
        else
          flatten_up_to(d.children[i], field, out, mismatch);
      }
      return;
    case NodeKind::registered: {
      const py::object parts = info.flatten(v);
      const py::list children(parts[py::int_(0)]);
      same_static(d.children[0], parts[py::int_(1)]);
      if (children.size() + 1 != d.children.size()) mismatch(v, d);
      for (std::size_t i = 0; i < children.size(); ++i)
        flatten_up_to(d.children[i + 1], children[i], out, mismatch);
      return;
    }
    case NodeKind::native: {
      const detail::FlatTree flat = info.native->flatten(v);
      if (!(flat.def == d.children[0])) mismatch(v, d);
      for (const Tensor& t : flat.leaves) out.push_back(py::cast(t));
      return;
    }
    case NodeKind::leaf:
      mismatch(v, d);
  }
}

// kiln.tree.TreeDef: a flattened tree's structure.
struct PyTreeDef {
  TreeDef def;
};

}  // namespace

TreeDef flatten(py::handle value, std::vector<py::object>& leaves, py::handle is_leaf) {
  ObjectSink sink{leaves, is_leaf};
  Path path;
  return flatten_node(value, sink, path);
}

TreeDef flatten_tensors(py::handle value, std::vector<Tensor>& leaves) {
  TensorSink sink{leaves};
  Path path;
  return flatten_node(value, sink, path);
}

detail::FlatTree flatten_tree(py::handle value) {
  detail::FlatTree out;
  out.def = flatten_tensors(value, out.leaves);
  return out;
}

py::object unflatten(const TreeDef& def, std::span<const py::object> leaves) {
  if (leaves.size() != def.num_leaves())
    fail("tree.unflatten", "wrong number of leaves: got ", leaves.size(), ", expected ",
         def.num_leaves());
  ObjectSource src{leaves};
  return unflatten_node(def, src);
}

py::object unflatten_tensors(const TreeDef& def, std::span<const Tensor> leaves) {
  if (leaves.size() != def.num_leaves())
    fail("tree.unflatten", "wrong number of leaves: got ", leaves.size(), ", expected ",
         def.num_leaves());
  TensorSource src{leaves};
  return unflatten_node(def, src);
}

TreeDef static_leaf(py::handle value) {
  TreeDef d = node(TreeDef::Kind::static_leaf);
  if (PyUnicode_Check(value.ptr())) {
    d.value = value.cast<std::string>();
    return d;
  }
  Registry& r = registry();
  // Keyed with the type, so 1, 1.0 and True stay apart.
  py::tuple key = py::make_tuple(py::type::handle_of(value), value);
  PyObject* k = PyDict_GetItemWithError(r.interned.ptr(), key.ptr());
  if (!k) {
    if (PyErr_Occurred()) {
      PyErr_Clear();
      fail("tree", "a static value must be hashable: got ", py::repr(value).cast<std::string>(),
           ", expected a hashable object");
    }
    r.interned[key] = py::int_(r.values.size());
    r.values.push_back(py::reinterpret_borrow<py::object>(value));
    d.value = static_cast<int64_t>(r.values.size() - 1);
  } else {
    d.value = py::handle(k).cast<int64_t>();
  }
  return d;
}

py::object static_value(const TreeDef& def) {
  if (const auto* s = std::get_if<std::string>(&def.value)) return py::str(*s);
  if (const auto* k = std::get_if<int64_t>(&def.value))
    return registry().values.at(static_cast<std::size_t>(*k));
  fail("tree.unflatten", "not a Python static value: got ", def.to_string(),
       ", expected one made by kiln.tree");
}

TreeDef one_arg(TreeDef def) {
  TreeDef d = node(TreeDef::Kind::tuple);
  d.children.push_back(std::move(def));
  return d;
}

detail::FlatFn python_fn(const py::object& f, const TreeDef& args_def, const py::dict* kwargs) {
  if (kwargs && kwargs->empty()) kwargs = nullptr;
  return [&f, &args_def, kwargs](const std::vector<Tensor>& in, TreeDef& out_def) {
    const py::object args = unflatten_tensors(args_def, in);
    const py::object out = kwargs ? f(*args, **(*kwargs)) : f(*args);
    std::vector<Tensor> leaves;
    out_def = flatten_tensors(out, leaves);
    return leaves;
  };
}

void broadcast_prefix(std::string_view op, py::handle prefix, const TreeDef& def,
                      const std::function<void(py::handle)>& emit) {
  PyTypeObject* type = Py_TYPE(prefix.ptr());
  const bool node_value = type == &PyTuple_Type || type == &PyList_Type || type == &PyDict_Type ||
                          (!prefix.is_none() && type != &PyLong_Type && type != &PyBool_Type &&
                           type != &PyUnicode_Type && info_of(type).kind != NodeKind::leaf);
  if (!node_value || def.kind == TreeDef::Kind::static_leaf) {
    for (std::size_t i = 0, n = def.num_leaves(); i < n; ++i) emit(prefix);
    return;
  }
  auto mismatch = [&] {
    fail(op, "not a tree prefix of the value: got ", py::repr(prefix).cast<std::string>(),
         ", expected an int, None, or a tree of them shaped like ", def.to_string());
  };
  switch (def.kind) {
    case TreeDef::Kind::tuple:
    case TreeDef::Kind::vector:
    case TreeDef::Kind::array: {
      if ((type != &PyTuple_Type && type != &PyList_Type) || py::len(prefix) != def.children.size())
        mismatch();
      for (std::size_t i = 0; i < def.children.size(); ++i)
        broadcast_prefix(op, prefix[py::int_(i)], def.children[i], emit);
      return;
    }
    case TreeDef::Kind::map: {
      if (type != &PyDict_Type || py::len(prefix) != def.children.size()) mismatch();
      for (std::size_t i = 0; i < def.children.size(); ++i) {
        PyObject* v = PyDict_GetItem(prefix.ptr(), key_of(def.names[i]).ptr());
        if (!v) mismatch();
        broadcast_prefix(op, v, def.children[i], emit);
      }
      return;
    }
    case TreeDef::Kind::structure: {
      const TypeInfo& info = info_of(type);
      if (info.type_name != def.type_name ||
          (info.kind != NodeKind::namedtuple && info.kind != NodeKind::dataclass))
        mismatch();
      for (std::size_t i = 0; i < def.children.size(); ++i)
        broadcast_prefix(op, prefix.attr(def.names[i].c_str()), def.children[i], emit);
      return;
    }
    default:
      mismatch();
  }
}

}  // namespace kiln::python::pytree

namespace kiln::python {

void bind_tree(py::module_& m) {
  using namespace pytree;
  py::module_ t = m.def_submodule(
      "_tree",
      "Pytrees: nested dict, list, tuple, namedtuple, None, dataclasses and registered types "
      "whose leaves are tensors, arrays or scalars (docs/PYTHON.md, 'Pytrees').");

  py::class_<PyTreeDef>(t, "TreeDef", "The structure of a flattened tree, without its leaves.")
      .def_property_readonly(
          "num_leaves", [](const PyTreeDef& d) { return d.def.num_leaves(); },
          "The number of leaves.")
      .def(
          "unflatten",
          [](const PyTreeDef& d, const py::iterable& leaves) {
            std::vector<py::object> l;
            for (py::handle x : leaves) l.push_back(py::reinterpret_borrow<py::object>(x));
            return unflatten(d.def, l);
          },
          py::arg("leaves"), "The tree of this structure with these leaves.")
      .def("__eq__", [](const PyTreeDef& a, const PyTreeDef& b) { return a.def == b.def; })
      .def("__hash__", [](const PyTreeDef& d) { return d.def.hash(); })
      .def("__repr__", [](const PyTreeDef& d) { return "TreeDef(" + d.def.to_string() + ")"; });

  // is_leaf, as JAX's: a predicate called on every subtree (the root, nodes and leaves); where
  // it returns true, the subtree is a leaf as it is.
  t.def(
      "flatten",
      [](py::handle tree, py::handle is_leaf) {
        std::vector<py::object> leaves;
        TreeDef def = flatten(tree, leaves, is_leaf);
        return py::make_tuple(py::cast(leaves), PyTreeDef{std::move(def)});
      },
      py::arg("tree"), py::arg("is_leaf") = py::none(),
      "flatten(tree, is_leaf=None) -> (leaves, treedef): the leaves in order (dict entries by "
      "sorted key) and the structure. is_leaf(x) -> bool, called on every subtree: where it is "
      "true, x is a leaf and is not flattened further (None included).");
  t.def(
      "unflatten",
      [](const PyTreeDef& d, const py::iterable& leaves) {
        std::vector<py::object> l;
        for (py::handle x : leaves) l.push_back(py::reinterpret_borrow<py::object>(x));
        return unflatten(d.def, l);
      },
      py::arg("treedef"), py::arg("leaves"), "The tree of structure `treedef` with these leaves.");
  t.def(
      "leaves",
      [](py::handle tree, py::handle is_leaf) {
        std::vector<py::object> leaves;
        flatten(tree, leaves, is_leaf);
        return leaves;
      },
      py::arg("tree"), py::arg("is_leaf") = py::none(),
      "leaves(tree, is_leaf=None): the leaves of `tree`, in flatten order (is_leaf as in "
      "flatten).");
  t.def(
      "structure",
      [](py::handle tree, py::handle is_leaf) {
        std::vector<py::object> leaves;
        return PyTreeDef{flatten(tree, leaves, is_leaf)};
      },
      py::arg("tree"), py::arg("is_leaf") = py::none(),
      "structure(tree, is_leaf=None): the TreeDef of `tree` (is_leaf as in flatten).");
  t.def(
      "map",
      [](const py::function& f, py::handle tree, const py::args& rest, py::handle is_leaf) {
        std::vector<py::object> leaves;
        const TreeDef def = flatten(tree, leaves, is_leaf);
        std::vector<std::vector<py::object>> others(rest.size());
        for (std::size_t k = 0; k < rest.size(); ++k) {
          auto mismatch = [&def, k](py::handle got, const TreeDef& where) {
            fail("tree.map", "tree ", k + 2, " does not have the first tree's structure: got ",
                 py::repr(got).cast<std::string>(), " where the first tree has ", where.to_string(),
                 ", expected the same nodes down to the first tree's leaves (", def.to_string(),
                 ")");
          };
          flatten_up_to(def, rest[k], others[k], mismatch);
        }
        std::vector<py::object> out;
        out.reserve(leaves.size());
        for (std::size_t i = 0; i < leaves.size(); ++i) {
          py::tuple xs(1 + rest.size());
          xs[0] = leaves[i];
          for (std::size_t k = 0; k < rest.size(); ++k) xs[k + 1] = others[k][i];
          out.push_back(f(*xs));
        }
        return unflatten(def, out);
      },
      py::arg("f"), py::arg("tree"), py::arg("is_leaf") = py::none(),
      "map(f, tree, *rest, is_leaf=None): the tree of f(leaf, *corresponding subtrees of rest). "
      "Each tree of rest must have tree's structure, or tree's structure as a prefix: where "
      "tree has a leaf, f gets the whole subtree of the others (as JAX's tree_map). is_leaf "
      "applies to tree, as in flatten.");
  t.def(
      "register",
      [](py::handle type, py::function flatten_fn, py::function unflatten_fn) {
        if (!PyType_Check(type.ptr()))
          fail("tree.register", "not a type: got ", py::repr(type).cast<std::string>(),
               ", expected a class");
        TypeInfo info;
        info.kind = NodeKind::registered;
        info.flatten = std::move(flatten_fn);
        info.unflatten = std::move(unflatten_fn);
        add_type(type, std::move(info));
        return py::reinterpret_borrow<py::object>(type);
      },
      py::arg("type"), py::arg("flatten"), py::arg("unflatten"),
      "Makes `type` a tree node: flatten(value) -> (children, aux_data) with children an "
      "iterable of subtrees and aux_data hashable static data; unflatten(aux_data, children) "
      "rebuilds the value. Returns `type`.");
}

}  // namespace kiln::python
