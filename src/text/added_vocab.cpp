#include "text/added_vocab.hpp"

#include <algorithm>

#include "text/unicode.hpp"

namespace fp4moe::text {

namespace {

bool same_options(const AddedToken& a, const AddedToken& b) {
  return a.content == b.content && a.special == b.special && a.single_word == b.single_word && a.lstrip == b.lstrip &&
         a.rstrip == b.rstrip && a.normalized == b.normalized;
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view s, int32_t token) {
  uint32_t node = 0;
  for (unsigned char c : s) {
    auto& next = nodes[node].next;
    auto it = std::lower_bound(next.begin(), next.end(), c, [](const auto& e, unsigned char v) { return e.first < v; });
    if (it == next.end() || it->first != c) {
      const uint32_t child = uint32_t(nodes.size());
      it = next.insert(it, {c, child});
      nodes.emplace_back();  // may reallocate: `next` and `it` are not used after this
      node = child;
    } else {
      node = it->second;
    }
  }
  nodes[node].token = token;
  if (!s.empty()) first[static_cast<unsigned char>(s[0])] = true;
}

int32_t AddedVocabulary::Trie::longest_at(std::string_view s, size_t i, size_t* end) const {
  int32_t best = -1;
  uint32_t node = 0;
  for (size_t k = i; k < s.size(); ++k) {
    const auto& next = nodes[node].next;
    const unsigned char c = static_cast<unsigned char>(s[k]);
    auto it = std::lower_bound(next.begin(), next.end(), c, [](const auto& e, unsigned char v) { return e.first < v; });
    if (it == next.end() || it->first != c) break;
    node = it->second;
    if (nodes[node].token >= 0) {
      best = nodes[node].token;
      *end = k + 1;
    }
  }
  return best;
}

std::vector<int32_t> AddedVocabulary::add(const std::vector<AddedToken>& tokens, const BpeModel& model,
                                          const Normalizer& normalizer) {
  int32_t max_added = -1;
  for (const AddedToken& t : tokens_) max_added = std::max(max_added, t.id);
  const int32_t vocab_size = int32_t(model.vocab_size());
  int32_t next_id = max_added < 0 ? vocab_size : (max_added >= vocab_size || vocab_size == 0 ? max_added + 1 : vocab_size);
  std::vector<int32_t> ids;
  for (const AddedToken& in : tokens) {
    if (in.content.empty()) {
      ids.push_back(-1);
      continue;
    }
    if (auto it = content_to_id_.find(in.content); it != content_to_id_.end()) {
      if (const AddedToken* old = by_id(it->second); old && same_options(*old, in)) {
        ids.push_back(it->second);
        continue;
      }
    }
    int32_t id = token_to_id(in.content);
    if (id < 0) id = model.token_to_id(in.content);
    if (id < 0) id = next_id++;
    AddedToken t = in;
    t.id = id;
    if (t.normalized && !normalizer.empty()) {
      std::string buf;
      const std::string_view n = normalizer.apply(t.content, &buf);
      if (n != t.content) normalized_form_[id] = std::string(n);
    }
    content_to_id_[t.content] = id;
    if (t.special && !is_special_content(t.content)) special_contents_.push_back(t.content);
    if (auto it = by_id_.find(id); it != by_id_.end()) {
      tokens_[it->second] = std::move(t);
    } else {
      by_id_[id] = tokens_.size();
      tokens_.push_back(std::move(t));
    }
    ids.push_back(id);
  }
  rebuild();
  return ids;
}

void AddedVocabulary::rebuild() {
  raw_.clear();
  normalized_.clear();
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const AddedToken& t = tokens_[k];
    if (t.normalized) {
      const auto it = normalized_form_.find(t.id);
      normalized_.insert(it != normalized_form_.end() ? std::string_view(it->second) : std::string_view(t.content),
                         int32_t(k));
    } else {
      raw_.insert(t.content, int32_t(k));
    }
  }
}

int32_t AddedVocabulary::token_to_id(std::string_view content) const {
  const auto it = content_to_id_.find(std::string(content));
  return it == content_to_id_.end() ? -1 : it->second;
}

const AddedToken* AddedVocabulary::by_id(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const std::string* AddedVocabulary::decode_string(int32_t id) const {
  const AddedToken* t = by_id(id);
  if (!t) return nullptr;
  const auto it = normalized_form_.find(id);
  return it != normalized_form_.end() ? &it->second : &t->content;
}

bool AddedVocabulary::is_special_content(std::string_view content) const {
  return std::find(special_contents_.begin(), special_contents_.end(), content) != special_contents_.end();
}

void AddedVocabulary::split(std::string_view text, bool normalized_set,
                            FunctionRef<void(std::string_view, int32_t)> emit) const {
  if (text.empty()) return;
  const Trie& trie = normalized_set ? normalized_ : raw_;
  if (trie.nodes.size() == 1) {
    emit(text, -1);
    return;
  }
  const size_t n = text.size();
  size_t start_offset = 0;
  for (size_t i = 0; i < n;) {
    if (!trie.first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    size_t match_end = 0;
    const int32_t k = trie.longest_at(text, i, &match_end);
    if (k < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = tokens_[size_t(k)];
    size_t start = i, stop = match_end;
    i = match_end;  // matches never overlap, whatever happens to this one below
    if (t.single_word) {
      size_t b;
      const bool start_space = start == 0 || !is_rust_word_char(prev_code_point(text, start, &b));
      size_t j = stop;
      const bool stop_space = stop == n || !is_rust_word_char(next_code_point(text, j));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t b;
        if (!is_white_space(prev_code_point(text, new_start, &b))) break;
        new_start = b;
      }
      start = std::max(new_start, start_offset);
    }
    if (t.rstrip) {
      while (stop < n) {
        size_t j = stop;
        if (!is_white_space(next_code_point(text, j))) break;
        stop = j;
      }
    }
    if (start_offset < start) emit(text.substr(start_offset, start - start_offset), -1);
    emit(text.substr(start, stop - start), t.id);
    start_offset = stop;
  }
  if (start_offset < n) emit(text.substr(start_offset), -1);
}

}  // namespace fp4moe::text
