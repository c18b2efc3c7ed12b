"""Encodes texts with HuggingFace's tokenizers library, for vllmsim's test
of WriteHFTokenizer (pip install tokenizers; e2e/requirements.txt):

  hftok.py TOKENIZER_DIR < texts.json > ids.json
"""

import json
import sys

try:
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"hftok: {e}; install e2e/requirements.txt", file=sys.stderr)
    sys.exit(3)

tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
texts = json.load(sys.stdin)
json.dump([tok.encode(t, add_special_tokens=False).ids for t in texts], sys.stdout)
