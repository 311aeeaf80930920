// safetensors: round-trip of every dtype, writer details, and every malformed-file case.
#include "format/safetensors.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fp4moe_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A raw file: 8-byte length (header_len_override if given) + header + data_size bytes.
  std::string write_raw(const std::string& header, uint64_t data_size,
                        std::optional<uint64_t> header_len_override = std::nullopt,
                        const std::string& name = "bad.safetensors") {
    const std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = header_len_override.value_or(header.size());
    for (int i = 0; i < 8; ++i) f.put(char(n >> (8 * i)));
    f << header;
    f << std::string(data_size, '\0');
    return p;
  }

  // Expects open() to fail with one line naming the file and containing `what`.
  void expect_bad(const std::string& p, const std::string& what) {
    try {
      auto f = SafetensorsFile::open(p);
      ADD_FAILURE() << "opened a malformed file, expected: " << what;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << "does not start with the path: " << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
    }
  }

  std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                    const std::string& offsets) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets +
           "}";
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  std::mt19937 rng(1234);
  struct Want {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Want> want;
  const std::vector<std::vector<int64_t>> shapes = {{3, 5}, {7}, {}, {2, 3, 4}, {0, 4}, {1, 1, 1, 9}};
  int i = 0;
  for (DType t : kAllDTypes) {
    for (const auto& shape : shapes) {
      Want w{fmt::format("t{}.{}", i++, dtype_name(t)), t, shape, {}};
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      w.bytes.resize(size_t(n) * dtype_size(t));
      for (auto& b : w.bytes) b = uint8_t(rng());
      want.push_back(std::move(w));
    }
  }
  const std::string p = path("all.safetensors");
  {
    SafetensorsWriter w(p);
    w.set_metadata("format", "pt");
    w.set_metadata("note", "line1\nline2 \"quoted\"");
    for (const auto& t : want) w.add(t.name, t.dtype, t.shape, std::span<const uint8_t>(t.bytes));
    w.finish();
  }
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_FALSE(fs::exists(p + ".tmp.data"));

  // Header length is a multiple of 8, padded with spaces.
  std::ifstream raw(p, std::ios::binary);
  uint8_t len_bytes[8];
  raw.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t len = 0;
  for (int k = 7; k >= 0; --k) len = (len << 8) | len_bytes[k];
  EXPECT_EQ(len % 8, 0u);
  std::string header(len, '\0');
  raw.read(header.data(), std::streamsize(len));
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));

  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->path(), p);
  ASSERT_EQ(f->tensors().size(), want.size());
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "line1\nline2 \"quoted\"");
  for (const auto& t : want) {
    const TensorInfo* info = f->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype);
    EXPECT_EQ(info->shape, t.shape);
    EXPECT_EQ(info->nbytes(), t.bytes.size());
    auto span = f->bytes(*info);
    ASSERT_EQ(span.size(), t.bytes.size());
    EXPECT_TRUE(std::equal(span.begin(), span.end(), t.bytes.begin())) << t.name;
    EXPECT_EQ(&f->get(t.name), info);
  }
  for (size_t k = 1; k < f->tensors().size(); ++k) EXPECT_LE(f->tensors()[k - 1].begin, f->tensors()[k].begin);
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_THROW(f->get("nope"), Error);
}

TEST_F(SafetensorsTest, ViewsAreZeroCopyIntoTheMapping) {
  const std::string p = path("z.safetensors");
  std::vector<float> a(1000, 1.5f), b(10, -2.0f);
  {
    SafetensorsWriter w(p);
    w.add("a", DType::F32, {10, 100}, a);
    w.add("b", DType::F32, {10}, b);
    w.finish();
  }
  auto f = SafetensorsFile::open(p);
  auto sa = f->bytes(f->get("a"));
  auto sb = f->bytes(f->get("b"));
  EXPECT_EQ(sa.data() + sa.size(), sb.data());  // contiguous in one mapping
  float x;
  std::memcpy(&x, sb.data(), 4);
  EXPECT_EQ(x, -2.0f);
}

TEST_F(SafetensorsTest, EmptyFileWithNoTensors) {
  const std::string p = path("empty.safetensors");
  {
    SafetensorsWriter w(p);
    w.finish();
  }
  auto f = SafetensorsFile::open(p);
  EXPECT_TRUE(f->tensors().empty());
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  const std::string p = path("w.safetensors");
  SafetensorsWriter w(p);
  std::vector<uint8_t> four(4);
  w.add("x", DType::U8, {4}, four);
  EXPECT_THROW(w.add("x", DType::U8, {4}, four), Error);              // duplicate
  EXPECT_THROW(w.add("y", DType::F32, {4}, four), Error);             // size mismatch
  EXPECT_THROW(w.add("z", DType::U8, {-4}, four), Error);             // negative dim
  EXPECT_THROW(w.add("__metadata__", DType::U8, {4}, four), Error);   // reserved
}

TEST_F(SafetensorsTest, StreamedTensorEqualsOneAdd) {
  std::vector<uint16_t> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint16_t(i * 7919u);
  const auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2);
  const std::string a = path("one.safetensors"), b = path("streamed.safetensors");
  {
    SafetensorsWriter w(a);
    w.add("before", DType::U8, {3}, std::vector<uint8_t>{1, 2, 3});
    w.add("t", DType::BF16, {10, 100}, bytes);
    w.add("after", DType::U8, {1}, std::vector<uint8_t>{9});
    w.finish();
  }
  {
    SafetensorsWriter w(b);
    w.add("before", DType::U8, {3}, std::vector<uint8_t>{1, 2, 3});
    w.begin_tensor("t", DType::BF16, {10, 100});
    w.append(bytes.subspan(0, 6));  // uneven pieces and an empty one
    w.append(bytes.subspan(6, 1000));
    w.append({});
    w.append(bytes.subspan(1006));
    w.end_tensor();
    w.add("after", DType::U8, {1}, std::vector<uint8_t>{9});
    w.finish();
  }
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  const std::string da((std::istreambuf_iterator<char>(fa)), {}), db((std::istreambuf_iterator<char>(fb)), {});
  EXPECT_EQ(da, db);
}

TEST_F(SafetensorsTest, StreamedTensorWithWrongByteCountIsRefused) {
  std::vector<uint8_t> eight(8);
  {
    SafetensorsWriter w(path("short.safetensors"));
    w.begin_tensor("t", DType::F32, {4});
    w.append(std::span<const uint8_t>(eight));
    EXPECT_THROW(w.end_tensor(), Error);  // 8 of 16 bytes
    EXPECT_THROW(w.finish(), Error);      // the file would be corrupt
  }
  {
    SafetensorsWriter w(path("long.safetensors"));
    w.begin_tensor("t", DType::U8, {4});
    EXPECT_THROW(w.append(std::span<const uint8_t>(eight)), Error);  // 8 bytes for 4
    EXPECT_THROW(w.add("u", DType::U8, {4}, std::vector<uint8_t>(4)), Error);  // still inside "t"
  }
  {
    SafetensorsWriter w(path("misuse.safetensors"));
    EXPECT_THROW(w.append(std::span<const uint8_t>(eight)), Error);  // no begin_tensor
    EXPECT_THROW(w.end_tensor(), Error);
  }
  EXPECT_FALSE(fs::exists(path("short.safetensors")));
}

TEST_F(SafetensorsTest, UnfinishedWriterLeavesNothing) {
  const std::string p = path("u.safetensors");
  {
    SafetensorsWriter w(p);
    std::vector<uint8_t> four(4);
    w.add("x", DType::U8, {4}, four);
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_FALSE(fs::exists(p + ".tmp.data"));
}

TEST_F(SafetensorsTest, MissingFile) { expect_bad(path("does_not_exist.safetensors"), "cannot open"); }

TEST_F(SafetensorsTest, Directory) { expect_bad(dir_.string(), "not a regular file"); }

TEST_F(SafetensorsTest, TruncatedBelowLength) {
  const std::string p = path("short.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  expect_bad(p, "too small");
}

TEST_F(SafetensorsTest, TruncatedData) {
  // A valid file cut short: the last tensor's bytes are missing.
  const std::string p = path("trunc.safetensors");
  {
    SafetensorsWriter w(p);
    std::vector<float> v(64, 1.0f);
    w.add("a", DType::F32, {64}, v);
    w.finish();
  }
  fs::resize_file(p, fs::file_size(p) - 10);
  expect_bad(p, "exceed the data section");
}

TEST_F(SafetensorsTest, TruncatedHeader) {
  const std::string p = path("trunc2.safetensors");
  {
    SafetensorsWriter w(p);
    std::vector<float> v(4, 1.0f);
    w.add("a", DType::F32, {4}, v);
    w.finish();
  }
  fs::resize_file(p, 20);
  expect_bad(p, "exceeds the file size");
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  expect_bad(write_raw("{}", 0, uint64_t(1000)), "exceeds the file size");
}

TEST_F(SafetensorsTest, HugeHeaderLength) {
  expect_bad(write_raw("{}", 0, ~uint64_t(0)), "exceeds the");
  expect_bad(write_raw("{}", 0, kSafetensorsMaxHeaderBytes + 1), "byte limit");
}

TEST_F(SafetensorsTest, EmptyHeader) { expect_bad(write_raw("", 0), "empty safetensors header"); }

TEST_F(SafetensorsTest, NotJson) {
  expect_bad(write_raw("{not json at all", 0), "not valid JSON");
  expect_bad(write_raw("{\"a\":1} trailing", 0), "not valid JSON");
  expect_bad(write_raw("{\"a\":\"\xff\xfe\"}", 0), "not valid JSON");  // invalid UTF-8
  expect_bad(write_raw("hello", 0), "does not start with");
}

TEST_F(SafetensorsTest, JsonNotAnObject) {
  expect_bad(write_raw("[1,2,3]", 0), "does not start with");
  expect_bad(write_raw(" [1,2,3]", 0), "does not start with");
}

TEST_F(SafetensorsTest, TooDeep) { expect_bad(write_raw(std::string(5000, '{'), 0), "nested deeper"); }

TEST_F(SafetensorsTest, EntryNotObject) { expect_bad(write_raw("{\"a\":[1,2]}", 0), "entry is not an object"); }

TEST_F(SafetensorsTest, MissingKeys) {
  expect_bad(write_raw("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4), "missing 'dtype'");
  expect_bad(write_raw("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4), "missing 'shape'");
  expect_bad(write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4), "missing 'data_offsets'");
}

TEST_F(SafetensorsTest, UnexpectedKey) {
  expect_bad(write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4),
             "unexpected key 'x'");
}

TEST_F(SafetensorsTest, BadDtype) {
  expect_bad(write_raw("{" + entry("a", "F33", "[1]", "[0,4]") + "}", 4), "unknown dtype 'F33'");
  expect_bad(write_raw("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4), "'dtype' is not a string");
}

TEST_F(SafetensorsTest, BadShape) {
  expect_bad(write_raw("{" + entry("a", "F32", "[-1]", "[0,4]") + "}", 4), "not a non-negative integer");
  expect_bad(write_raw("{" + entry("a", "F32", "[1.0]", "[0,4]") + "}", 4), "not a non-negative integer");
  expect_bad(write_raw("{" + entry("a", "F32", "[\"1\"]", "[0,4]") + "}", 4), "not a non-negative integer");
  expect_bad(write_raw("{" + entry("a", "F32", "[true]", "[0,4]") + "}", 4), "not a non-negative integer");
  expect_bad(write_raw("{" + entry("a", "F32", "4", "[0,16]") + "}", 16), "'shape' is not an array");
}

TEST_F(SafetensorsTest, NumelOverflow) {
  expect_bad(write_raw("{" + entry("a", "F32", "[4294967296,4294967296]", "[0,4]") + "}", 4), "overflows");
  expect_bad(write_raw("{" + entry("a", "F32", "[18446744073709551615]", "[0,4]") + "}", 4), "overflows");
  // numel fits, numel * 4 bytes does not
  expect_bad(write_raw("{" + entry("a", "F32", "[4611686018427387904]", "[0,4]") + "}", 4), "overflows");
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  expect_bad(write_raw("{" + entry("a", "F32", "[2]", "[0,8]") + "}", 4), "exceed the data section");
  expect_bad(write_raw("{" + entry("a", "F32", "[1]", "[8,4]") + "}", 8), "reversed");
  expect_bad(write_raw("{" + entry("a", "F32", "[1]", "[0]") + "}", 4), "not [begin, end]");
  expect_bad(write_raw("{" + entry("a", "F32", "[1]", "[0,-4]") + "}", 4), "not non-negative integers");
}

TEST_F(SafetensorsTest, Overlap) {
  expect_bad(write_raw("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}", 12),
             "overlaps");
}

TEST_F(SafetensorsTest, Hole) {
  expect_bad(write_raw("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}", 12),
             "hole of 4 bytes");
  expect_bad(write_raw("{" + entry("a", "F32", "[1]", "[4,8]") + "}", 8), "hole of 4 bytes");
  expect_bad(write_raw("{" + entry("a", "F32", "[1]", "[0,4]") + "}", 12), "8 bytes at the end");
}

TEST_F(SafetensorsTest, SizeMismatch) {
  expect_bad(write_raw("{" + entry("a", "BF16", "[3]", "[0,8]") + "}", 8), "need 6 bytes but data_offsets span 8");
}

TEST_F(SafetensorsTest, DuplicateNames) {
  expect_bad(write_raw("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("a", "F32", "[1]", "[4,8]") + "}", 8),
             "duplicate tensor name 'a'");
  expect_bad(write_raw("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
             "duplicate key 'dtype'");
}

TEST_F(SafetensorsTest, BadMetadata) {
  expect_bad(write_raw("{\"__metadata__\":[1]}", 0), "__metadata__ is not an object");
  expect_bad(write_raw("{\"__metadata__\":{\"k\":1}}", 0), "__metadata__ value 'k' is not a string");
  expect_bad(write_raw("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0), "duplicate key 'k'");
}

TEST_F(SafetensorsTest, NamesInErrorsStayOnOneLine) {
  expect_bad(write_raw("{" + entry("evil\\nname", "F33", "[1]", "[0,4]") + "}", 4), "evil\\x0aname");
}

TEST_F(SafetensorsTest, ZeroSizedTensorsShareOffsets) {
  const std::string p = write_raw(
      "{" + entry("e1", "F32", "[0]", "[4,4]") + "," + entry("a", "F32", "[1]", "[0,4]") + "," +
          entry("e2", "BF16", "[0,3]", "[4,4]") + "," + entry("b", "U8", "[2]", "[4,6]") + "}",
      6, std::nullopt, "zeros.safetensors");
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->get("e2").numel(), 0);
  EXPECT_EQ(f->bytes(f->get("b")).size(), 2u);
}

TEST_F(SafetensorsTest, HeaderParserDirectly) {
  std::map<std::string, std::string> meta;
  auto t = parse_safetensors_header(
      "{\"__metadata__\":{\"format\":\"pt\"}," + entry("w", "F8_E4M3", "[2,8]", "[0,16]") + "}   ", 16, &meta, "mem");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].dtype, DType::F8_E4M3);
  EXPECT_EQ(t[0].numel(), 16);
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_THROW(parse_safetensors_header("{}", 1, nullptr, "mem"), Error);
}

}  // namespace
}  // namespace fp4moe
