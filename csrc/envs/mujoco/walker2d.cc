// Walker2d-v5: Gymnasium's planar biped, rewarded for walking forward while healthy.
#include <limits>

#include "envs/mujoco/planar_walker.h"

namespace onebox {

struct Walker2dBody {
  static constexpr const char* kXml = "walker2d_v5.xml";
  static constexpr const char* kName = "walker";
  static constexpr std::pair<double, double> kZ{0.8, 2.0};
  static constexpr std::pair<double, double> kAngle{-1.0, 1.0};
  static constexpr bool kStateRange = false;
  static constexpr double kRewardThreshold = std::numeric_limits<double>::quiet_NaN();
};
using Walker2d = mj::PlanarWalker<Walker2dBody>;

ONEBOX_REGISTER_ENV(Walker2d, "Walker2d-v5");

}  // namespace onebox
