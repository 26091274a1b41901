// What the MuJoCo envs share: a model cache, a simulation with the semantics of Gymnasium's
// MujocoEnv (reset, set_state, do_simulation), option and spec helpers, and sums that round like
// numpy's, so that rewards match Gymnasium's v5 envs to the last bit.
#pragma once

#include <mujoco/mujoco.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/registry.h"

namespace onebox::mj {

// A compiled model, shared read-only by every env of every pool that loads the same file.
inline std::shared_ptr<const mjModel> LoadModel(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const mjModel>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto model = cache[path].lock()) return model;
  char err[1000] = "";
  mjModel* m = mj_loadXML(path.c_str(), nullptr, err, sizeof(err));
  if (!m) throw std::invalid_argument("cannot load the MuJoCo model " + path + ": " + err);
  std::shared_ptr<const mjModel> model(m, [](const mjModel* p) { mj_deleteModel(const_cast<mjModel*>(p)); });
  cache[path] = model;
  return model;
}

// numpy's pairwise summation of n values at(0..n-1) (np.sum of a contiguous array).
template <class T, class F>
T PairwiseSum(size_t n, const F& at, size_t off = 0) {
  if (n < 8) {
    T res = 0;
    for (size_t i = 0; i < n; ++i) res += at(off + i);
    return res;
  }
  if (n <= 128) {
    T r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = at(off + j);
    size_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (size_t j = 0; j < 8; ++j) r[j] += at(off + i + j);
    T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += at(off + i);
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return PairwiseSum<T>(n2, at, off) + PairwiseSum<T>(n - n2, at, off + n2);
}

// np.sum(np.square(a)) of a float32 action.
inline float SquaredSum(const float* a, size_t n) {
  return PairwiseSum<float>(n, [a](size_t i) { return a[i] * a[i]; });
}

// np.sum(np.square(a)) of float64 values.
inline double SquaredSum(const double* a, size_t n) {
  return PairwiseSum<double>(n, [a](size_t i) { return a[i] * a[i]; });
}

// `weight * np.sum(np.square(action))` of a float32 action: NumPy 2 computes it in float32.
inline double ActionCost(double weight, const float* action, size_t n) {
  return static_cast<float>(weight) * SquaredSum(action, n);
}

inline double Norm2(double x, double y) { return std::sqrt(x * x + y * y); }
inline double Norm3(const double* a, const double* b) {
  const double x = a[0] - b[0], y = a[1] - b[1], z = a[2] - b[2];
  return std::sqrt(x * x + y * y + z * z);
}

// A (min, max) tuple option.
inline std::pair<double, double> Range(const Config& cfg, const std::string& key) {
  const std::vector<double>& v = cfg.Floats(key);
  if (v.size() != 2) throw std::invalid_argument(key + " must be a (min, max) pair");
  return {v[0], v[1]};
}

// The options every MuJoCo env has, with its model file and frame skip as defaults.
inline std::vector<OptionDecl> BaseOptions(const char* xml_file, int64_t frame_skip) {
  return {{"xml_file", std::string(xml_file),
           "MuJoCo model: a file name in Gymnasium's mujoco assets folder, or a path."},
          {"frame_skip", frame_skip, "MuJoCo steps per env step (dt = timestep * frame_skip)."}};
}

// The model named by a config's xml_file.
inline std::shared_ptr<const mjModel> ModelOf(const Config& cfg) {
  return LoadModel(cfg.Str("xml_file"));
}

// A spec with a float64 observation of obs_size, the model's actuator ranges as a float32 Box,
// Gymnasium's time limit (1000 unless given) and threshold.
inline EnvSpec MakeSpec(const mjModel* m, int64_t obs_size, std::vector<std::string> info_keys,
                        double reward_threshold, int64_t max_episode_steps = 1000) {
  EnvSpec s;
  s.observation = Space::Box({obs_size}, DType::kFloat64, -kInf, kInf);
  std::vector<double> low(m->nu), high(m->nu);
  for (int i = 0; i < m->nu; ++i) {  // Gymnasium casts the ranges to float32
    low[i] = static_cast<float>(m->actuator_ctrlrange[2 * i]);
    high[i] = static_cast<float>(m->actuator_ctrlrange[2 * i + 1]);
  }
  s.action = Space::Box({m->nu}, DType::kFloat32, std::move(low), std::move(high));
  s.max_episode_steps = max_episode_steps;
  s.reward_threshold = reward_threshold;
  s.info_keys = std::move(info_keys);
  return s;
}

// `name_0 .. name_{n-1}`: an array-valued Gymnasium info as scalar info keys.
inline void AddKeys(std::vector<std::string>* keys, const std::string& name, int n) {
  for (int i = 0; i < n; ++i) keys->push_back(name + "_" + std::to_string(i));
}

// One MuJoCo simulation with Gymnasium's MujocoEnv semantics.
class Sim {
 public:
  explicit Sim(const Config& cfg)
      : model_(ModelOf(cfg)), frame_skip_(cfg.Int("frame_skip")), data_(mj_makeData(model_.get())) {
    if (frame_skip_ < 1) throw std::invalid_argument("frame_skip must be >= 1");
    if (!data_) throw std::runtime_error("MuJoCo could not allocate mjData");
    m = model_.get();
    d = data_.get();
    init_qpos.assign(d->qpos, d->qpos + m->nq);
    init_qvel.assign(d->qvel, d->qvel + m->nv);
  }

  double dt() const { return m->opt.timestep * static_cast<double>(frame_skip_); }

  // MujocoEnv.reset: mj_resetData; the env then draws qpos, qvel and calls SetState.
  void ResetData() { mj_resetData(m, d); }

  // The reset most v5 envs use: mj_resetData, qpos = init + U(-scale, scale), then
  // qvel = init + U(-scale, scale) (or + scale * N(0, 1) with `normal_qvel`), in this draw
  // order, written in place (no allocation), then mj_forward as set_state.
  void ResetNoisy(Rng& rng, double scale, bool normal_qvel) {
    mj_resetData(m, d);
    for (int i = 0; i < m->nq; ++i) d->qpos[i] = init_qpos[i] + rng.Uniform(-scale, scale);
    for (int i = 0; i < m->nv; ++i)
      d->qvel[i] = init_qvel[i] + (normal_qvel ? scale * rng.Normal() : rng.Uniform(-scale, scale));
    mj_forward(m, d);
  }

  // MujocoEnv.set_state.
  void SetState(const double* qpos, const double* qvel) {
    std::copy(qpos, qpos + m->nq, d->qpos);
    std::copy(qvel, qvel + m->nv, d->qvel);
    mj_forward(m, d);
  }

  // MujocoEnv.do_simulation: ctrl = action, frame_skip mj_steps, then mj_rnePostConstraint,
  // which only computes outputs (cacc, cfrc_int, cfrc_ext): envs that do not read them skip it.
  void Simulate(const float* action) {
    for (int i = 0; i < m->nu; ++i) d->ctrl[i] = static_cast<double>(action[i]);
    for (int64_t k = 0; k < frame_skip_; ++k) mj_step(m, d);
    if (post_constraint) mj_rnePostConstraint(m, d);
  }

  // (qpos, qvel), for tests and debugging.
  std::vector<double> GetState() const {
    std::vector<double> s(d->qpos, d->qpos + m->nq);
    s.insert(s.end(), d->qvel, d->qvel + m->nv);
    return s;
  }
  void SetState(const std::vector<double>& s) {
    if (s.size() != static_cast<size_t>(m->nq + m->nv))
      throw std::invalid_argument("this MuJoCo env's state is qpos then qvel: " +
                                  std::to_string(m->nq + m->nv) + " values");
    SetState(s.data(), s.data() + m->nq);
  }

  int BodyId(const char* name) const {
    const int id = mj_name2id(m, mjOBJ_BODY, name);
    if (id < 0) throw std::invalid_argument(std::string("the MuJoCo model has no body ") + name);
    return id;
  }
  const double* BodyPos(int body) const { return d->xpos + 3 * body; }

  const mjModel* m = nullptr;
  mjData* d = nullptr;
  bool post_constraint = true;  // run mj_rnePostConstraint after each step (for cfrc_ext)
  std::vector<double> init_qpos, init_qvel;

 private:
  struct DataDeleter {
    void operator()(mjData* p) const { mj_deleteData(p); }
  };
  std::shared_ptr<const mjModel> model_;
  int64_t frame_skip_;
  std::unique_ptr<mjData, DataDeleter> data_;
};

// Observation writers: each appends to o and returns the end.
template <class T>
T* Put(T* o, const double* v, int n) {
  return std::copy(v, v + n, o);
}
template <class T>
T* PutClipped(T* o, const double* v, int n, double lo, double hi) {
  for (int i = 0; i < n; ++i) *o++ = std::min(std::max(v[i], lo), hi);
  return o;
}

// Humanoid's and HumanoidStandup's observation: qpos (without x, y by default), qvel, then the
// optional cinert[1:], cvel[1:], qfrc_actuator[6:] and cfrc_ext[1:].
struct BodyObs {
  explicit BodyObs(const Config& cfg)
      : skip(cfg.Bool("exclude_current_positions_from_observation") ? 2 : 0),
        cinert(cfg.Bool("include_cinert_in_observation")),
        cvel(cfg.Bool("include_cvel_in_observation")),
        qfrc_actuator(cfg.Bool("include_qfrc_actuator_in_observation")),
        cfrc_ext(cfg.Bool("include_cfrc_ext_in_observation")) {}

  static void AddOptions(std::vector<OptionDecl>* o) {
    o->push_back({"exclude_current_positions_from_observation", true,
                  "Leave the x and y positions out of the observation."});
    o->push_back({"include_cinert_in_observation", true, "Observe the bodies' cinert[1:]."});
    o->push_back({"include_cvel_in_observation", true, "Observe the bodies' cvel[1:]."});
    o->push_back({"include_qfrc_actuator_in_observation", true, "Observe qfrc_actuator[6:]."});
    o->push_back({"include_cfrc_ext_in_observation", true, "Observe the bodies' cfrc_ext[1:]."});
  }

  int64_t Size(const mjModel* m) const {
    const int64_t bodies = m->nbody - 1;
    return m->nq - skip + m->nv + (cinert ? 10 * bodies : 0) + (cvel ? 6 * bodies : 0) +
           (qfrc_actuator ? m->nv - 6 : 0) + (cfrc_ext ? 6 * bodies : 0);
  }

  void Write(const mjModel* m, const mjData* d, double* o) const {
    const int bodies = m->nbody - 1;
    o = Put(o, d->qpos + skip, m->nq - skip);
    o = Put(o, d->qvel, m->nv);
    if (cinert) o = Put(o, d->cinert + 10, 10 * bodies);
    if (cvel) o = Put(o, d->cvel + 6, 6 * bodies);
    if (qfrc_actuator) o = Put(o, d->qfrc_actuator + 6, m->nv - 6);
    if (cfrc_ext) Put(o, d->cfrc_ext + 6, 6 * bodies);
  }

  int skip;
  bool cinert, cvel, qfrc_actuator, cfrc_ext;
};

}  // namespace onebox::mj
