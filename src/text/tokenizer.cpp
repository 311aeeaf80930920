#include "text/tokenizer.hpp"

#include <atomic>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "text/tokenizer_impl.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {

namespace {

// Per-thread cache of word → ids, one per tokenizer (keyed by its uid). Keys and values
// live in two arenas; the table is open-addressed. It is emptied when it grows past its
// budget, so memory stays bounded whatever the input.
class WordCache {
 public:
  static constexpr size_t kMaxWord = 128;  // longer words are not cached
  static constexpr size_t kMaxEntries = size_t(1) << 20;
  static constexpr size_t kMaxKeyBytes = size_t(32) << 20;

  WordCache() { reset(size_t(1) << 14); }

  // The cached ids of word, or nullptr.
  const int32_t* find(std::string_view word, uint64_t h, uint32_t* n) const {
    for (size_t s = h & mask_;; s = (s + 1) & mask_) {
      const Slot& e = slots_[s];
      if (e.hash == 0) return nullptr;
      if (e.hash == h && e.key_len == word.size() && same_bytes(keys_.data() + e.key_off, word)) {
        *n = e.val_len;
        return vals_.data() + e.val_off;
      }
    }
  }

  void insert(std::string_view word, uint64_t h, const int32_t* ids, size_t n) {
    if (used_ + 1 > kMaxEntries || keys_.size() + word.size() > kMaxKeyBytes) reset(size_t(1) << 14);
    if ((used_ + 1) * 2 > slots_.size()) grow();
    Slot e{h, uint32_t(keys_.size()), uint32_t(word.size()), uint32_t(vals_.size()), uint32_t(n)};
    keys_.append(word);
    vals_.insert(vals_.end(), ids, ids + n);
    place(e);
    ++used_;
  }

  static uint64_t hash(std::string_view word) { return uint64_t(StringHash{}(word)) | 1; }

  // Equal bytes, without a library call for the short words that dominate.
  static bool same_bytes(const char* a, std::string_view b) {
    size_t i = 0;
    for (; i + 8 <= b.size(); i += 8) {
      uint64_t x, y;
      std::memcpy(&x, a + i, 8);
      std::memcpy(&y, b.data() + i, 8);
      if (x != y) return false;
    }
    for (; i < b.size(); ++i)
      if (a[i] != b[i]) return false;
    return true;
  }

 private:
  struct Slot {
    uint64_t hash;  // 0: free
    uint32_t key_off, key_len, val_off, val_len;
  };
  void reset(size_t cap) {
    slots_.assign(cap, Slot{0, 0, 0, 0, 0});
    mask_ = cap - 1;
    used_ = 0;
    keys_.clear();
    vals_.clear();
  }
  void place(const Slot& e) {
    size_t s = e.hash & mask_;
    while (slots_[s].hash != 0) s = (s + 1) & mask_;
    slots_[s] = e;
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{0, 0, 0, 0, 0});
    mask_ = slots_.size() - 1;
    for (const Slot& e : old)
      if (e.hash) place(e);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, used_ = 0;
  std::string keys_;
  std::vector<int32_t> vals_;
};

WordCache& word_cache(uint64_t uid) {
  thread_local std::unordered_map<uint64_t, WordCache> caches;
  auto it = caches.find(uid);
  if (it != caches.end()) return it->second;
  if (caches.size() >= 4) caches.clear();  // tokenizers come and go: keep at most a few
  return caches[uid];
}

std::atomic<uint64_t> g_next_uid{1};

}  // namespace

void TokenizerImpl::finalize() {
  uid = g_next_uid.fetch_add(1);
  int32_t max_id = model->max_id();
  for (const AddedToken& t : added.tokens()) max_id = std::max(max_id, t.id);
  vocab_size = max_id + 1;
  decoded.assign(size_t(vocab_size), std::string());
  known.assign(size_t(vocab_size), 0);
  special.assign(size_t(vocab_size), 0);
  const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string* s = added.decode_string(id);
    if (!s) s = model->id_to_token(id);
    if (!s) continue;
    known[size_t(id)] = 1;
    special[size_t(id)] = added.is_special_content(*s);
    std::string& out = decoded[size_t(id)];
    if (decoder == DecoderKind::ByteLevel) {
      // Each character back to its byte; a token with any other character decodes to its
      // own UTF-8 bytes (tokenizers' ByteLevel decoder).
      bool all_bytes = true;
      for (size_t i = 0; i < s->size() && all_bytes;) {
        const int b = alpha.byte_of(next_code_point(*s, i));
        if (b < 0) all_bytes = false;
        else out += char(b);
      }
      if (!all_bytes) out = *s;
    } else {
      out = *s;
    }
  }
}

int32_t TokenizerImpl::token_to_id(std::string_view token) const {
  const int32_t id = added.token_to_id(token);
  return id >= 0 ? id : model->token_to_id(token);
}

void TokenizerImpl::encode_words(std::string_view text, std::vector<int32_t>& ids) const {
  const bool byte_level = pre_tokenizer.byte_level();
  WordCache& cache = word_cache(uid);
  const auto word = [&](std::string_view w) {
    if (w.size() > WordCache::kMaxWord || w.size() == 1) return model->tokenize(w, byte_level, ids);
    const uint64_t h = WordCache::hash(w);
    uint32_t n = 0;
    if (const int32_t* hit = cache.find(w, h, &n)) {
      for (uint32_t k = 0; k < n; ++k) ids.push_back(hit[k]);
      return;
    }
    const size_t before = ids.size();
    model->tokenize(w, byte_level, ids);
    cache.insert(w, h, ids.data() + before, ids.size() - before);
  };
  if (pre_tokenizer.empty())
    word(text);
  else
    pre_tokenizer.run(text, word);
}

std::vector<int32_t> TokenizerImpl::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  std::string normalized;
  added.split(text, /*normalized_set=*/false, [&](std::string_view piece, int32_t id) {
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
    const std::string_view n = normalizer.apply(piece, &normalized);
    added.split(n, /*normalized_set=*/true, [&](std::string_view p, int32_t id2) {
      if (id2 >= 0)
        ids.push_back(id2);
      else
        encode_words(p, ids);
    });
  });
  for (const auto& tmpl : post_templates) {
    std::vector<int32_t> wrapped;
    wrapped.reserve(ids.size() + 4);
    for (const TemplatePiece& piece : tmpl) {
      if (piece.is_sequence)
        wrapped.insert(wrapped.end(), ids.begin(), ids.end());
      else if (add_special_tokens)
        wrapped.insert(wrapped.end(), piece.ids.begin(), piece.ids.end());
    }
    ids.swap(wrapped);
  }
  return ids;
}

// ---- Tokenizer -----------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view json, std::string_view origin) {
  auto impl = load_tokenizer_json(json, origin);
  impl->finalize();
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const TokenizerImpl& t = *impl_;
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size || !t.known[size_t(id)]) continue;  // unknown ids are dropped
    if (skip_special_tokens && t.special[size_t(id)]) continue;
    if (t.decoder == DecoderKind::None && !first) bytes += ' ';
    bytes += t.decoded[size_t(id)];
    first = false;
  }
  if (t.decoder == DecoderKind::None) return bytes;  // token strings are valid UTF-8 already
  std::string out;
  out.reserve(bytes.size());
  append_lossy_utf8(out, bytes);
  return out;
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* a = impl_->added.by_id(id)) return a->content;
  if (const std::string* s = impl_->model->id_to_token(id)) return *s;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[size_t(id)];
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size) return {};
  return impl_->decoded[size_t(id)];
}

bool Tokenizer::has_space_separator() const { return impl_->decoder == DecoderKind::None; }

const std::vector<NamedToken>& Tokenizer::named_tokens() const { return impl_->named; }

const NamedToken* Tokenizer::named_token(std::string_view name) const {
  for (const NamedToken& t : impl_->named)
    if (t.name == name) return &t;
  return nullptr;
}

std::optional<bool> Tokenizer::add_bos_token() const { return impl_->add_bos; }
std::optional<bool> Tokenizer::add_eos_token() const { return impl_->add_eos; }
const std::vector<int32_t>& Tokenizer::stop_ids() const { return impl_->stop_ids; }
const std::optional<std::string>& Tokenizer::chat_template() const { return impl_->chat_template; }

std::string Tokenizer::summary() const {
  const TokenizerImpl& t = *impl_;
  return fmt::format("tokenizer {}: byte-level BPE, {} tokens ({} merges, {} added), stop ids [{}], chat template {}",
                     t.origin, t.vocab_size, t.model->num_merges(), t.added.tokens().size(), fmt::join(t.stop_ids, ","),
                     t.chat_template ? "present" : "absent");
}

}  // namespace fp4moe::text
