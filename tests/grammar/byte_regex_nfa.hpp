// An independent byte-level regex checker for the grammar tests (no code shared with xgrammar):
// a regex subset parsed into an AST and run as a Thompson NFA over bytes.
//   alternation |, groups ( ) and (?: ), quantifiers * + ? {m} {m,} {m,n}, classes [a-z0-9_]
//   (no negation), escapes \d \w \s \. \\ \" \{ ... , literal bytes (UTF-8 literals are byte
//   sequences, one atom each). No '.', no negated class: they mean a Unicode character to xgrammar.
// prefix_ok(s): some string in the language starts with s (every NFA state of a regex without
// empty classes reaches the accepting state). full_match(s): s is in the language.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::test {

class ByteRegexNfa {
 public:
  explicit ByteRegexNfa(std::string_view re) : re_(re) {
    auto ast = parse_alt();
    if (pos_ != re_.size()) throw std::runtime_error("regex: unexpected ')' at " + std::to_string(pos_));
    const int start = new_state();
    const int accept = new_state();
    compile(*ast, start, accept);
    start_ = start;
    accept_ = accept;
  }

  bool prefix_ok(std::string_view s) const { return !run(s).empty(); }
  bool full_match(std::string_view s) const {
    for (int st : run(s))
      if (st == accept_) return true;
    return false;
  }

 private:
  struct Node {
    enum Kind { kBytes, kConcat, kAlt, kRepeat } kind = kBytes;
    std::bitset<256> set;
    std::vector<std::unique_ptr<Node>> kids;
    int lo = 0, hi = 0;  // kRepeat: hi = -1 unbounded
  };
  using NodePtr = std::unique_ptr<Node>;
  struct State {
    std::bitset<256> set;  // a byte edge to `next` (when next >= 0)
    int next = -1;
    std::vector<int> eps;
  };

  std::unique_ptr<Node> leaf(std::bitset<256> set) {
    auto n = std::make_unique<Node>();
    n->set = set;
    return n;
  }
  bool more() const { return pos_ < re_.size(); }
  char peek() const { return re_[pos_]; }

  NodePtr parse_alt() {
    auto n = std::make_unique<Node>();
    n->kind = Node::kAlt;
    n->kids.push_back(parse_concat());
    while (more() && peek() == '|') {
      ++pos_;
      n->kids.push_back(parse_concat());
    }
    return n;
  }
  NodePtr parse_concat() {
    auto n = std::make_unique<Node>();
    n->kind = Node::kConcat;
    while (more() && peek() != '|' && peek() != ')') n->kids.push_back(parse_repeat());
    return n;
  }
  int number() {
    int v = 0;
    if (!more() || peek() < '0' || peek() > '9') throw std::runtime_error("regex: number expected");
    while (more() && peek() >= '0' && peek() <= '9') v = v * 10 + (re_[pos_++] - '0');
    return v;
  }
  NodePtr parse_repeat() {
    NodePtr a = parse_atom();
    while (more() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
      auto r = std::make_unique<Node>();
      r->kind = Node::kRepeat;
      const char q = re_[pos_++];
      if (q == '*') r->lo = 0, r->hi = -1;
      if (q == '+') r->lo = 1, r->hi = -1;
      if (q == '?') r->lo = 0, r->hi = 1;
      if (q == '{') {
        r->lo = number();
        r->hi = r->lo;
        if (more() && peek() == ',') {
          ++pos_;
          r->hi = more() && peek() == '}' ? -1 : number();
        }
        if (!more() || re_[pos_++] != '}') throw std::runtime_error("regex: '}' expected");
      }
      r->kids.push_back(std::move(a));
      a = std::move(r);
    }
    return a;
  }
  std::bitset<256> escape_set(char c) {
    std::bitset<256> s;
    auto range = [&](int a, int b) {
      for (int x = a; x <= b; ++x) s.set(size_t(x));
    };
    switch (c) {
      case 'd': range('0', '9'); break;
      case 'w': range('0', '9'), range('a', 'z'), range('A', 'Z'), s.set('_'); break;
      case 's': s.set(' '), s.set('\t'), s.set('\n'), s.set('\r'), s.set('\f'), s.set('\v'); break;
      case 'n': s.set('\n'); break;
      case 't': s.set('\t'); break;
      default: s.set(uint8_t(c));
    }
    return s;
  }
  NodePtr parse_atom() {
    const char c = re_[pos_++];
    if (c == '(') {
      if (re_.substr(pos_, 2) == "?:") pos_ += 2;
      NodePtr n = parse_alt();
      if (!more() || re_[pos_++] != ')') throw std::runtime_error("regex: ')' expected");
      return n;
    }
    if (c == '\\') return leaf(escape_set(re_[pos_++]));
    if (c == '[') {
      std::bitset<256> s;
      if (more() && peek() == '^') throw std::runtime_error("regex: negated classes are not in the subset");
      while (more() && peek() != ']') {
        std::bitset<256> one;
        int a;
        if (peek() == '\\') {
          ++pos_;
          one = escape_set(re_[pos_++]);
          s |= one;
          continue;
        }
        a = uint8_t(re_[pos_++]);
        if (more() && peek() == '-' && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
          ++pos_;
          const int b = uint8_t(re_[pos_++]);
          for (int x = a; x <= b; ++x) s.set(size_t(x));
        } else {
          s.set(size_t(a));
        }
      }
      if (!more()) throw std::runtime_error("regex: ']' expected");
      ++pos_;
      return leaf(s);
    }
    if (c == '.' || c == '^' || c == '$') throw std::runtime_error("regex: '.', '^', '$' are not in the subset");
    std::bitset<256> s;
    s.set(uint8_t(c));
    const uint8_t u = uint8_t(c);
    const size_t len = u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : u >= 0xC0 ? 2 : 1;
    if (len == 1) return leaf(s);
    // A UTF-8 literal is one character (one atom for a quantifier): its bytes in sequence.
    auto n = std::make_unique<Node>();
    n->kind = Node::kConcat;
    n->kids.push_back(leaf(s));
    for (size_t k = 1; k < len && more(); ++k) {
      std::bitset<256> b;
      b.set(uint8_t(re_[pos_++]));
      n->kids.push_back(leaf(b));
    }
    return n;
  }

  int new_state() {
    states_.emplace_back();
    return int(states_.size()) - 1;
  }
  // Wires node n from state a to state b.
  void compile(const Node& n, int a, int b) {
    switch (n.kind) {
      case Node::kBytes:
        states_[size_t(a)].set = n.set;
        states_[size_t(a)].next = b;
        break;
      case Node::kConcat: {
        int cur = a;
        for (const auto& k : n.kids) {
          const int mid = new_state();
          const int in = new_state();
          states_[size_t(cur)].eps.push_back(in);
          compile(*k, in, mid);
          cur = mid;
        }
        states_[size_t(cur)].eps.push_back(b);
        break;
      }
      case Node::kAlt:
        for (const auto& k : n.kids) {
          const int in = new_state();
          states_[size_t(a)].eps.push_back(in);
          compile(*k, in, b);
        }
        break;
      case Node::kRepeat: {
        int cur = a;
        for (int i = 0; i < n.lo; ++i) {  // the required copies
          const int in = new_state(), out = new_state();
          states_[size_t(cur)].eps.push_back(in);
          compile(*n.kids[0], in, out);
          cur = out;
        }
        if (n.hi < 0) {  // then any number more
          const int loop = new_state();
          states_[size_t(cur)].eps.push_back(loop);
          const int in = new_state();
          states_[size_t(loop)].eps.push_back(in);
          compile(*n.kids[0], in, loop);
          states_[size_t(loop)].eps.push_back(b);
        } else {
          for (int i = n.lo; i < n.hi; ++i) {  // optional copies
            states_[size_t(cur)].eps.push_back(b);
            const int in = new_state(), out = new_state();
            states_[size_t(cur)].eps.push_back(in);
            compile(*n.kids[0], in, out);
            cur = out;
          }
          states_[size_t(cur)].eps.push_back(b);
        }
        break;
      }
    }
  }
  void closure(std::vector<int>& set, std::vector<char>& in) const {
    for (size_t i = 0; i < set.size(); ++i)
      for (int e : states_[size_t(set[i])].eps)
        if (!in[size_t(e)]) {
          in[size_t(e)] = 1;
          set.push_back(e);
        }
  }
  std::vector<int> run(std::string_view s) const {
    std::vector<char> in(states_.size(), 0);
    std::vector<int> cur{start_};
    in[size_t(start_)] = 1;
    closure(cur, in);
    for (char ch : s) {
      std::vector<char> nin(states_.size(), 0);
      std::vector<int> next;
      for (int st : cur) {
        const State& x = states_[size_t(st)];
        if (x.next >= 0 && x.set.test(uint8_t(ch)) && !nin[size_t(x.next)]) {
          nin[size_t(x.next)] = 1;
          next.push_back(x.next);
        }
      }
      closure(next, nin);
      cur.swap(next);
      in.swap(nin);
      if (cur.empty()) break;
    }
    return cur;
  }

  std::string re_;
  size_t pos_ = 0;
  std::vector<State> states_;
  int start_ = 0, accept_ = 0;
};

// A mask's bit for token t (mask_words layout: bit t % 32 of word t / 32).
inline bool mask_bit(const std::vector<uint32_t>& mask, int32_t t) { return (mask[size_t(t) / 32] >> (t % 32)) & 1u; }

// The brute force's verdict on token t after text: the end-of-sequence id eos when text is a
// whole match; any other token when text + its bytes is still a prefix of the language (a token
// with no bytes, or past token_bytes, never).
inline bool brute_force_allows(const ByteRegexNfa& ref, const std::vector<std::string>& token_bytes, int32_t eos,
                               const std::string& text, int32_t t) {
  if (t == eos) return ref.full_match(text);
  return t < int32_t(token_bytes.size()) && !token_bytes[size_t(t)].empty() && ref.prefix_ok(text + token_bytes[size_t(t)]);
}

}  // namespace fp4moe::test
