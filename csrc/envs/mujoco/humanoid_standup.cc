// HumanoidStandup-v5: Gymnasium's humanoid lying on the ground, rewarded for raising its torso.
// Gymnasium's array infos tendon_length and tendon_velocity are keys tendon_length_0, ... here.
#include <limits>

#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct HumanoidStandup {
  using Obs = double;
  using Act = float;
  enum Info { kX, kY, kZ, kLinup, kQuadctrl, kImpact, kTendons };

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("humanoidstandup.xml", 5);
    o.push_back({"uph_cost_weight", 1.0, "Accepted and unused, as in Gymnasium v5."});
    o.push_back({"ctrl_cost_weight", 0.1, "Weight of the control cost sum(ctrl^2)."});
    o.push_back({"impact_cost_weight", 5e-7, "Weight of the impact cost sum(cfrc_ext^2)."});
    o.push_back({"impact_cost_range", std::vector<double>{-kInf, 10.0},
                 "Range the impact cost is clipped to."});
    o.push_back({"reset_noise_scale", 0.01, "Half-width of the uniform reset noise."});
    mj::BodyObs::AddOptions(&o);
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    std::vector<std::string> keys{"x_position",  "y_position",      "z_distance_from_origin",
                                  "reward_linup", "reward_quadctrl", "reward_impact"};
    mj::AddKeys(&keys, "tendon_length", m->ntendon);
    mj::AddKeys(&keys, "tendon_velocity", m->ntendon);
    return mj::MakeSpec(m.get(), mj::BodyObs(cfg).Size(m.get()), std::move(keys), std::numeric_limits<double>::quiet_NaN());
  }

  explicit HumanoidStandup(const Config& cfg)
      : sim_(cfg),
        ctrl_weight_(cfg.Float("ctrl_cost_weight")),
        impact_weight_(cfg.Float("impact_cost_weight")),
        impact_range_(mj::Range(cfg, "impact_cost_range")),
        noise_(cfg.Float("reset_noise_scale")),
        obs_(cfg) {}

  void Reset(Rng& rng, Obs* obs, double* info) {
    sim_.ResetNoisy(rng, noise_, /*normal_qvel=*/false);
    Write(obs);
    WritePositions(info);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    sim_.Simulate(action);
    const mjModel* m = sim_.m;
    const mjData* d = sim_.d;
    const double linup = (d->qpos[2] - 0) / m->opt.timestep;
    const double ctrl = ctrl_weight_ * mj::SquaredSum(d->ctrl, m->nu);
    const double impact =
        std::min(std::max(impact_weight_ * mj::SquaredSum(d->cfrc_ext, 6 * m->nbody),
                          impact_range_.first),
                 impact_range_.second);
    WritePositions(info);
    info[kLinup] = linup;
    info[kQuadctrl] = -ctrl;
    info[kImpact] = -impact;
    Write(obs);
    return {linup - ctrl - impact + 1, false};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  void WritePositions(double* info) const {
    const mjData* d = sim_.d;
    const int nt = sim_.m->ntendon;
    info[kX] = d->qpos[0];
    info[kY] = d->qpos[1];
    info[kZ] = d->qpos[2] - sim_.init_qpos[2];
    std::copy(d->ten_length, d->ten_length + nt, info + kTendons);
    std::copy(d->ten_velocity, d->ten_velocity + nt, info + kTendons + nt);
  }

  void Write(Obs* o) const { obs_.Write(sim_.m, sim_.d, o); }

  mj::Sim sim_;
  double ctrl_weight_, impact_weight_;
  std::pair<double, double> impact_range_;
  double noise_;
  mj::BodyObs obs_;
};

ONEBOX_REGISTER_ENV(HumanoidStandup, "HumanoidStandup-v5");

}  // namespace onebox
