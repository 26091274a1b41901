// MountainCar-v0: Gymnasium's discrete mountain car (Moore 1990), same dynamics, reward and limits.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine/registry.h"

namespace onebox {

struct MountainCar {
  using Obs = float;
  using Act = int64_t;

  static constexpr double kMinPosition = -1.2, kMaxPosition = 0.6, kMaxSpeed = 0.07;
  static constexpr double kGoalPosition = 0.5, kForce = 0.001, kGravity = 0.0025;

  static std::vector<OptionDecl> Options() {
    return {{"goal_velocity", 0.0, "Minimum velocity at the goal position for the episode to end."}};
  }
  static EnvSpec Spec(const Config&) {
    EnvSpec s;
    s.observation = Space::Box({2}, DType::kFloat32, {kMinPosition, -kMaxSpeed},
                               {kMaxPosition, kMaxSpeed});
    s.action = Space::Discrete(3);
    s.max_episode_steps = 200;
    s.reward_threshold = -110.0;
    return s;
  }

  explicit MountainCar(const Config& cfg) : goal_velocity_(cfg.Float("goal_velocity")) {}

  void Reset(Rng& rng, Obs* obs, double*) {
    position_ = rng.Uniform(-0.6, -0.4);
    velocity_ = 0.0;
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double*) {
    velocity_ += static_cast<double>(action[0] - 1) * kForce + std::cos(3 * position_) * -kGravity;
    velocity_ = std::clamp(velocity_, -kMaxSpeed, kMaxSpeed);
    position_ += velocity_;
    position_ = std::clamp(position_, kMinPosition, kMaxPosition);
    if (position_ == kMinPosition && velocity_ < 0) velocity_ = 0.0;
    Write(obs);
    const bool terminated = position_ >= kGoalPosition && velocity_ >= goal_velocity_;
    return {-1.0, terminated};
  }

  std::vector<double> GetState() const { return {position_, velocity_}; }
  void SetState(const std::vector<double>& s) {
    if (s.size() != 2) throw std::invalid_argument("MountainCar state has 2 values");
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

ONEBOX_REGISTER_ENV(MountainCar, "MountainCar-v0");

}  // namespace onebox
