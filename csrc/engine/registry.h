// The table of native envs. Each env file registers itself with one line:
//   ONEBOX_REGISTER_ENV(CartPole, "CartPole-v1");
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace onebox {

struct EnvEntry {
  std::string id;
  std::vector<OptionDecl> (*options)();
  EnvSpec (*spec)(const Config&);
  std::unique_ptr<Engine> (*make)(const Config&, const EnvSpec&, const EngineOptions&);
};

class Registry {
 public:
  static Registry& Get();
  void Add(EnvEntry entry);
  // Throws std::out_of_range for an unknown id.
  const EnvEntry& Find(const std::string& id) const;
  std::vector<std::string> Ids() const;

 private:
  std::vector<EnvEntry> entries_;
};

template <class E>
struct Registrar {
  explicit Registrar(const char* id) {
    Registry::Get().Add(EnvEntry{
        id, &E::Options, &E::Spec,
        [](const Config& cfg, const EnvSpec& spec, const EngineOptions& opt) -> std::unique_ptr<Engine> {
          return std::make_unique<EngineT<E>>(cfg, spec, opt);
        }});
  }
};

}  // namespace onebox

#define ONEBOX_CONCAT_INNER(a, b) a##b
#define ONEBOX_CONCAT(a, b) ONEBOX_CONCAT_INNER(a, b)
#define ONEBOX_REGISTER_ENV(E, ID) \
  static const ::onebox::Registrar<E> ONEBOX_CONCAT(onebox_registrar_, __COUNTER__)(ID)
