// Pendulum-v1: Gymnasium's inverted pendulum swing-up, same dynamics, reward and limits.
// The state is (theta, theta_dot); theta is not wrapped, the observation is (cos, sin, theta_dot).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine/registry.h"

namespace onebox {

struct Pendulum {
  using Obs = float;
  using Act = float;

  static constexpr double kMaxSpeed = 8.0, kMaxTorque = 2.0, kDt = 0.05, kM = 1.0, kL = 1.0;

  static std::vector<OptionDecl> Options() {
    return {{"g", 10.0, "Acceleration of gravity (m/s^2)."}};
  }
  static EnvSpec Spec(const Config&) {
    EnvSpec s;
    s.observation = Space::Box({3}, DType::kFloat32, {-1.0, -1.0, -kMaxSpeed}, {1.0, 1.0, kMaxSpeed});
    s.action = Space::Box({1}, DType::kFloat32, -kMaxTorque, kMaxTorque);
    s.max_episode_steps = 200;
    return s;
  }

  explicit Pendulum(const Config& cfg) : g_(cfg.Float("g")) {}

  void Reset(Rng& rng, Obs* obs, double*) {
    th_ = rng.Uniform(-M_PI, M_PI);
    thdot_ = rng.Uniform(-1.0, 1.0);
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double*) {
    const double u = std::clamp(static_cast<double>(action[0]), -kMaxTorque, kMaxTorque);
    const double th_norm = std::fmod(th_ + M_PI, 2 * M_PI);  // Python's % takes the divisor's sign
    const double th_n = (th_norm < 0 ? th_norm + 2 * M_PI : th_norm) - M_PI;
    const double costs = th_n * th_n + 0.1 * (thdot_ * thdot_) + 0.001 * (u * u);
    double newthdot = thdot_ + (3 * g_ / (2 * kL) * std::sin(th_) + 3.0 / (kM * kL * kL) * u) * kDt;
    newthdot = std::clamp(newthdot, -kMaxSpeed, kMaxSpeed);
    th_ = th_ + newthdot * kDt;
    thdot_ = newthdot;
    Write(obs);
    return {-costs, false};
  }

  std::vector<double> GetState() const { return {th_, thdot_}; }
  void SetState(const std::vector<double>& s) {
    if (s.size() != 2) throw std::invalid_argument("Pendulum state has 2 values");
    th_ = s[0];
    thdot_ = s[1];
  }

 private:
  void Write(Obs* obs) const {
    obs[0] = static_cast<float>(std::cos(th_));
    obs[1] = static_cast<float>(std::sin(th_));
    obs[2] = static_cast<float>(thdot_);
  }
  double g_;
  double th_ = 0.0, thdot_ = 0.0;
};

ONEBOX_REGISTER_ENV(Pendulum, "Pendulum-v1");

}  // namespace onebox
