"""The test corpus for text/: the cases every tokenizer golden is computed on, and the
training text the test tokenizers are trained on. Written for the tests (no external data).

Each case is bytes: most are UTF-8 text, a few are deliberately ill-formed UTF-8.
"""

CASES: list[tuple[str, bytes]] = []


def case(name: str, text) -> None:
    CASES.append((name, text if isinstance(text, bytes) else text.encode("utf-8")))


# ---- languages -----------------------------------------------------------------------------
case("english", "The quick brown fox jumps over the lazy dog. It's 9:45 a.m., isn't it?")
case("english_contractions", "I'm sure they'LL say we'VE done what you'd do, and SHE'S right; y'all's")
case("english_caps", "HELLO WORLD!!! This IS Loud... okay?? (maybe) [brackets] {braces} <angles>")
case("chinese", "我们今天去公园散步，天气非常好。人工智能正在改变世界！")
case("japanese", "東京は日本の首都です。ひらがなとカタカナ、そして漢字を使います。ｶﾀｶﾅ半角もあります。")
case("korean", "안녕하세요, 세계! 한국어 문장은 띄어쓰기를 합니다. 각각의 음절.")
case("korean_jamo_nfd", "\u1100\u1161\u11a8\u1100\u1161\u11a8 \u1112\u1161\u11ab")
case("arabic", "مرحبا بالعالم! اللُّغَةُ العَرَبِيَّةُ جميلة. ١٢٣٤٥ أرقام.")
case("hindi", "नमस्ते दुनिया! हिंदी भाषा। क़लम और ज़मीन। १२३४")
case("vietnamese_nfd", "Tie\u0302\u0301ng Vie\u0323\u0302t co\u0301 da\u0302\u0301u. Ca\u0300 phe\u0302 sư\u0303a đa\u0301.")
case("greek_russian", "Καλημέρα κόσμε. Привет, мир! Ёлка и ёж.")
case("thai", "สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ")
case("mixed_scripts", "Hello世界مرحبا नमस्ते こんにちは안녕 Привет123abc")

# ---- emoji -----------------------------------------------------------------------------------
case("emoji_skin_tones", "👍🏽 👋🏿 🙌🏻 thumbs👍🏼up")
case("emoji_zwj", "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag, 🧑‍🤝‍🧑 pair")
case("emoji_flags_keycaps", "🇯🇵🇫🇷🇺🇸 1️⃣2️⃣#️⃣ ❤️ ☺︎")
case("emoji_run", "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘😗☺😚😙🥲😋😛")

# ---- code / whitespace -------------------------------------------------------------------------
case("code_tabs_crlf", "def f(x):\r\n\tif x > 0:\r\n\t\treturn x ** 2  # square\r\n\treturn -x\r\n")
case("code_cpp", "int main() {\n    std::vector<int> v{1, 2, 3};\n    for (auto& x : v) x *= 2;\n    return 0;\n}\n")
case("code_json", '{"name": "fp4moe", "tokens": [1, 22, 333], "ok": true, "nested": {"a": null}}')
case("spaces_long", "a" + " " * 300 + "b")
case("spaces_mixed", "  leading and trailing   \t\t  \n\n\n  \r\n \u00a0x\u3000y ")
case("newlines_only", "\n\n\n\n\r\n\r\r\n")
case("digits_long", "1234567890" * 12 + " 3.14159265358979 1,000,000 0x1F 2024-12-03")
case("digits_unicode", "١٢٣ ١٢٣٤ ０１２３ ²³ Ⅻ ½ ९८७")
case("whitespace_zoo", "a\u0085b\u00a0c\u2028d\u2029e\u180ef\u200bg\x0bh\x0ci\u1680j\u2007k\u205fl")
case("punctuation_runs", "!!!??? ... --- ___ *** ### ~~~ ``` '''' \"\"\" ;;;:::,,, @@@ $$$ %%% ^^^ &&&")
case("long_word", "a" * 500)
case("long_repeat", "abc" * 200 + " " + "\u00e9" * 150)
case("unicode_nfc", "e\u0301 A\u030a \u212b \uf900 \u0958 \u1e9b\u0323 \u00c5ngstr\u00f6m caf\u00e9")
case("nfkc_compat", "ﬁ ﬀ ① ㎏ ｈｅｌｌｏ ＡＢＣ ﹏ ℌ ™")
case("case_folding", "'S 'ſ 'T 'RE ΣΑΣ straße İstanbul")
case("control_chars", "a\x00b\x01c\x7fd\x1be[0m\x07")
case("single_chars", "a")
case("empty", "")

# ---- ill-formed UTF-8 ------------------------------------------------------------------------
case("invalid_bytes", b"abc\xff\xfedef")
case("invalid_truncated", b"caf\xc3 na\xe2\x82 \xf0\x9f\x98")
case("invalid_continuation", b"\x80\x81x\xbf")
case("invalid_overlong", b"\xc0\xaf\xe0\x80\xaf ok")
case("invalid_surrogate", b"\xed\xa0\x80\xed\xbf\xbf z")
case("invalid_out_of_range", b"\xf4\x90\x80\x80 \xf5\x80")
case("invalid_mixed", "héllo".encode() + b"\xff" + "世界".encode()[:4] + b"!")

# ---- text that spells special tokens --------------------------------------------------------
case("special_chatml", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n")
case("special_glued", "foo<|endoftext|>bar<|endoftext|><|endoftext|>baz")
case("special_partial", "<|im_sta <|im_end| <|endoftext|x |im_end|>")
case("special_glm", "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nhi<|assistant|>\n<think></think>")
case("special_spaces", "  <|im_start|>  padded  <|im_end|>  \n<tool_call>  x </tool_call>  ")
case("special_words", "thinking <think> word<think>word <think>\n answer </think>end")
case("special_deepseek", "<｜begin▁of▁sentence｜>System<｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜>")
case("special_lstrip_rstrip", "left   <mask>   right <lstrip>  x  <rstrip>   y [single] a[single]b")
case("special_only", "<|endoftext|>")


def training_text() -> list[str]:
    """Lines to train the test tokenizers on: the cases plus varied prose and code."""
    prose = [
        "Tokenizers split text into pieces that a language model can read, one id per piece.",
        "The weather in the mountains changes quickly; bring a coat, water and a map.",
        "She said that they would arrive by noon, but the train was delayed by an hour.",
        "Mixture-of-experts models route each token to a few experts out of many.",
        "Numbers like 42, 3.5, 1000000 and 2024 appear in text all the time.",
        "我喜欢学习新的语言，也喜欢阅读历史书籍。这个模型可以理解中文和英文。",
        "日本語の文章には、ひらがな、カタカナ、漢字が混ざっています。東京と大阪。",
        "한국어는 한글로 씁니다. 오늘 날씨가 좋아서 산책을 했습니다.",
        "العربية لغة جميلة يتحدث بها الملايين حول العالم.",
        "हिंदी भारत की एक प्रमुख भाषा है और इसे देवनागरी लिपि में लिखा जाता है।",
        "Привет! Как дела? Всё хорошо, спасибо. Καλημέρα σας.",
        "Café, naïve, résumé, jalapeño, façade, Ångström, Zürich, São Paulo.",
        "def tokenize(text):\n    return [t for t in text.split() if t]\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
        "<html><body><p class=\"x\">Hello &amp; welcome</p></body></html>",
        "SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name;",
        "😀 🎉 👍 ❤️ 🚀 ✨ 🌍 🍕 — emoji are everywhere now!",
        "    indented with spaces\n\tindented with a tab\n\n\nmany newlines",
    ]
    lines = []
    for i in range(30):
        for j, p in enumerate(prose):
            lines.append(p if (i + j) % 3 else p.upper() if j % 2 else p.lower())
    for _, b in CASES:
        lines.append(b.decode("utf-8", errors="replace"))
    return lines
