// MinAtar Breakout: a paddle at the bottom bounces a ball that travels along diagonals into 3 rows
// of bricks (+1 a brick; a cleared wall is rebuilt); the episode ends when the ball reaches the
// bottom row past the paddle. Channels: paddle, ball, trail (the ball's last cell), brick.
#include "envs/minatar/minatar.h"

namespace onebox {

class MinAtarBreakout {
 public:
  static constexpr int kChannels = 4;
  static constexpr std::array<int64_t, 3> kMinimalActions{minatar::kNoop, minatar::kLeft,
                                                          minatar::kRight};

  explicit MinAtarBreakout(bool) {}

  void Reset(minatar::RandomState& random) {
    ball_y_ = 3;
    if (random.RandInt(2) == 0) {
      ball_x_ = 0;
      dir_ = 2;
    } else {
      ball_x_ = 9;
      dir_ = 3;
    }
    pos_ = 4;
    Rebuild();
    strike_ = false;
    last_x_ = ball_x_;
    last_y_ = ball_y_;
    terminal_ = false;
  }

  StepResult Act(int64_t a, minatar::RandomState&) {
    if (terminal_) return {0.0, true};
    double r = 0.0;
    if (a == minatar::kLeft) pos_ = std::max(0, pos_ - 1);
    else if (a == minatar::kRight) pos_ = std::min(9, pos_ + 1);

    // Directions 0..3: up-left, up-right, down-right, down-left.
    static constexpr int kDx[4] = {-1, 1, 1, -1}, kDy[4] = {-1, -1, 1, 1};
    static constexpr int kFlipX[4] = {1, 0, 3, 2}, kFlipY[4] = {3, 2, 1, 0};
    static constexpr int kPaddle[4] = {2, 3, 0, 1};
    last_x_ = ball_x_;
    last_y_ = ball_y_;
    int new_x = ball_x_ + kDx[dir_], new_y = ball_y_ + kDy[dir_];
    bool strike_toggle = false;
    if (new_x < 0 || new_x > 9) {
      new_x = std::min(std::max(new_x, 0), 9);
      dir_ = kFlipX[dir_];
    }
    if (new_y < 0) {
      new_y = 0;
      dir_ = kFlipY[dir_];
    } else if (HasBrick(new_y, new_x)) {
      strike_toggle = true;
      if (!strike_) {
        r += 1.0;
        strike_ = true;
        bricks_[BrickIndex(new_y, new_x)] = 0;
        --num_bricks_;
        new_y = last_y_;
        dir_ = kFlipY[dir_];
      }
    } else if (new_y == 9) {
      if (num_bricks_ == 0) Rebuild();
      if (ball_x_ == pos_) {
        dir_ = kFlipY[dir_];
        new_y = last_y_;
      } else if (new_x == pos_) {
        dir_ = kPaddle[dir_];
        new_y = last_y_;
      } else {
        terminal_ = true;
      }
    }
    if (!strike_toggle) strike_ = false;
    ball_x_ = new_x;
    ball_y_ = new_y;
    return {r, terminal_};
  }

  void Draw(uint8_t* obs) const {
    std::memcpy(obs + kBrickRows * minatar::kSize * kChannels, bricks_, sizeof(bricks_));
    minatar::Set(obs, kChannels, ball_y_, ball_x_, 1);
    minatar::Set(obs, kChannels, 9, pos_, 0);
    minatar::Set(obs, kChannels, last_y_, last_x_, 2);
  }

 private:
  // Bricks exist in rows 1..3 only.
  static constexpr int kBrickRows = 1, kNumBrickRows = 3;
  static int BrickIndex(int y, int x) {
    return ((y - kBrickRows) * minatar::kSize + x) * kChannels + 3;
  }
  bool HasBrick(int y, int x) const {
    return y >= kBrickRows && y < kBrickRows + kNumBrickRows && bricks_[BrickIndex(y, x)];
  }
  void Rebuild() {
    for (int k = 0; k < kNumBrickRows * minatar::kSize; ++k) bricks_[k * kChannels + 3] = 1;
    num_bricks_ = kNumBrickRows * minatar::kSize;
  }
  int ball_x_ = 0, ball_y_ = 0, dir_ = 0, pos_ = 4, last_x_ = 0, last_y_ = 0, num_bricks_ = 0;
  bool strike_ = false, terminal_ = false;
  // Rows 1..3 of the observation with only the brick channel set: drawn with one copy.
  uint8_t bricks_[kNumBrickRows * minatar::kSize * kChannels] = {};
};

ONEBOX_REGISTER_MINATAR(MinAtarBreakout, "Breakout");

}  // namespace onebox
