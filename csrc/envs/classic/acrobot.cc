// Acrobot-v1: Gymnasium's two-link underactuated pendulum (Sutton 1996; Sutton & Barto's "book"
// dynamics), integrated with one RK4 step of dt = 0.2 per env step, as in Gymnasium.
#include <cmath>
#include <stdexcept>

#include "engine/registry.h"

namespace onebox {

struct Acrobot {
  using Obs = float;
  using Act = int64_t;

  static constexpr double kDt = 0.2, kG = 9.8;
  static constexpr double kM1 = 1.0, kM2 = 1.0, kL1 = 1.0;  // link masses, length of link 1
  static constexpr double kLc1 = 0.5, kLc2 = 0.5;          // positions of the centres of mass
  static constexpr double kI1 = 1.0, kI2 = 1.0;            // moments of inertia
  static constexpr double kMaxVel1 = 4 * M_PI, kMaxVel2 = 9 * M_PI;
  static constexpr double kTorque[3] = {-1.0, 0.0, 1.0};

  static std::vector<OptionDecl> Options() { return {}; }
  static EnvSpec Spec(const Config&) {
    EnvSpec s;
    const std::vector<double> high{1.0, 1.0, 1.0, 1.0, kMaxVel1, kMaxVel2};
    std::vector<double> low(high.size());
    for (size_t k = 0; k < high.size(); ++k) low[k] = -high[k];
    s.observation = Space::Box({6}, DType::kFloat32, low, high);
    s.action = Space::Discrete(3);
    s.max_episode_steps = 500;
    s.reward_threshold = -100.0;
    return s;
  }

  explicit Acrobot(const Config&) {}

  void Reset(Rng& rng, Obs* obs, double*) {
    // Gymnasium draws the initial state as float32.
    for (double& v : s_) v = static_cast<float>(rng.Uniform(-0.1, 0.1));
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double*) {
    const double a = kTorque[action[0]];
    // One classic RK4 step over [0, dt], with the torque held constant.
    double k1[4], k2[4], k3[4], k4[4], y[4];
    const double dt = kDt, dt2 = dt / 2.0;
    Derivs(s_, a, k1);
    for (int j = 0; j < 4; ++j) y[j] = s_[j] + dt2 * k1[j];
    Derivs(y, a, k2);
    for (int j = 0; j < 4; ++j) y[j] = s_[j] + dt2 * k2[j];
    Derivs(y, a, k3);
    for (int j = 0; j < 4; ++j) y[j] = s_[j] + dt * k3[j];
    Derivs(y, a, k4);
    for (int j = 0; j < 4; ++j) s_[j] = s_[j] + dt / 6.0 * (k1[j] + 2 * k2[j] + 2 * k3[j] + k4[j]);
    s_[0] = Wrap(s_[0]);
    s_[1] = Wrap(s_[1]);
    s_[2] = std::min(std::max(s_[2], -kMaxVel1), kMaxVel1);
    s_[3] = std::min(std::max(s_[3], -kMaxVel2), kMaxVel2);
    Write(obs);
    const bool terminated = -std::cos(s_[0]) - std::cos(s_[1] + s_[0]) > 1.0;
    return {terminated ? 0.0 : -1.0, terminated};
  }

  std::vector<double> GetState() const { return {s_[0], s_[1], s_[2], s_[3]}; }
  void SetState(const std::vector<double>& s) {
    if (s.size() != 4) throw std::invalid_argument("Acrobot state has 4 values");
    for (int k = 0; k < 4; ++k) s_[k] = s[k];
  }

 private:
  // Time derivative of (theta1, theta2, dtheta1, dtheta2) under torque a (book dynamics).
  static void Derivs(const double* s, double a, double* ds) {
    const double theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
    const double d1 = kM1 * (kLc1 * kLc1) +
                      kM2 * (kL1 * kL1 + kLc2 * kLc2 + 2 * kL1 * kLc2 * std::cos(theta2)) + kI1 +
                      kI2;
    const double d2 = kM2 * (kLc2 * kLc2 + kL1 * kLc2 * std::cos(theta2)) + kI2;
    const double phi2 = kM2 * kLc2 * kG * std::cos(theta1 + theta2 - M_PI / 2.0);
    const double phi1 = -kM2 * kL1 * kLc2 * (dtheta2 * dtheta2) * std::sin(theta2) -
                        2 * kM2 * kL1 * kLc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                        (kM1 * kLc1 + kM2 * kL1) * kG * std::cos(theta1 - M_PI / 2) + phi2;
    const double ddtheta2 =
        (a + d2 / d1 * phi1 - kM2 * kL1 * kLc2 * (dtheta1 * dtheta1) * std::sin(theta2) - phi2) /
        (kM2 * (kLc2 * kLc2) + kI2 - (d2 * d2) / d1);
    const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    ds[0] = dtheta1;
    ds[1] = dtheta2;
    ds[2] = ddtheta1;
    ds[3] = ddtheta2;
  }
  // Gymnasium's wrap(x, -pi, pi): shift by 2 pi until in range.
  static double Wrap(double x) {
    const double lo = -M_PI, hi = M_PI, diff = hi - lo;
    while (x > hi) x = x - diff;
    while (x < lo) x = x + diff;
    return x;
  }
  void Write(Obs* obs) const {
    obs[0] = static_cast<float>(std::cos(s_[0]));
    obs[1] = static_cast<float>(std::sin(s_[0]));
    obs[2] = static_cast<float>(std::cos(s_[1]));
    obs[3] = static_cast<float>(std::sin(s_[1]));
    obs[4] = static_cast<float>(s_[2]);
    obs[5] = static_cast<float>(s_[3]);
  }
  double s_[4] = {0, 0, 0, 0};
};

ONEBOX_REGISTER_ENV(Acrobot, "Acrobot-v1");

}  // namespace onebox
