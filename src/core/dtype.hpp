// Element types, named as safetensors names them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fp4moe {

enum class DType : uint8_t {
  BF16, F16, F32, F64, U8, I8, I16, I32, I64, F8_E4M3, F8_E5M2, F8_E8M0, BOOL,
};

inline constexpr DType kAllDTypes[] = {
    DType::BF16, DType::F16, DType::F32, DType::F64, DType::U8, DType::I8, DType::I16,
    DType::I32, DType::I64, DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0, DType::BOOL};

size_t dtype_size(DType t);                              // bytes per element
std::string_view dtype_name(DType t);                    // "BF16", "F8_E4M3", ...
std::optional<DType> dtype_from_name(std::string_view);  // inverse of dtype_name

}  // namespace fp4moe
