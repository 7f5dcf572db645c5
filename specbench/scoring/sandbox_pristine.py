"""The tests' side of a checked run: their own namespace, the program's entry points wrapped, the standard
library put back after every call. Part of the sandboxed child's source (``sandbox.py`` joins the files of
``GUARD_SOURCE``); never imported.

The tests run in the program's interpreter, so besides returning a forged value (``sandbox_values.py``) a
program could change what the tests compare with: ``math.isclose = lambda *a, **k: True``, ``re.match``,
``builtins.all``, a helper of the prompt the tests call (HumanEval/38's ``encode_cyclic``). So, when
``run_program`` names entry points:
- the stages after the solution run in a namespace of their own that the program never sees: the dataset's
  context (the prompt's helpers, MBPP's setup) is run again there, and the only names taken from the
  solution are the entry points, each wrapped;
- the modules the tests import are imported before the program runs, and after the solution and after every
  call the standard library is put back as it was then: ``sys.modules``, each module's class and
  attributes, the attributes of the classes it holds, the class and attributes of the other objects it
  holds, the contents of its dicts, lists and sets (``sys.path``, ``sys.meta_path``, ``re``'s cache);
- a checked entry point's return value goes through ``copy_value``; an argument entry point (MBPP's
  ``Pair(5, 24)``, only ever called inside the arguments of another entry point) returns its value as is:
  it goes back into the solution, never to a comparison.
No program code runs between calls: no thread can start (sandbox_guard.py), and one found running when a call
returns fails the run all the same; audit hooks and replacing the code or defaults of the library's functions
are refused (``make_audit_hook``), the cyclic garbage collector is off, and everything a call handed back or a
restore removed is kept alive (``keep``), so no finalizer of the program's runs later.
"""
import gc
import sys
import types

IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: built-in and C types, whose attributes cannot be set
ORDER = ("class-of", "class", "attributes", "dict", "list", "set")  # classes first: the rest reads through them


def import_test_modules(sources):
    """Import now, before the program runs, what the later stages import: a module first imported after the
    snapshot would be one the program could change unseen."""
    import ast

    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                try:
                    __import__(name)
                except Exception:  # noqa: BLE001 - a name that is not a module, or a module that does not import
                    pass


def pristine_library(skip, keep):
    """Snapshot the standard library now; return ``(restore, function_ids)``. ``restore()`` puts back whatever
    changed since (see the module docstring), keeping what it removes alive; ``function_ids`` are the
    library's Python functions, whose ``__code__`` and defaults the audit hook protects. ``skip`` is the
    program's namespace. Every name ``restore`` uses is bound here, before the program runs; what it compares
    it compares by identity, in C (``map(operator.is_, ...)``: no ``__eq__`` of the program's, and no ``id``,
    which raises an audit event per call)."""
    import operator

    _all, _len, _list, _map, _zip, _type, _dict, is_ = all, len, list, map, zip, type, dict, operator.is_
    type_dict = type.__dict__["__dict__"].__get__
    set_class, set_attr, del_attr = object.__setattr__, type.__setattr__, type.__delattr__
    missing = object()

    def contents(kind, obj, saved):
        """What must stay the same objects, in order: a list of sequences."""
        if kind == "class-of":
            return [(_type(obj),)]
        if kind == "attributes":
            obj = saved[1] if saved[0].__get__(obj) is saved[1] else None  # a replaced __dict__ is never read
            return [(obj,)] if obj is None else [_list(obj), _list(obj.values())]
        if kind in ("dict", "class"):
            mapping = type_dict(obj) if kind == "class" else obj
            return [_list(mapping), _list(mapping.values())]
        return [_list(obj)]

    def unchanged(kind, obj, saved, before):
        now = contents(kind, obj, saved)
        return _all(_len(a) == _len(b) and _all(_map(is_, a, b)) for a, b in _zip(now, before))

    def put_back(kind, obj, saved):
        if kind == "class-of":
            keep(_type(obj))
            set_class(obj, "__class__", saved)
        elif kind == "class":
            current = _dict(type_dict(obj))  # keys of a class are always exact str (type.__setattr__ copies)
            keep(current)
            for name in current:
                if name not in saved:
                    del_attr(obj, name)
            for name, value in saved.items():
                if current.get(name, missing) is not value:
                    set_attr(obj, name, value)
        elif kind == "attributes":
            descriptor, attributes, values = saved
            current = descriptor.__get__(obj)
            if current is not attributes:
                keep(current)
                descriptor.__set__(obj, attributes)
            put_back("dict", attributes, values)
        else:
            keep(_list(obj.items()) if kind == "dict" else _list(obj))  # no hashing of what the program put there
            if kind == "list":
                obj[:] = saved
            else:
                obj.clear()
                obj.update(saved)

    entries, seen, function_ids = [], set(), set()

    def add(kind, obj, saved):
        if (kind, id(obj)) not in seen:
            seen.add((kind, id(obj)))
            entries.append([kind, obj, saved, contents(kind, obj, saved)])

    def functions_of(namespace):
        for value in namespace.values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if type(value) is types.FunctionType:
                function_ids.add(id(value))

    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict or namespace is skip:
            continue
        add("class-of", module, type(module))
        add("dict", namespace, dict(namespace))
        functions_of(namespace)
        for value in list(namespace.values()):
            cls = type(value)
            if isinstance(value, type):
                if not value.__flags__ & IMMUTABLE_TYPE:
                    add("class", value, dict(vars(value)))
                    functions_of(vars(value))
            elif cls in (dict, list, set):
                add(cls.__name__, value, cls(value))
            elif not cls.__flags__ & IMMUTABLE_TYPE and not isinstance(value, types.ModuleType):
                add("class-of", value, cls)
                descriptor = next((vars(base)["__dict__"] for base in cls.__mro__ if "__dict__" in vars(base)), None)
                if type(descriptor) is types.GetSetDescriptorType:
                    attributes = descriptor.__get__(value)
                    add("attributes", value, (descriptor, attributes, dict(attributes)))
    entries.sort(key=lambda entry: ORDER.index(entry[0]))

    def restore():
        for entry in entries:
            kind, obj, saved, before = entry
            if not unchanged(kind, obj, saved, before):
                put_back(kind, obj, saved)
                entry[3] = contents(kind, obj, saved)  # the same objects; only their order may differ

    return restore, function_ids


def entry_point(name, function, checked, values, after_call, fail, keep):
    """``function`` as the tests call it: after the call (returned or raised) ``after_call`` puts the library
    back, and the arguments that were made of built-in types must still be; a checked entry point's value
    must pass ``copy_value``, and the tests get the copy. ``values``: ``(copy_value, check_value)``."""
    copy_value, check_value = values
    anything = BaseException  # bound now: an except clause looks its class up when it runs, and the program
    # may have replaced builtins.BaseException by then

    def call(*args, **kwargs):
        keep((args, kwargs))  # what the program put in the arguments never dies, so never runs a finalizer
        plain = [a for a in (*args, *kwargs.values()) if check_value(a) is None]  # the tests' own, unforged
        try:
            result = function(*args, **kwargs)
        except anything as exc:  # re-raised once the library is back
            keep(exc)
            after_call(name)
            check_arguments(plain)
            raise
        keep(result)
        after_call(name)
        check_arguments(plain)
        if not checked:
            return result
        try:
            copy, problem = copy_value(result)
        except anything:  # MemoryError, RecursionError: not a pass either way
            copy, problem = None, "a value the sandbox could not copy"
        if problem is not None:
            fail(f"{name} returned {problem}")
        return copy

    def check_arguments(plain):
        for argument in plain:
            problem = check_value(argument)
            if problem is not None:
                fail(f"after {name} returned, an argument of the tests is {problem}")

    call.__name__ = call.__qualname__ = name
    return call


def make_after_call(restore, fail):
    """What runs after the solution and after every call, before the tests go on."""
    thread_count = getattr(sys.modules["_thread"], "_count", lambda: 0)  # every thread of the interpreter
    gc_disable, anything = gc.disable, BaseException

    def after_call(name):
        try:
            if thread_count():  # it could change anything while the tests run: not a pass, whatever it does
                fail(f"{name} left a thread running")
            gc_disable()  # the program may have turned it back on; a collection would run its finalizers
            restore()
        except anything:
            fail(f"the standard library could not be put back after {name}")

    return after_call


def tests_namespace(solution, modes, builtins, values, after_call, fail, keep, module_ids):
    """The namespace the later stages run in: fresh builtins and, from the solution, only the entry points
    (``modes``: name -> "checked" | "argument"). A non-callable entry is passed through when it is a module of
    the snapshot (MBPP 596's tests read the solution's ``sys``); otherwise it goes through ``copy_value``
    (``values``: ``(copy_value, check_value)``)."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    for name, mode in modes.items():
        if name not in solution:
            continue  # the tests fail with a NameError, as they would have
        value, checked = solution[name], mode == "checked"
        if callable(value):
            namespace[name] = entry_point(name, value, checked, values, after_call, fail, keep)
        elif id(value) in module_ids or not checked:
            namespace[name] = value
        else:
            copy, problem = values[0](value)
            if problem is not None:
                fail(f"{name} is {problem}")
            namespace[name] = copy
    return namespace
