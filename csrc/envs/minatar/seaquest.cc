// MinAtar Seaquest (minatar 1.0.15, environments/seaquest.py), step for step: a two-cell submarine
// shoots enemy fish and subs (+1 each), picks up divers, and must surface before its oxygen runs
// out; surfacing with 6 divers pays the oxygen left. Enemies and divers spawn on timers in random
// rows and directions, drawn from the package's stream in its order; with difficulty ramping each
// surfacing speeds enemies up. The episode ends on a hit by a fish, sub or bullet, on running out
// of oxygen, or on surfacing with no diver.
//
// The package keeps its objects in Python lists, iterates some of them in reverse while removing
// from them, and removes by value: the first equal list, not necessarily the one at hand, which is
// then visited again. Twins are rare (two friendly bullets a cell apart as an enemy spawns in front
// of them) and have so far changed nothing visible, but `Objects` and `Held` follow the list
// semantics exactly, so the whole state, list order included, stays the package's.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "envs/minatar/minatar.h"

namespace onebox {

namespace {

// One object as the package's list of ints: [x, y, lr, move timer, shot timer] (unused fields
// stay 0, so whole-list equality is the package's `==`).
struct Object {
  std::array<int, 5> f{};
  int& x() { return f[0]; }
  int& y() { return f[1]; }
  int x() const { return f[0]; }
  int y() const { return f[1]; }
  bool lr() const { return f[2] != 0; }
  bool operator==(const Object& o) const { return f == o.f; }
};

// A Python list of objects: `remove` deletes the first equal object and says where it was.
class Objects {
 public:
  size_t size() const { return v_.size(); }
  Object& operator[](size_t i) { return v_[i]; }
  const Object& operator[](size_t i) const { return v_[i]; }
  void Append(const Object& o) { v_.push_back(o); }
  void Clear() { v_.clear(); }
  size_t Remove(const Object o) {
    const auto it = std::find(v_.begin(), v_.end(), o);  // o is always in the list here
    const size_t at = static_cast<size_t>(it - v_.begin());
    v_.erase(it);
    return at;
  }
  // Index of the first object at (x, y), or size() if none: `for z in list: if z[0:2] == ...`.
  size_t FindAt(int x, int y) const {
    size_t i = 0;
    while (i < v_.size() && !(v_[i].x() == x && v_[i].y() == y)) ++i;
    return i;
  }
  auto begin() const { return v_.begin(); }
  auto end() const { return v_.end(); }

 private:
  std::vector<Object> v_;
};

// The object a `for obj in reversed(list)` body holds: it stays the same Python object when the
// body removes it (then detached, still mutable) or an earlier equal one (then it shifts left).
class Held {
 public:
  Held(Objects& list, size_t i) : list_(list), i_(i) {}
  Object& get() { return attached_ ? list_[i_] : detached_; }
  void RemoveFromList() {
    const Object value = get();
    const size_t at = list_.Remove(value);
    if (at == i_) {
      attached_ = false;
      detached_ = value;
    } else {
      --i_;  // an earlier equal object went: ours moved one place left
    }
  }

 private:
  Objects& list_;
  size_t i_;
  bool attached_ = true;
  Object detached_;
};

// Python's reversed(list): from the last index down; stops once the index is out of range.
template <class Body>
void ForReversed(Objects& list, const Body& body) {
  for (ptrdiff_t i = static_cast<ptrdiff_t>(list.size()) - 1;
       i >= 0 && static_cast<size_t>(i) < list.size(); --i) {
    Held held(list, static_cast<size_t>(i));
    body(held);
  }
}

}  // namespace

class MinAtarSeaquest {
 public:
  static constexpr int kChannels = 10;
  static constexpr std::array<int64_t, 6> kMinimalActions{minatar::kNoop,  minatar::kLeft,
                                                          minatar::kUp,    minatar::kRight,
                                                          minatar::kDown,  minatar::kFire};

  explicit MinAtarSeaquest(bool ramping) : ramping_(ramping) {}

  void Reset(minatar::RandomState&) {
    oxygen_ = kMaxOxygen;
    diver_count_ = 0;
    sub_x_ = 5;
    sub_y_ = 0;
    sub_or_ = false;
    f_bullets_.Clear();
    e_bullets_.Clear();
    e_fish_.Clear();
    e_subs_.Clear();
    divers_.Clear();
    e_spawn_speed_ = kInitSpawnSpeed;
    e_spawn_timer_ = e_spawn_speed_;
    d_spawn_timer_ = kDiverSpawnSpeed;
    move_speed_ = kInitMoveInterval;
    ramp_index_ = 0;
    shot_timer_ = 0;
    surface_ = true;
    terminal_ = false;
  }

  StepResult Act(int64_t a, minatar::RandomState& random) {
    int r = 0;
    if (terminal_) return {0.0, true};

    if (e_spawn_timer_ == 0) {
      SpawnEnemy(random);
      e_spawn_timer_ = e_spawn_speed_;
    }
    if (d_spawn_timer_ == 0) {
      SpawnDiver(random);
      d_spawn_timer_ = kDiverSpawnSpeed;
    }

    if (a == minatar::kFire && shot_timer_ == 0) {
      f_bullets_.Append(Object{{sub_x_, sub_y_, sub_or_, 0, 0}});
      shot_timer_ = kShotCoolDown;
    } else if (a == minatar::kLeft) {
      sub_x_ = std::max(0, sub_x_ - 1);
      sub_or_ = false;
    } else if (a == minatar::kRight) {
      sub_x_ = std::min(9, sub_x_ + 1);
      sub_or_ = true;
    } else if (a == minatar::kUp) {
      sub_y_ = std::max(0, sub_y_ - 1);
    } else if (a == minatar::kDown) {
      sub_y_ = std::min(8, sub_y_ + 1);
    }

    UpdateFriendlyBullets(r);
    UpdateDivers();
    UpdateEnemies(e_subs_, true, r);
    UpdateEnemyBullets();
    UpdateEnemies(e_fish_, false, r);

    e_spawn_timer_ -= e_spawn_timer_ > 0;
    d_spawn_timer_ -= d_spawn_timer_ > 0;
    shot_timer_ -= shot_timer_ > 0;
    if (oxygen_ <= 0) terminal_ = true;
    if (sub_y_ > 0) {
      oxygen_ -= 1;
      surface_ = false;
    } else if (!surface_) {
      if (diver_count_ == 0)
        terminal_ = true;
      else
        r += Surface();
    }
    return {static_cast<double>(r), terminal_};
  }

  // [oxygen, diver count, sub x, sub y, sub facing right, enemy spawn speed, enemy spawn timer,
  // diver spawn timer, move speed, ramp index, shot timer, surfaced, terminal], then for each of
  // the friendly bullets, enemy bullets, fish, enemy subs and divers: their count, then each
  // object's [x, y, lr, move timer, shot timer] (0 where the package's list has no such field).
  std::vector<double> GetState() const {
    std::vector<double> s{double(oxygen_),        double(diver_count_),   double(sub_x_),
                          double(sub_y_),         double(sub_or_),        double(e_spawn_speed_),
                          double(e_spawn_timer_), double(d_spawn_timer_), double(move_speed_),
                          double(ramp_index_),    double(shot_timer_),    double(surface_),
                          double(terminal_)};
    for (const Objects* list : Lists()) {
      s.push_back(static_cast<double>(list->size()));
      for (const Object& o : *list) s.insert(s.end(), o.f.begin(), o.f.end());
    }
    return s;
  }

  void SetState(const std::vector<double>& s) {
    size_t at = 0;
    auto next = [&](int lo, int hi, const char* what) {
      if (at >= s.size()) throw std::invalid_argument("Seaquest state: too few values");
      const double v = s[at++];
      if (!(v >= lo && v <= hi) || v != std::floor(v))
        throw std::invalid_argument(std::string("Seaquest state: ") + what +
                                    " must be an integer in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "]");
      return static_cast<int>(v);
    };
    constexpr int kBig = 1 << 20;
    oxygen_ = next(-kBig, kMaxOxygen, "oxygen");
    diver_count_ = next(-kBig, 6, "diver count");
    sub_x_ = next(0, 9, "sub x");
    sub_y_ = next(0, 8, "sub y");
    sub_or_ = next(0, 1, "sub facing right");
    if (sub_x_ == (sub_or_ ? 0 : 9))
      throw std::invalid_argument("Seaquest state: the sub's back cell is off the grid");
    e_spawn_speed_ = next(0, kBig, "enemy spawn speed");
    e_spawn_timer_ = next(0, kBig, "enemy spawn timer");
    d_spawn_timer_ = next(0, kBig, "diver spawn timer");
    move_speed_ = next(0, kBig, "move speed");
    ramp_index_ = next(0, kBig, "ramp index");
    shot_timer_ = next(0, kBig, "shot timer");
    surface_ = next(0, 1, "surfaced");
    terminal_ = next(0, 1, "terminal");
    for (Objects* list : Lists()) {
      list->Clear();
      for (int n = next(0, kBig, "object count"); n > 0; --n) {
        Object o;
        o.f = {next(0, 9, "object x"), next(0, 9, "object y"), next(0, 1, "object lr"),
               next(0, kBig, "object move timer"), next(0, kBig, "object shot timer")};
        list->Append(o);
      }
    }
    if (at != s.size()) throw std::invalid_argument("Seaquest state: too many values");
  }

  void Draw(uint8_t* obs) const {
    auto set = [obs](int y, int x, int c) { minatar::Set(obs, kChannels, y, x, c); };
    set(sub_y_, sub_x_, kSubFront);
    set(sub_y_, Behind(sub_x_, sub_or_), kSubBack);
    for (int x = 0; x < std::max(0, oxygen_) * 10 / kMaxOxygen; ++x) set(9, x, kOxygenGauge);
    // state[9, 9 - diver_count:9]: empty once the count goes negative (see Surface).
    for (int x = 9 - diver_count_; x < 9; ++x) set(9, x, kDiverGauge);
    for (const Object& b : f_bullets_) set(b.y(), b.x(), kFriendlyBullet);
    for (const Object& b : e_bullets_) set(b.y(), b.x(), kEnemyBullet);
    auto draw_with_trail = [&](const Objects& list, int channel) {
      for (const Object& o : list) {
        set(o.y(), o.x(), channel);
        const int back_x = Behind(o.x(), o.lr());
        if (back_x >= 0 && back_x <= 9) set(o.y(), back_x, kTrail);
      }
    };
    draw_with_trail(e_fish_, kEnemyFish);
    draw_with_trail(e_subs_, kEnemySub);
    draw_with_trail(divers_, kDiver);
  }

 private:
  static constexpr int kSubFront = 0, kSubBack = 1, kFriendlyBullet = 2, kTrail = 3;
  static constexpr int kEnemyBullet = 4, kEnemyFish = 5, kEnemySub = 6, kOxygenGauge = 7;
  static constexpr int kDiverGauge = 8, kDiver = 9;
  static constexpr int kMaxOxygen = 200, kInitSpawnSpeed = 20, kDiverSpawnSpeed = 30;
  static constexpr int kInitMoveInterval = 5, kShotCoolDown = 5, kEnemyShotInterval = 10;
  static constexpr int kDiverMoveInterval = 5;
  enum { kX = 0, kY = 1, kLr = 2, kMoveTimer = 3, kShotTimer = 4 };

  std::array<const Objects*, 5> Lists() const {
    return {&f_bullets_, &e_bullets_, &e_fish_, &e_subs_, &divers_};
  }
  std::array<Objects*, 5> Lists() {
    return {&f_bullets_, &e_bullets_, &e_fish_, &e_subs_, &divers_};
  }

  // The cell behind x when facing right (`right`) or left: arithmetic, not a branch (the
  // objects of many envs side by side defeat the branch predictor).
  static int Behind(int x, bool right) { return x + 1 - 2 * right; }
  static void Advance(Object& o) { o.x() += o.lr() ? 1 : -1; }
  static bool OffScreen(const Object& o) { return o.x() < 0 || o.x() > 9; }
  bool AtSub(const Object& o) const { return o.x() == sub_x_ && o.y() == sub_y_; }

  void UpdateFriendlyBullets(int& r) {
    ForReversed(f_bullets_, [&](Held& bullet) {
      Advance(bullet.get());
      if (OffScreen(bullet.get())) {
        bullet.RemoveFromList();
        return;
      }
      for (Objects* enemies : {&e_fish_, &e_subs_}) {
        const size_t k = enemies->FindAt(bullet.get().x(), bullet.get().y());
        if (k < enemies->size()) {
          enemies->Remove((*enemies)[k]);
          bullet.RemoveFromList();
          r += 1;
          return;
        }
      }
    });
  }

  void UpdateDivers() {
    ForReversed(divers_, [&](Held& diver) {
      Object& d = diver.get();
      if (AtSub(d) && diver_count_ < 6) {
        diver.RemoveFromList();
        diver_count_ += 1;
      } else if (d.f[kMoveTimer] == 0) {
        d.f[kMoveTimer] = kDiverMoveInterval;
        Advance(d);
        if (OffScreen(d)) {
          diver.RemoveFromList();
        } else if (AtSub(d) && diver_count_ < 6) {
          diver.RemoveFromList();
          diver_count_ += 1;
        }
      } else {
        d.f[kMoveTimer] -= 1;
      }
    });
  }

  // The package's loops over enemy subs (which also shoot) and over fish: the same steps.
  void UpdateEnemies(Objects& enemies, bool subs, int& r) {
    ForReversed(enemies, [&](Held& enemy) {
      if (AtSub(enemy.get())) terminal_ = true;
      if (enemy.get().f[kMoveTimer] == 0) {
        enemy.get().f[kMoveTimer] = move_speed_;
        Advance(enemy.get());
        if (OffScreen(enemy.get())) {
          enemy.RemoveFromList();
        } else if (AtSub(enemy.get())) {
          terminal_ = true;
        } else {
          const size_t k = f_bullets_.FindAt(enemy.get().x(), enemy.get().y());
          if (k < f_bullets_.size()) {
            enemy.RemoveFromList();
            f_bullets_.Remove(f_bullets_[k]);
            r += 1;
          }
        }
      } else {
        enemy.get().f[kMoveTimer] -= 1;
      }
      if (!subs) return;
      // A sub shoots on its timer even when it has just been removed (off screen or shot).
      Object& sub = enemy.get();
      if (sub.f[kShotTimer] == 0) {
        sub.f[kShotTimer] = kEnemyShotInterval;
        e_bullets_.Append(Object{{sub.x(), sub.y(), sub.f[kLr], 0, 0}});
      } else {
        sub.f[kShotTimer] -= 1;
      }
    });
  }

  void UpdateEnemyBullets() {
    ForReversed(e_bullets_, [&](Held& bullet) {
      if (AtSub(bullet.get())) terminal_ = true;
      Advance(bullet.get());
      if (OffScreen(bullet.get()))
        bullet.RemoveFromList();
      else if (AtSub(bullet.get()))
        terminal_ = true;
    });
  }

  // Surfacing with divers: one is dropped off (all 6, for oxygen points, when full) and oxygen
  // refills. As in the package, surfacing with 6 leaves the count at -1 (set to 0, then the
  // decrement every surfacing gets), so the next surfacing without a diver does not end the game.
  int Surface() {
    surface_ = true;
    int r = 0;
    if (diver_count_ == 6) {
      diver_count_ = 0;
      r = oxygen_ * 10 / kMaxOxygen;
    }
    oxygen_ = kMaxOxygen;
    diver_count_ -= 1;
    if (ramping_ && (e_spawn_speed_ > 1 || move_speed_ > 2)) {
      if (move_speed_ > 2 && ramp_index_ % 2) move_speed_ -= 1;
      if (e_spawn_speed_ > 1) e_spawn_speed_ -= 1;
      ramp_index_ += 1;
    }
    return r;
  }

  // A fish or sub at a random edge and row, unless an enemy already goes the other way there
  // (the draws happen either way).
  void SpawnEnemy(minatar::RandomState& random) {
    const bool lr = random.Rand() < 1.0 / 2;
    const bool is_sub = random.Rand() < 1.0 / 3;
    const int x = lr ? 0 : 9;
    const int y = static_cast<int>(random.RandInt(1, 9));
    for (const Objects* list : {&e_subs_, &e_fish_})
      for (const Object& z : *list)
        if (z.y() == y && z.lr() != lr) return;
    if (is_sub)
      e_subs_.Append(Object{{x, y, lr, move_speed_, kEnemyShotInterval}});
    else
      e_fish_.Append(Object{{x, y, lr, move_speed_, 0}});
  }

  void SpawnDiver(minatar::RandomState& random) {
    const bool lr = random.Rand() < 1.0 / 2;
    const int y = static_cast<int>(random.RandInt(1, 9));
    divers_.Append(Object{{lr ? 0 : 9, y, lr, kDiverMoveInterval, 0}});
  }

  bool ramping_;
  int oxygen_ = kMaxOxygen, diver_count_ = 0;
  int sub_x_ = 5, sub_y_ = 0;
  bool sub_or_ = false;  // facing right
  Objects f_bullets_, e_bullets_, e_fish_, e_subs_, divers_;
  int e_spawn_speed_ = kInitSpawnSpeed, e_spawn_timer_ = kInitSpawnSpeed;
  int d_spawn_timer_ = kDiverSpawnSpeed, move_speed_ = kInitMoveInterval, ramp_index_ = 0;
  int shot_timer_ = 0;
  bool surface_ = true, terminal_ = false;
};

ONEBOX_REGISTER_MINATAR(MinAtarSeaquest, "Seaquest");

}  // namespace onebox
