// Gymnasium's planar robots that hop or walk forward while healthy (Hopper-v5, Walker2d-v5): the
// same rewards (forward velocity, a bonus per healthy step, a control cost), observation (qpos
// without x, then qvel clipped to [-10, 10]) and episode end (the torso's height or angle leaves
// its healthy range). A robot is a `Body` with its model file and healthy ranges.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "envs/mujoco/mujoco_env.h"

namespace onebox::mj {

// `Body` holds: kXml (the model file), kName (the robot, in option docs), kZ and kAngle (the
// default healthy torso height and angle ranges), kStateRange (also bound qpos[2:] and qvel by a
// `healthy_state_range` option, as Hopper does) and kRewardThreshold (NaN: none).
template <class Body>
struct PlanarWalker {
  using Obs = double;
  using Act = float;
  enum Info { kX, kZ, kXVel, kForward, kCtrl, kSurvive };

  static std::vector<OptionDecl> Options() {
    const std::string name = Body::kName;
    auto o = BaseOptions(Body::kXml, 4);
    o.push_back({"forward_reward_weight", 1.0, "Weight of the forward velocity reward."});
    o.push_back({"ctrl_cost_weight", 0.001, "Weight of the control cost sum(action^2)."});
    o.push_back({"healthy_reward", 1.0, "Reward for every step the " + name + " is healthy."});
    o.push_back({"terminate_when_unhealthy", true,
                 "End the episode when the " + name + " is unhealthy."});
    if constexpr (Body::kStateRange)
      o.push_back({"healthy_state_range", std::vector<double>{-100.0, 100.0},
                   "Healthy range of qpos[2:] and qvel (exclusive)."});
    o.push_back({"healthy_z_range", std::vector<double>{Body::kZ.first, Body::kZ.second},
                 "Healthy range of the torso height (exclusive)."});
    o.push_back({"healthy_angle_range",
                 std::vector<double>{Body::kAngle.first, Body::kAngle.second},
                 "Healthy range of the torso angle (exclusive)."});
    o.push_back({"reset_noise_scale", 0.005, "Half-width of the uniform reset noise."});
    o.push_back({"exclude_current_positions_from_observation", true,
                 "Leave the x position out of the observation."});
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = ModelOf(cfg);
    const bool exclude = cfg.Bool("exclude_current_positions_from_observation");
    return MakeSpec(m.get(), m->nq + m->nv - exclude,
                    {"x_position", "z_distance_from_origin", "x_velocity", "reward_forward",
                     "reward_ctrl", "reward_survive"},
                    Body::kRewardThreshold);
  }

  explicit PlanarWalker(const Config& cfg)
      : sim_(cfg),
        forward_weight_(cfg.Float("forward_reward_weight")),
        ctrl_weight_(cfg.Float("ctrl_cost_weight")),
        healthy_reward_(cfg.Float("healthy_reward")),
        terminate_(cfg.Bool("terminate_when_unhealthy")),
        z_range_(Range(cfg, "healthy_z_range")),
        angle_range_(Range(cfg, "healthy_angle_range")),
        noise_(cfg.Float("reset_noise_scale")),
        skip_(cfg.Bool("exclude_current_positions_from_observation") ? 1 : 0) {
    if constexpr (Body::kStateRange) state_range_ = Range(cfg, "healthy_state_range");
    sim_.post_constraint = false;  // cfrc_ext is not used
  }

  void Reset(Rng& rng, Obs* obs, double* info) {
    sim_.ResetNoisy(rng, noise_, /*normal_qvel=*/false);
    Write(obs);
    info[kX] = sim_.d->qpos[0];
    info[kZ] = sim_.d->qpos[1] - sim_.init_qpos[1];
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    const double x_before = sim_.d->qpos[0];
    sim_.Simulate(action);
    const double x_after = sim_.d->qpos[0];
    const double x_velocity = (x_after - x_before) / sim_.dt();
    Write(obs);
    const bool healthy = Healthy();
    const double forward = forward_weight_ * x_velocity;
    const double survive = healthy ? healthy_reward_ : 0.0;
    const double ctrl = ActionCost(ctrl_weight_, action, sim_.m->nu);
    info[kX] = x_after;
    info[kZ] = sim_.d->qpos[1] - sim_.init_qpos[1];
    info[kXVel] = x_velocity;
    info[kForward] = forward;
    info[kCtrl] = -ctrl;
    info[kSurvive] = survive;
    return {(forward + survive) - ctrl, !healthy && terminate_};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  static bool Inside(double v, std::pair<double, double> r) { return r.first < v && v < r.second; }

  bool Healthy() const {
    const mjData* d = sim_.d;
    if constexpr (Body::kStateRange) {
      for (int i = 2; i < sim_.m->nq; ++i)
        if (!Inside(d->qpos[i], state_range_)) return false;
      for (int i = 0; i < sim_.m->nv; ++i)
        if (!Inside(d->qvel[i], state_range_)) return false;
    }
    return Inside(d->qpos[1], z_range_) && Inside(d->qpos[2], angle_range_);
  }

  void Write(Obs* o) const {
    o = Put(o, sim_.d->qpos + skip_, sim_.m->nq - skip_);
    PutClipped(o, sim_.d->qvel, sim_.m->nv, -10.0, 10.0);
  }

  Sim sim_;
  double forward_weight_, ctrl_weight_, healthy_reward_;
  bool terminate_;
  std::pair<double, double> state_range_, z_range_, angle_range_;
  double noise_;
  int skip_;
};

}  // namespace onebox::mj
