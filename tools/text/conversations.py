"""Conversations and tool schemas the chat-template goldens are rendered on."""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web — returns snippets (日本語 ok).",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
                   "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is 2 + 2?"}],
    "multi_turn": [{"role": "system", "content": "Be brief.\n"},
                   {"role": "user", "content": "Hi there"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke about \"quotes\" and back\\slashes."}],
    "tool_call_dict_args": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."}],
    "tool_call_string_args": [
        {"role": "user", "content": "Search for fp4 kernels"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"fp4 kernels\", \"top_k\": 3}"}}]},
        {"role": "tool", "content": "1. NVFP4 GEMM\n2. MXFP4"}],
    "parallel_tool_calls": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Tokyo and Oslo, then search news."},
        {"role": "assistant", "content": "Let me check both.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "fahrenheit"}}},
            {"type": "function", "function": {"name": "search", "arguments": {"query": "news", "top_k": 2}}}]},
        {"role": "tool", "content": "Tokyo: 18"},
        {"role": "tool", "content": "Oslo: 41F"},
        {"role": "tool", "content": "no news"},
        {"role": "assistant", "content": "Tokyo 18 °C, Oslo 41 °F, and no news."},
        {"role": "user", "content": "Thanks!"}],
    "reasoning": [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No, 91 = 7 × 13.", "reasoning_content": "91 / 7 = 13, so it is composite and not prime at all."},
        {"role": "user", "content": "And 97?"}],
    "reasoning_inline_think": [
        {"role": "user", "content": "Pick a number"},
        {"role": "assistant", "content": "<think>\nLet me think about it.\n</think>\n\nSeven."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<think>Because it is lucky.</think>Luck."}],
    "content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "Describe this image:"}, {"type": "image", "url": "x.png"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": "More detail?"}],
    "unicode": [
        {"role": "system", "content": "Réponds en français 🇫🇷"},
        {"role": "user", "content": "日本語で答えて 👨‍👩‍👧‍👦 <b>&amp;</b> tab\there\r\nCRLF"},
        {"role": "assistant", "content": "はい、わかりました。✅"},
        {"role": "user", "content": "   spaces   "}],
    "bad_role": [{"role": "user", "content": "hi"}, {"role": "narrator", "content": "Meanwhile..."}],
}
