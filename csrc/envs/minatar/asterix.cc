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
    double r = 0.0;
    if (spawn_timer_ == 0) {
      Spawn(random);
      spawn_timer_ = spawn_speed_;
    }
    if (a == minatar::kLeft) player_x_ = std::max(0, player_x_ - 1);
    else if (a == minatar::kRight) player_x_ = std::min(9, player_x_ + 1);
    else if (a == minatar::kUp) player_y_ = std::max(1, player_y_ - 1);
    else if (a == minatar::kDown) player_y_ = std::min(8, player_y_ + 1);

    for (Entity& e : entities_) Touch(e, &r);
    if (move_timer_ == 0) {
      move_timer_ = move_speed_;
      for (Entity& e : entities_) {
        e.x += e.alive * (e.right ? 1 : -1);
        e.alive = e.alive & (e.x >= 0) & (e.x <= 9);  // off screen: gone before it can touch
        Touch(e, &r);
      }
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
    return {r, terminal_};
  }

  void Draw(uint8_t* obs) const {
    minatar::Set(obs, kChannels, player_y_, player_x_, 0);
    for (const Entity& e : entities_) {
      if (!e.alive) continue;
      minatar::Set(obs, kChannels, e.y, e.x, e.gold ? 3 : 1);
      const int back_x = e.right ? e.x - 1 : e.x + 1;
      if (back_x >= 0 && back_x <= 9) minatar::Set(obs, kChannels, e.y, back_x, 2);
    }
  }

 private:
  struct Entity {
    bool alive;
    int x, y;
    bool right, gold;
  };

  // An entity on the player's cell: gold is picked up (+1), an enemy ends the episode. Without
  // branches: the entities of many envs side by side defeat the branch predictor.
  void Touch(Entity& e, double* r) {
    const bool hit = e.alive & (e.x == player_x_) & (e.y == player_y_);
    *r += hit & e.gold;
    terminal_ = terminal_ | (hit & !e.gold);
    e.alive = e.alive & !(hit & e.gold);
  }

  // The package's _spawn_entity: side and kind are drawn even when every row is taken.
  void Spawn(minatar::RandomState& random) {
    const bool right = random.Rand() < 1.0 / 2;
    const bool gold = random.Rand() < 1.0 / 3;
    int free[kSlots], n = 0;
    for (int i = 0; i < kSlots; ++i)
      if (!entities_[i].alive) free[n++] = i;
    if (n == 0) return;
    const int slot = free[random.RandInt(n)];
    entities_[slot] = {true, right ? 0 : 9, slot + 1, right, gold};
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
