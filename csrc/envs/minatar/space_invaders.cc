// MinAtar Space Invaders (minatar 1.0.15, environments/space_invaders.py), step for step: a cannon
// on the bottom row shoots at a 4x6 block of aliens that sweeps sideways, steps down at the edges
// and shoots back from its alien nearest the cannon. The block speeds up as it thins out and,
// with difficulty ramping, with each cleared wave. Reward +1 per alien shot; the episode ends
// when an alien or an alien's bullet reaches the cannon. The game itself draws no random numbers.
//
// The package's 10x10 maps of aliens and bullets are rows of 10 bits here (bit x: column x).
#include <algorithm>
#include <array>
#include <cstdint>

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
    if (terminal_) return {0.0, true};
    if (a == minatar::kFire && shot_timer_ == 0) {
      friendly_[9] |= Bit(pos_);
      shot_timer_ = kShotCoolDown;
    } else if (a == minatar::kLeft) {
      pos_ = std::max(0, pos_ - 1);
    } else if (a == minatar::kRight) {
      pos_ = std::min(9, pos_ + 1);
    }

    // Friendly bullets go up a row (np.roll by -1; the wrapped row is cleared), enemy ones down.
    RollRows(friendly_, -1);
    friendly_[9] = 0;
    RollRows(enemy_, 1);
    enemy_[0] = 0;
    if (enemy_[9] & Bit(pos_)) terminal_ = true;

    if (aliens_[9] & Bit(pos_)) terminal_ = true;
    if (alien_move_timer_ == 0) {
      alien_move_timer_ = std::min(CountAliens(), move_interval_);
      const Row columns = Columns();
      if (((columns & Bit(0)) && alien_dir_ < 0) || ((columns & Bit(9)) && alien_dir_ > 0)) {
        alien_dir_ = -alien_dir_;
        if (aliens_[9]) terminal_ = true;
        RollRows(aliens_, 1);  // np.roll: the bottom row wraps to the top
      } else {
        for (Row& row : aliens_) row = alien_dir_ > 0 ? RollRight(row) : RollLeft(row);
      }
      if (aliens_[9] & Bit(pos_)) terminal_ = true;
    }
    if (alien_shot_timer_ == 0) {
      alien_shot_timer_ = kEnemyShotInterval;
      ShootFromNearestAlien();
    }

    int kills = 0;
    for (int y = 0; y < minatar::kSize; ++y) {
      const Row hit = aliens_[y] & friendly_[y];
      kills += __builtin_popcount(hit);
      aliens_[y] &= ~hit;
      friendly_[y] &= ~hit;
    }

    shot_timer_ -= shot_timer_ > 0;
    alien_move_timer_ -= 1;
    alien_shot_timer_ -= 1;
    if (CountAliens() == 0) {
      if (move_interval_ > 6 && ramping_) move_interval_ -= 1;
      FillWave();
    }
    return {static_cast<double>(kills), terminal_};
  }

  void Draw(uint8_t* obs) const {
    minatar::Set(obs, kChannels, 9, pos_, kCannon);
    const int dir_channel = alien_dir_ < 0 ? kAlienLeft : kAlienRight;
    for (int y = 0; y < minatar::kSize; ++y) {
      ForBits(aliens_[y], [&](int x) {
        minatar::Set(obs, kChannels, y, x, kAlien);
        minatar::Set(obs, kChannels, y, x, dir_channel);
      });
      ForBits(friendly_[y], [&](int x) { minatar::Set(obs, kChannels, y, x, kFriendlyBullet); });
      ForBits(enemy_[y], [&](int x) { minatar::Set(obs, kChannels, y, x, kEnemyBullet); });
    }
  }

 private:
  using Row = uint32_t;  // the low 10 bits: one row of a map
  using Grid = std::array<Row, minatar::kSize>;  // [y]
  static constexpr int kCannon = 0, kAlien = 1, kAlienLeft = 2, kAlienRight = 3;
  static constexpr int kFriendlyBullet = 4, kEnemyBullet = 5;
  static constexpr int kShotCoolDown = 5, kEnemyMoveInterval = 12, kEnemyShotInterval = 10;
  static constexpr Row kFull = (1u << minatar::kSize) - 1;

  static constexpr Row Bit(int x) { return 1u << x; }
  // np.roll(row, 1) and np.roll(row, -1) on the 10 columns.
  static Row RollRight(Row row) { return ((row << 1) | (row >> 9)) & kFull; }
  static Row RollLeft(Row row) { return (row >> 1) | ((row & 1u) << 9); }
  // np.roll(grid, shift, axis=0) for shift = +1 (rows down) or -1 (rows up).
  static void RollRows(Grid& g, int shift) {
    if (shift > 0)
      std::rotate(g.rbegin(), g.rbegin() + 1, g.rend());
    else
      std::rotate(g.begin(), g.begin() + 1, g.end());
  }
  template <class F>
  static void ForBits(Row row, F f) {
    for (; row; row &= row - 1) f(__builtin_ctz(row));
  }

  void FillWave() {
    for (int y = 0; y < 4; ++y) aliens_[y] |= 0xFCu;  // columns 2..7
  }

  int CountAliens() const {
    int n = 0;
    for (Row row : aliens_) n += __builtin_popcount(row);
    return n;
  }

  Row Columns() const {  // the columns that have an alien
    Row c = 0;
    for (Row row : aliens_) c |= row;
    return c;
  }

  // The package's _nearest_alien: columns by distance to the cannon (ties: the left one first);
  // the lowest alien of the first column that has one shoots. There is always an alien here:
  // a cleared wave is refilled at the end of the step that cleared it.
  void ShootFromNearestAlien() {
    const Row columns = Columns();
    for (int d = 0; d < minatar::kSize; ++d) {
      for (int x : {pos_ - d, pos_ + d}) {
        if (x < 0 || x >= minatar::kSize || !(columns & Bit(x))) continue;
        int y = minatar::kSize - 1;
        while (!(aliens_[y] & Bit(x))) --y;
        enemy_[y] |= Bit(x);
        return;
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
