// atoll._atoll: the Python binding of the C API (include/atoll/c_api.h). The Python package
// (python/atoll/__init__.py) turns torch tensors and numpy arrays into float32 numpy views and
// calls this module; here every view is checked (float32, C-contiguous, writable, aligned) and
// kept alive for the learner's lifetime, so the C API writes merged fragments straight into the
// caller's memory. Every atoll error becomes a Python exception; no C++ exception or abort
// reaches the interpreter for bad input.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "atoll/c_api.h"

namespace py = pybind11;

namespace {

// atoll.RefusedError (a RuntimeError) and atoll.AccessRefusedError (a RefusedError and a
// PermissionError), created at import and never freed (no Python call after finalisation).
PyObject* refused_error = nullptr;
PyObject* access_refused_error = nullptr;

const char* StatusName(atoll_status st) {
  switch (st) {
    case ATOLL_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case ATOLL_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case ATOLL_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case ATOLL_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case ATOLL_UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "OTHER";
  }
}

// Raises `type(msg)` with the C status's name as its `code` attribute.
[[noreturn]] void RaiseRefused(PyObject* type, atoll_status st, const std::string& msg) {
  py::object e = py::reinterpret_borrow<py::object>(type)(msg);
  e.attr("code") = StatusName(st);
  PyErr_SetObject(type, e.ptr());
  throw py::error_already_set();
}

[[noreturn]] void Raise(atoll_status st) {
  const std::string msg = atoll_last_error();
  switch (st) {
    case ATOLL_INVALID_ARGUMENT: throw py::value_error(msg);
    case ATOLL_UNAVAILABLE:
    case ATOLL_DEADLINE_EXCEEDED: PyErr_SetString(PyExc_ConnectionError, msg.c_str()); break;
    case ATOLL_PERMISSION_DENIED:
    case ATOLL_UNAUTHENTICATED: RaiseRefused(access_refused_error, st, msg);
    case ATOLL_NOT_FOUND: PyErr_SetString(PyExc_FileNotFoundError, msg.c_str()); break;
    case ATOLL_ALREADY_EXISTS:
    case ATOLL_RESOURCE_EXHAUSTED:
    case ATOLL_FAILED_PRECONDITION: RaiseRefused(refused_error, st, msg);
    default: PyErr_SetString(PyExc_RuntimeError, msg.c_str()); break;
  }
  throw py::error_already_set();
}

// One parameter handed in from Python: its name, a float32 view of its memory (or of the host
// buffer that stages it), embedding flag, staged flag.
struct Param {
  std::string name;
  py::array array;
  bool is_embedding = false;
  bool staged = false;
  std::vector<int64_t> shape;
};

Param CheckParam(const py::tuple& t) {
  if (t.size() != 4) throw py::value_error("each parameter is (name, float32 array, is_embedding, staged)");
  Param p{t[0].cast<std::string>(),
          py::reinterpret_borrow<py::object>(t[1]).cast<py::array>(),
          t[2].cast<bool>(),
          t[3].cast<bool>(),
          {}};
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

// The settings of atoll_learner_open_ex from a dict (absent or None keys keep the defaults).
atoll_learner_settings SettingsOf(const py::dict& d, std::string& state_dir, std::vector<int>& staged) {
  atoll_learner_settings s;
  atoll_learner_settings_init(&s);
  if (auto v = Get<std::string>(d, "state_dir")) {
    state_dir = *v;
    s.state_dir = state_dir.c_str();
  }
  const std::pair<const char*, double*> numbers[] = {
      {"call_timeout_s", &s.call_timeout_s},       {"push_timeout_s", &s.push_timeout_s},
      {"min_link_mbps", &s.min_link_mbps},         {"heartbeat_s", &s.heartbeat_s},
      {"backoff_initial_s", &s.backoff_initial_s}, {"backoff_max_s", &s.backoff_max_s}};
  for (const auto& [key, field] : numbers) {
    if (auto v = Get<double>(d, key)) *field = *v;
  }
  s.staged = staged.data();
  return s;
}

class Learner {
 public:
  Learner(const py::dict& options, const py::list& params, const py::dict& settings) {
    for (const auto& item : params) params_.push_back(CheckParam(item.cast<py::tuple>()));
    std::vector<int> staged;
    for (const auto& p : params_) staged.push_back(p.staged ? 1 : 0);
    std::string state_dir;
    const atoll_learner_settings s = SettingsOf(settings, state_dir, staged);
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
      st = atoll_learner_open_ex(&o, &s, cp.data(), cp.size(), &handle_);
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

  int NumFragments() { return atoll_learner_num_fragments(Handle()); }

  // Fragment p's slices: (parameter index, offset, count) in slice order.
  std::vector<std::tuple<int, int64_t, int64_t>> FragmentSlices(int p) {
    size_t n = 0;
    atoll_learner_fragment_slices(Handle(), p, nullptr, 0, &n);  // the count (or the error below)
    std::vector<atoll_slice> slices(n);
    if (atoll_status st = atoll_learner_fragment_slices(Handle(), p, slices.data(), n, &n); st != ATOLL_OK) Raise(st);
    std::vector<std::tuple<int, int64_t, int64_t>> out;
    for (const auto& s : slices) out.emplace_back(s.param, s.offset, s.count);
    return out;
  }

  std::vector<int> Due() { return Fragments(atoll_learner_due); }
  std::vector<int> Sends() { return Fragments(atoll_learner_sends); }
  std::vector<int> Pending() { return Fragments(atoll_learner_pending); }

  int64_t StagedCount(int p) {
    const int64_t n = atoll_learner_staged_count(Handle(), p);
    if (n < 0) throw py::value_error("fragment " + std::to_string(p) + " is out of range");
    return n;
  }

  // The staged values of pending fragment p (float32, C-contiguous, one dimension).
  void Send(int p, const py::array_t<float, py::array::c_style | py::array::forcecast>& values) {
    if (values.ndim() != 1) throw py::value_error("the staged values of a fragment are one-dimensional");
    atoll_status st;
    {
      py::gil_scoped_release release;
      st = atoll_learner_send(Handle(), p, values.data(), static_cast<size_t>(values.size()));
    }
    if (st != ATOLL_OK) Raise(st);
  }

  // (fragment, additive) per fragment the last step (or the open) wrote, in order.
  std::vector<std::pair<int, bool>> Receipts() {
    size_t n = 0;
    atoll_learner_receipts(Handle(), nullptr, 0, &n);  // the count
    std::vector<atoll_receipt> r(n);
    if (atoll_status st = atoll_learner_receipts(Handle(), r.data(), n, &n); st != ATOLL_OK) Raise(st);
    std::vector<std::pair<int, bool>> out;
    for (size_t i = 0; i < n; ++i) out.emplace_back(r[i].fragment, r[i].kind == ATOLL_RECEIPT_ADD);
    return out;
  }

  std::string State() {
    std::string text(4096, '\0');
    for (;;) {  // the counters may grow the text between two calls
      size_t n = 0;
      const atoll_status st = atoll_learner_state_json(Handle(), text.data(), text.size(), &n);
      if (st == ATOLL_OK) {
        text.resize(n);
        return text;
      }
      if (n + 1 <= text.size()) Raise(st);
      text.assign(n + 256, '\0');
    }
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
  using ListFn = atoll_status (*)(const atoll_learner*, int*, size_t, size_t*);
  std::vector<int> Fragments(ListFn fn) {
    std::vector<int> out(static_cast<size_t>(std::max(0, atoll_learner_num_fragments(Handle()))));
    size_t n = 0;
    if (atoll_status st = fn(Handle(), out.data(), out.size(), &n); st != ATOLL_OK) Raise(st);
    out.resize(n);
    return out;
  }

  atoll_learner* Handle() const {
    if (handle_ == nullptr) throw py::value_error("this learner is closed");
    return handle_;
  }

  void Strings(const py::dict& options, atoll_learner_options& o) {
    const std::pair<const char*, const char**> fields[] = {{"syncer", &o.syncer},
                                                           {"run_id", &o.run_id},
                                                           {"token", &o.token},
                                                           {"token_file", &o.token_file},
                                                           {"tls_ca", &o.tls_ca_file},
                                                           {"tls_server_name", &o.tls_server_name},
                                                           {"tls_cert", &o.tls_cert_file},
                                                           {"tls_key", &o.tls_key_file},
                                                           {"mode", &o.mode},
                                                           {"plan", &o.plan}};
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
  refused_error = PyErr_NewExceptionWithDoc("atoll._atoll.RefusedError",
                                            "The syncer refused this learner (its code attribute says why).",
                                            PyExc_RuntimeError, nullptr);
  py::object bases = py::make_tuple(py::handle(refused_error), py::handle(PyExc_PermissionError));
  access_refused_error =
      PyErr_NewExceptionWithDoc("atoll._atoll.AccessRefusedError",
                                "The syncer refused this learner's token or credentials.", bases.ptr(), nullptr);
  m.attr("RefusedError") = py::handle(refused_error);
  m.attr("AccessRefusedError") = py::handle(access_refused_error);
  m.attr("C_API_VERSION") = atoll_c_api_version();
  py::class_<Learner>(m, "Learner")
      .def(py::init<const py::dict&, const py::list&, const py::dict&>(), py::arg("options"), py::arg("params"),
           py::arg("settings"))
      .def("step", &Learner::Step, py::arg("tokens"), py::arg("loss"))
      .def("num_fragments", &Learner::NumFragments)
      .def("fragment_slices", &Learner::FragmentSlices, py::arg("fragment"))
      .def("due", &Learner::Due)
      .def("sends", &Learner::Sends)
      .def("pending", &Learner::Pending)
      .def("staged_count", &Learner::StagedCount, py::arg("fragment"))
      .def("send", &Learner::Send, py::arg("fragment"), py::arg("values"))
      .def("receipts", &Learner::Receipts)
      .def("state", &Learner::State)
      .def("close", &Learner::Close, py::arg("flush_timeout_s"))
      .def_property_readonly("closed", &Learner::closed)
      .def("finish_requested", &Learner::FinishRequested)
      .def("counters", &Learner::Counters)
      .def("addresses", &Learner::Addresses);
}
