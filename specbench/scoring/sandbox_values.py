"""What a checked entry point may hand the tests: values made of exact built-in types, as a fresh copy;
and what the tests' own arguments must still be made of after a call.

Part of the sandboxed child's source (``sandbox.py`` joins the files of ``GUARD_SOURCE``); never imported.
The tests compare what the program returns with ``==``, and a comparison runs the ``__eq__`` of whatever
the program returned: an object whose ``__eq__`` always says True, an ``int`` or ``str`` subclass doing the
same, a list holding such an object or a dict keyed by one passes any test. Exact built-in types compare
in C, whatever the program does, so every value reachable from a returned value must be of one of them —
``type(x) is int``, never ``isinstance``: a subclass is refused. Three dict types of ``collections``
(``Counter``, ``OrderedDict``, ``defaultdict``) are let through as well: reference solutions return them
(MBPP 40, 88, 653, 902) and compare them with dict literals; the classes must be the ones that existed
before the program ran (their attributes are put back after every call, ``sandbox_pristine.py``); a
``defaultdict``'s factory is kept only when it is a built-in type (``int``, ``list``: a factory of the
program's would run its code when the tests read a missing key), else the copy has none.

The tests get a copy built here, which the program holds no reference to, so nothing it left behind can
change the value between this check and the comparison. Every step is iterative, visits each container
once (shared parts and cycles through lists and dicts are copied as such) and runs no code of the program:
types are compared by identity (a class can define ``__eq__`` and ``__hash__`` on its metaclass), names
are read through ``type``'s own descriptors. Identity keys are ``object.__hash__`` (the address, rotated:
unique among live objects), not ``id``, which raises an audit event, and so calls the guard's hook, per call.

The arguments the tests pass are theirs, and the program can put a forged object into them (``xs[:] =
[AlwaysEqual()]`` before the tests compare ``xs``): an argument made of built-in types before a call must
still be after it (``check_value``; the program can change it only while it is called).
"""


def make_value_copier(counter, ordered_dict, default_dict):
    """``(copy_value, check_value)``: ``copy_value(x) -> (copy, None)``, or ``(None, what was refused)``;
    ``check_value(x)`` -> what would be refused, or None. The classes are bound now, before the program runs,
    like every name they use."""
    key = object.__hash__
    scalars = {key(t) for t in (int, float, complex, bool, str, bytes, type(None))}
    # container type -> (mutable, how to read its items, how to make an empty copy)
    kinds = {key(list): (True, None, list), key(dict): (True, dict.items, dict), key(set): (True, None, set),
             key(tuple): (False, None, tuple), key(frozenset): (False, None, frozenset),
             key(counter): (True, dict.items, counter), key(ordered_dict): (True, ordered_dict.items, ordered_dict),
             key(default_dict): (True, dict.items, None)}
    factories = {key(t) for t in (int, float, complex, bool, str, bytes, list, tuple, dict, set, frozenset)}
    dicts = {key(dict), key(counter), key(ordered_dict), key(default_dict)}
    _type, _len, _list, _str, _range = type, len, list, str, range
    type_name, type_module = type.__dict__["__name__"].__get__, type.__dict__["__module__"].__get__

    def factory(x):
        return x.default_factory if key(x.default_factory) in factories else None  # a C member: no program code

    def describe(cls):
        try:
            name, module = _str.__str__(type_name(cls)), type_module(cls)
            return name if _type(module) is not _str or module == "builtins" else f"{_str.__str__(module)}.{name}"
        except BaseException:  # noqa: BLE001 - a name we could not read is still refused
            return "?"

    def discover(root):
        """``(seen, order, problem)``: every container reachable from ``root`` once (key -> (it, its
        children)), in discovery order; or the first value of a type not allowed."""
        seen, order, stack = {}, [], [root]
        while stack:
            x = stack.pop()
            cls = _type(x)
            if key(cls) in scalars or key(x) in seen:
                continue
            kind = kinds.get(key(cls))
            if kind is None:
                holder = "" if x is root else f"a {describe(_type(root))} holding "
                return seen, order, f"{holder}a value of type {describe(cls)}, not a built-in type"
            items = kind[1]
            children = _list(x) if items is None else [part for pair in items(x) for part in pair]
            seen[key(x)] = (x, children)
            order.append(x)
            stack.extend(children)
        return seen, order, None

    def check_value(root):
        return None if key(_type(root)) in scalars else discover(root)[2]

    def copy_value(root):
        if key(_type(root)) in scalars:
            return root, None
        seen, order, problem = discover(root)
        if problem is not None:
            return None, problem
        copies = {}
        for x in order:  # empty mutable containers first: tuples may hold them, and they may hold tuples
            cls = _type(x)
            mutable, _, make = kinds[key(cls)]
            if mutable:
                copies[key(x)] = make() if make is not None else default_dict(factory(x))
        for x in order:
            if key(x) not in copies and not build_immutable(x, seen, copies):
                return None, "a tuple that contains itself"
        for x in order:
            fill(x, seen[key(x)][1], copies)
        return copies[key(root)], None

    def build_immutable(top, seen, copies):
        """Tuples and frozensets are made from their parts' copies, so the parts first (post-order); a
        cycle needs a list or dict on the way, which already has its (empty) copy."""
        stack, busy = [(top, False)], set()
        while stack:
            x, parts_ready = stack.pop()
            if key(x) in copies:
                continue
            children = seen[key(x)][1]
            if parts_ready:
                copies[key(x)] = _type(x)([c if key(_type(c)) in scalars else copies[key(c)] for c in children])
                continue
            if key(x) in busy:
                return False
            busy.add(key(x))
            stack.append((x, True))
            stack.extend((c, False) for c in children if key(_type(c)) not in scalars and key(c) not in copies)
        return True

    def fill(x, children, copies):
        cls = _type(x)
        parts = [c if key(_type(c)) in scalars else copies[key(c)] for c in children]
        copy = copies[key(x)]
        if key(cls) in dicts:
            for i in _range(0, _len(parts), 2):
                copy[parts[i]] = parts[i + 1]
        elif cls is list:
            copy.extend(parts)
        elif cls is set:
            copy.update(parts)

    return copy_value, check_value
