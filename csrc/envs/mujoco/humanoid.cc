// Humanoid-v5: Gymnasium's 3D humanoid, rewarded for walking forward (its center of mass) while
// healthy. The observation holds qpos, qvel, cinert, cvel, qfrc_actuator and cfrc_ext by default.
// Gymnasium's array infos tendon_length and tendon_velocity are keys tendon_length_0, ... here.
#include <limits>

#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct Humanoid {
  using Obs = double;
  using Act = float;
  enum Info { kX, kY, kDist, kXVel, kYVel, kSurvive, kForward, kCtrl, kContact, kTendons };

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("humanoid.xml", 5);
    o.push_back({"forward_reward_weight", 1.25, "Weight of the forward velocity reward."});
    o.push_back({"ctrl_cost_weight", 0.1, "Weight of the control cost sum(ctrl^2)."});
    o.push_back({"contact_cost_weight", 5e-7, "Weight of the contact cost sum(cfrc_ext^2)."});
    o.push_back({"contact_cost_range", std::vector<double>{-kInf, 10.0},
                 "Range the contact cost is clipped to."});
    o.push_back({"healthy_reward", 5.0, "Reward for every step the humanoid is healthy."});
    o.push_back({"terminate_when_unhealthy", true, "End the episode when the humanoid is unhealthy."});
    o.push_back({"healthy_z_range", std::vector<double>{1.0, 2.0},
                 "Healthy range of the torso height (exclusive)."});
    o.push_back({"reset_noise_scale", 0.01, "Half-width of the uniform reset noise."});
    mj::BodyObs::AddOptions(&o);
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    std::vector<std::string> keys{"x_position", "y_position", "distance_from_origin",
                                  "x_velocity", "y_velocity", "reward_survive",
                                  "reward_forward", "reward_ctrl", "reward_contact"};
    mj::AddKeys(&keys, "tendon_length", m->ntendon);
    mj::AddKeys(&keys, "tendon_velocity", m->ntendon);
    return mj::MakeSpec(m.get(), mj::BodyObs(cfg).Size(m.get()), std::move(keys),
                        std::numeric_limits<double>::quiet_NaN());
  }
  explicit Humanoid(const Config& cfg)
      : sim_(cfg),
        forward_weight_(cfg.Float("forward_reward_weight")),
        ctrl_weight_(cfg.Float("ctrl_cost_weight")),
        contact_weight_(cfg.Float("contact_cost_weight")),
        contact_range_(mj::Range(cfg, "contact_cost_range")),
        healthy_reward_(cfg.Float("healthy_reward")),
        terminate_(cfg.Bool("terminate_when_unhealthy")),
        z_range_(mj::Range(cfg, "healthy_z_range")),
        noise_(cfg.Float("reset_noise_scale")),
        obs_(cfg) {
    const mjModel* m = sim_.m;
    total_mass_ = mj::PairwiseSum<double>(m->nbody, [m](size_t b) { return m->body_mass[b]; });
  }

  void Reset(Rng& rng, Obs* obs, double* info) {
    sim_.ResetNoisy(rng, noise_, /*normal_qvel=*/false);
    Write(obs);
    WritePositions(info);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    double before[2], after[2];
    MassCenter(before);
    sim_.Simulate(action);
    MassCenter(after);
    const double x_velocity = (after[0] - before[0]) / sim_.dt();
    const double y_velocity = (after[1] - before[1]) / sim_.dt();
    Write(obs);
    const mjModel* m = sim_.m;
    const mjData* d = sim_.d;
    const bool healthy = z_range_.first < d->qpos[2] && d->qpos[2] < z_range_.second;
    const double forward = forward_weight_ * x_velocity;
    const double survive = healthy ? healthy_reward_ : 0.0;
    const double ctrl = ctrl_weight_ * mj::SquaredSum(d->ctrl, m->nu);
    const double contact =
        std::min(std::max(contact_weight_ * mj::SquaredSum(d->cfrc_ext, 6 * m->nbody),
                          contact_range_.first),
                 contact_range_.second);
    WritePositions(info);
    info[kXVel] = x_velocity;
    info[kYVel] = y_velocity;
    info[kSurvive] = survive;
    info[kForward] = forward;
    info[kCtrl] = -ctrl;
    info[kContact] = -contact;
    return {(forward + survive) - (ctrl + contact), !healthy && terminate_};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  // The xy of the center of mass (Gymnasium's mass_center).
  void MassCenter(double* xy) const {
    const mjModel* m = sim_.m;
    const double* p = sim_.d->xipos;
    for (int j = 0; j < 2; ++j) {
      double s = 0.0;
      for (int b = 0; b < m->nbody; ++b) s += m->body_mass[b] * p[3 * b + j];
      xy[j] = s / total_mass_;
    }
  }

  void WritePositions(double* info) const {
    const mjData* d = sim_.d;
    const int nt = sim_.m->ntendon;
    info[kX] = d->qpos[0];
    info[kY] = d->qpos[1];
    info[kDist] = mj::Norm2(d->qpos[0], d->qpos[1]);
    std::copy(d->ten_length, d->ten_length + nt, info + kTendons);
    std::copy(d->ten_velocity, d->ten_velocity + nt, info + kTendons + nt);
  }

  void Write(Obs* o) const { obs_.Write(sim_.m, sim_.d, o); }

  mj::Sim sim_;
  double forward_weight_, ctrl_weight_, contact_weight_;
  std::pair<double, double> contact_range_;
  double healthy_reward_;
  bool terminate_;
  std::pair<double, double> z_range_;
  double noise_;
  mj::BodyObs obs_;
  double total_mass_;
};

ONEBOX_REGISTER_ENV(Humanoid, "Humanoid-v5");

}  // namespace onebox
