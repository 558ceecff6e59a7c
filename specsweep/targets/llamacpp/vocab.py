"""The generated models' vocabulary: sentencepiece-style pieces learned from English text, so that prompts
tokenize into about as many tokens as a real model's tokenizer gives them (about 1.5 times as many).

A vocabulary of whole words alone does not do that: llama.cpp's sentencepiece tokenizer only joins two
adjacent pieces whose concatenation is itself in the vocabulary, so a word whose prefixes are missing stays
letter by letter (an MT-Bench question was 208 tokens, against about 70 for a real model's tokenizer).
The pieces are byte-pair merges, learned once from the docstrings and comments of Python's standard library
and kept in ``pieces.txt`` beside this module, so that every machine writes the same models (a standard
library of another version would learn slightly other pieces). Each piece is the concatenation of two
earlier ones, and its score ranks it by when it was learned, so llama.cpp joins the first-learned first.
With 4,096 tokens an MT-Bench question is about 106 tokens. ``python -m specsweep.targets.llamacpp.vocab``
learns them again and writes the file.
"""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

#: Control, then the 256 byte tokens (llama.cpp's fallback for anything not in the vocabulary).
SPECIAL = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
_SPACE = "\u2581"  # sentencepiece's word boundary
_ASCII = [chr(c) for c in range(33, 127)]

# Common English words, added to the corpus so that even a Python without its sources learns them whole.
_WORDS = """the of and to a in is it you that he was for on are with as I his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing see
him two has look more day could go come did number sound no most people my over know water than call
first who may down side been now find any new work part take get place made live where after back
little only round man year came show every good me give our under name very through just form sentence
great think say help low line differ turn cause much mean before move right boy old too same tell does
set three want air well also play small end put home read hand port large spell add even land here must
big high such follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father head stand own page should country found answer school
grow study still learn plant cover food sun four between state keep eye never last let thought city tree
cross farm hard start might story saw far sea draw left late run while press close night real life few
north open seem together next white children begin got walk example ease paper group always music those
both mark often letter until mile river car feet care second book carry took science eat room friend
began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock order
fire south problem piece told knew pass since top whole king space heard best hour better true during
hundred five remember step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center love person money
serve appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead
cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive
stood contain front teach week final gave green oh quick develop ocean warm free minute strong special
mind behind clear tail produce fact street inch multiply nothing course stay wheel full force blue object
decide surface deep moon island foot system busy test record boat common gold possible plane stead dry
wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring yes distant fill
east paint language among server model token speed batch cache request stream latency throughput
""".split()

_PROSE = re.compile(r'"""(.*?)"""|#([^\n]*)', re.S)
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]+")


def corpus(stdlib: Path | None = None) -> list[str]:
    """The text the pieces are learned from: the docstrings and comments of the standard library's top-level
    modules (ASCII only, in a fixed order), and the common words above."""
    folder = Path(stdlib or sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    for path in sorted(folder.glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8", errors="ignore")
        except OSError:
            continue
        for m in _PROSE.finditer(source):
            if text := _NOT_PRINTABLE_ASCII.sub(" ", m.group(1) or m.group(2) or "").strip():
                texts.append(text)
    return texts + [" ".join(_WORDS)] * 20


def learn_pieces(n_pieces: int, texts: list[str] | None = None) -> list[str]:
    """``n_pieces`` sentencepiece pieces: the word boundary and the printable ASCII characters, the byte-pair merges
    in the order they were learned, and last any character after a word boundary that was not learned (so that
    no text falls back to bytes but what is not printable ASCII)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    chars = [_SPACE, *_ASCII]
    if n_pieces < 2 * len(chars):
        raise ValueError(f"vocab_size leaves room for {n_pieces} pieces; at least {2 * len(chars)} are needed")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Words apart from punctuation and digits (as real tokenizers learn them): no piece is spent on code.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation("isolated"),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    trainer = trainers.BpeTrainer(vocab_size=n_pieces + 1, special_tokens=["<unk>"], initial_alphabet=chars,
                                  limit_alphabet=len(chars), show_progress=False)
    tok.train_from_iterator(corpus() if texts is None else texts, trainer)
    model = json.loads(tok.to_str())["model"]
    learned = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in model["merges"]]
    return _fit(list(dict.fromkeys([*chars, *learned])), n_pieces)  # first learned first, once each


def _fit(pieces: list[str], n_pieces: int) -> list[str]:
    """The first ``n_pieces`` pieces, ending with every printable character after a word boundary."""
    keep = n_pieces
    while True:
        head = pieces[:keep]
        have = set(head)
        missing = [p for p in (_SPACE + c for c in _ASCII) if p not in have]
        if len(head) + len(missing) <= n_pieces:
            return head + missing
        keep = n_pieces - len(missing)


PIECES = Path(__file__).with_name("pieces.txt")


def pieces(n_pieces: int) -> list[str]:
    """The first ``n_pieces`` of the pieces kept in ``pieces.txt``."""
    kept = PIECES.read_text(encoding="utf-8").splitlines()
    if not 2 * (len(_ASCII) + 1) <= n_pieces <= len(kept):
        raise ValueError(f"vocab_size must leave {2 * (len(_ASCII) + 1)} to {len(kept)} pieces beside the "
                         f"{len(SPECIAL)} special tokens (got {n_pieces} pieces)")
    return _fit(kept, n_pieces)


def build_vocab(vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types for a GGUF file: the special tokens, then the learned pieces, scored so that
    llama.cpp joins the first-learned merge first."""
    import gguf

    learned = pieces(vocab_size - len(SPECIAL))
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    scores = [0.0] * len(SPECIAL) + [-float(i) for i in range(len(learned))]
    types += [gguf.TokenType.NORMAL] * len(learned)
    return SPECIAL + learned, scores, [int(t) for t in types]


if __name__ == "__main__":  # learn the pieces again from this machine's standard library
    PIECES.write_text("\n".join(learn_pieces(4096 - len(SPECIAL))) + "\n", encoding="utf-8")
    print(f"wrote {PIECES}")
