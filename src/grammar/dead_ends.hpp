// Compile-time check that a compiled grammar cannot strand a generation: every point the
// matcher can reach by accepting text must still have a way to complete (grammar.cpp refuses
// the grammar otherwise). Internal to grammar/ (it reads xgrammar's compiled automata).
#pragma once

#include <optional>

#include <xgrammar/xgrammar.h>

namespace fp4moe::grammar {

struct DeadEndReport {
  bool admits_nothing = false;  // the start itself cannot complete: the language is empty
};

// Looks at xgrammar's per-rule automata (every rule of a compiled grammar has one, all in one
// state space): a state is live when an end of its rule is reachable from it through edges
// that can be taken (bytes, tokens, epsilon, a reference to a rule that can complete, a
// repetition of such a rule or of none). Then, from the root, every state the matcher can
// reach is walked; a reachable state that is not live and that text can enter or leave (it
// was reached over a non-epsilon edge, or it has a consuming edge out) is a dead end: the mask
// would let a token in, after which no token is allowed. O(states + edges) of the grammar.
// Lookahead assertions, token budgets and the vocabulary's coverage of bytes are not looked at
// (xgrammar's own constructions keep them consistent; byte-level vocabularies spell every
// byte); the runtime's "allows no next token" abort stays as the backstop.
std::optional<DeadEndReport> find_dead_end(const xgrammar::CompiledGrammar& compiled);

}  // namespace fp4moe::grammar
