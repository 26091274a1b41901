// Hopper-v5: Gymnasium's one-legged planar hopper, rewarded for hopping forward while healthy.
#include "envs/mujoco/planar_walker.h"

namespace onebox {

struct HopperBody {
  static constexpr const char* kXml = "hopper.xml";
  static constexpr const char* kName = "hopper";
  static constexpr std::pair<double, double> kZ{0.7, kInf};
  static constexpr std::pair<double, double> kAngle{-0.2, 0.2};
  static constexpr bool kStateRange = true;
  static constexpr double kRewardThreshold = 3800.0;
};
using Hopper = mj::PlanarWalker<HopperBody>;

ONEBOX_REGISTER_ENV(Hopper, "Hopper-v5");

}  // namespace onebox
