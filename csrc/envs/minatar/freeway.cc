// MinAtar Freeway: a chicken crosses 8 lanes of cars from the bottom row to the top (+1, then
// back to the bottom with new car speeds); it moves at most every 3 steps, and a car sends it back
// to the bottom. The episode ends after 2500 steps. Channels: chicken, car, then one trail channel
// per car speed (a car moving every 1..5 steps).
#include "envs/minatar/minatar.h"

namespace onebox {

class MinAtarFreeway {
 public:
  static constexpr int kChannels = 7;
  static constexpr std::array<int64_t, 3> kMinimalActions{minatar::kNoop, minatar::kUp,
                                                          minatar::kDown};
  static constexpr int kPlayerSpeed = 3, kTimeLimit = 2500, kCars = 8;

  explicit MinAtarFreeway(bool) {}

  void Reset(minatar::RandomState& random) {
    RandomizeCars(random, true);
    pos_ = 9;
    move_timer_ = kPlayerSpeed;
    terminate_timer_ = kTimeLimit;
    terminal_ = false;
  }

  StepResult Act(int64_t a, minatar::RandomState& random) {
    if (terminal_) return {0.0, true};
    double r = 0.0;
    if (a == minatar::kUp && move_timer_ == 0) {
      move_timer_ = kPlayerSpeed;
      pos_ = std::max(0, pos_ - 1);
    } else if (a == minatar::kDown && move_timer_ == 0) {
      move_timer_ = kPlayerSpeed;
      pos_ = std::min(9, pos_ + 1);
    }
    if (pos_ == 0) {
      r += 1.0;
      RandomizeCars(random, false);
      pos_ = 9;
    }
    for (Car& c : cars_) {
      if (c.x == 4 && c.y == pos_) pos_ = 9;
      if (c.timer == 0) {
        c.timer = std::abs(c.speed);
        c.x += c.speed > 0 ? 1 : -1;
        if (c.x < 0) c.x = 9;
        else if (c.x > 9) c.x = 0;
        if (c.x == 4 && c.y == pos_) pos_ = 9;
      } else {
        --c.timer;
      }
    }
    if (move_timer_ > 0) --move_timer_;
    if (--terminate_timer_ < 0) terminal_ = true;
    return {r, terminal_};
  }

  void Draw(uint8_t* obs) const {
    minatar::Set(obs, kChannels, pos_, 4, 0);
    for (const Car& c : cars_) {
      minatar::Set(obs, kChannels, c.y, c.x, 1);
      int back_x = c.speed > 0 ? c.x - 1 : c.x + 1;
      if (back_x < 0) back_x = 9;
      else if (back_x > 9) back_x = 0;
      // Channel speed1..speed5 (2..6). A speed of 0 (a draw of exactly 0.5, probability 2**-53)
      // leaves the package without a trail channel; it is drawn in the car channel here.
      minatar::Set(obs, kChannels, c.y, back_x, 1 + std::abs(c.speed));
    }
  }

 private:
  struct Car {
    int x, y, timer, speed;
  };

  // speeds = randint(1, 6, 8) * sign(rand(8) - 0.5); initialize also puts every car at x = 0.
  void RandomizeCars(minatar::RandomState& random, bool initialize) {
    int speeds[kCars];
    for (int& s : speeds) s = static_cast<int>(random.RandInt(1, 6));
    for (int& s : speeds) {
      const double d = random.Rand() - 0.5;
      s *= (d > 0) - (d < 0);
    }
    for (int i = 0; i < kCars; ++i) {
      if (initialize) cars_[i] = {0, i + 1, 0, 0};
      cars_[i].timer = std::abs(speeds[i]);
      cars_[i].speed = speeds[i];
    }
  }

  Car cars_[kCars] = {};
  int pos_ = 9, move_timer_ = 0, terminate_timer_ = 0;
  bool terminal_ = false;
};

ONEBOX_REGISTER_MINATAR(MinAtarFreeway, "Freeway");

}  // namespace onebox
