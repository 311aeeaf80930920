#include "grammar/dead_ends.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

// xgrammar's internal headers (its cpp/ folder): the compiled grammar's automata.
#include "compiled_grammar_impl.h"
#include "fsm.h"
#include "grammar_impl.h"

namespace fp4moe::grammar {
namespace {

using xgrammar::FSMEdge;

// What an edge needs to be taken, beyond its target being live.
struct EdgeNeed {
  int32_t rule = -1;  // a rule that must be able to complete (-1: none)
  bool passable = true;
};

EdgeNeed need_of(const FSMEdge& e, const std::vector<int32_t>& aux) {
  if (e.IsRuleRef()) return {e.GetRefRuleId(), true};
  if (e.IsRepeatRef()) {
    const int32_t at = e.GetAuxIndex();  // [rule_id, lower, upper]
    if (at < 0 || size_t(at) + 2 >= aux.size()) return {-1, true};
    return aux[size_t(at) + 1] == 0 ? EdgeNeed{-1, true} : EdgeNeed{aux[size_t(at)], true};
  }
  if (e.IsToken()) {
    const int32_t at = e.GetAuxIndex();  // [count, ids...]
    return {-1, at >= 0 && size_t(at) < aux.size() && aux[size_t(at)] > 0};
  }
  return {-1, true};  // bytes, epsilon, EOS, any token but some
}

}  // namespace

std::optional<DeadEndReport> find_dead_end(const xgrammar::CompiledGrammar& compiled) {
  const xgrammar::Grammar grammar = compiled.GetGrammar();
  const auto& g = *grammar.ImplPtr();
  if (g.complete_fsm.IsNull()) return std::nullopt;
  const xgrammar::CompactFSM& fsm = g.complete_fsm;
  const std::vector<int32_t>& aux = fsm.GetEdgeAuxData();
  const int32_t n_states = fsm.NumStates();
  const int32_t n_rules = g.NumRules();
  if (int32_t(g.per_rule_fsms.size()) != n_rules) return std::nullopt;
  std::vector<int32_t> start(size_t(n_rules), -1);
  std::vector<std::vector<int32_t>> rules_starting_at{size_t(n_states)};
  for (int32_t r = 0; r < n_rules; ++r) {
    if (!g.per_rule_fsms[size_t(r)]) return std::nullopt;  // not an optimized grammar: nothing to say
    start[size_t(r)] = g.per_rule_fsms[size_t(r)]->GetFsm().GetStart();
    if (start[size_t(r)] < 0 || start[size_t(r)] >= n_states) return std::nullopt;
    rules_starting_at[size_t(start[size_t(r)])].push_back(r);
  }

  // Reverse edges (CSR): for each target, the (source, edge) pairs into it.
  struct Into {
    int32_t source;
    EdgeNeed need;
  };
  std::vector<int32_t> offset(size_t(n_states) + 1, 0);
  for (int32_t s = 0; s < n_states; ++s)
    for (const FSMEdge& e : fsm.GetEdges(s))
      if (e.target >= 0 && e.target < n_states) ++offset[size_t(e.target) + 1];
  for (int32_t s = 0; s < n_states; ++s) offset[size_t(s) + 1] += offset[size_t(s)];
  std::vector<Into> into(size_t(offset.back()));
  {
    std::vector<int32_t> fill(offset.begin(), offset.end() - 1);
    for (int32_t s = 0; s < n_states; ++s)
      for (const FSMEdge& e : fsm.GetEdges(s))
        if (e.target >= 0 && e.target < n_states) into[size_t(fill[size_t(e.target)]++)] = {s, need_of(e, aux)};
  }

  // Live states, backwards from every rule's ends; an edge through a rule waits for the rule.
  std::vector<uint8_t> live(size_t(n_states), 0), productive(size_t(n_rules), 0);
  std::vector<std::vector<int32_t>> waiting{size_t(n_rules)};  // sources whose edge waits for the rule
  std::vector<int32_t> work;
  auto make_live = [&](int32_t s) {
    if (live[size_t(s)]) return;
    live[size_t(s)] = 1;
    work.push_back(s);
  };
  for (int32_t r = 0; r < n_rules; ++r)
    for (int32_t end : g.per_rule_fsms[size_t(r)]->GetFsm().GetEnds())
      if (end >= 0 && end < n_states) make_live(end);
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (int32_t r : rules_starting_at[size_t(t)]) {
      if (productive[size_t(r)]) continue;
      productive[size_t(r)] = 1;
      for (int32_t s : waiting[size_t(r)]) make_live(s);
      waiting[size_t(r)].clear();
    }
    for (int32_t k = offset[size_t(t)]; k < offset[size_t(t) + 1]; ++k) {
      const Into& in = into[size_t(k)];
      if (!in.need.passable || live[size_t(in.source)]) continue;
      if (in.need.rule < 0 || in.need.rule >= n_rules || productive[size_t(in.need.rule)])
        make_live(in.source);
      else
        waiting[size_t(in.need.rule)].push_back(in.source);
    }
  }

  const int32_t root = g.GetRootRuleId();
  if (root < 0 || root >= n_rules) return std::nullopt;
  if (!productive[size_t(root)]) return DeadEndReport{true};

  // States the matcher can reach from the root's start, each once plain and once with text
  // behind it (reached over a non-epsilon edge somewhere on the way).
  std::vector<uint8_t> reached(size_t(n_states), 0);  // bit 1: plain, bit 2: with text behind it
  struct Visit {
    int32_t state;
    bool by_text;
  };
  std::vector<Visit> stack;
  auto visit = [&](int32_t s, bool by_text) {
    const uint8_t bit = by_text ? 2 : 1;
    if (reached[size_t(s)] & bit) return;
    reached[size_t(s)] |= bit;
    stack.push_back({s, by_text});
  };
  visit(start[size_t(root)], false);
  while (!stack.empty()) {
    const Visit v = stack.back();
    stack.pop_back();
    for (const FSMEdge& e : fsm.GetEdges(v.state)) {
      if (e.target < 0 || e.target >= n_states) continue;
      const EdgeNeed need = need_of(e, aux);
      if (e.IsRuleRef() || e.IsRepeatRef()) {
        const int32_t at = e.GetAuxIndex();
        const int32_t r = e.IsRuleRef() ? e.GetRefRuleId() : (at >= 0 && size_t(at) < aux.size() ? aux[size_t(at)] : -1);
        if (r >= 0 && r < n_rules) visit(start[size_t(r)], false);
        // Past the reference: text went through the rule (or the repetition was skipped).
        if (need.rule < 0 || productive[size_t(need.rule)]) visit(e.target, true);
        continue;
      }
      if (need.passable) visit(e.target, v.by_text || !e.IsEpsilon());
    }
  }
  for (int32_t s = 0; s < n_states; ++s) {
    if (!reached[size_t(s)] || live[size_t(s)]) continue;
    const auto edges = fsm.GetEdges(s);
    const bool consumes = std::any_of(edges.begin(), edges.end(), [](const FSMEdge& e) { return !e.IsEpsilon(); });
    if ((reached[size_t(s)] & 2) || consumes) return DeadEndReport{false};  // text can get in, and not out
  }
  return std::nullopt;
}

}  // namespace fp4moe::grammar
