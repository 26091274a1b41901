// InvertedPendulum-v5: Gymnasium's cart-pole in MuJoCo; +1 per step while the pole is upright.
#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct InvertedPendulum {
  using Obs = double;
  using Act = float;

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("inverted_pendulum.xml", 2);
    o.push_back({"reset_noise_scale", 0.01, "Half-width of the uniform reset noise."});
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    if (m->nq + m->nv != 4) throw std::invalid_argument("InvertedPendulum needs nq + nv = 4");
    return mj::MakeSpec(m.get(), 4, {"reward_survive"}, 950.0);
  }

  explicit InvertedPendulum(const Config& cfg) : sim_(cfg), noise_(cfg.Float("reset_noise_scale")) {
    sim_.post_constraint = false;  // cfrc_ext is not used
    Spec(cfg);  // checks the model's shape
  }

  void Reset(Rng& rng, Obs* obs, double*) {
    sim_.ResetNoisy(rng, noise_, /*normal_qvel=*/false);
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    sim_.Simulate(action);
    Write(obs);
    bool terminated = std::abs(obs[1]) > 0.2;
    for (int i = 0; i < 4; ++i) terminated = terminated || !std::isfinite(obs[i]);
    const double reward = terminated ? 0.0 : 1.0;
    info[0] = reward;
    return {reward, terminated};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  void Write(Obs* o) const { mj::Put(mj::Put(o, sim_.d->qpos, sim_.m->nq), sim_.d->qvel, sim_.m->nv); }

  mj::Sim sim_;
  double noise_;
};

ONEBOX_REGISTER_ENV(InvertedPendulum, "InvertedPendulum-v5");

}  // namespace onebox
