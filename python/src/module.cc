// atoll._atoll: the Python binding of the C API (include/atoll/c_api.h). The Python package
// (python/atoll/__init__.py) turns torch tensors and numpy arrays into float32 numpy views and
// calls this module; here every view is checked (float32, C-contiguous, writable, aligned) and
// kept alive for the learner's lifetime, so the C API writes merged fragments straight into the
// caller's memory. Every atoll error becomes a Python exception; no C++ exception or abort
// reaches the interpreter for bad input.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "atoll/c_api.h"

namespace py = pybind11;

namespace {

struct Refused {};
// atoll.RefusedError, created at import and never freed (no Python call after finalisation).
py::exception<Refused>* refused_error = nullptr;

[[noreturn]] void Raise(atoll_status st) {
  const std::string msg = atoll_last_error();
  switch (st) {
    case ATOLL_INVALID_ARGUMENT: throw py::value_error(msg);
    case ATOLL_UNAVAILABLE:
    case ATOLL_DEADLINE_EXCEEDED: PyErr_SetString(PyExc_ConnectionError, msg.c_str()); break;
    case ATOLL_PERMISSION_DENIED:
    case ATOLL_UNAUTHENTICATED: PyErr_SetString(PyExc_PermissionError, msg.c_str()); break;
    case ATOLL_NOT_FOUND: PyErr_SetString(PyExc_FileNotFoundError, msg.c_str()); break;
    case ATOLL_FAILED_PRECONDITION: PyErr_SetString(refused_error->ptr(), msg.c_str()); break;
    default: PyErr_SetString(PyExc_RuntimeError, msg.c_str()); break;
  }
  throw py::error_already_set();
}

// One parameter handed in from Python: its name, a float32 view of its memory, embedding flag.
struct Param {
  std::string name;
  py::array array;
  bool is_embedding = false;
  std::vector<int64_t> shape;
};

Param CheckParam(const py::tuple& t) {
  if (t.size() != 3) throw py::value_error("each parameter is (name, float32 array, is_embedding)");
  Param p{t[0].cast<std::string>(), py::reinterpret_borrow<py::object>(t[1]).cast<py::array>(), t[2].cast<bool>(), {}};
  const py::array& a = p.array;
  if (!a.dtype().is(py::dtype::of<float>())) {
    throw py::value_error("parameter '" + p.name + "' is " + std::string(py::str(a.dtype())) + ", not float32");
  }
  const int flags = py::array::c_style;
  if ((a.flags() & flags) != flags) throw py::value_error("parameter '" + p.name + "' is not C-contiguous");
  if (!a.writeable()) throw py::value_error("parameter '" + p.name + "' is read-only");
  if (reinterpret_cast<uintptr_t>(a.data()) % alignof(float) != 0) {
    throw py::value_error("parameter '" + p.name + "' is not aligned to 4 bytes");
  }
  for (py::ssize_t d = 0; d < a.ndim(); ++d) p.shape.push_back(a.shape(d));
  return p;
}

template <typename T>
std::optional<T> Get(const py::dict& d, const char* key) {
  if (!d.contains(key) || d[key].is_none()) return std::nullopt;
  return d[key].cast<T>();
}

class Learner {
 public:
  Learner(const py::dict& options, const py::list& params) {
    for (const auto& item : params) params_.push_back(CheckParam(item.cast<py::tuple>()));
    atoll_learner_options o;
    atoll_learner_options_init(&o);
    Strings(options, o);
    if (auto v = Get<int>(options, "learner_id")) o.learner_id = *v;
    if (auto v = Get<int>(options, "fragments")) o.fragments = *v;
    if (auto v = Get<int>(options, "H")) o.H = *v;
    if (auto v = Get<int>(options, "tau")) o.tau = *v;
    if (auto v = Get<double>(options, "alpha")) o.alpha = *v;
    if (auto v = Get<bool>(options, "keep_progress")) o.keep_progress = *v ? 1 : 0;
    if (auto v = Get<double>(options, "join_timeout_s")) o.join_timeout_s = *v;
    if (auto v = Get<bool>(options, "rejoin")) o.rejoin = *v ? 1 : 0;
    std::vector<atoll_param> cp;
    for (auto& p : params_) {
      cp.push_back({p.name.c_str(), static_cast<float*>(p.array.mutable_data()), p.shape.data(),
                    static_cast<int>(p.shape.size()), p.is_embedding ? 1 : 0});
    }
    atoll_status st;
    {
      py::gil_scoped_release release;  // the join waits on the network
      st = atoll_learner_open(&o, cp.data(), cp.size(), &handle_);
    }
    if (st != ATOLL_OK) Raise(st);
  }
  ~Learner() {
    if (handle_ == nullptr) return;
    py::gil_scoped_release release;
    atoll_learner_close(handle_, 0.0);
  }

  int Step(int64_t tokens, double loss) {
    atoll_status st;
    int applied = 0;
    {
      py::gil_scoped_release release;  // diloco mode waits at the barrier
      st = atoll_learner_step(Handle(), tokens, loss, &applied);
    }
    if (st != ATOLL_OK) Raise(st);
    return applied;
  }

  void Close(double flush_timeout_s) {
    atoll_learner* h = handle_;
    handle_ = nullptr;
    if (h == nullptr) return;
    atoll_status st;
    {
      py::gil_scoped_release release;
      st = atoll_learner_close(h, flush_timeout_s);
    }
    if (st != ATOLL_OK) Raise(st);
  }

  bool closed() const { return handle_ == nullptr; }
  bool FinishRequested() { return atoll_learner_finish_requested(Handle()) != 0; }

  py::dict Counters() {
    atoll_learner_counters k;
    if (atoll_status st = atoll_learner_counters_get(Handle(), &k); st != ATOLL_OK) Raise(st);
    py::dict d;
    d["steps"] = k.steps;
    d["pushes"] = k.pushes;
    d["pushes_failed"] = k.pushes_failed;
    d["pulls"] = k.pulls;
    d["fragments_applied"] = k.fragments_applied;
    d["joins"] = k.joins;
    d["catchup_fragments"] = k.catchup_fragments;
    d["payload_bytes_up"] = k.payload_bytes_up;
    d["payload_bytes_down"] = k.payload_bytes_down;
    d["version_held"] = k.version_held;
    d["learner_id"] = k.learner_id;
    d["joined"] = k.joined != 0;
    return d;
  }

  // The addresses the C API reads and writes, one per parameter (for tests: no copies).
  std::vector<uintptr_t> Addresses() const {
    std::vector<uintptr_t> a;
    for (const auto& p : params_) a.push_back(reinterpret_cast<uintptr_t>(p.array.data()));
    return a;
  }

 private:
  atoll_learner* Handle() const {
    if (handle_ == nullptr) throw py::value_error("this learner is closed");
    return handle_;
  }

  void Strings(const py::dict& options, atoll_learner_options& o) {
    const std::pair<const char*, const char**> fields[] = {
        {"syncer", &o.syncer}, {"run_id", &o.run_id}, {"token", &o.token}, {"token_file", &o.token_file},
        {"tls_ca", &o.tls_ca_file}, {"tls_server_name", &o.tls_server_name}, {"tls_cert", &o.tls_cert_file},
        {"tls_key", &o.tls_key_file}, {"mode", &o.mode}, {"plan", &o.plan}};
    strings_.reserve(std::size(fields));  // the pointers below must not move
    for (const auto& [key, field] : fields) {
      if (auto v = Get<std::string>(options, key)) {
        strings_.push_back(*v);
        *field = strings_.back().c_str();
      }
    }
  }

  std::vector<Param> params_;
  std::vector<std::string> strings_;
  atoll_learner* handle_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_atoll, m) {
  m.doc() = "atoll's C API for Python (use the atoll package, not this module)";
  refused_error = new py::exception<Refused>(m, "RefusedError", PyExc_RuntimeError);
  py::class_<Learner>(m, "Learner")
      .def(py::init<const py::dict&, const py::list&>(), py::arg("options"), py::arg("params"))
      .def("step", &Learner::Step, py::arg("tokens"), py::arg("loss"))
      .def("close", &Learner::Close, py::arg("flush_timeout_s"))
      .def_property_readonly("closed", &Learner::closed)
      .def("finish_requested", &Learner::FinishRequested)
      .def("counters", &Learner::Counters)
      .def("addresses", &Learner::Addresses);
}
