"""retort.Transformer.generate: greedy generation against repeated argmax of model.logits on the growing
sequence, stop ids, the streaming callback (which may use the model, stop early, or raise), seeded sampling,
sliding past the context, and bad arguments raising ValueError with the C++ message."""

import numpy as np
import pytest

import retort


def tiny(**kw):
    args = dict(vocab=32, context=24, layers=2, d_model=16, heads=4, kv_heads=2, d_ff=32, qkv_bias=True,
                tie_embeddings=False)
    args.update(kw)
    return retort.TransformerConfig(**args)


def model(seed=3, **kw):
    m = retort.Transformer(tiny(**kw), seed=seed)
    # Biases start at zero: give them values so that a decoder that dropped one would show.
    rng = np.random.default_rng(seed)
    for name, a in m.state_dict().items():
        if name.endswith(("bq", "bk", "bv")):
            a[:] = rng.normal(0, 0.5, a.shape)
    return m


def argmax_continuation(m, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(m.logits(np.array(seq))[0, -1])))
    return seq[len(prompt):]


def test_greedy_equals_repeated_argmax_of_the_logits():
    m = model()
    prompt = [3, 1, 4, 1, 5]
    out = m.generate(prompt, 15, temperature=0)
    assert isinstance(out, list) and len(out) == 15 and all(isinstance(t, int) for t in out)
    assert out == argmax_continuation(m, prompt, 15)
    # Exactly the context (5 + 20 - 1 = 24 positions), from a NumPy prompt, and again (the cache is reused).
    full = m.generate(np.array(prompt, dtype=np.int64), 20, temperature=0)
    assert full[:15] == out and full == argmax_continuation(m, prompt, 20)
    assert m.generate(prompt, 20, temperature=0) == full
    # top_k=1 is greedy at any temperature.
    assert m.generate(prompt, 15, temperature=2.0, top_k=1, seed=7) == out


def test_stop_ids_end_generation_after_the_stop_token():
    m = model()
    prompt = [7, 7, 2]
    out = m.generate(prompt, 12, temperature=0)
    stop = out[3]
    first = out.index(stop)
    assert m.generate(prompt, 12, temperature=0, stop=stop) == out[:first + 1]
    assert m.generate(prompt, 12, temperature=0, stop=[31, stop]) == out[:first + 1]
    assert m.generate(prompt, 12, temperature=0, stop=np.array([stop])) == out[:first + 1]
    assert m.generate(prompt, 0) == []


def test_on_token_streams_stops_and_may_use_the_model():
    m = model()
    prompt = [1, 2, 3]
    want = m.generate(prompt, 10, temperature=0)
    seen = []
    assert m.generate(prompt, 10, temperature=0, on_token=seen.append) == want and seen == want
    # Returning False stops; the model can be used from the callback (its lock is not held there).
    seen.clear()

    def first_four(t):
        seen.append(t)
        assert m.logits(np.array(prompt)).shape == (1, 3, 32)
        return len(seen) < 4

    assert m.generate(prompt, 10, temperature=0, on_token=first_four) == want[:4] and seen == want[:4]

    def boom(t):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        m.generate(prompt, 10, on_token=boom)

    def nested(t):
        m.generate(prompt, 2)

    with pytest.raises(ValueError, match="called from its own on_token callback"):
        m.generate(prompt, 3, on_token=nested)
    assert m.generate(prompt, 10, temperature=0) == want  # still usable


def test_seeded_sampling_is_reproducible():
    m = model()
    a = m.generate([5], 20, temperature=1.2, top_k=8, top_p=0.9, seed=11)
    assert a == m.generate([5], 20, temperature=1.2, top_k=8, top_p=0.9, seed=11)
    assert a != m.generate([5], 20, temperature=1.2, top_k=8, top_p=0.9, seed=12)
    assert all(0 <= t < 32 for t in a)


def test_slide_goes_past_the_context():
    m = model()
    out = m.generate([1, 2], 60, temperature=0, slide=True)
    assert len(out) == 60
    assert out[:23] == m.generate([1, 2], 23, temperature=0)  # the same until the cache first fills


def raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, retort.Error)


def test_bad_arguments_raise_value_error_with_the_cpp_message():
    m = model()
    raises(r"^Transformer\.generate: prompt_ids is empty", m.generate, [], 3)
    raises(r"^Transformer\.generate: prompt_ids holds id 32, outside the vocabulary \[0, 32\)", m.generate,
           [1, 32], 3)
    raises(r"^Transformer\.generate: prompt_ids must be one sequence", m.generate, np.zeros((2, 3), np.int64), 3)
    raises(r"^generate: a prompt of 5 tokens and 21 new ones need 25 positions, more than max_len 24",
           m.generate, [1, 2, 3, 4, 5], 21)
    raises(r"^sampling: temperature must be >= 0", m.generate, [1], 3, temperature=-1.0)
    raises(r"^sampling: top_p must be in \(0, 1\]", m.generate, [1], 3, top_p=0.0)
    raises(r"^Transformer\.generate: max_len must be in \[0, 24\]", m.generate, [1], 3, max_len=25)
    raises(r"^generate: .* more than max_len 4", m.generate, [1, 2, 3], 3, max_len=4)
    raises(r"^Transformer\.generate: on_token must be callable", m.generate, [1], 3, on_token=5)
    raises(r"^Transformer\.generate: stop must hold integer token ids", m.generate, [1], 3, stop=["a"])
