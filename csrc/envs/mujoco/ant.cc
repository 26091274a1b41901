// Ant-v5: Gymnasium's four-legged ant, rewarded for walking forward while healthy, with a cost on
// (clipped) external contact forces, which are also part of the observation by default.
#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct Ant {
  using Obs = double;
  using Act = float;
  enum Info { kX, kY, kDist, kXVel, kYVel, kForward, kCtrl, kContact, kSurvive };

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("ant.xml", 5);
    o.push_back({"forward_reward_weight", 1.0, "Weight of the forward velocity reward."});
    o.push_back({"ctrl_cost_weight", 0.5, "Weight of the control cost sum(action^2)."});
    o.push_back({"contact_cost_weight", 0.0005, "Weight of the contact cost sum(clipped cfrc_ext^2)."});
    o.push_back({"healthy_reward", 1.0, "Reward for every step the ant is healthy."});
    o.push_back({"main_body", int64_t{1}, "Body id whose xy displacement is the velocity."});
    o.push_back({"terminate_when_unhealthy", true, "End the episode when the ant is unhealthy."});
    o.push_back({"healthy_z_range", std::vector<double>{0.2, 1.0},
                 "Healthy range of the torso height (inclusive)."});
    o.push_back({"contact_force_range", std::vector<double>{-1.0, 1.0},
                 "Range the contact forces are clipped to."});
    o.push_back({"reset_noise_scale", 0.1, "Scale of the reset noise on qpos and qvel."});
    o.push_back({"exclude_current_positions_from_observation", true,
                 "Leave the x and y positions out of the observation."});
    o.push_back({"include_cfrc_ext_in_observation", true,
                 "Append the clipped contact forces cfrc_ext[1:] to the observation."});
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    int64_t size = m->nq + m->nv - (cfg.Bool("exclude_current_positions_from_observation") ? 2 : 0);
    if (cfg.Bool("include_cfrc_ext_in_observation")) size += 6 * (m->nbody - 1);
    return mj::MakeSpec(m.get(), size,
                        {"x_position", "y_position", "distance_from_origin", "x_velocity",
                         "y_velocity", "reward_forward", "reward_ctrl", "reward_contact",
                         "reward_survive"},
                        6000.0);
  }

  explicit Ant(const Config& cfg)
      : sim_(cfg),
        forward_weight_(cfg.Float("forward_reward_weight")),
        ctrl_weight_(cfg.Float("ctrl_cost_weight")),
        contact_weight_(cfg.Float("contact_cost_weight")),
        healthy_reward_(cfg.Float("healthy_reward")),
        main_body_(static_cast<int>(cfg.Int("main_body"))),
        terminate_(cfg.Bool("terminate_when_unhealthy")),
        z_range_(mj::Range(cfg, "healthy_z_range")),
        force_range_(mj::Range(cfg, "contact_force_range")),
        noise_(cfg.Float("reset_noise_scale")),
        skip_(cfg.Bool("exclude_current_positions_from_observation") ? 2 : 0),
        cfrc_in_obs_(cfg.Bool("include_cfrc_ext_in_observation")) {
    if (main_body_ < 0 || main_body_ >= sim_.m->nbody)
      throw std::invalid_argument("main_body must be a body id in [0, " +
                                  std::to_string(sim_.m->nbody) + ")");
  }

  void Reset(Rng& rng, Obs* obs, double* info) {
    sim_.ResetNoisy(rng, noise_, /*normal_qvel=*/true);
    Write(obs);
    const double* q = sim_.d->qpos;
    info[kX] = q[0];
    info[kY] = q[1];
    info[kDist] = mj::Norm2(q[0], q[1]);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    const double* body = sim_.BodyPos(main_body_);
    const double x_before = body[0], y_before = body[1];
    sim_.Simulate(action);
    const double x_velocity = (body[0] - x_before) / sim_.dt();
    const double y_velocity = (body[1] - y_before) / sim_.dt();
    Write(obs);
    const bool healthy = Healthy();
    const double forward = x_velocity * forward_weight_;
    const double survive = healthy ? healthy_reward_ : 0.0;
    const double ctrl = mj::ActionCost(ctrl_weight_, action, sim_.m->nu);
    const double* f = sim_.d->cfrc_ext;
    const double contact = contact_weight_ * mj::PairwiseSum<double>(6 * sim_.m->nbody, [&](size_t i) {
                             const double c = Clip(f[i]);
                             return c * c;
                           });
    const double* q = sim_.d->qpos;
    info[kX] = q[0];
    info[kY] = q[1];
    info[kDist] = mj::Norm2(q[0], q[1]);
    info[kXVel] = x_velocity;
    info[kYVel] = y_velocity;
    info[kForward] = forward;
    info[kCtrl] = -ctrl;
    info[kContact] = -contact;
    info[kSurvive] = survive;
    return {(forward + survive) - (ctrl + contact), !healthy && terminate_};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  double Clip(double v) const { return std::min(std::max(v, force_range_.first), force_range_.second); }

  bool Healthy() const {
    const mjModel* m = sim_.m;
    const mjData* d = sim_.d;
    for (int i = 0; i < m->nq; ++i)
      if (!std::isfinite(d->qpos[i])) return false;
    for (int i = 0; i < m->nv; ++i)
      if (!std::isfinite(d->qvel[i])) return false;
    return z_range_.first <= d->qpos[2] && d->qpos[2] <= z_range_.second;
  }

  void Write(Obs* o) const {
    const mjModel* m = sim_.m;
    o = mj::Put(o, sim_.d->qpos + skip_, m->nq - skip_);
    o = mj::Put(o, sim_.d->qvel, m->nv);
    if (cfrc_in_obs_)
      mj::PutClipped(o, sim_.d->cfrc_ext + 6, 6 * (m->nbody - 1), force_range_.first,
                     force_range_.second);
  }

  mj::Sim sim_;
  double forward_weight_, ctrl_weight_, contact_weight_, healthy_reward_;
  int main_body_;
  bool terminate_;
  std::pair<double, double> z_range_, force_range_;
  double noise_;
  int skip_;
  bool cfrc_in_obs_;
};

ONEBOX_REGISTER_ENV(Ant, "Ant-v5");

}  // namespace onebox
