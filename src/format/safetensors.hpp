// safetensors: an mmap'd, validated reader with zero-copy views, and a streaming writer.
//
// Files are untrusted. open() validates everything before any view is handed out:
// the 8-byte header length (bounded by the file size and by kMaxHeaderBytes), well-formed
// JSON whose top level is an object, every entry having a known dtype, an integer shape
// and [begin, end) offsets inside the data section, byte size == numel * dtype size
// (with overflow checks), no overlaps and no holes between tensors, unique names.
// A violation throws fp4moe::Error with one line: "<path>: <problem>".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"

namespace fp4moe {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;  // 100 MiB

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// "[2, 3]" (for messages).
std::string shape_str(const std::vector<int64_t>& shape);

// Every file of a checkpoint (safetensors, config.json, index, quantization config) is
// checked with stat() (following symlinks) before it is opened: a FIFO, a device, a socket or
// a directory is refused with "<path>: not a regular file (<kind>)" instead of blocking in
// open(). The open itself is O_NONBLOCK and re-checked with fstat (a swap in between).
void require_regular_file(const std::string& path);
// Opens a regular file for reading as above; returns the fd (the caller closes it) and its size.
int open_regular_file(const std::string& path, uint64_t* size);
// The whole of a small regular file (at most max_bytes), through open_regular_file.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

// A validated, memory-mapped safetensors file. Views stay valid while the file lives.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by begin offset
  const TensorInfo* find(std::string_view name) const;                   // nullptr if absent
  const TensorInfo& get(std::string_view name) const;                    // throws if absent
  std::span<const uint8_t> bytes(const TensorInfo& t) const;             // zero-copy view
  // File offset of the data section (8 + header length): tensor t's bytes lie at
  // [data_offset() + t.begin, data_offset() + t.end) of the file (per-rank partial reads).
  uint64_t data_offset() const { return uint64_t(data_ - map_); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
  friend struct SafetensorsParser;
};

// Validates a header (the JSON text after the 8-byte length) against a data section of
// data_size bytes; returns the tensors sorted by offset. Used by open() and by the fuzzer.
std::vector<TensorInfo> parse_safetensors_header(std::string_view json_text, uint64_t data_size,
                                                 std::map<std::string, std::string>* metadata,
                                                 const std::string& path_for_errors);

// Streaming writer: add tensors one by one (data is written immediately, so peak memory
// stays at one tensor), then finish() writes the header. The file is written to
// "<path>.tmp" and renamed on finish(); a writer destroyed unfinished removes it.
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path);
  ~SafetensorsWriter();
  void set_metadata(std::string key, std::string value);
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const uint8_t> data);
  template <typename T>
  void add(std::string name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
    add(std::move(name), dtype, std::move(shape),
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)));
  }
  // Streamed add, for tensors too large to hold: begin_tensor(), then append() its bytes in
  // pieces, then end_tensor() (which checks that exactly the shape's bytes came).
  void begin_tensor(std::string name, DType dtype, std::vector<int64_t> shape);
  void append(std::span<const uint8_t> piece);
  void end_tensor();
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe
