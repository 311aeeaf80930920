// The HTTP routes of parser_endpoints.hpp: POST /parse_function_call and POST
// /separate_reasoning. The server passes its own senders so that the responses, error
// JSON and error metrics are those of every other route; authentication and body limits are
// the server's pre-routing checks, as for the other routes.
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include "serve/api_request.hpp"
#include "serve/http_server.hpp"

namespace fp4moe::serve {

using JsonSender = std::function<void(http::Response&, const nlohmann::json&)>;
using ErrorSender = std::function<void(http::Response&, const ApiError&)>;

void register_parser_routes(HttpServer& http, JsonSender send_json, ErrorSender send_error);

}  // namespace fp4moe::serve
