// MinAtar Asterix: the player moves in 4 directions among enemies and gold that spawn at either
// side of rows 1..8 and cross the screen (+1 a gold picked up); touching an enemy ends the
// episode. With difficulty ramping, spawns and moves speed up every 100 steps. Channels: player,
// enemy, trail (the cell an entity came from), gold.
#include "envs/minatar/minatar.h"

namespace onebox {

class MinAtarAsterix {
 public:
  static constexpr int kChannels = 4;
  static constexpr std::array<int64_t, 5> kMinimalActions{
      minatar::kNoop, minatar::kLeft, minatar::kUp, minatar::kRight, minatar::kDown};
  static constexpr int kRampInterval = 100, kInitSpawnSpeed = 10, kInitMoveInterval = 5;
  static constexpr int kSlots = 8;

  explicit MinAtarAsterix(bool ramping) : ramping_(ramping) {}

  void Reset(minatar::RandomState&) {
    player_x_ = player_y_ = 5;
    for (Entity& e : entities_) e.alive = false;
    spawn_speed_ = spawn_timer_ = kInitSpawnSpeed;
    move_speed_ = move_timer_ = kInitMoveInterval;
    ramp_timer_ = kRampInterval;
    ramp_index_ = 0;
    terminal_ = false;
  }

  StepResult Act(int64_t a, minatar::RandomState& random) {
    if (terminal_) return {0.0, true};
    int r = 0;
    if (spawn_timer_ == 0) {
      Spawn(random);
      spawn_timer_ = spawn_speed_;
    }
    // 'l', 'r', 'u', 'd' within x 0..9 and y 1..8; 'n' and 'f' stay. Without branches: the
    // actions of many envs side by side defeat the branch predictor.
    static constexpr int kDx[minatar::kNumActions] = {0, -1, 0, 1, 0, 0};
    static constexpr int kDy[minatar::kNumActions] = {0, 0, -1, 0, 1, 0};
    player_x_ = std::min(std::max(player_x_ + kDx[a], 0), 9);
    player_y_ = std::min(std::max(player_y_ + kDy[a], 1), 8);

    // Slot i holds the entity of row i + 1: only the player's row's can touch the player.
    Entity& row = entities_[player_y_ - 1];
    Touch(row, &r);
    if (move_timer_ == 0) {
      move_timer_ = move_speed_;
      for (Entity& e : entities_) {
        e.x += e.alive * e.dx;
        e.alive = e.alive & (e.x >= 0) & (e.x <= 9);  // off screen: gone before it can touch
      }
      Touch(row, &r);
    }
    --spawn_timer_;
    --move_timer_;

    if (ramping_ && (spawn_speed_ > 1 || move_speed_ > 1)) {
      if (ramp_timer_ >= 0) {
        --ramp_timer_;
      } else {
        if (move_speed_ > 1 && ramp_index_ % 2) --move_speed_;
        if (spawn_speed_ > 1) --spawn_speed_;
        ++ramp_index_;
        ramp_timer_ = kRampInterval;
      }
    }
    return {static_cast<double>(r), terminal_};
  }

  // Over the live entities' bits: one hard-to-predict loop exit rather than a branch per slot.
  void Draw(uint8_t* obs) const {
    obs[Cell(player_y_, player_x_, 0)] = 1;
    unsigned alive = 0;
    for (int i = 0; i < kSlots; ++i) alive |= static_cast<unsigned>(entities_[i].alive) << i;
    for (; alive; alive &= alive - 1) {
      const int i = __builtin_ctz(alive);
      const Entity& e = entities_[i];
      obs[Cell(i + 1, e.x, e.gold ? 3 : 1)] = 1;
      const int back_x = e.x - e.dx;
      if (back_x >= 0 && back_x <= 9) obs[Cell(i + 1, back_x, 2)] = 1;
    }
  }

 private:
  // The entity of row slot + 1 (the package's [x, slot + 1, lr, is_gold], or None when dead);
  // dx: +1 moving right, -1 left.
  struct Entity {
    bool alive;
    int x, dx;
    bool gold;
  };

  static int Cell(int y, int x, int c) { return (y * minatar::kSize + x) * kChannels + c; }

  // An entity on the player's cell: gold is picked up (+1), an enemy ends the episode.
  void Touch(Entity& e, int* r) {
    if (!(e.alive & (e.x == player_x_))) return;
    if (e.gold) {
      *r += 1;
      e.alive = false;
    } else {
      terminal_ = true;
    }
  }

  // The package's _spawn_entity: side and kind are drawn even when every row is taken.
  void Spawn(minatar::RandomState& random) {
    const bool right = random.Rand() < 1.0 / 2;
    const bool gold = random.Rand() < 1.0 / 3;
    int free[kSlots], n = 0;
    for (int i = 0; i < kSlots; ++i)
      if (!entities_[i].alive) free[n++] = i;
    if (n == 0) return;
    entities_[free[random.RandInt(n)]] = {true, right ? 0 : 9, right ? 1 : -1, gold};
  }

  bool ramping_;
  Entity entities_[kSlots] = {};
  int player_x_ = 5, player_y_ = 5;
  int spawn_speed_ = 0, spawn_timer_ = 0, move_speed_ = 0, move_timer_ = 0;
  int ramp_timer_ = 0, ramp_index_ = 0;
  bool terminal_ = false;
};

ONEBOX_REGISTER_MINATAR(MinAtarAsterix, "Asterix");

}  // namespace onebox
