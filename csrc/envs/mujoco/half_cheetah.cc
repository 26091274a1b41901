// HalfCheetah-v5: Gymnasium's planar cheetah, rewarded for running forward.
#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct HalfCheetah {
  using Obs = double;
  using Act = float;
  enum Info { kX, kXVel, kForward, kCtrl };

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("half_cheetah.xml", 5);
    o.push_back({"forward_reward_weight", 1.0, "Weight of the forward velocity reward."});
    o.push_back({"ctrl_cost_weight", 0.1, "Weight of the control cost sum(action^2)."});
    o.push_back({"reset_noise_scale", 0.1, "Scale of the reset noise on qpos and qvel."});
    o.push_back({"exclude_current_positions_from_observation", true,
                 "Leave the x position out of the observation."});
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    const bool exclude = cfg.Bool("exclude_current_positions_from_observation");
    return mj::MakeSpec(m.get(), m->nq + m->nv - exclude,
                        {"x_position", "x_velocity", "reward_forward", "reward_ctrl"}, 4800.0);
  }

  explicit HalfCheetah(const Config& cfg)
      : sim_(cfg),
        forward_weight_(cfg.Float("forward_reward_weight")),
        ctrl_weight_(cfg.Float("ctrl_cost_weight")),
        noise_(cfg.Float("reset_noise_scale")),
        skip_(cfg.Bool("exclude_current_positions_from_observation") ? 1 : 0) {
    sim_.post_constraint = false;  // cfrc_ext is not used
  }

  void Reset(Rng& rng, Obs* obs, double* info) {
    sim_.ResetNoisy(rng, noise_, /*normal_qvel=*/true);
    Write(obs);
    info[kX] = sim_.d->qpos[0];
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    const double x_before = sim_.d->qpos[0];
    sim_.Simulate(action);
    const double x_after = sim_.d->qpos[0];
    const double x_velocity = (x_after - x_before) / sim_.dt();
    Write(obs);
    const double forward = forward_weight_ * x_velocity;
    const double ctrl = mj::ActionCost(ctrl_weight_, action, sim_.m->nu);
    info[kX] = x_after;
    info[kXVel] = x_velocity;
    info[kForward] = forward;
    info[kCtrl] = -ctrl;
    return {forward - ctrl, false};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  void Write(Obs* o) const {
    o = mj::Put(o, sim_.d->qpos + skip_, sim_.m->nq - skip_);
    mj::Put(o, sim_.d->qvel, sim_.m->nv);
  }

  mj::Sim sim_;
  double forward_weight_, ctrl_weight_, noise_;
  int skip_;
};

ONEBOX_REGISTER_ENV(HalfCheetah, "HalfCheetah-v5");

}  // namespace onebox
