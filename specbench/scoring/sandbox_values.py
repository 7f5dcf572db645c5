"""What the tests stage sees of the solution: pristine modules, and only values of exact built-in types.

Part of the sandboxed child's source (after ``sandbox_isolation.py``, before ``sandbox_guard.py``; never imported
by the harness). The tests decide a pass by comparing what the solution returns, so a solution could make its
own answer look right: return an object whose ``__eq__`` always says True (or an ``int`` / ``str`` / ``list``
subclass doing the same), patch ``math.isclose`` or ``re.match`` for the tests, or shadow a builtin the tests
use (``abs = lambda x: 0``). Between the stages the guard therefore
1. restores every module to what it was before the solution ran (``snapshot_modules`` / ``restore_modules``):
   each module's attributes, the contents of the dicts, lists and sets it holds (``re``'s compiled-pattern
   cache, ``sys.modules``), its Python functions' code and defaults, and its classes' attributes; modules the
   solution imported first are dropped, so the tests import fresh copies;
2. runs the tests in a namespace of their own (``tests_namespace``): the builtins as they were before the
   solution ran, and of the solution's names only those the tests' code mentions; a builtin's name the
   solution rebound is dropped (unless it is the function under test), a module is the restored one, a
   callable is wrapped so that every value it returns, and every list / dict / set argument it was given, is
   checked before the tests see it: exact built-in types only (``type(x) is int``, not a subclass),
   recursively through lists, tuples, dicts (keys and values), sets and frozensets; any other value is refused,
   the run fails with the reason, even if the tests catch the exception.
What stays possible: a solution that computes the right answer only when tested (that is a correct solution),
and stdlib state held deeper than one level (an object's attributes inside a module's object).
"""
import sys
import types

EXACT_TYPES = (int, float, complex, bool, str, bytes, type(None), list, tuple, dict, set, frozenset)
CHECKED_LAYERS = ["pristine-modules", "exact-builtin-returns"]

# The checker and the wrapper are made in a namespace of their own: a function defined in this file would hand
# whoever reaches it the guard's globals through __globals__. Types are compared by identity (``id``): a class
# with a metaclass can make ``==`` and ``hash`` on itself say anything.
CHECKER_SOURCE = '''
def offending_type(value, _type=type, _id=id, _allowed=frozenset(map(id, EXACT_TYPES)),
                   _sequences=frozenset(map(id, (list, tuple, set, frozenset))), _dict=dict):
    """The first type in ``value`` (recursively) that is not an exact built-in one, or None."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        kind = _type(item)
        if _id(kind) not in _allowed:
            return kind
        if _id(kind) in _sequences or kind is _dict:
            if _id(item) in seen:  # a cycle, or a container met twice
                continue
            seen.add(_id(item))
            if kind is _dict:
                stack.extend(_dict.keys(item))
                stack.extend(_dict.values(item))
            else:
                stack.extend(item)
    return None


def guarded(function, name, refusals, _name_of=type.__repr__, _type=type, _mutable=(list, dict, set)):
    """``function`` whose results (and list / dict / set arguments, after the call) must be exact built-ins."""
    def call(*args, **kwargs):
        result = function(*args, **kwargs)
        for what, value in (("returned", result), *(("left in an argument", a) for a in (*args, *kwargs.values())
                                                     if _type(a) in _mutable)):
            bad = offending_type(value)
            if bad is not None:
                refusals.append(f"{name} {what} a value of type {_name_of(bad)}, not an exact built-in type "
                                "(int, float, complex, bool, str, bytes, None, list, tuple, dict, set, frozenset)")
                raise TypeError("blocked by the sandbox: " + refusals[-1])
        return result
    return call
'''


def make_checker():
    """(guarded, refusals): the wrapper factory and the list every refusal is appended to."""
    namespace = {"EXACT_TYPES": EXACT_TYPES}
    exec(CHECKER_SOURCE, namespace)
    return namespace["guarded"], []


def snapshot_modules():
    """Every loaded module's state, one level deep: [(name, module, attributes, containers, functions, classes)]."""
    saved = []
    for name, module in list(sys.modules.items()):
        if name == "__main__":  # the solution's own namespace: what it defines is what the tests test
            saved.append((name, module, None, {}, {}, {}))
            continue
        attributes = dict(getattr(module, "__dict__", {}))
        containers = {key: (value, value.copy()) for key, value in attributes.items()
                      if type(value) in (dict, list, set)}
        functions = {key: (value, value.__code__, value.__defaults__, value.__kwdefaults__)
                     for key, value in attributes.items() if type(value) is types.FunctionType}
        classes = {key: (value, dict(vars(value))) for key, value in attributes.items()
                   if isinstance(value, type) and getattr(value, "__module__", None) == name}
        saved.append((name, module, attributes, containers, functions, classes))
    return saved


def restore_modules(saved):
    """Put every module back as ``snapshot_modules`` saw it; drop the modules imported since."""
    known = {name for name, *_ in saved}
    for name in [n for n in sys.modules if n not in known]:
        del sys.modules[name]
    for name, module, attributes, containers, functions, classes in saved:
        sys.modules[name] = module
        now = getattr(module, "__dict__", None)
        if now is None or attributes is None:
            continue
        for key in [k for k in now if k not in attributes]:
            del now[key]
        for key, value in attributes.items():
            if now.get(key, restore_modules) is not value:
                now[key] = value
        for value, copy in containers.values():  # always: comparing would call what the solution put there
            if type(value) is list:
                value[:] = copy
            else:
                value.clear()
                value.update(copy)
        for function, code, defaults, kwdefaults in functions.values():
            if function.__code__ is not code:
                function.__code__ = code
            if function.__defaults__ is not defaults:
                function.__defaults__ = defaults
            if function.__kwdefaults__ is not kwdefaults:
                function.__kwdefaults__ = kwdefaults
        for cls, class_attributes in classes.values():
            restore_class(cls, class_attributes)


def restore_class(cls, attributes):
    try:
        for key in [k for k in vars(cls) if k not in attributes]:
            delattr(cls, key)
        for key, value in attributes.items():
            if vars(cls).get(key, restore_class) is not value and key not in ("__dict__", "__weakref__"):
                setattr(cls, key, value)
    except (TypeError, AttributeError):  # a built-in (immutable) type: the solution could not change it either
        pass


def referenced_names(code):
    """Every global or attribute name the tests' code (and the functions it defines) mentions."""
    names, stack = set(), [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return names


def tests_namespace(solution, tests_code, builtins, entry_points, guarded, refusals):
    """The namespace the tests run in (module docstring, 2)."""
    namespace = {"__builtins__": dict(builtins), "__name__": "__main__", "__file__": solution.get("__file__")}
    for name in referenced_names(tests_code):
        if name.startswith("__") or name not in solution:
            continue
        value = solution[name]
        if name in builtins and name not in entry_points:
            continue  # the solution rebound a builtin the tests use: they get the builtin
        if type(value) is types.ModuleType:
            module = sys.modules.get(value.__name__)
            if module is not None:
                namespace[name] = module
        elif callable(value):
            namespace[name] = guarded(value, name, refusals)
        else:  # a value the tests read directly: checked now (a refusal fails the run once the tests end)
            try:
                namespace[name] = guarded(lambda v=value: v, name, refusals)()
            except TypeError:
                pass
    return namespace
