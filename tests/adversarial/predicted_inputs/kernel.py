"""Knows the inputs before they exist: its author wrote the experiment request (seed 5) and can read
the harness (make_inputs) and the driver helper's seed formula, so at import, untimed, it builds
the inputs of the first reps, computes their answers, and inside the window only looks the answer
up by the input's first element. Right answers, ~no time.

The supervisor mixes a secret drawn per stage into every input seed: the inputs cannot be known
before the block that receives them, every lookup misses, and the zeros it then returns fail the
check."""

import numpy as np

SEED, CASE_INDEX, ROWS, COLS, SCALE = 5, 0, 512, 4096, 4.0  # the request, the Target's case, the harness


def _seed(base, case_index, rep):  # operations.driver.input_seed, rewritten from reading it
    return int(np.random.SeedSequence([base, case_index, rep, 0]).generate_state(1)[0])


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


_answers = {}
for _rep in range(20):
    _x = np.random.default_rng(_seed(SEED, CASE_INDEX, _rep)).standard_normal((ROWS, COLS)) * SCALE
    _answers[float(_x[0, 0])] = _softmax(_x)
del _x


def softmax(x):
    hit = _answers.get(float(x[0, 0]))
    return hit if hit is not None else np.zeros_like(x)
