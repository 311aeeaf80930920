// Python str methods on UTF-8 strings (code point semantics), for the Jinja builtins.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::text::jinja::pystr {

// chars: nullopt strips Python whitespace (str.isspace), else any of the given characters.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string jinja_title(std::string_view s); // jinja's |title filter
int64_t find(std::string_view s, std::string_view sub, bool reverse);  // code point index or -1
int64_t count(std::string_view s, std::string_view sub);
bool is_digit(std::string_view s);
bool is_alpha(std::string_view s);
bool is_alnum(std::string_view s);
bool is_space(std::string_view s);
bool is_upper(std::string_view s);
bool is_lower(std::string_view s);

}  // namespace fp4moe::text::jinja::pystr
