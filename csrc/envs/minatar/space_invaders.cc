// MinAtar Space Invaders (minatar 1.0.15, environments/space_invaders.py), step for step: a cannon
// on the bottom row shoots at a 4x6 block of aliens that sweeps sideways, steps down at the edges
// and shoots back from its alien nearest the cannon. The block speeds up as it thins out and,
// with difficulty ramping, with each cleared wave. Reward +1 per alien shot; the episode ends
// when an alien or an alien's bullet reaches the cannon. The game itself draws no random numbers.
#include <algorithm>
#include <array>
#include <cstdlib>

#include "envs/minatar/minatar.h"

namespace onebox {

class MinAtarSpaceInvaders {
 public:
  static constexpr int kChannels = 6;
  static constexpr std::array<int64_t, 4> kMinimalActions{minatar::kNoop, minatar::kLeft,
                                                          minatar::kRight, minatar::kFire};

  explicit MinAtarSpaceInvaders(bool ramping) : ramping_(ramping) {}

  void Reset(minatar::RandomState&) {
    pos_ = 5;
    friendly_ = {};
    enemy_ = {};
    aliens_ = {};
    FillWave();
    alien_dir_ = -1;
    move_interval_ = kEnemyMoveInterval;
    alien_move_timer_ = move_interval_;
    alien_shot_timer_ = kEnemyShotInterval;
    shot_timer_ = 0;
    terminal_ = false;
  }

  StepResult Act(int64_t a, minatar::RandomState&) {
    double r = 0;
    if (terminal_) return {r, true};
    if (a == minatar::kFire && shot_timer_ == 0) {
      friendly_[9][pos_] = 1;
      shot_timer_ = kShotCoolDown;
    } else if (a == minatar::kLeft) {
      pos_ = std::max(0, pos_ - 1);
    } else if (a == minatar::kRight) {
      pos_ = std::min(9, pos_ + 1);
    }

    // Friendly bullets go up a row (np.roll by -1; the wrapped row is cleared), enemy ones down.
    RollRows(friendly_, -1);
    friendly_[9] = {};
    RollRows(enemy_, 1);
    enemy_[0] = {};
    if (enemy_[9][pos_]) terminal_ = true;

    if (aliens_[9][pos_]) terminal_ = true;
    if (alien_move_timer_ == 0) {
      alien_move_timer_ = std::min(CountAliens(), move_interval_);
      if ((ColumnHasAlien(0) && alien_dir_ < 0) || (ColumnHasAlien(9) && alien_dir_ > 0)) {
        alien_dir_ = -alien_dir_;
        for (int x = 0; x < minatar::kSize; ++x)
          if (aliens_[9][x]) terminal_ = true;
        RollRows(aliens_, 1);  // np.roll: the bottom row wraps to the top
      } else {
        for (auto& row : aliens_) {  // the edge check above means nothing wraps here
          if (alien_dir_ > 0)
            std::rotate(row.rbegin(), row.rbegin() + 1, row.rend());
          else
            std::rotate(row.begin(), row.begin() + 1, row.end());
        }
      }
      if (aliens_[9][pos_]) terminal_ = true;
    }
    if (alien_shot_timer_ == 0) {
      alien_shot_timer_ = kEnemyShotInterval;
      ShootFromNearestAlien();
    }

    for (int y = 0; y < minatar::kSize; ++y)
      for (int x = 0; x < minatar::kSize; ++x)
        if (aliens_[y][x] && friendly_[y][x]) {
          aliens_[y][x] = friendly_[y][x] = 0;
          r += 1;
        }

    shot_timer_ -= shot_timer_ > 0;
    alien_move_timer_ -= 1;
    alien_shot_timer_ -= 1;
    if (CountAliens() == 0) {
      if (move_interval_ > 6 && ramping_) move_interval_ -= 1;
      FillWave();
    }
    return {r, terminal_};
  }

  void Draw(uint8_t* obs) const {
    minatar::Set(obs, kChannels, 9, pos_, kCannon);
    const int dir_channel = alien_dir_ < 0 ? kAlienLeft : kAlienRight;
    for (int y = 0; y < minatar::kSize; ++y)
      for (int x = 0; x < minatar::kSize; ++x) {
        if (aliens_[y][x]) {
          minatar::Set(obs, kChannels, y, x, kAlien);
          minatar::Set(obs, kChannels, y, x, dir_channel);
        }
        if (friendly_[y][x]) minatar::Set(obs, kChannels, y, x, kFriendlyBullet);
        if (enemy_[y][x]) minatar::Set(obs, kChannels, y, x, kEnemyBullet);
      }
  }

 private:
  using Grid = std::array<std::array<uint8_t, minatar::kSize>, minatar::kSize>;  // [y][x]
  static constexpr int kCannon = 0, kAlien = 1, kAlienLeft = 2, kAlienRight = 3;
  static constexpr int kFriendlyBullet = 4, kEnemyBullet = 5;
  static constexpr int kShotCoolDown = 5, kEnemyMoveInterval = 12, kEnemyShotInterval = 10;

  // np.roll(grid, shift, axis=0) for shift = +1 (rows down) or -1 (rows up).
  static void RollRows(Grid& g, int shift) {
    if (shift > 0)
      std::rotate(g.rbegin(), g.rbegin() + 1, g.rend());
    else
      std::rotate(g.begin(), g.begin() + 1, g.end());
  }

  void FillWave() {
    for (int y = 0; y < 4; ++y)
      for (int x = 2; x < 8; ++x) aliens_[y][x] = 1;
  }

  int CountAliens() const {
    int n = 0;
    for (const auto& row : aliens_)
      for (uint8_t c : row) n += c;
    return n;
  }

  bool ColumnHasAlien(int x) const {
    for (const auto& row : aliens_)
      if (row[x]) return true;
    return false;
  }

  // The package's _nearest_alien: columns by distance to the cannon (ties: the left one first);
  // the lowest alien of the first column that has one shoots. There is always an alien here:
  // a cleared wave is refilled at the end of the step that cleared it.
  void ShootFromNearestAlien() {
    for (int d = 0; d < minatar::kSize; ++d) {
      for (int x : {pos_ - d, pos_ + d}) {
        if (x < 0 || x >= minatar::kSize) continue;
        for (int y = minatar::kSize - 1; y >= 0; --y)
          if (aliens_[y][x]) {
            enemy_[y][x] = 1;
            return;
          }
      }
    }
  }

  bool ramping_;
  int pos_ = 5;
  Grid friendly_{}, enemy_{}, aliens_{};
  int alien_dir_ = -1, move_interval_ = kEnemyMoveInterval;
  int alien_move_timer_ = 0, alien_shot_timer_ = 0, shot_timer_ = 0;
  bool terminal_ = false;
};

ONEBOX_REGISTER_MINATAR(MinAtarSpaceInvaders, "SpaceInvaders");

}  // namespace onebox
