"""Writes the tokenizer.json fixtures of package vocab and the texts they
encode, with HuggingFace's own tokenizers library (pip install
tokenizers==0.23.3):

  python3 gen.py    # in this directory

Each fixture is a small vocabulary trained here, laid out as the model family
it stands for lays out its tokenizer.json (normalizer, pre-tokenizer, model,
decoder and added tokens). cases.json holds, per fixture, texts and the ids
the real library encodes them to (add_special_tokens=False, as vLLM encodes a
rendered chat prompt), and what the library's own decode prints.
"""

import json

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

CORPUS = """The quick brown fox jumps over the lazy dog. A prefix cache keeps the keys and values of earlier prompts.
Routing a request to the replica that holds its prefix saves the prefill of every cached block.
def hello(name):
    return "Hello, " + name + "!"  # greet
for i in range(10): print(i * i)
System: You are a helpful assistant. Answer briefly and precisely.
User: What is the capital of France? Assistant: The capital of France is Paris.
Numbers 1234567890 and punctuation: (a), [b], {c}; d - e / f.
Cafe, naive, resume: words without accents are frequent here.
""" * 20

# Texts every fixture encodes; each family adds texts with its own special tokens.
COMMON = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def hello(name):\n    return 'Hello, ' + name\n",
    "naïve café — 東京 😀 emoji\ttab\nnewline  double  spaces\r\n",
    "Ünïcödé bytes: ǅ ꙮ 𝄞 and a zero width joiner 👩‍💻.",
    "trailing spaces   ",
]


def bytelevel():
    """Qwen2 / Llama 3 style: byte-level BPE after a regex split, NFC."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    texts = COMMON + [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|> leading space after a special token<|im_end|>",
    ]
    return tok, texts


def byte_tokens():
    return ["<0x%02X>" % b for b in range(256)]


def with_byte_fallback(tok, specials):
    """Rebuilds a trained SentencePiece-style BPE with <0xNN> tokens in the
    model vocabulary (not added tokens), right after the specials, as
    Llama 2, Mistral and Gemma lay them out."""
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    ordered = specials + byte_tokens() + [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    d["model"]["vocab"] = {t: i for i, t in enumerate(ordered)}
    d["model"]["byte_fallback"] = True
    d["model"]["unk_token"] = "<unk>" if "<unk>" in specials else None
    d["model"]["fuse_unk"] = True
    d["added_tokens"] = [a for a in d["added_tokens"] if a["content"] in specials]
    for a in d["added_tokens"]:
        a["id"] = ordered.index(a["content"])
    return Tokenizer.from_str(json.dumps(d))


def llama2():
    """Llama 2 / Mistral v0.1 (legacy): Prepend and Replace normalizers, no
    pre-tokenizer, byte fallback, Replace/ByteFallback/Fuse/Strip decoder."""
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")  # for training only: no merges across words
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, limit_alphabet=70)
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok.pre_tokenizer = None
    tok = with_byte_fallback(tok, specials)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    texts = COMMON + [
        "<s>[INST] What is the capital of France? [/INST]",
        "<s>[INST] Hi [/INST] Hello</s><s>[INST]  two spaces after a special token [/INST]",
        " one leading space",
    ]
    return tok, texts


def metaspace():
    """Mistral v0.3 style: a Metaspace pre-tokenizer that prepends to the
    first segment only, byte fallback, and a Metaspace decoder."""
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, limit_alphabet=70)
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok = with_byte_fallback(tok, specials)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="first", split=False), decoders.ByteFallback(), decoders.Fuse()])
    texts = COMMON + [
        "<s>[INST] What is the capital of France?[/INST]",
        "Text first, then <s>[INST] a segment[/INST]",
    ]
    return tok, texts


def gemma():
    """Gemma style: spaces replaced by '▁' with no dummy prefix, byte
    fallback, Replace/ByteFallback/Fuse decoder."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")  # for training only
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, limit_alphabet=70)
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok.pre_tokenizer = None
    tok = with_byte_fallback(tok, specials)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    texts = COMMON + [
        "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
        " leading space",
    ]
    return tok, texts


def unigram():
    """A Unigram model with a Metaspace pre-tokenizer and decoder that
    prepend to every segment (SentencePiece Unigram conversions)."""
    specials = ["<pad>", "</s>", "<unk>"]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=500, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok.decoder = decoders.Metaspace(prepend_scheme="always")
    texts = ["Hello world", "The quick brown fox jumps over the lazy dog.", "Answer</s>Next segment</s>"]
    return tok, texts


def main():
    cases = {}
    for name, make in [("bytelevel", bytelevel), ("llama2", llama2), ("metaspace", metaspace), ("gemma", gemma), ("unigram", unigram)]:
        tok, texts = make()
        tok.save(name + ".json", pretty=False)
        tok = Tokenizer.from_file(name + ".json")
        out = []
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False).ids
            out.append({"text": t, "ids": ids, "hf_decode": tok.decode(ids, skip_special_tokens=False)})
        cases[name] = out
    with open("cases.json", "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
