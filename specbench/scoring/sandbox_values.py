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
   the run fails with the reason, even if the tests catch the exception. The tests receive fresh copies (the
   solution keeps no reference to what they compare), and after every call the modules are restored again.
Threads cannot start (sandbox_guard.py), so nothing of the solution runs between its calls but finalizers.
What stays possible: a finalizer (``__del__``, a weakref callback) of the solution's that runs during the tests
and patches a module again; stdlib state held deeper than one level (an attribute of an object a module holds).
"""
import sys
import types

SCALAR_TYPES = (int, float, complex, bool, str, bytes, type(None))  # immutable; with the containers below, the
EXACT_TYPES = (*SCALAR_TYPES, list, tuple, dict, set, frozenset)      # values the tests may receive
CHECKED_LAYERS = ["pristine-modules", "exact-builtin-returns"]

# The checker and the wrapper are made in a namespace of their own: a function defined in this file would hand
# whoever reaches it the guard's globals through __globals__. Types are compared by identity (``id``): a class
# with a metaclass can make ``==`` and ``hash`` on itself say anything.
CHECKER_SOURCE = '''
class Refused(Exception):
    pass


def fresh_copy(value, memo, _type=type, _id=id, _scalars=frozenset(map(id, SCALAR_TYPES)), _list=list,
               _tuple=tuple, _dict=dict, _set=set, _frozenset=frozenset):
    """A copy of ``value`` built anew from exact built-in types (``memo``: id -> copy, for shared parts and
    cycles), or Refused(the first other type met). The caller never holds anything the solution can reach."""
    kind = _type(value)
    if _id(kind) in _scalars:
        return value  # immutable, and of an exact built-in type: its comparisons are the interpreter's own
    if _id(value) in memo:
        return memo[_id(value)]
    if kind is _list:
        copy = memo[_id(value)] = []
        copy.extend([fresh_copy(item, memo) for item in _list.copy(value)])
    elif kind is _dict:
        copy = memo[_id(value)] = {}
        for key, item in _list(_dict.items(value)):
            copy[fresh_copy(key, memo)] = fresh_copy(item, memo)
    elif kind is _set:
        copy = memo[_id(value)] = set()
        copy.update([fresh_copy(item, memo) for item in _list(value)])
    elif kind is _tuple or kind is _frozenset:
        copy = kind([fresh_copy(item, memo) for item in value])
    else:
        raise Refused(kind)
    return copy


def guarded(function, name, refusals, restore, _name_of=type.__repr__, _type=type, _id=id,
            _mutable=(list, dict, set), _TypeError=TypeError, _RecursionError=RecursionError):
    """``function`` as the tests see it: list / dict / set arguments handed over as copies (copied back, checked,
    after the call), the result checked and copied: exact built-in types only, recursively, anything else
    refused; after every call the modules are restored again (``restore``), since the call may patch them. The
    tests never hold an object the solution can still change. Builtins are bound here, as they were."""
    def call(*args, **kwargs):
        originals = [a for a in (*args, *kwargs.values()) if _type(a) in _mutable]
        copies = {}
        for original in originals:
            try:
                copies[_id(original)] = fresh_copy(original, {})
            except Refused:  # the tests passed objects of their own: handed over as they are
                pass
        args = [copies.get(_id(a), a) for a in args]
        kwargs = {k: copies.get(_id(v), v) for k, v in kwargs.items()}
        try:
            result = function(*args, **kwargs)
        finally:
            restore()
        what = "returned"
        try:
            checked = fresh_copy(result, {})
            what = "left in an argument"
            for original in originals:
                if _id(original) in copies:
                    back = fresh_copy(copies[_id(original)], {})
                    if _type(original) is list:
                        original[:] = back
                    else:
                        original.clear()
                        original.update(back)
        except Refused as refused:
            refusals.append(f"{name} {what} a value of type {_name_of(refused.args[0])}, not an exact built-in type "
                            "(int, float, complex, bool, str, bytes, None, list, tuple, dict, set, frozenset)")
            raise _TypeError("blocked by the sandbox: " + refusals[-1]) from None
        except _RecursionError:
            refusals.append(f"{name} {what} a value nested too deeply to check")
            raise _TypeError("blocked by the sandbox: " + refusals[-1]) from None
        return checked
    return call
'''


def make_checker():
    """(guarded, refusals): the wrapper factory and the list every refusal is appended to."""
    namespace = {"SCALAR_TYPES": SCALAR_TYPES}
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


def restore_modules(saved, _modules=sys.modules, _getattr=getattr, _type=type, _list=list):
    """Put every module back as ``snapshot_modules`` saw it; drop the modules imported since. Runs after the
    solution's code, so every builtin it uses is bound at definition, as it was."""
    known = {name for name, *_ in saved}
    for name in [n for n in _modules if n not in known]:
        del _modules[name]
    for name, module, attributes, containers, functions, classes in saved:
        _modules[name] = module
        now = _getattr(module, "__dict__", None)
        if now is None or attributes is None:
            continue
        for key in [k for k in now if k not in attributes]:
            del now[key]
        for key, value in attributes.items():
            if now.get(key, restore_modules) is not value:
                now[key] = value
        for value, copy in containers.values():  # always: comparing would call what the solution put there
            if _type(value) is _list:
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


def restore_class(cls, attributes, _vars=vars, _setattr=setattr, _delattr=delattr,
                  _immutable=(TypeError, AttributeError)):
    try:
        for key in [k for k in _vars(cls) if k not in attributes]:
            _delattr(cls, key)
        for key, value in attributes.items():
            if _vars(cls).get(key, restore_class) is not value and key not in ("__dict__", "__weakref__"):
                _setattr(cls, key, value)
    except _immutable:  # a built-in (immutable) type: the solution could not change it either
        pass


def referenced_names(code):
    """Every global or attribute name the tests' code (and the functions it defines) mentions."""
    names, stack = set(), [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return names


def tests_namespace(solution, tests_code, builtins, entry_points, guarded, refusals, restore):
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
            namespace[name] = guarded(value, name, refusals, restore)
        else:  # a value the tests read directly: checked now (a refusal fails the run once the tests end)
            try:
                namespace[name] = guarded(lambda v=value: v, name, refusals, restore)()
            except TypeError:
                pass
    return namespace
