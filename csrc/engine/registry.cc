#include "engine/registry.h"

#include <algorithm>
#include <stdexcept>

namespace onebox {

const Value& Config::Get(const std::string& k) const {
  auto it = values_.find(k);
  if (it == values_.end()) throw std::invalid_argument("missing env option '" + k + "'");
  return it->second;
}

Registry& Registry::Get() {
  static Registry registry;
  return registry;
}

void Registry::Add(EnvEntry entry) {
  for (const auto& e : entries_)
    if (e.id == entry.id) throw std::logic_error("env id registered twice: " + entry.id);
  entries_.push_back(std::move(entry));
}

const EnvEntry& Registry::Find(const std::string& id) const {
  for (const auto& e : entries_)
    if (e.id == id) return e;
  throw std::out_of_range("unknown native env id: " + id);
}

std::vector<std::string> Registry::Ids() const {
  std::vector<std::string> ids;
  for (const auto& e : entries_) ids.push_back(e.id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace onebox
