// safetensors reader (mmap, validated, zero-copy) and streaming writer.
//
// File layout: u64 little-endian header length N, N bytes of JSON header (starting with
// '{', padded with trailing spaces), then the data section. The header maps tensor names
// to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data
// section) plus an optional "__metadata__" map of strings.
#include "format/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace fp4moe {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a plain file";
}

}  // namespace

void require_regular_file(const std::string& path) {
  struct stat st {};
  FP4MOE_CHECK(::stat(path.c_str(), &st) == 0, "{}: cannot open: {}", path, std::strerror(errno));
  FP4MOE_CHECK(S_ISREG(st.st_mode), "{}: not a regular file ({})", path, file_kind(st.st_mode));
}

int open_regular_file(const std::string& path, uint64_t* size) {
  require_regular_file(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FP4MOE_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    FP4MOE_FAIL("{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    FP4MOE_FAIL("{}: not a regular file ({})", path, file_kind(st.st_mode));
  }
  *size = uint64_t(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);
  if (size > max_bytes) {
    ::close(fd);
    FP4MOE_FAIL("{}: {} bytes is over the {} byte limit for this file", path, size, max_bytes);
  }
  std::string text(size_t(size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      FP4MOE_FAIL("{}: short read ({} of {} bytes){}", path, got, size, n < 0 ? std::string(": ") + std::strerror(err) : "");
    }
    got += size_t(n);
  }
  ::close(fd);
  return text;
}

namespace {

using json = nlohmann::json;

// Deepest nesting a valid header has: {top {entry [shape]}}. A little slack for errors.
constexpr int kMaxHeaderDepth = 4;
constexpr size_t kMaxNameInError = 120;

// A name from an untrusted file, safe to put in a one-line message.
// ascii_only also escapes bytes >= 0x80 (text that may hold invalid UTF-8).
std::string printable(std::string_view s, size_t max_len = kMaxNameInError, bool ascii_only = false) {
  std::string out;
  size_t i = 0;
  for (; i < s.size() && out.size() < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || (ascii_only && c >= 0x80)) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += char(c);
    }
  }
  if (i < s.size()) out += "...";
  return out;
}

// Nesting depth of JSON text outside strings; stops early once above the limit.
int json_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') max_depth = std::max(max_depth, ++depth);
    else if (c == '}' || c == ']') --depth;
    if (max_depth > kMaxHeaderDepth) break;
  }
  return max_depth;
}

// Reads a non-negative integer; rejects floats, negatives, booleans.
bool read_uint(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {  // signed: only non-negative values are fine
    const int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = uint64_t(x);
    return true;
  }
  return false;
}

std::string strip_json_exception_prefix(const char* what) {
  std::string s(what);
  if (!s.empty() && s[0] == '[') {
    if (auto p = s.find("] "); p != std::string::npos) s = s.substr(p + 2);
  }
  return printable(s, 400, /*ascii_only=*/true);
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorInfo> parse_safetensors_header(std::string_view text, uint64_t data_size,
                                                 std::map<std::string, std::string>* metadata,
                                                 const std::string& path) {
  FP4MOE_CHECK(!text.empty(), "{}: empty safetensors header", path);
  FP4MOE_CHECK(text.front() == '{', "{}: safetensors header does not start with '{{' (byte 0x{:02x})",
               path, static_cast<unsigned char>(text.front()));
  FP4MOE_CHECK(json_depth(text) <= kMaxHeaderDepth,
               "{}: safetensors header is nested deeper than {} levels", path, kMaxHeaderDepth);

  // nlohmann keeps the last of duplicate keys silently: watch every object's keys.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  int duplicate_depth = 0;
  json::parser_callback_t watch = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == json::parse_event_t::key && duplicate.empty() && !open_objects.empty()) {
      if (!open_objects.back().insert(parsed.get<std::string>()).second) {
        duplicate = parsed.get<std::string>();
        duplicate_depth = depth;
      }
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), watch, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    FP4MOE_FAIL("{}: safetensors header is not valid JSON: {}", path, strip_json_exception_prefix(e.what()));
  }
  FP4MOE_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", path);
  if (!duplicate.empty()) {
    if (duplicate_depth <= 1) FP4MOE_FAIL("{}: duplicate tensor name '{}'", path, printable(duplicate));
    FP4MOE_FAIL("{}: duplicate key '{}' in safetensors header", path, printable(duplicate));
  }

  std::vector<TensorInfo> tensors;
  tensors.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      FP4MOE_CHECK(v.is_object(), "{}: __metadata__ is not an object of strings", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        FP4MOE_CHECK(m.value().is_string(), "{}: __metadata__ value '{}' is not a string", path,
                     printable(m.key()));
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string pname = printable(name);
    FP4MOE_CHECK(v.is_object(), "{}: tensor '{}': entry is not an object", path, pname);
    for (auto f = v.begin(); f != v.end(); ++f)
      FP4MOE_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets",
                   "{}: tensor '{}': unexpected key '{}'", path, pname, printable(f.key()));
    TensorInfo t;
    t.name = name;

    const auto dt = v.find("dtype");
    FP4MOE_CHECK(dt != v.end(), "{}: tensor '{}': missing 'dtype'", path, pname);
    FP4MOE_CHECK(dt->is_string(), "{}: tensor '{}': 'dtype' is not a string", path, pname);
    const auto dtype = dtype_from_name(dt->get_ref<const std::string&>());
    FP4MOE_CHECK(dtype.has_value(), "{}: tensor '{}': unknown dtype '{}'", path, pname,
                 printable(dt->get_ref<const std::string&>()));
    t.dtype = *dtype;

    const auto sh = v.find("shape");
    FP4MOE_CHECK(sh != v.end(), "{}: tensor '{}': missing 'shape'", path, pname);
    FP4MOE_CHECK(sh->is_array(), "{}: tensor '{}': 'shape' is not an array", path, pname);
    uint64_t numel = 1;
    for (const json& d : *sh) {
      uint64_t dim = 0;
      FP4MOE_CHECK(read_uint(d, &dim), "{}: tensor '{}': shape entry {} is not a non-negative integer",
                   path, pname, printable(d.dump()));
      FP4MOE_CHECK(dim <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(numel, dim, &numel) &&
                       numel <= uint64_t(INT64_MAX),
                   "{}: tensor '{}': element count overflows", path, pname);
      t.shape.push_back(int64_t(dim));
    }

    const auto off = v.find("data_offsets");
    FP4MOE_CHECK(off != v.end(), "{}: tensor '{}': missing 'data_offsets'", path, pname);
    FP4MOE_CHECK(off->is_array() && off->size() == 2, "{}: tensor '{}': 'data_offsets' is not [begin, end]",
                 path, pname);
    FP4MOE_CHECK(read_uint((*off)[0], &t.begin) && read_uint((*off)[1], &t.end),
                 "{}: tensor '{}': 'data_offsets' are not non-negative integers", path, pname);
    FP4MOE_CHECK(t.begin <= t.end, "{}: tensor '{}': data_offsets [{}, {}] are reversed", path, pname,
                 t.begin, t.end);
    FP4MOE_CHECK(t.end <= data_size, "{}: tensor '{}': data_offsets [{}, {}] exceed the data section ({} bytes)",
                 path, pname, t.begin, t.end, data_size);
    uint64_t nbytes = 0;
    FP4MOE_CHECK(!__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes),
                 "{}: tensor '{}': byte size overflows", path, pname);
    FP4MOE_CHECK(nbytes == t.end - t.begin,
                 "{}: tensor '{}': {} {} elements need {} bytes but data_offsets span {}", path, pname, numel,
                 dtype_name(t.dtype), nbytes, t.end - t.begin);
    tensors.push_back(std::move(t));
  }

  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const TensorInfo& t : tensors) {
    FP4MOE_CHECK(t.begin >= cursor, "{}: tensor '{}' [{}, {}] overlaps the previous tensor (ends at {})", path,
                 printable(t.name), t.begin, t.end, cursor);
    FP4MOE_CHECK(t.begin == cursor, "{}: hole of {} bytes in the data section before tensor '{}'", path,
                 t.begin - cursor, printable(t.name));
    cursor = t.end;
  }
  FP4MOE_CHECK(cursor == data_size, "{}: {} bytes at the end of the data section belong to no tensor", path,
               data_size - cursor);
  return tensors;
}

// ---- reader ----------------------------------------------------------------------------

struct SafetensorsParser {
  static void load(SafetensorsFile& f) {
    const std::string& path = f.path_;
    uint64_t size = 0;
    const int fd = open_regular_file(path, &size);  // a FIFO would block open(): refused before
    if (size < 8) {
      ::close(fd);
      FP4MOE_FAIL("{}: file is {} bytes, too small for a safetensors header", path, size);
    }
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_err = errno;
    ::close(fd);
    FP4MOE_CHECK(map != MAP_FAILED, "{}: cannot mmap {} bytes: {}", path, size, std::strerror(map_err));
    f.map_ = static_cast<const uint8_t*>(map);
    f.map_size_ = size;

    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f.map_[i];
    FP4MOE_CHECK(header_len <= kSafetensorsMaxHeaderBytes,
                 "{}: header length {} exceeds the {} byte limit", path, header_len, kSafetensorsMaxHeaderBytes);
    FP4MOE_CHECK(header_len <= size - 8, "{}: header length {} exceeds the file size ({} bytes)", path,
                 header_len, size);
    const std::string_view text(reinterpret_cast<const char*>(f.map_ + 8), header_len);
    f.data_ = f.map_ + 8 + header_len;
    f.tensors_ = parse_safetensors_header(text, size - 8 - header_len, &f.metadata_, path);
    for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  }
};

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  SafetensorsParser::load(*f);  // on a throw, ~SafetensorsFile unmaps
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  FP4MOE_CHECK(t != nullptr, "{}: no tensor named '{}'", path_, printable(name));
  return *t;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& t) const {
  FP4MOE_CHECK(t.end >= t.begin && data_ + t.end <= map_ + map_size_,
               "{}: tensor '{}' is not part of this file", path_, printable(t.name));
  return {data_ + t.begin, size_t(t.end - t.begin)};
}

// ---- writer ----------------------------------------------------------------------------
//
// Tensor bytes stream into "<path>.tmp.data" as they are added; finish() writes
// "<path>.tmp" = length + header + the data (copied in-kernel with copy_file_range where
// possible) and renames it to <path>.

namespace {

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    FP4MOE_CHECK(w > 0, "{}: write failed: {}", path, w < 0 ? std::strerror(errno) : "no progress");
    c += w;
    n -= size_t(w);
  }
}

void copy_all(int in, int out, uint64_t n, const std::string& path) {
  off_t in_off = 0;
  bool kernel_copy = true;
  std::vector<uint8_t> buf;
  while (n > 0) {
    if (kernel_copy) {
      const ssize_t c = ::copy_file_range(in, &in_off, out, nullptr, size_t(std::min<uint64_t>(n, 1ull << 30)), 0);
      if (c > 0) {
        n -= uint64_t(c);
        continue;
      }
      if (c < 0 && errno == EINTR) continue;
      kernel_copy = false;  // unsupported here (EXDEV, ENOSYS, ...): fall back to read/write
      buf.resize(4u << 20);
    }
    const ssize_t r = ::pread(in, buf.data(), size_t(std::min<uint64_t>(n, buf.size())), in_off);
    if (r < 0 && errno == EINTR) continue;
    FP4MOE_CHECK(r > 0, "{}: reading back the data failed: {}", path, r < 0 ? std::strerror(errno) : "short file");
    write_all(out, buf.data(), size_t(r), path);
    in_off += r;
    n -= uint64_t(r);
  }
}

}  // namespace

struct SafetensorsWriter::Impl {
  std::string path, tmp_path, data_path;
  int data_fd = -1;
  uint64_t offset = 0;
  bool finished = false;
  std::map<std::string, std::string> metadata;
  std::vector<TensorInfo> tensors;  // in add order
  std::set<std::string, std::less<>> names;
  bool streaming = false;   // between begin_tensor() and end_tensor()
  bool broken = false;      // a streamed tensor got the wrong byte count: finish() refuses
  uint64_t expected = 0;    // bytes the streamed tensor needs

  void cleanup() {
    if (data_fd >= 0) ::close(data_fd);
    data_fd = -1;
    ::unlink(data_path.c_str());
  }
};

SafetensorsWriter::SafetensorsWriter(std::string path) : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->tmp_path = impl_->path + ".tmp";
  impl_->data_path = impl_->path + ".tmp.data";
  impl_->data_fd = ::open(impl_->data_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FP4MOE_CHECK(impl_->data_fd >= 0, "{}: cannot create: {}", impl_->data_path, std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!impl_) return;
  impl_->cleanup();
  if (!impl_->finished) ::unlink(impl_->tmp_path.c_str());
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  FP4MOE_CHECK(!impl_->finished, "{}: set_metadata after finish()", impl_->path);
  impl_->metadata[std::move(key)] = std::move(value);
}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::span<const uint8_t> data) {
  uint64_t numel = 1;
  for (int64_t d : shape)
    FP4MOE_CHECK(d >= 0 && !__builtin_mul_overflow(numel, uint64_t(d), &numel),
                 "{}: tensor '{}': bad shape", impl_->path, printable(name));
  FP4MOE_CHECK(numel * dtype_size(dtype) == data.size(), "{}: tensor '{}': {} {} elements need {} bytes, got {}",
               impl_->path, printable(name), numel, dtype_name(dtype), numel * dtype_size(dtype), data.size());
  begin_tensor(std::move(name), dtype, std::move(shape));
  append(data);
  end_tensor();
}

void SafetensorsWriter::begin_tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  Impl& w = *impl_;
  FP4MOE_CHECK(!w.finished, "{}: add('{}') after finish()", w.path, printable(name));
  FP4MOE_CHECK(!w.streaming, "{}: add('{}') while '{}' is being written", w.path, printable(name),
               printable(w.tensors.back().name));
  FP4MOE_CHECK(name != "__metadata__", "{}: '__metadata__' is not a valid tensor name", w.path);
  FP4MOE_CHECK(!w.names.count(name), "{}: duplicate tensor name '{}'", w.path, printable(name));
  uint64_t numel = 1;
  for (int64_t d : shape)
    FP4MOE_CHECK(d >= 0 && !__builtin_mul_overflow(numel, uint64_t(d), &numel),
                 "{}: tensor '{}': bad shape", w.path, printable(name));
  TensorInfo t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.begin = t.end = w.offset;
  w.names.insert(std::move(name));
  w.tensors.push_back(std::move(t));
  w.streaming = true;
  w.expected = numel * dtype_size(dtype);
}

void SafetensorsWriter::append(std::span<const uint8_t> piece) {
  Impl& w = *impl_;
  FP4MOE_CHECK(w.streaming, "{}: append() outside begin_tensor() / end_tensor()", w.path);
  TensorInfo& t = w.tensors.back();
  if (t.end - t.begin + piece.size() > w.expected) {
    w.broken = true;
    FP4MOE_FAIL("{}: tensor '{}': {} {} elements need {} bytes, got more", w.path, printable(t.name), t.numel(),
                dtype_name(t.dtype), w.expected);
  }
  write_all(w.data_fd, piece.data(), piece.size(), w.data_path);
  t.end += piece.size();
  w.offset = t.end;
}

void SafetensorsWriter::end_tensor() {
  Impl& w = *impl_;
  FP4MOE_CHECK(w.streaming, "{}: end_tensor() without begin_tensor()", w.path);
  const TensorInfo& t = w.tensors.back();
  w.streaming = false;
  w.broken = w.broken || t.end - t.begin != w.expected;
  FP4MOE_CHECK(t.end - t.begin == w.expected, "{}: tensor '{}': {} {} elements need {} bytes, got {}", w.path,
               printable(t.name), t.numel(), dtype_name(t.dtype), w.expected, t.end - t.begin);
}

void SafetensorsWriter::finish() {
  Impl& w = *impl_;
  FP4MOE_CHECK(!w.finished, "{}: finish() called twice", w.path);
  FP4MOE_CHECK(!w.streaming, "{}: finish() while '{}' is being written", w.path, printable(w.tensors.back().name));
  FP4MOE_CHECK(!w.broken, "{}: a tensor was written with the wrong byte count", w.path);
  json header = json::object();
  if (!w.metadata.empty()) header["__metadata__"] = w.metadata;
  for (const TensorInfo& t : w.tensors)
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape},
                      {"data_offsets", {t.begin, t.end}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + N stays 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  const int fd = ::open(w.tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FP4MOE_CHECK(fd >= 0, "{}: cannot create: {}", w.tmp_path, std::strerror(errno));
  try {
    write_all(fd, len, 8, w.tmp_path);
    write_all(fd, text.data(), text.size(), w.tmp_path);
    copy_all(w.data_fd, fd, w.offset, w.tmp_path);
  } catch (...) {
    ::close(fd);
    ::unlink(w.tmp_path.c_str());
    throw;
  }
  const int rc = ::close(fd);
  FP4MOE_CHECK(rc == 0, "{}: close failed: {}", w.tmp_path, std::strerror(errno));
  w.cleanup();
  FP4MOE_CHECK(::rename(w.tmp_path.c_str(), w.path.c_str()) == 0, "{}: cannot rename {} to it: {}", w.path,
               w.tmp_path, std::strerror(errno));
  w.finished = true;
}

}  // namespace fp4moe
