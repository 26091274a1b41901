// InvertedDoublePendulum-v5: Gymnasium's cart with two stacked poles to keep upright.
#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct InvertedDoublePendulum {
  using Obs = double;
  using Act = float;
  enum Info { kSurvive, kDistance, kVelocity };

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("inverted_double_pendulum.xml", 5);
    o.push_back({"healthy_reward", 10.0, "Reward for every step the tip is above y = 1."});
    o.push_back({"reset_noise_scale", 0.1, "Scale of the reset noise on qpos and qvel."});
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    if (m->nq != 3 || m->nv != 3 || m->nsite < 1)
      throw std::invalid_argument("InvertedDoublePendulum needs nq = nv = 3 and a tip site");
    return mj::MakeSpec(m.get(), 9, {"reward_survive", "distance_penalty", "velocity_penalty"},
                        9100.0);
  }

  explicit InvertedDoublePendulum(const Config& cfg)
      : sim_(cfg), healthy_reward_(cfg.Float("healthy_reward")), noise_(cfg.Float("reset_noise_scale")) {
    sim_.post_constraint = false;  // cfrc_ext is not used
    Spec(cfg);  // checks the model's shape
  }

  void Reset(Rng& rng, Obs* obs, double*) {
    sim_.ResetNoisy(rng, noise_, /*normal_qvel=*/true);
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    sim_.Simulate(action);
    const double x = sim_.d->site_xpos[0], y = sim_.d->site_xpos[2];
    Write(obs);
    const bool terminated = y <= 1;
    const double v1 = sim_.d->qvel[1], v2 = sim_.d->qvel[2];
    const double dist = 0.01 * (x * x) + (y - 2) * (y - 2);
    const double vel = 0.001 * (v1 * v1) + 0.005 * (v2 * v2);
    const double alive = terminated ? 0.0 : healthy_reward_;
    info[kSurvive] = alive;
    info[kDistance] = -dist;
    info[kVelocity] = -vel;
    return {alive - dist - vel, terminated};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  void Write(Obs* o) const {
    const double* q = sim_.d->qpos;
    o[0] = q[0];
    o[1] = std::sin(q[1]);
    o[2] = std::sin(q[2]);
    o[3] = std::cos(q[1]);
    o[4] = std::cos(q[2]);
    mj::PutClipped(o + 5, sim_.d->qvel, 3, -10.0, 10.0);
    o[8] = std::min(std::max(sim_.d->qfrc_constraint[0], -10.0), 10.0);
  }

  mj::Sim sim_;
  double healthy_reward_, noise_;
};

ONEBOX_REGISTER_ENV(InvertedDoublePendulum, "InvertedDoublePendulum-v5");

}  // namespace onebox
