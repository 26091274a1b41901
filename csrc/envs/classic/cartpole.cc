// CartPole-v1: Gymnasium's cart-pole (Barto, Sutton & Anderson, 1983), same dynamics, reward and limits.
// With hide_velocities the observation is (x, theta) only: a task that needs memory.
#include <cmath>

#include "engine/registry.h"

namespace onebox {

struct CartPole {
  using Obs = float;
  using Act = int64_t;

  static constexpr double kGravity = 9.8, kMassCart = 1.0, kMassPole = 0.1;
  static constexpr double kTotalMass = kMassCart + kMassPole, kLength = 0.5;
  static constexpr double kPoleMassLength = kMassPole * kLength, kForceMag = 10.0, kTau = 0.02;
  static constexpr double kThetaThreshold = 12 * 2 * M_PI / 360, kXThreshold = 2.4;

  static std::vector<OptionDecl> Options() {
    return {{"sutton_barto_reward", false,
             "Reward 0 per step and -1 on failure (Sutton & Barto) instead of +1 per step."},
            {"hide_velocities", false,
             "Observe only the cart position and pole angle (x, theta), not their velocities: the "
             "agent must infer them from past observations (a partially observed CartPole)."}};
  }
  static EnvSpec Spec(const Config& cfg) {
    EnvSpec s;
    if (cfg.Bool("hide_velocities")) {
      const std::vector<double> high{kXThreshold * 2, kThetaThreshold * 2};
      s.observation = Space::Box({2}, DType::kFloat32, {-high[0], -high[1]}, high);
    } else {
      const std::vector<double> high{kXThreshold * 2, kInf, kThetaThreshold * 2, kInf};
      s.observation = Space::Box({4}, DType::kFloat32, {-high[0], -high[1], -high[2], -high[3]}, high);
    }
    s.action = Space::Discrete(2);
    s.max_episode_steps = 500;
    s.reward_threshold = 475.0;
    return s;
  }

  explicit CartPole(const Config& cfg)
      : sutton_barto_(cfg.Bool("sutton_barto_reward")), hide_velocities_(cfg.Bool("hide_velocities")) {}

  void Reset(Rng& rng, Obs* obs, double*) {
    for (double& v : s_) v = rng.Uniform(-0.05, 0.05);
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double*) {
    const double force = action[0] == 1 ? kForceMag : -kForceMag;
    const double cost = std::cos(s_[2]), sint = std::sin(s_[2]);
    const double temp = (force + kPoleMassLength * (s_[3] * s_[3]) * sint) / kTotalMass;
    const double thetaacc =
        (kGravity * sint - cost * temp) / (kLength * (4.0 / 3.0 - kMassPole * (cost * cost) / kTotalMass));
    const double xacc = temp - kPoleMassLength * thetaacc * cost / kTotalMass;
    s_[0] += kTau * s_[1];
    s_[1] += kTau * xacc;
    s_[2] += kTau * s_[3];
    s_[3] += kTau * thetaacc;
    Write(obs);
    const bool terminated = s_[0] < -kXThreshold || s_[0] > kXThreshold ||
                            s_[2] < -kThetaThreshold || s_[2] > kThetaThreshold;
    const double reward = sutton_barto_ ? (terminated ? -1.0 : 0.0) : 1.0;
    return {reward, terminated};
  }

  std::vector<double> GetState() const { return {s_[0], s_[1], s_[2], s_[3]}; }
  void SetState(const std::vector<double>& s) {
    if (s.size() != 4) throw std::invalid_argument("CartPole state has 4 values");
    for (int k = 0; k < 4; ++k) s_[k] = s[k];
  }

 private:
  void Write(Obs* obs) const {
    if (hide_velocities_) {
      obs[0] = static_cast<float>(s_[0]);
      obs[1] = static_cast<float>(s_[2]);
      return;
    }
    for (int k = 0; k < 4; ++k) obs[k] = static_cast<float>(s_[k]);
  }
  bool sutton_barto_, hide_velocities_;
  double s_[4] = {0, 0, 0, 0};
};

ONEBOX_REGISTER_ENV(CartPole, "CartPole-v1");

}  // namespace onebox
