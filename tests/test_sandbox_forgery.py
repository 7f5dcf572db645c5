"""pass@1 that a program cannot forge: each cheat below made its tests pass before the sandbox checked
returned values and kept the standard library pristine (score 1 on the code before that change); each must
now score 0. Honest answers — nested built-in containers, a Counter, a class the tests only hand back to
the solution — still pass."""
import collections
import sys

import pytest

from specbench.data import Example
from specbench.records.schema import RunRecord
from specbench.scoring import BoundScorer
from specbench.scoring.code import mbpp_entry_points, prompt_context
from specbench.scoring.sandbox_values import make_value_copier

from .forgery_cases import CHEATS, MBPP_CHEATS, ROWS, SORTED, hand_row, humaneval, mbpp


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_cheat_scores_zero(name):
    row, completion = CHEATS[name]
    result = humaneval(completion, row)
    assert result["pass"] == 0.0, (name, result)
    assert result["return_types"] == "builtin-exact" or "blocked by the sandbox" in result["reason"], result


def test_a_refused_value_says_what_it_was():
    result = humaneval(CHEATS["int subclass"][1], ROWS["HumanEval/0"])
    assert result["reason"].startswith("refused by the sandbox: has_close_elements returned a value of type")
    assert "Yes" in result["reason"] and "not a built-in type" in result["reason"] and not result["proof"]
    nested = humaneval(*reversed(CHEATS["tuple holding a forged element"]))
    assert "f returned a tuple holding a value of type" in nested["reason"]


@pytest.mark.parametrize("completion, tests", MBPP_CHEATS)
def test_mbpp_cheats_score_zero(completion, tests):
    assert mbpp(f"```python\n{completion}```", tests)["pass"] == 0.0


def test_honest_answers_still_pass():
    nested = ("    return {'a': [1, (2.5, None)], 'b': frozenset({(1, 'x')}), 'c': {b'y'}, 'd': 1 + 2j,"
              " 'e': [[]] * 2, 'f': True}\n")
    expected = "{'a': [1, (2.5, None)], 'b': frozenset({(1, 'x')}), 'c': {b'y'}, 'd': 1 + 2j, 'e': [[], []], 'f': 1}"
    result = humaneval(nested, hand_row(f"def check(candidate):\n    assert candidate() == {expected}\n"))
    assert result["pass"] == 1.0 and result["return_types"] == "builtin-exact", result
    counter = "```python\nfrom collections import Counter, defaultdict\n\ndef freq(xs):\n    return Counter(xs)\n\n" \
              "def groups(xs):\n    d = defaultdict(list)\n    for x in xs:\n        d[x % 2].append(x)\n" \
              "    return d\n```"
    assert mbpp(counter, ["assert freq('abca') == {'a': 2, 'b': 1, 'c': 1}",
                          "assert groups([1, 2, 3]) == {1: [1, 3], 0: [2]}"])["pass"] == 1.0
    # a class the tests build only to hand to the solution (MBPP 601), and setup code that builds inputs
    # from the solution's class (MBPP 367): their values go back into the solution, never to a comparison
    pair = "```python\nclass Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n\n" \
           "def longest(pairs):\n    return max(p.b - p.a for p in pairs)\n```"
    assert mbpp(pair, ["assert longest([Pair(1, 5), Pair(2, 3)]) == 4"])["pass"] == 1.0
    assert humaneval("    xs.sort()\n", SORTED)["pass"] == 1.0  # tests may look at their arguments after a call
    assert mbpp("```python\ndef sum(xs):\n    return 42\n```", ["assert sum([1]) == 42"],
                reference="def sum(xs):\n    return 42")["pass"] == 1.0  # a task asking for a built-in's name
    node = "```python\nclass Node:\n    def __init__(self, v, left=None):\n        self.v, self.left = v, left\n\n" \
           "def depth(n):\n    return 0 if n is None else 1 + depth(n.left)\n```"
    assert mbpp(node, ["assert depth(root) == 2"], setup="root = Node(1, Node(2))")["pass"] == 1.0


def test_the_check_is_recorded_beside_the_isolation_layers():
    row = ROWS["HumanEval/2"]
    score = BoundScorer("humaneval_pass").score(Example(id=row["task_id"], turns=[row["prompt"]], row=row),
                                               [row["canonical_solution"]])
    values = RunRecord.from_dict(RunRecord(score=score).to_dict()).score["values"]
    assert values["pass"] == 1.0 and values["return_types"] == "builtin-exact" and "audit-hook" in values["isolation"]
    broken = Example(id="h", turns=["?"], row=hand_row("x = ("))  # tests that do not compile never start
    failed = BoundScorer("humaneval_pass").score(broken, ["    return 1\n"])
    assert failed["values"]["pass"] == 0.0 and failed["values"]["return_types"] is None


def test_a_counter_subclass_or_a_thread_is_still_refused():
    sub = "```python\nfrom collections import Counter\n\nclass C(Counter):\n    def __eq__(self, o):\n" \
          "        return True\n\ndef freq(xs):\n    return C(xs)\n```"
    assert "not a built-in type" in mbpp(sub, ["assert freq('ab') == {'z': 9}"])["reason"]
    thread = humaneval(*reversed(CHEATS["a thread that keeps patching"]))
    assert thread["pass"] == 0.0 and "blocked by the sandbox: starting a thread" in thread["reason"]


def test_which_names_the_tests_take_from_the_solution():
    assert mbpp_entry_points(["assert f(1) == g(2)", "x = h(3)", "assert x"]) == {"f": "checked", "g": "checked",
                                                                                    "h": "checked"}
    assert mbpp_entry_points(["assert longest([Pair(1, 2)], 1) == 1"]) == {"longest": "checked", "Pair": "argument"}
    assert mbpp_entry_points(["assert set(common(a, b)) == set(b)"], setup="a = Node(1)\nb = [2]") == {
        "common": "checked", "Node": "argument"}
    assert mbpp_entry_points(["assert sum([1]) == abs(-1)"], reference="def sum(xs):\n    return 1") == {
        "sum": "checked"}  # a built-in name the task asks for
    assert mbpp_entry_points(["assert sys.getsizeof(f(1)) == 9"]) == {"sys": "checked", "f": "checked"}


def test_the_prompt_context_is_the_prompt_without_its_stub():
    prompt = ROWS["HumanEval/38"]["prompt"]
    context = prompt_context(prompt, "decode_cyclic")
    assert "def encode_cyclic" in context and "decode_cyclic" not in context
    assert prompt_context("def f():\n", "f") == "" and prompt_context("def f(:\n", "f") == ""


# --- the copier itself, in this process --------------------------------------------------------------

COPY, CHECK = make_value_copier(collections.Counter, collections.OrderedDict, collections.defaultdict)


def test_the_copy_is_equal_fresh_and_keeps_shared_parts_and_cycles():
    shared = [1, 2]
    value = {"t": (shared, shared), "s": {(1, (2,))}, "f": frozenset({"x"}), "n": None}
    copy, problem = COPY(value)
    assert problem is None and copy == value and copy is not value and copy["t"][0] is not shared
    assert copy["t"][0] is copy["t"][1]
    loop = [1]
    loop.append((loop, {"back": loop}))
    copy, problem = COPY(loop)
    assert problem is None and copy[1][0] is copy and copy[1][1]["back"] is copy
    ordered = collections.OrderedDict([("b", 1), ("a", 2)])
    assert list(COPY(ordered)[0]) == ["b", "a"] and type(COPY(ordered)[0]) is collections.OrderedDict
    lam = collections.defaultdict(lambda: sys.exit(1), {"a": 1})
    assert COPY(lam)[0].default_factory is None and COPY(collections.defaultdict(list))[0].default_factory is list


def test_deep_and_large_values_cost_no_recursion():
    deep = []
    for _ in range(200_000):
        deep = [deep]
    copy, problem = COPY(deep)
    assert problem is None and type(copy) is list
    assert COPY(list(range(300_000)))[0][-1] == 299_999


def test_no_code_of_the_value_runs_while_it_is_checked():
    ran = []

    class Meta(type):
        def __eq__(cls, other):
            ran.append("eq")
            return True

        def __hash__(cls):
            ran.append("hash")
            return hash(int)

    class Lying(metaclass=Meta):
        pass

    class Key(str):
        def __hash__(self):
            ran.append("key")
            return 0

    values = (Lying(), [1, (2, frozenset({Lying()}))], {Key("a"): 1}, {1: {2: [True, 3.0, Key()]}})
    ran.clear()  # building them hashed a Key
    for value in values:
        copy, problem = COPY(value)
        assert copy is None and "not a built-in type" in problem
    assert not ran
