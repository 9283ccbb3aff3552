"""`tformer attention --walkthrough`: every number against attention redone with plain floats and math.exp.

The reference below uses no torch and no tformer code, and the built-in numbers are written out
here again, so a change to the example or to the library's attention shows up as a failure.
"""

import json
import math

import pytest

from tformer.cli import main
from tformer.teach import walkthrough as wt
from tformer.teach.examples import Example, default_example

TOKENS = ["I", "love", "tea"]
X = [[1, 0, 0, 1], [0, 1, 2, 0], [0, 0, 1, 0]]
H1 = {"W_Q": [[0, 0], [0, 1], [1, 0], [0, 1]], "W_K": [[0, 1], [0, 0], [1, 0], [0, 0]],
      "W_V": [[1, 0], [0, 1], [1, 1], [0, 0]]}
H2 = {"W_Q": [[0, 0], [0, 0], [0, 1], [1, 0]], "W_K": [[0, 0], [0, 0], [1, 0], [0, 1]],
      "W_V": [[0, 1], [1, 0], [1, 0], [0, 1]]}
W_O = [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]]


# ---------------------------------------------------------------------------------------------
# The independent computation


def matmul(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def columns(m, start, stop):
    return [row[start:stop] for row in m]


def reference(x, w_q, w_k, w_v, heads, causal, w_o=None):
    """Textbook multi-head attention: per head softmax(Q Kᵀ / √d_k) V, concatenate, times W_O."""
    T = len(x)
    q, k, v = matmul(x, w_q), matmul(x, w_k), matmul(x, w_v)
    d_k, d_v = len(w_q[0]) // heads, len(w_v[0]) // heads
    per_head = []
    for h in range(heads):
        qh, kh, vh = columns(q, h * d_k, (h + 1) * d_k), columns(k, h * d_k, (h + 1) * d_k), \
            columns(v, h * d_v, (h + 1) * d_v)
        scores = [[sum(qh[i][c] * kh[j][c] for c in range(d_k)) for j in range(T)] for i in range(T)]
        scaled, weights = [], []
        for i in range(T):
            visible = [j for j in range(T) if not causal or j <= i]
            s = [scores[i][j] / math.sqrt(d_k) if j in visible else None for j in range(T)]
            total = sum(math.exp(s[j]) for j in visible)
            scaled.append(s)
            weights.append([math.exp(s[j]) / total if j in visible else 0.0 for j in range(T)])
        out = matmul(weights, vh)
        per_head.append({"Q": qh, "K": kh, "V": vh, "scores": scores, "scaled": scaled,
                         "weights": weights, "output": out})
    concat = [sum((ph["output"][i] for ph in per_head), []) for i in range(T)]
    return {"Q": q, "K": k, "V": v, "per_head": per_head, "concat": concat,
            "output": matmul(concat, w_o) if w_o else concat}


def assert_close(got, want, tol=1e-9, where=""):
    assert len(got) == len(want), where
    for i, (g_row, w_row) in enumerate(zip(got, want)):
        assert len(g_row) == len(w_row), where
        for j, (g, w) in enumerate(zip(g_row, w_row)):
            if w is None:  # masked score
                assert g is None, f"{where}[{i}][{j}]: expected masked, got {g}"
            else:
                assert g is not None and abs(g - w) <= tol, f"{where}[{i}][{j}]: {g} != {w}"


def check_against_reference(got: dict, want: dict, heads: int, tol=1e-9):
    for name in ("Q", "K", "V", "concat", "output"):
        assert_close(got[name], want[name], tol, name)
    assert len(got["per_head"]) == heads
    for h, (g, w) in enumerate(zip(got["per_head"], want["per_head"])):
        for name in ("Q", "K", "V", "scores", "scaled", "weights", "output"):
            assert_close(g[name], w[name], tol, f"head {h + 1} {name}")


def cli_json(capsys, *argv) -> dict:
    assert main(["attention", "--walkthrough", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def two_head_weights():
    side = lambda a, b: [ra + rb for ra, rb in zip(a, b)]  # noqa: E731
    return {n: side(H1[n], H2[n]) for n in ("W_Q", "W_K", "W_V")}


# ---------------------------------------------------------------------------------------------
# The built-in example


def test_builtin_example_is_the_documented_one():
    one, two = default_example(1), default_example(2)
    assert one.tokens == TOKENS and one.X == X and one.W_O is None
    assert all(getattr(one, n) == H1[n] for n in H1)
    assert all(getattr(two, n) == m for n, m in two_head_weights().items()) and two.W_O == W_O


def test_default_scores_by_hand():
    # Q = [[0,1],[2,1],[1,0]], K = [[0,1],[2,0],[1,0]]: small enough to check on paper.
    s = wt.run(default_example(1)).per_head[0]
    assert s.Q.tolist() == [[0, 1], [2, 1], [1, 0]] and s.K.tolist() == [[0, 1], [2, 0], [1, 0]]
    assert s.scores.tolist() == [[1, 0, 0], [1, 4, 2], [0, 2, 1]]


@pytest.mark.parametrize("heads,causal", [(1, False), (1, True), (2, False), (2, True)])
def test_walkthrough_equals_reference(heads, causal):
    w = wt.run(default_example(heads), heads=heads, causal=causal)
    weights = two_head_weights() if heads == 2 else H1
    want = reference(X, weights["W_Q"], weights["W_K"], weights["W_V"], heads, causal, W_O if heads == 2 else None)
    check_against_reference(wt.to_dict(w), want, heads, tol=1e-12)


@pytest.mark.parametrize("argv,heads,causal", [([], 1, False), (["--causal"], 1, True),
                                               (["--heads", "2"], 2, False), (["--heads", "2", "--causal"], 2, True)])
def test_cli_json_equals_reference(capsys, argv, heads, causal):
    got = cli_json(capsys, *argv)
    weights = two_head_weights() if heads == 2 else H1
    want = reference(X, weights["W_Q"], weights["W_K"], weights["W_V"], heads, causal, W_O if heads == 2 else None)
    check_against_reference(got, want, heads)
    assert got["tokens"] == TOKENS and got["d_k"] == 2 and abs(got["scale"] - 1 / math.sqrt(2)) < 1e-15
    for head in got["per_head"]:
        for row in head["weights"]:
            assert abs(sum(row) - 1.0) < 1e-12
        if causal:  # nothing above the diagonal: masked scores, zero weights
            for i in range(3):
                for j in range(i + 1, 3):
                    assert head["scaled"][i][j] is None and head["weights"][i][j] == 0.0
        else:
            assert all(x > 0 for row in head["weights"] for x in row)


def test_strongest_key_per_token(capsys):
    got = cli_json(capsys)
    # Head 1 by hand: "I" scores (1, 0, 0) -> itself; "love" (1, 4, 2) -> itself; "tea" (0, 2, 1) -> "love".
    assert [(s["query"], s["keys"]) for s in got["per_head"][0]["strongest"]] == [
        ("I", ["I"]), ("love", ["love"]), ("tea", ["love"])]
    two = cli_json(capsys, "--heads", "2")
    assert [s["keys"] for s in two["per_head"][1]["strongest"]] == [["love"], ["I"], ["I"]]


# ---------------------------------------------------------------------------------------------
# The user's own matrices


def test_json_input_with_unequal_widths_and_output_projection(tmp_path, capsys):
    # Three heads, d_k = 1, d_v = 2, W_O to 2 outputs, one-decimal entries, a repeated token.
    ex = {"tokens": ["a", "b", "a", "c"],
          "X": [[0.5, -1, 2], [1, 0, 0.3], [0, 1.5, -0.2], [2, 2, 1]],
          "W_Q": [[0.1, 1, 0], [0, -0.5, 1], [1, 0, 0.2]],
          "W_K": [[1, 0, 0.4], [0.3, 1, 0], [0, -1, 1]],
          "W_V": [[1, 0, 0, 1, 0.5, 0], [0, 1, 0, 0, 1, -1], [1, 1, 1, 0, 0, 2]],
          "W_O": [[1, 0], [0, 1], [0.5, 0.5], [1, -1], [0, 2], [0.3, 0]]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(ex))
    for causal in (False, True):
        got = cli_json(capsys, "--input", str(path), "--heads", "3", *(["--causal"] if causal else []))
        want = reference(ex["X"], ex["W_Q"], ex["W_K"], ex["W_V"], 3, causal, ex["W_O"])
        check_against_reference(got, want, 3)
        assert got["d_k"] == 1 and got["d_v"] == 2 and len(got["output"][0]) == 2


def test_csv_input_gives_x_and_labels(tmp_path, capsys):
    path = tmp_path / "x.csv"
    path.write_text("# my sentence\nwe,1,0,1,0\n\nsee,0,1,0,1\nit,1,1,0,0\n")
    got = cli_json(capsys, "--input", str(path), "--causal")
    x = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]
    assert got["tokens"] == ["we", "see", "it"] and got["X"] == x
    check_against_reference(got, reference(x, H1["W_Q"], H1["W_K"], H1["W_V"], 1, True), 1)


def test_text_output_teaches_the_steps(capsys, tmp_path):
    assert main(["attention", "--walkthrough", "--causal"]) == 0
    out = capsys.readouterr().out
    for needle in ("d_k = 2, √d_k = 1.414", "Q[tea, q1] = 0·0 + 0·0 + 1·1 + 0·0 = 1", "-inf",
                   "scores[tea, love] = Q[tea]·K[love] = 1·2 + 0·0 = 2",
                   "“tea” attends most to “love”: weight 0.576 = 57.6%",
                   "“love” attends most to “love”: weight 0.893 = 89.3% (it can see only I, love)"):
        assert needle in out, needle
    # A token that looks like rich markup must print as itself.
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"tokens": ["[b]", "x"], "X": [[1, 0], [0, 1]], "W_Q": [[1], [0]],
                                "W_K": [[1], [1]], "W_V": [[1], [2]]}))
    assert main(["attention", "--walkthrough", "--input", str(path), "--decimals", "5"]) == 0
    out = capsys.readouterr().out
    assert "“[b]” attends most to" in out and "0.50000" in out


def test_steps_are_checked_against_the_library(monkeypatch):
    # If the library's attention and the walkthrough's steps ever diverge, the walkthrough must refuse.
    real = wt.reference

    def drifted(q, k, v, mask, scale):
        return real(q, k, v, mask, scale * 1.001)

    monkeypatch.setattr(wt, "reference", drifted)
    with pytest.raises(RuntimeError, match="disagree"):
        wt.run(default_example(1))


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2


GOOD = {"X": [[1, 2], [3, 4]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 0], [0, 1]]}


@pytest.mark.parametrize("content,argv,expect", [
    (json.dumps({**GOOD, "W_Q": [[1, 0], [0, 1], [1, 1]]}), [], "W_Q is 3×2"),
    (json.dumps({**GOOD, "W_K": [[1], [0]]}), [], "W_K is 2×1"),
    (json.dumps({**GOOD, "W_O": [[1, 0]]}), [], "W_O is 1×2"),
    (json.dumps({**GOOD, "tokens": ["a"]}), [], "1 tokens but X is 2×2"),
    (json.dumps(GOOD), ["--heads", "3"], "do not split into 3 heads"),
    (json.dumps({**GOOD, "X": [[1, 2], [3]]}), [], "X row 2 has 1 numbers"),
    (json.dumps({**GOOD, "X": [[1, "2"], [3, 4]]}), [], "finite numbers"),
    (json.dumps({**GOOD, "W_q": [[1]]}), [], "unknown key"),
    (json.dumps({"X": [[1, 2]], "W_Q": [[1], [1]]}), [], "lacks W_K, W_V"),
    (json.dumps([[1, 2]]), [], "JSON object"),
    ('{"X": [[1, 2]', [], "not valid JSON"),
])
def test_bad_json_is_one_line_exit_2(tmp_path, capsys, content, argv, expect):
    path = tmp_path / "in.json"
    path.write_text(content)
    assert main(["attention", "--walkthrough", "--input", str(path), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tformer attention: error:") and expect in lines[0], lines


@pytest.mark.parametrize("argv,expect", [
    (["--input", "{dir}/missing.json"], "does not exist"),
    (["--input", "{dir}/x.csv"], "built-in weights expect 4 features"),
    (["--heads", "3"], "1 or 2 heads"),
    (["--heads", "0"], "--heads must be a whole number in [1, 1024]"),
    (["--decimals", "-1"], "--decimals"),
])
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, argv, expect):
    (tmp_path / "x.csv").write_text("1,2,3\n4,5,6\n")
    argv = [a.format(dir=tmp_path) for a in argv]
    assert main(["attention", "--walkthrough", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err


def test_example_dataclass_rejects_mismatch_directly():
    ex = Example(["a", "b"], [[1.0, 2.0], [3.0, 4.0]], [[1.0], [1.0]], [[1.0], [1.0]], [[1.0], [1.0]],
                 W_O=[[1.0], [2.0]])
    from tformer.core.errors import TformerError

    with pytest.raises(TformerError, match="W_O is 2×1"):
        wt.run(ex)
