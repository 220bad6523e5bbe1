#include "planner.h"

#include <algorithm>
#include <climits>
#include <unordered_map>

#include "checked.h"
#include "error.h"

namespace retort {

Tensor* storage_root(Tensor* t) {
  if (t->op == Op::View) return t->view_src;
  if (writes_into_src0(t->op)) return storage_root(t->src[0]);
  if (writes_accumulator(t)) return t->view_src;  // written into an accumulator
  return t;
}

namespace {

bool owns_storage(const Tensor* t) {
  if (writes_accumulator(t)) return false;  // Graph::backward pointed it at an accumulator
  return t->op != Op::None && t->op != Op::View && !writes_into_src0(t->op);
}

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

}  // namespace

Plan plan_memory(const std::vector<Tensor*>& nodes, size_t alignment) {
  std::unordered_map<const Tensor*, int> step;
  for (int i = 0; i < int(nodes.size()); ++i) step[nodes[i]] = i;

  std::unordered_map<Tensor*, size_t> slot_of;
  Plan plan;
  for (int i = 0; i < int(nodes.size()); ++i) {
    Tensor* t = nodes[i];
    if (!owns_storage(t)) continue;
    int first = i;
    // An extra output is written by its owner, so it is live from the owner's step.
    if (t->op == Op::AuxOutput) {
      auto it = step.find(t->src[0]);
      RT_ASSERT(it != step.end());
      first = it->second;
    }
    bool keep = t->has(kOutput) || t->has(kLoss);
    slot_of[t] = plan.slots.size();
    plan.slots.push_back({t, 0, round_up(t->nbytes(), alignment), first, keep ? INT_MAX : first});
  }
  // A slot stays live through the last step that reads it or any view of it.
  for (int i = 0; i < int(nodes.size()); ++i) {
    Tensor* t = nodes[i];
    for (Tensor* s : t->src) {
      if (!s) continue;
      auto it = slot_of.find(storage_root(s));
      if (it == slot_of.end()) continue;
      PlanSlot& slot = plan.slots[it->second];
      if (slot.last != INT_MAX) slot.last = std::max(slot.last, i);
    }
    // A view that is itself an output keeps its storage alive.
    if ((t->has(kOutput) || t->has(kLoss)) && !owns_storage(t)) {
      auto it = slot_of.find(storage_root(t));
      if (it != slot_of.end()) plan.slots[it->second].last = INT_MAX;
    }
  }
  // Greedy by size: place the largest first, each at the lowest offset that does not collide with an
  // already placed slot whose live range intersects its own.
  std::vector<size_t> order(plan.slots.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.slots[a].size > plan.slots[b].size; });
  std::vector<size_t> placed;
  std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of conflicting slots
  for (size_t idx : order) {
    PlanSlot& s = plan.slots[idx];
    busy.clear();
    for (size_t j : placed) {
      const PlanSlot& o = plan.slots[j];
      if (o.first <= s.last && s.first <= o.last) busy.emplace_back(o.offset, o.offset + o.size);
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (auto [b, e] : busy) {
      if (offset + s.size <= b) break;
      offset = std::max(offset, e);
    }
    s.offset = offset;
    placed.push_back(idx);
    plan.arena_bytes = std::max(plan.arena_bytes, checked_add(offset, s.size, "memory planner: arena"));
    plan.naive_bytes = checked_add(plan.naive_bytes, s.size, "memory planner: arena");
  }
  return plan;
}

}  // namespace retort
