// MountainCarContinuous-v0: Gymnasium's continuous mountain car, same dynamics, reward and limits.
// As in Gymnasium, the force is the action clipped to [-1, 1] but the action cost uses the
// unclipped action, and the state is stored as float32 after every step.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine/registry.h"

namespace onebox {

struct MountainCarContinuous {
  using Obs = float;
  using Act = float;

  static constexpr double kMinAction = -1.0, kMaxAction = 1.0;
  static constexpr double kMinPosition = -1.2, kMaxPosition = 0.6, kMaxSpeed = 0.07;
  static constexpr double kGoalPosition = 0.45, kPower = 0.0015;

  static std::vector<OptionDecl> Options() {
    return {{"goal_velocity", 0.0, "Minimum velocity at the goal position for the episode to end."}};
  }
  static EnvSpec Spec(const Config&) {
    EnvSpec s;
    s.observation = Space::Box({2}, DType::kFloat32, {kMinPosition, -kMaxSpeed},
                               {kMaxPosition, kMaxSpeed});
    s.action = Space::Box({1}, DType::kFloat32, kMinAction, kMaxAction);
    s.max_episode_steps = 999;
    s.reward_threshold = 90.0;
    return s;
  }

  explicit MountainCarContinuous(const Config& cfg)
      : goal_velocity_(cfg.Float("goal_velocity")) {}

  void Reset(Rng& rng, Obs* obs, double*) {
    position_ = rng.Uniform(-0.6, -0.4);
    velocity_ = 0.0;
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double*) {
    const double a = action[0];
    const double force = std::min(std::max(a, kMinAction), kMaxAction);
    double position = position_, velocity = velocity_;
    velocity += force * kPower - 0.0025 * std::cos(3 * position);
    velocity = std::clamp(velocity, -kMaxSpeed, kMaxSpeed);
    position += velocity;
    position = std::clamp(position, kMinPosition, kMaxPosition);
    if (position == kMinPosition && velocity < 0) velocity = 0.0;
    const bool terminated = position >= kGoalPosition && velocity >= goal_velocity_;
    const double reward = (terminated ? 100.0 : 0.0) - a * a * 0.1;
    position_ = static_cast<float>(position);  // Gymnasium keeps a float32 state
    velocity_ = static_cast<float>(velocity);
    Write(obs);
    return {reward, terminated};
  }

  std::vector<double> GetState() const { return {position_, velocity_}; }
  void SetState(const std::vector<double>& s) {
    if (s.size() != 2) throw std::invalid_argument("MountainCarContinuous state has 2 values");
    position_ = s[0];
    velocity_ = s[1];
  }

 private:
  void Write(Obs* obs) const {
    obs[0] = static_cast<float>(position_);
    obs[1] = static_cast<float>(velocity_);
  }
  double goal_velocity_;
  double position_ = 0.0, velocity_ = 0.0;
};

ONEBOX_REGISTER_ENV(MountainCarContinuous, "MountainCarContinuous-v0");

}  // namespace onebox
