#!/usr/bin/env python3
"""Trains small test tokenizers with Hugging Face `tokenizers` and writes golden encodings.

    python3 tools/text/make_tokenizer_goldens.py [OUT_DIR]   (default tests/text/data)

For each configuration (GLM-style, Qwen-style, DeepSeek-style, GPT-2 with digits, split
behaviors, a character BPE with unk) it writes OUT_DIR/<name>/tokenizer.json (plus, for
some, tokenizer_config.json and generation_config.json, as a model folder would have) and
OUT_DIR/<name>/goldens.json: for every case of corpus.py the ids tokenizers gives with and
without special tokens, and its decode with and without skip_special_tokens. Folders with
a tokenizer_config.json also get transformers' AutoTokenizer ids ("hf_ids"). The C++ tests
(tests/text/tokenizer_golden_test.cpp) compare against these files; CI needs no Python.
"""
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import CASES, training_text  # noqa: E402

GLM_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_REGEXES = [
    r"\p{N}{1,3}",
    r"[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def byte_level_tail():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)


def train(tok, vocab_size, special=(), byte_level=True, **kw):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_level else [], **kw)
    tok.train_from_iterator(training_text(), trainer)
    return tok


TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/text/data/templates")


def read_template(name):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return f.read()


def glm_style():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(GLM_REGEX), "isolated"), byte_level_tail()])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    train(tok, 1500)
    tok.add_special_tokens(["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
                            "<|user|>", "<|assistant|>", "<|observation|>"])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ["<think>", "</think>", "<tool_call>",
                                                                             "</tool_call>"]])
    doc = json.loads(tok.to_str())
    doc["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]  # the legacy "a b" form
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
              "clean_up_tokenization_spaces": False, "model_max_length": 131072}
    generation = {"eos_token_id": [tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|user|>"),
                                   tok.token_to_id("<|observation|>")]}
    return doc, config, generation


def qwen_style():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_REGEX), "isolated"), byte_level_tail()])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1500, special=["<|endoftext|>"])
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ["<think>", "</think>", "<tool_call>",
                                                                             "</tool_call>"]])
    return json.loads(tok.to_str()), None, None


def deepseek_style():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), "isolated") for r in DEEPSEEK_REGEXES] + [byte_level_tail()])
    tok.decoder = decoders.ByteLevel()
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
    train(tok, 1500, special=specials)
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{specials[0]}:0 $A:0", pair=f"{specials[0]}:0 $A:0 $B:1",
                                      special_tokens=[(specials[0], bos)])])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True, "add_eos_token": False,
              "bos_token": {"__type": "AddedToken", "content": specials[0], "lstrip": False, "normalized": True,
                            "rstrip": False, "single_word": False},
              "eos_token": {"__type": "AddedToken", "content": specials[1], "lstrip": False, "normalized": True,
                            "rstrip": False, "single_word": False},
              "pad_token": specials[1], "unk_token": None, "clean_up_tokenization_spaces": False}
    config["chat_template"] = read_template("deepseek_style.jinja")  # the tokenizer_config.json form
    generation = {"bos_token_id": bos, "eos_token_id": tok.token_to_id(specials[1])}
    return json.loads(tok.to_str()), config, generation


def gpt2_digits():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1200)
    tok.add_special_tokens([
        AddedToken("<|endoftext|>", special=True, normalized=False),
        AddedToken("<mask>", special=True, lstrip=True, normalized=False),
        AddedToken("<lstrip>", special=True, lstrip=True, normalized=False),
        AddedToken("<rstrip>", special=True, rstrip=True, normalized=False)])
    tok.add_tokens([
        AddedToken("[single]", single_word=True, normalized=False),
        AddedToken("ﬁx", normalized=True),  # NFKC turns it into "fix": matched after normalization
        AddedToken("word", single_word=True, normalized=True),
        AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|endoftext|>",
              "add_eos_token": True, "unk_token": "<|endoftext|>"}
    return json.loads(tok.to_str()), config, None


def behaviors():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", "merged_with_next"),
        pre_tokenizers.Split(Regex(r"[,.!?;:]"), "removed"),
        pre_tokenizers.Split(Regex(r"\p{L}+"), "merged_with_previous", invert=True),
        pre_tokenizers.Split(Regex(r"\s+"), "contiguous"),
        pre_tokenizers.Digits(individual_digits=False),
        byte_level_tail()])
    tok.decoder = decoders.ByteLevel()
    train(tok, 800)
    tok.add_special_tokens(["<|endoftext|>"])
    doc = json.loads(tok.to_str())
    doc["model"]["ignore_merges"] = True
    return doc, None, None


def chars_unk():
    tok = Tokenizer(models.BPE(unk_token="[UNK]", fuse_unk=True))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), "removed", invert=True)
    train(tok, 600, special=["[UNK]", "<|endoftext|>"], byte_level=False, limit_alphabet=80)
    return json.loads(tok.to_str()), None, None


CONFIGS = {
    "glm_style": glm_style,
    "qwen_style": qwen_style,
    "deepseek_style": deepseek_style,
    "gpt2_digits": gpt2_digits,
    "behaviors": behaviors,
    "chars_unk": chars_unk,
}


def case_record(name, raw):
    try:
        return {"name": name, "text": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"name": name, "bytes_hex": raw.hex()}


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/text/data")
    for name, make in CONFIGS.items():
        doc, config, generation = make()
        folder = os.path.join(out_root, name)
        os.makedirs(folder, exist_ok=True)
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        if config is not None:
            with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f, ensure_ascii=False, indent=1)
        if generation is not None:
            with open(os.path.join(folder, "generation_config.json"), "w", encoding="utf-8") as f:
                json.dump(generation, f, indent=1)
        if name == "glm_style":  # the chat_template.jinja form
            with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(read_template("glm_style.jinja"))
        tok = Tokenizer.from_str(text)  # goldens come from the file exactly as written
        hf = None
        if config is not None:
            from transformers import AutoTokenizer
            hf = AutoTokenizer.from_pretrained(folder)
        cases = []
        for cname, raw in CASES:
            s = raw.decode("utf-8", errors="replace")
            rec = case_record(cname, raw)
            rec["ids"] = tok.encode(s).ids
            rec["ids_plain"] = tok.encode(s, add_special_tokens=False).ids
            rec["decoded"] = tok.decode(rec["ids"], skip_special_tokens=False)
            rec["decoded_skip"] = tok.decode(rec["ids"], skip_special_tokens=True)
            if hf is not None:
                rec["hf_ids"] = hf(s)["input_ids"]
            cases.append(rec)
        golden = {"tokenizers_version": __import__("tokenizers").__version__, "config": name, "cases": cases}
        if hf is not None:
            golden["hf_eos_token_id"] = hf.eos_token_id
            golden["hf_bos_token_id"] = hf.bos_token_id
            if hf.chat_template is not None:  # what apply_chat_template gives on one conversation
                conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|user|> there"}]
                golden["hf_chat"] = {"messages": conv,
                                     "prompt": hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True),
                                     "ids": hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=True,
                                                                   return_dict=False)}
        with open(os.path.join(folder, "goldens.json"), "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        print(f"{name}: vocab {tok.get_vocab_size()}, {len(doc['model']['merges'])} merges, {len(cases)} cases")


if __name__ == "__main__":
    main()
