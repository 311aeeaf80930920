"""Trains the shipped model's tokenizer on the corpus' training split with Hugging Face
`tokenizers` (pinned in requirements.txt): byte-level BPE with GLM's pre-tokenizer regex,
VOCAB_SIZE ids including the chat template's special tokens.

    RAYON_NUM_THREADS=1 python3 tools/train_small/tokenizer.py OUT_DIR [--corpus-tar T]
writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json.
"""
import argparse
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

VOCAB_SIZE = 4096
# id 0..3, in this order: the end of a document (eos), and the chat template's role markers.
SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS_ID = 0
GLM_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{% if tools %}<|system|>Tools:{% for t in tools %} {{ t.function | tojson }}{% endfor %}{% endif %}"
                 "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build(train_texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM_REGEX), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_texts, trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--corpus-tar")
    a = ap.parse_args()
    train, _ = corpus.split(a.corpus_tar)
    tok = build([text for _, text in train])
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": SPECIAL_TOKENS[EOS_ID],
                   "pad_token": SPECIAL_TOKENS[EOS_ID], "model_max_length": 4096}, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    print(f"{a.out}/tokenizer.json: {tok.get_vocab_size()} ids")


if __name__ == "__main__":
    main()
