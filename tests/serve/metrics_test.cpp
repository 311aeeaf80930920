#include <gtest/gtest.h>

#include "serve/metrics.hpp"

using namespace fp4moe;
using namespace fp4moe::serve;

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({1, 2, 4});
  h.observe(0.5);
  h.observe(2, 3);
  h.observe(9);
  std::string out;
  h.render(out, "x", "help");
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"2\"} 4\n"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"4\"} 4\n"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 5\n"), std::string::npos);
  EXPECT_NE(out.find("x_sum 15.5\n"), std::string::npos);
  EXPECT_NE(out.find("x_count 5\n"), std::string::npos);
}

TEST(Metrics, RenderCarriesEngineGaugesAndTheExpertHook) {
  Metrics m;
  const int32_t per_expert[] = {0, 3, 5, 0};
  m.on_moe_gemm(0, per_expert);
  m.on_step(3, 17);
  m.request_started();
  m.request_finished(engine::FinishReason::kAbort, 10, 4, 2);
  m.http_error(429);
  engine::EngineStats st;
  st.running = 2;
  st.queued = 1;
  st.pages_total = 10;
  st.pages_used = 3;
  st.pages_free = 7;
  st.busy_seconds = 2.5;
  st.backend_seconds = 1.25;
  const std::string out = m.render(st, true);
  for (const char* line : {"fp4moe_requests_total 1\n", "fp4moe_request_finished_total{finished_reason=\"abort\"} 1\n",
                           "fp4moe_prompt_tokens_total 10\n", "fp4moe_cached_prompt_tokens_total 4\n",
                           "fp4moe_num_running_requests 2\n", "fp4moe_num_queued_requests 1\n",
                           "fp4moe_kv_pages_used 3\n", "fp4moe_kv_pages_free 7\n", "fp4moe_moe_expert_tokens_count 4\n",
                           "fp4moe_http_errors_total{status=\"429\"} 1\n", "fp4moe_healthy 1\n",
                           "# TYPE fp4moe_time_to_first_token_seconds histogram\n",
                           "fp4moe_moe_expert_tokens_bucket{le=\"0\"} 2\n", "fp4moe_moe_expert_tokens_sum 8\n",
                           "fp4moe_moe_tokens_per_expert_mean 2\n", "fp4moe_moe_tokens_per_active_expert_mean 4\n",
                           "fp4moe_step_batch_requests_bucket{le=\"2\"} 0\n", "fp4moe_step_batch_requests_bucket{le=\"4\"} 1\n",
                           "fp4moe_step_batch_tokens_sum 17\n", "fp4moe_engine_busy_seconds_total 2.500000\n",
                           "fp4moe_engine_backend_seconds_total 1.250000\n"})
    EXPECT_NE(out.find(line), std::string::npos) << line;
}
