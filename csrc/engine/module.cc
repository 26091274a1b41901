// Python bindings of the engine: module onebox._engine, or, compiled again with the MuJoCo envs,
// onebox._mujoco (ONEBOX_MODULE_NAME). The Python layer (onebox.envs.native) does
// argument checking with friendly messages; this layer checks again what would be unsafe.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "engine/atari_ledger.h"
#include "engine/registry.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace onebox {
namespace {

using Array = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

nb::dlpack::dtype ToDl(DType d) {
  switch (d) {
    case DType::kBool: return nb::dtype<bool>();
    case DType::kUInt8: return nb::dtype<uint8_t>();
    case DType::kInt32: return nb::dtype<int32_t>();
    case DType::kInt64: return nb::dtype<int64_t>();
    case DType::kFloat32: return nb::dtype<float>();
    case DType::kFloat64: return nb::dtype<double>();
  }
  throw std::logic_error("bad dtype");
}

int NpyType(DType d) {
  switch (d) {
    case DType::kBool: return NPY_BOOL;
    case DType::kUInt8: return NPY_UINT8;
    case DType::kInt32: return NPY_INT32;
    case DType::kInt64: return NPY_INT64;
    case DType::kFloat32: return NPY_FLOAT32;
    case DType::kFloat64: return NPY_FLOAT64;
  }
  throw std::logic_error("bad dtype");
}

const char* DTypeName(DType d) {
  static const char* names[] = {"bool", "uint8", "int32", "int64", "float32", "float64"};
  return names[static_cast<int>(d)];
}

nb::dict SpaceDict(const Space& s) {
  nb::dict d;
  d["discrete"] = s.discrete;
  d["n"] = s.n;
  d["shape"] = nb::tuple(nb::cast(s.shape));
  d["dtype"] = DTypeName(s.dtype);
  d["low"] = s.low;
  d["high"] = s.high;
  return d;
}

nb::dict SpecDict(const EnvSpec& spec) {
  nb::dict d;
  d["observation"] = SpaceDict(spec.observation);
  d["action"] = SpaceDict(spec.action);
  d["max_episode_steps"] = spec.max_episode_steps;
  d["reward_threshold"] = spec.reward_threshold;
  d["info_keys"] = spec.info_keys;
  return d;
}

// Numpy views of a result set; each view keeps the engine alive.
nb::dict Views(Engine& e, ResultBuffers& r) {
  nb::handle owner = nb::find(&e);
  auto view = [&](Buffer& b) {
    return nb::ndarray<nb::numpy>(b.bytes.data(), b.shape.size(), b.shape.data(), owner, nullptr,
                                  ToDl(b.dtype))
        .cast();
  };
  nb::dict d;
  d["obs"] = view(r.obs);
  d["reward"] = view(r.reward);
  d["terminated"] = view(r.terminated);
  d["truncated"] = view(r.truncated);
  d["info"] = view(r.info);
  d["final_obs"] = view(r.final_obs);
  d["final_info"] = view(r.final_info);
  d["final"] = view(r.final);
  d["env_id"] = view(r.env_id);
  return d;
}

// Check an action array against the action space for `rows` envs.
void CheckActions(const Engine& e, const Array& a, size_t rows) {
  const Space& s = e.spec().action;
  std::vector<size_t> want{rows};
  if (!s.discrete)
    for (int64_t d : s.shape) want.push_back(static_cast<size_t>(d));
  bool ok = a.ndim() == want.size();
  for (size_t k = 0; ok && k < want.size(); ++k) ok = a.shape(k) == want[k];
  if (!ok) throw std::invalid_argument("actions have the wrong shape for this env pool");
  if (a.dtype() != ToDl(s.dtype))
    throw std::invalid_argument(std::string("actions must have dtype ") + DTypeName(s.dtype));
}

// Whether `a` is an array that a step reads as it is: an ndarray (not a subclass), C-contiguous,
// of the action dtype, with `rows` rows of the action's shape (as onebox.envs.native takes it).
bool ReadyActions(const Engine& e, nb::handle a, size_t rows) {
  if (!PyArray_CheckExact(a.ptr())) return false;
  auto* arr = reinterpret_cast<PyArrayObject*>(a.ptr());
  const Space& s = e.spec().action;
  const int ndim = 1 + (s.discrete ? 0 : static_cast<int>(s.shape.size()));
  if (!PyArray_IS_C_CONTIGUOUS(arr) || PyArray_NDIM(arr) != ndim ||
      static_cast<size_t>(PyArray_DIM(arr, 0)) != rows)
    return false;
  for (int k = 1; k < ndim; ++k)
    if (PyArray_DIM(arr, k) != s.shape[k - 1]) return false;
  PyArray_Descr* want = PyArray_DescrFromType(NpyType(s.dtype));
  const bool same = PyArray_EquivTypes(PyArray_DESCR(arr), want);
  Py_DECREF(want);
  return same;
}

// A new numpy array of `b`'s dtype and shape.
nb::object NewArray(const Buffer& b) {
  npy_intp dims[NPY_MAXDIMS];
  std::copy(b.shape.begin(), b.shape.end(), dims);
  PyObject* a = PyArray_SimpleNew(static_cast<int>(b.shape.size()), dims, NpyType(b.dtype));
  if (!a) throw nb::python_error();
  return nb::steal(a);
}

// Engine::Step into new arrays: (obs, reward, terminated, truncated), the observations written
// there by the envs; None if `actions` is not ReadyActions (convert it and call again).
nb::object StepCopy(Engine& e, nb::handle actions) {
  if (!ReadyActions(e, actions, e.options().num_envs)) return nb::none();
  ResultBuffers& r = e.per_env();
  nb::object obs = NewArray(r.obs);
  {
    nb::gil_scoped_release release;
    e.Step(PyArray_DATA(reinterpret_cast<PyArrayObject*>(actions.ptr())),
           PyArray_DATA(reinterpret_cast<PyArrayObject*>(obs.ptr())));
  }
  auto copy = [](const Buffer& b) {
    nb::object a = NewArray(b);
    std::memcpy(PyArray_DATA(reinterpret_cast<PyArrayObject*>(a.ptr())), b.bytes.data(),
                b.bytes.size());
    return a;
  };
  return nb::make_tuple(obs, copy(r.reward), copy(r.terminated), copy(r.truncated));
}

std::unique_ptr<Engine> Make(const std::string& id, const std::map<std::string, Value>& config,
                             int num_envs, int batch_size, int num_threads, int affinity,
                             int autoreset, int64_t max_episode_steps, uint64_t seed) {
  if (autoreset < 0 || autoreset > static_cast<int>(Autoreset::kDisabled))
    throw std::invalid_argument("autoreset must be 0 (NextStep), 1 (SameStep) or 2 (Disabled)");
  const EnvEntry& entry = Registry::Get().Find(id);
  const Config cfg(config);
  const EnvSpec spec = entry.spec(cfg);
  EngineOptions opt;
  opt.num_envs = num_envs;
  opt.batch_size = batch_size;
  opt.num_threads = num_threads;
  opt.thread_affinity_offset = affinity;
  opt.autoreset = static_cast<Autoreset>(autoreset);
  opt.max_episode_steps = max_episode_steps;
  opt.seed = seed;
  return entry.make(cfg, spec, opt);
}

using Weights = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Vector = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

using Sums = nb::ndarray<double, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

nb::tuple Rollout(Engine& e, const Weights& w, int hidden, const std::optional<Vector>& mean,
                  const std::optional<Vector>& std, int64_t max_steps,
                  const std::vector<uint64_t>& seeds, double obs_clip, bool squash,
                  std::optional<Sums> obs_sums) {
  if (hidden < 0) throw std::invalid_argument("hidden must be >= 0");
  const size_t n = static_cast<size_t>(e.options().num_envs);
  const size_t params = static_cast<size_t>(e.PolicyParams(hidden));
  if (w.shape(0) != n || w.shape(1) != params)
    throw std::invalid_argument("weights must have shape (" + std::to_string(n) + ", " +
                                std::to_string(params) + ")");
  const size_t obs = static_cast<size_t>(e.spec().observation.Size());
  for (const auto* v : {&mean, &std})
    if (v->has_value() && (*v)->shape(0) != obs)
      throw std::invalid_argument("obs_mean and obs_std must have shape (" + std::to_string(obs) +
                                  ",)");
  if (obs_sums && (obs_sums->shape(0) != n || obs_sums->shape(1) != 2 || obs_sums->shape(2) != obs))
    throw std::invalid_argument("obs_sums must have shape (" + std::to_string(n) + ", 2, " +
                                std::to_string(obs) + ")");
  if (!(obs_clip >= 0)) throw std::invalid_argument("obs_clip must be >= 0");
  RolloutPolicy p;
  p.weights = w.data();
  p.obs_clip = obs_clip;
  p.squash = squash;
  p.obs_sums = obs_sums ? obs_sums->data() : nullptr;
  p.hidden = hidden;
  p.obs_mean = mean ? mean->data() : nullptr;
  p.obs_std = std ? std->data() : nullptr;
  p.max_steps = max_steps;
  {
    nb::gil_scoped_release release;
    e.Rollout(p, seeds);
  }
  return nb::make_tuple(e.rollout_returns(), e.rollout_lengths());
}

template <class T>
using In = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <class T>
using Out = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// AtariLedgerStep over arrays: state arrays of num_envs rows, batch and output arrays of n rows.
void AtariLedger(Out<double> game_return, Out<int64_t> game_length, Out<int32_t> lives,
                 Out<bool> game_reset, Out<bool> life_reset, In<int32_t> ids, In<int32_t> raw,
                 In<bool> terminated, In<bool> truncated, In<int32_t> new_lives,
                 Out<float> reward, Out<bool> out_terminated, Out<bool> game_over,
                 Out<bool> life_lost, Out<double> out_return, Out<int64_t> out_length,
                 bool episodic_life, bool reward_clip, bool next_step) {
  const size_t envs = game_return.shape(0), n = ids.shape(0);
  for (size_t rows : {game_length.shape(0), lives.shape(0), game_reset.shape(0),
                      life_reset.shape(0)})
    if (rows != envs) throw std::invalid_argument("atari_ledger: state arrays differ in length");
  for (size_t rows : {raw.shape(0), terminated.shape(0), truncated.shape(0), new_lives.shape(0),
                      reward.shape(0), out_terminated.shape(0), game_over.shape(0),
                      life_lost.shape(0), out_return.shape(0), out_length.shape(0)})
    if (rows != n) throw std::invalid_argument("atari_ledger: batch arrays differ in length");
  const AtariState s{game_return.data(), game_length.data(), lives.data(), game_reset.data(),
                     life_reset.data(), static_cast<int64_t>(envs)};
  const AtariBatch b{ids.data(),       raw.data(),       terminated.data(),
                     truncated.data(), new_lives.data(), static_cast<int64_t>(n)};
  const AtariOut o{reward.data(),    out_terminated.data(), game_over.data(),
                   life_lost.data(), out_return.data(),     out_length.data()};
  AtariLedgerStep(s, b, o, episodic_life, reward_clip, next_step);
}

}  // namespace
}  // namespace onebox

#ifndef ONEBOX_MODULE_NAME
#define ONEBOX_MODULE_NAME _engine
#endif

NB_MODULE(ONEBOX_MODULE_NAME, m) {
  using namespace onebox;
  m.doc() = "onebox native environment engine";
  if (_import_array() < 0) throw nb::python_error();

  // Stepping an env that needs a reset raises a subclass of Gymnasium's own error for it.
  nb::exception<ResetNeeded>(m, "ResetNeeded",
                             nb::module_::import_("gymnasium.error").attr("ResetNeeded"));

  m.def("list_envs", [] { return Registry::Get().Ids(); }, "Ids of the native envs, sorted.");
  m.def(
      "env_options",
      [](const std::string& id) {
        std::vector<std::tuple<std::string, Value, std::string>> out;
        for (const auto& o : Registry::Get().Find(id).options())
          out.emplace_back(o.name, o.default_value, o.doc);
        return out;
      },
      "id"_a, "The constructor options of a native env: (name, default, doc) tuples.");
  m.def(
      "env_spec",
      [](const std::string& id, const std::map<std::string, Value>& config) {
        return SpecDict(Registry::Get().Find(id).spec(Config(config)));
      },
      "id"_a, "config"_a, "Spaces, time limit and info keys of a native env under options.");

  m.def("atari_ledger", &AtariLedger, "game_return"_a.noconvert(), "game_length"_a.noconvert(),
        "lives"_a.noconvert(), "game_reset"_a.noconvert(), "life_reset"_a.noconvert(), "ids"_a,
        "raw_reward"_a, "terminated"_a, "truncated"_a, "new_lives"_a, "reward"_a.noconvert(),
        "out_terminated"_a.noconvert(), "game_over"_a.noconvert(), "life_lost"_a.noconvert(),
        "out_return"_a.noconvert(), "out_length"_a.noconvert(), "episodic_life"_a,
        "reward_clip"_a, "next_step"_a,
        "One batch of ALE step results through AtariEnvPool's bookkeeping (atari_ledger.h).");

  nb::class_<Engine>(m, "Engine")
      .def(nb::new_(&Make), "id"_a, "config"_a, "num_envs"_a, "batch_size"_a, "num_threads"_a,
           "thread_affinity_offset"_a, "autoreset"_a, "max_episode_steps"_a, "seed"_a)
      .def("spec", [](const Engine& e) { return SpecDict(e.spec()); })
      .def("per_env_buffers", [](Engine& e) { return Views(e, e.per_env()); })
      .def("batch_buffers", [](Engine& e) { return Views(e, e.batch()); })
      .def("reset", &Engine::Reset, "seeds"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "reset_envs",
          [](Engine& e, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> ids,
             const std::vector<uint64_t>& seeds) {
            nb::gil_scoped_release release;
            e.ResetEnvs(ids.data(), static_cast<int>(ids.shape(0)), seeds);
          },
          "env_ids"_a, "seeds"_a)
      .def_prop_ro("seeds", &Engine::seeds)
      .def("async_reset", &Engine::AsyncReset, "seeds"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "step",
          [](Engine& e, const Array& actions) {
            CheckActions(e, actions, e.options().num_envs);
            nb::gil_scoped_release release;
            e.Step(actions.data());
          },
          "actions"_a)
      .def("step_copy", &StepCopy, "actions"_a,
           "Step every env; (obs, reward, terminated, truncated) as new arrays, or None if the "
           "actions are not a C-contiguous ndarray of the action dtype and shape.")
      .def(
          "send",
          [](Engine& e, const Array& actions, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig,
                                                          nb::device::cpu> ids) {
            CheckActions(e, actions, ids.shape(0));
            nb::gil_scoped_release release;
            e.Send(actions.data(), ids.data(), static_cast<int>(ids.shape(0)));
          },
          "actions"_a, "env_ids"_a)
      .def("recv", &Engine::Recv, nb::call_guard<nb::gil_scoped_release>())
      .def("close", &Engine::Close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("closed", &Engine::closed)
      .def_prop_ro("pending", &Engine::pending)
      .def_prop_ro("step_cost_ns", &Engine::step_cost_ns)
      .def("rollout", &Rollout, "weights"_a, "hidden"_a, "obs_mean"_a.none(), "obs_std"_a.none(),
           "max_steps"_a, "seeds"_a, "obs_clip"_a, "squash"_a, "obs_sums"_a.none().noconvert())
      .def("policy_params", &Engine::PolicyParams, "hidden"_a)
      .def("get_state", &Engine::GetState, "env_id"_a)
      .def("set_state", &Engine::SetState, "env_id"_a, "state"_a);
}
