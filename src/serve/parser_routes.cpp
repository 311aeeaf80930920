#include "serve/parser_routes.hpp"

#include "serve/parser_endpoints.hpp"

namespace fp4moe::serve {

void register_parser_routes(HttpServer& http, JsonSender send_json, ErrorSender send_error) {
  using Endpoint = std::variant<nlohmann::json, ApiError> (*)(std::string_view);
  auto route = [send_json, send_error](Endpoint endpoint) {
    return [=](const http::Request& req, http::Response& res) {
      auto reply = endpoint(req.body);
      if (auto* e = std::get_if<ApiError>(&reply)) return send_error(res, *e);
      send_json(res, std::get<nlohmann::json>(reply));
    };
  };
  http.Post("/parse_function_call", route(&parse_function_call_endpoint));
  http.Post("/separate_reasoning", route(&separate_reasoning_endpoint));
}

}  // namespace fp4moe::serve
