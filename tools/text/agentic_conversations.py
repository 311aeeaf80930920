"""The agentic corpus the tool-calling chat-template goldens are rendered on (issue 41): 60
conversations, each with its own set of 2-5 tools, made deterministically from a seed.

Every conversation has tools; most have assistant tool calls (arguments as a dict or as a
JSON string, nested objects and lists, unicode, quotes, backslashes, newlines), tool results
(strings, and lists of parts), reasoning history (reasoning_content, or <think> inline), system
prompts, and content given as lists of text parts.
"""
import json
import random

UNICODE = ["Zürich", "東京都", "서울", "Москва", "القاهرة", "मुंबई", "Hà Nội", "🇫🇷 Paris", "👨‍👩‍👧 family",
           "naïve café", "“quoted”", "tab\there", "line1\nline2", "back\\slash", "emoji 🚀✨", "ℝ ∑ ∞",
           "\"double\" 'single'", "<tag>&amp;</tag>", "zero\u200bwidth", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
WORDS = ["weather", "stock", "flight", "recipe", "invoice", "meeting", "repo", "ticket", "sensor", "playlist"]


def tool_catalog():
    """Tools with parameters of every JSON type, nested objects and arrays."""
    return [
        {"type": "function", "function": {
            "name": "get_weather", "description": "Current weather for a city — 天气.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "search_web", "description": "Search the web; returns snippets.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"}, "top_k": {"type": "integer", "minimum": 1, "maximum": 20},
                "filters": {"type": "object", "properties": {
                    "site": {"type": "string"}, "after": {"type": "string", "format": "date"}}}},
                "required": ["query"]}}},
        {"type": "function", "function": {
            "name": "create_event", "description": "Create a calendar event.",
            "parameters": {"type": "object", "properties": {
                "title": {"type": "string"}, "start": {"type": "string"}, "duration_min": {"type": "number"},
                "attendees": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "email": {"type": "string"}, "optional": {"type": "boolean"}}}},
                "reminder": {"type": ["integer", "null"]}}, "required": ["title", "start"]}}},
        {"type": "function", "function": {
            "name": "run_sql", "description": "Run a read-only SQL query.",
            "parameters": {"type": "object", "properties": {
                "sql": {"type": "string"}, "params": {"type": "array", "items": {}},
                "limit": {"type": "integer"}}, "required": ["sql"]}}},
        {"type": "function", "function": {
            "name": "translate", "description": "Translate text between languages (多语言).",
            "parameters": {"type": "object", "properties": {
                "text": {"type": "string"}, "source": {"type": "string"}, "target": {"type": "string"},
                "glossary": {"type": "object", "additionalProperties": {"type": "string"}}},
                "required": ["text", "target"]}}},
        {"type": "function", "function": {
            "name": "set_thermostat", "description": "Set a thermostat.",
            "parameters": {"type": "object", "properties": {
                "room": {"type": "string"}, "celsius": {"type": "number"}, "eco": {"type": "boolean"},
                "schedule": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}}}},
        {"type": "function", "function": {
            "name": "no_params", "description": "A tool without parameters."}},
    ]


def arguments(rng, name):
    u = lambda: rng.choice(UNICODE)  # noqa: E731
    if name == "get_weather":
        a = {"city": u()}
        if rng.random() < 0.5:
            a["unit"] = rng.choice(["celsius", "fahrenheit"])
        return a
    if name == "search_web":
        a = {"query": f"{rng.choice(WORDS)} {u()}", "top_k": rng.randint(1, 20)}
        if rng.random() < 0.6:
            a["filters"] = {"site": "example.org", "after": "2025-01-0" + str(rng.randint(1, 9))}
        return a
    if name == "create_event":
        return {"title": u(), "start": "2026-12-0%dT09:30:00Z" % rng.randint(1, 9),
                "duration_min": rng.choice([30, 45.5, 90, 1e3]),
                "attendees": [{"name": u(), "email": f"p{i}@example.com", "optional": rng.random() < 0.5}
                              for i in range(rng.randint(0, 3))],
                "reminder": rng.choice([None, 5, 15])}
    if name == "run_sql":
        return {"sql": "SELECT name, \"value\" FROM t WHERE note LIKE '%\\_x%'\nLIMIT ?",
                "params": [rng.randint(-5, 5), u(), None, True, 2.5, {"nested": [1, {"deep": u()}]}],
                "limit": rng.randint(1, 100)}
    if name == "translate":
        return {"text": u() + " " + u(), "source": "auto", "target": rng.choice(["ja", "de", "ar", "zh-Hans"]),
                "glossary": {u(): u() for _ in range(rng.randint(0, 2))}}
    if name == "set_thermostat":
        return {"room": u(), "celsius": rng.choice([19, 20.5, -3.25, 21.0]), "eco": rng.random() < 0.5,
                "schedule": [[rng.randint(0, 23), rng.choice([18, 19.5])] for _ in range(rng.randint(1, 3))]}
    return {}


def text(rng, parts_ok=True):
    s = rng.choice(["Please help: ", "", "  ", "Q: "]) + rng.choice(UNICODE) + rng.choice(["?", "!", "\n", " "])
    if parts_ok and rng.random() < 0.2:
        return [{"type": "text", "text": s}, {"type": "text", "text": " (" + rng.choice(UNICODE) + ")"}]
    return s


def tool_result(rng, name, args):
    payload = {"ok": True, "tool": name, "echo": args, "note": rng.choice(UNICODE)}
    r = rng.random()
    if r < 0.6:
        return json.dumps(payload, ensure_ascii=rng.random() < 0.5)
    if r < 0.8:
        return "plain result: " + rng.choice(UNICODE)
    return [{"type": "text", "text": json.dumps(payload, ensure_ascii=False)}]


def conversation(rng, i):
    catalog = tool_catalog()
    tools = rng.sample(catalog, rng.randint(2, 5))
    names = [t["function"]["name"] for t in tools]
    msgs = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": "You are an agent. " + rng.choice(UNICODE)})
    for turn in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": text(rng)})
        for _ in range(rng.randint(0, 2)):  # rounds of tool calls
            calls = []
            for _ in range(rng.randint(1, 3)):
                name = rng.choice(names)
                args = arguments(rng, name)
                as_string = rng.random() < 0.3
                call = {"id": f"call_{i}_{len(calls)}", "type": "function",
                        "function": {"name": name,
                                     "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}
                calls.append((call, name, args))
            m = {"role": "assistant", "content": rng.choice(["", None, "Let me check. ", text(rng, False)]),
                 "tool_calls": [c for c, _, _ in calls]}
            if rng.random() < 0.5:
                m["reasoning_content"] = "I should call " + ", ".join(n for _, n, _ in calls) + ". " + rng.choice(UNICODE)
            msgs.append(m)
            for call, name, args in calls:
                msgs.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result(rng, name, args)})
        final = {"role": "assistant", "content": text(rng, False)}
        r = rng.random()
        if r < 0.35:
            final["reasoning_content"] = "Thinking about " + rng.choice(UNICODE) + "\n\nstep 2."
        elif r < 0.6:
            final["content"] = "<think>\nInline reasoning " + rng.choice(UNICODE) + "\n</think>\n\n" + final["content"]
        if turn < 2 or rng.random() < 0.5:
            msgs.append(final)
    if msgs[-1]["role"] == "assistant" and rng.random() < 0.7:
        msgs.append({"role": "user", "content": text(rng) if rng.random() < 0.8 else "Thanks /nothink"})
    return tools, msgs


def corpus(n=60, seed=41):
    rng = random.Random(seed)
    return [(f"agentic_{i:02d}", *conversation(rng, i)) for i in range(n)]


# The template variables each conversation is rendered with (kwargs as chat_template_kwargs).
KWARGS = [{}, {"enable_thinking": True}, {"enable_thinking": False}, {"enable_thinking": True, "clear_thinking": False},
          {"thinking": True}]
