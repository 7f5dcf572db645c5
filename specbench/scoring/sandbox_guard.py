"""The code that runs in a sandboxed child before the model-written program; never imported by the harness.

Its source follows ``sandbox_isolation.py``'s, ``sandbox_values.py``'s and ``sandbox_pristine.py``'s in one
``python -I -S -c`` argument (so the child never reads the harness's files), with one JSON argument holding
the policy. In order it
1. reads the run's proof token from a pipe and closes it (the token is never in argv, the environment or
   a file, and lives only in a local variable of ``main``);
2. sets up operating-system isolation (``isolate_process``) and resource limits;
3. compiles every stage (the solution, then its tests) before any of them runs and removes their files
   (the tests' file holds their answers), and keeps its own references to what it needs afterwards
   (``exec``, ``os.write``, ``os._exit``), so a program that replaces builtins or module functions cannot
   skip the tests;
4. installs a Python audit hook (PEP 578; hooks cannot be removed) that refuses process creation,
   signals, sockets, native code, frame and garbage-collector introspection (the ways to reach the
   token), further audit hooks, code objects built from anything but source (``types.CodeType``,
   ``code.replace``, ``marshal``: imports from then on compile from source), file changes outside the sandbox
   directory (also through a directory descriptor) and reads of the harness's directories, and removes the
   calls that raise no audit event (mknod, mkfifo, pidfd);
5. runs the stages in order. Without entry points they share one namespace (the tests with the builtins as
   they were before the solution ran). With entry points (HumanEval's, MBPP's) the stages after the solution
   run in a namespace of their own, against the entry points wrapped, with the standard library put back
   after every call and every returned value checked (``sandbox_pristine.py``, ``sandbox_values.py``); the
   report says so (``returns builtin-exact``), and a refused value ends the run (``refused <why>``).
   Only when the last stage returned does it write the token to the report pipe and exit.
A pass is that token; an exit status (0 from ``sys.exit``, ``os._exit``, an ``atexit`` handler) proves nothing.
"""
import json
import os
import resource
import sys
import types

POLICY = json.loads(sys.argv[1])
WORKDIR = os.path.realpath(POLICY["workdir"])
DENY_READ = tuple(os.path.realpath(p) for p in POLICY["deny_read"])
ALLOW_READ = tuple(os.path.realpath(p) for p in POLICY["allow_read"])
SECRET_PROC = ("mem", "map_files", "pagemap", "environ", "syscall", "stack")  # of /proc/self as well


def set_limits(active):
    limits = [
        (resource.RLIMIT_AS, POLICY["memory_bytes"]),
        (resource.RLIMIT_CPU, POLICY["cpu_seconds"]),
        (resource.RLIMIT_FSIZE, POLICY["file_bytes"]),
        (resource.RLIMIT_NOFILE, POLICY["open_files"]),
        (resource.RLIMIT_NPROC, POLICY["processes"]),  # not enforced for root; the audit hook is
        (resource.RLIMIT_CORE, 0),
    ]
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    active.append("rlimits")


def under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def resolve(path, dir_fd=None):
    """The absolute path a call acts on; None for a bare file descriptor (those came from an audited open)."""
    if isinstance(path, int):
        return None
    base = os.getcwd() if dir_fd is None else os.readlink(f"/proc/self/fd/{dir_fd}")
    return os.path.realpath(os.path.join(base, os.fsdecode(path)))


# Events that start processes, signal them, open sockets, load native code or reach frames (and with
# them the proof token): always refused.
REFUSED = {
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__", "socket.connect", "socket.bind",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto", "socket.sendmsg", "ctypes.dlopen",
    "ctypes.dlsym", "os.setuid", "os.setgid", "sys.remote_exec", "webbrowser.open", "sys._getframe",
    "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents",
    "sys.addaudithook", "sys.monitoring.register_callback",  # code that would run inside the tests' own steps
    # code objects made from anything but source (types.CodeType, code.replace, marshal): crafted bytecode reads
    # memory outside what this hook checks (the token, the tests' values), and no event follows what it reads
    "code.__new__", "marshal.loads", "marshal.load",
}
# Imports after the hook is in place compile from source (no bytecode is read from a cache, none is written):
# the compiler's bytecode only. A path nobody can create (changes outside the sandbox directory are refused).
NO_BYTECODE_CACHE = "/nonexistent/specbench-sandbox-no-bytecode-cache"
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "f_back", "f_locals"}
# What makes a standard-library function do something else under the same name: refused for those functions.
FUNCTION_INTERNALS = {"__code__", "__defaults__", "__kwdefaults__"}
REFUSED_IMPORTS = {"ctypes", "_ctypes", "cffi", "_posixsubprocess", "multiprocessing", "_multiprocessing",
                   "posix", "os", "signal", "_signal", "sys", "builtins", "_thread"}  # the last: fresh copies
# Calls that change files but raise no audit event, or signal without one: removed before the program runs.
UNAUDITED = {"os": ("mknod", "mkfifo", "pidfd_open", "chroot"), "signal": ("pidfd_send_signal",)}
# Starting a thread raises no audit event either, and a thread could change a module or a value the tests hold
# after the checks (its count right after the start can still be 0): refused (``import threading`` still works).
THREAD_STARTERS = ("start_new_thread", "start_new", "start_joinable_thread")
# Events whose path arguments must stay inside the sandbox directory: (path position, its dir_fd position).
CHANGES = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.rename": ((0, 2), (1, 3)), "os.replace": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)), "os.symlink": ((0, None), (1, 2)), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.lchmod": ((0, None),), "os.chown": ((0, 3),), "os.lchown": ((0, None),), "os.chflags": ((0, None),),
    "os.lchflags": ((0, None),), "os.truncate": ((0, None),), "os.utime": ((0, 3),),
    "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 2),),
    "shutil.copyfile": ((1, None),), "shutil.copytree": ((1, None),), "shutil.move": ((0, None), (1, None)),
    "shutil.chown": ((0, None),), "os.chdir": ((0, None),),
}
READS = {"os.listdir": 0, "os.scandir": 0, "glob.glob": 0, "os.walk": 0}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Standard-library modules that look at their caller's frame while being imported: imported first.
PRELOAD = ("typing", "collections", "dataclasses", "enum", "functools", "re", "math", "itertools", "string",
           "heapq", "bisect", "fractions", "decimal", "statistics", "random", "hashlib", "copy", "operator",
           "json", "datetime", "io", "abc", "contextlib", "numbers", "array", "struct", "textwrap")


def refuse(what):
    raise PermissionError(f"blocked by the sandbox: {what}")


def make_audit_hook(workdir, deny_read, allow_read, own_proc, library_functions):
    """The policy as a closure: every name the hook uses is bound here, so nothing the program rebinds
    later (this module's globals, were it to reach them) changes it. The event-name checks — process
    creation, signals, sockets, native code, frames — depend on nothing else; the path checks call
    ``os.path`` functions the program could replace, which is why the read-only mounts exist.
    ``library_functions`` (ids) is filled later, once the standard library's snapshot is taken."""
    refuse, under, resolve, isdir = globals()["refuse"], globals()["under"], globals()["resolve"], os.path.isdir
    refused, frame_attributes = frozenset(REFUSED), frozenset(FRAME_ATTRIBUTES)
    refused_imports, function_internals = frozenset(REFUSED_IMPORTS), frozenset(FUNCTION_INTERNALS)
    identity = id  # the program may replace builtins.id; the hook keeps its own
    changes, reads, secret_proc, write_flags = dict(CHANGES), dict(READS), frozenset(SECRET_PROC), WRITE_FLAGS

    def check_read(event, path):
        if path is None or under(path, allow_read):
            return
        if under(path, deny_read) or path.startswith("/proc/") and (
                not under(path, own_proc) or any(part in secret_proc for part in path.split("/"))):
            refuse(f"{event} of a harness path {path}")

    def audit(event, args):
        if event in refused:
            refuse(event)
        if event == "object.__getattr__" and args[1] in frame_attributes:
            refuse(f"reading {args[1]}")
        if event == "object.__setattr__" and args[1] in function_internals and identity(args[0]) in library_functions:
            refuse(f"replacing {args[1]} of a standard-library function")
        if event == "import" and args[0].split(".")[0] in refused_imports:
            refuse(f"import {args[0]}")
        if event in changes:
            for i, fd_at in changes[event]:
                if i < len(args):
                    dir_fd = args[fd_at] if fd_at is not None and fd_at < len(args) else None
                    path = resolve(args[i], dir_fd if isinstance(dir_fd, int) and dir_fd >= 0 else None)
                    if path is None or not under(path, (workdir,)):
                        refuse(f"{event} outside the sandbox directory ({args[i]!r})")
        elif event == "open":
            path, mode, flags = (list(args) + [None, None])[:3]
            path = resolve(path)
            writes = (mode and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & write_flags)
            if path is not None and not under(path, (workdir,)):
                if writes:
                    refuse(f"writing outside the sandbox directory ({args[0]!r})")
                if isdir(path):  # a directory descriptor would let dir_fd calls act outside unseen
                    refuse(f"opening a directory outside the sandbox directory ({args[0]!r})")
            check_read("open", path)
        elif event in reads and args:
            check_read(event, resolve(args[reads[event]] if args[reads[event]] is not None else "."))

    return audit


def disarm_modules():
    import collections
    import signal
    import typing

    for name in PRELOAD:
        __import__(name)
    for module, names in UNAUDITED.items():
        for name in names:
            for holder in (sys.modules[module], sys.modules.get("posix"), sys.modules.get("_signal")):
                if holder is not None and hasattr(holder, name):
                    delattr(holder, name)

    # The replacements are made in a namespace of their own: a function defined in this file would hand
    # the program this module's globals through its __globals__.
    replacements = {"namedtuple": collections.namedtuple}
    exec("def no_handlers(*_):\n"  # a handler receives the interrupted frame
         "    raise PermissionError('blocked by the sandbox: signal.signal')\n"
         "def caller(depth=1, default='__main__'):\n"  # typing's would read its caller's frame
         "    return default\n"
         "def no_threads(*_, **__):\n"
         "    raise PermissionError('blocked by the sandbox: starting a thread')\n"
         "def make_namedtuple(*args, module='__main__', _original=namedtuple, **kwargs):\n"
         "    return _original(*args, module=module, **kwargs)\n", replacements)
    signal.signal = sys.modules["_signal"].signal = replacements["no_handlers"]
    typing._caller = replacements["caller"]
    collections.namedtuple = replacements["make_namedtuple"]
    for name in THREAD_STARTERS:
        if hasattr(sys.modules["_thread"], name):
            setattr(sys.modules["_thread"], name, replacements["no_threads"])

def read_stages():
    stages = []
    for name, path in POLICY["stages"]:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
        os.remove(path)  # compiled here; left in the directory, the tests' file would hand a program their answers
        stages.append((name, compile(source, path, "exec"), source))
    return stages


def describe(stage, exc):
    """One line for the harness (the traceback module needs frames, which are refused from here on)."""
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None else None  # the first entry is this guard's exec
    line = tb.tb_lineno if tb is not None else None  # the stage's own line that raised
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - the program's own __str__
        message = "?"
    return f"{type(exc).__name__}: {message} ({stage}, line {line})"


def make_fail(write, report_fd, exit_now):
    """End the run as refused: the reason on the report pipe (and stderr), exit status 1, no proof."""
    def fail(reason):
        try:
            line = reason.encode("utf-8", "replace")
            write(report_fd, b"refused " + line + b"\n")
            write(2, b"refused by the sandbox: " + line + b"\n")
        finally:
            exit_now(1)

    return fail


def main():
    with os.fdopen(POLICY["proof_fd"], "rb") as fh:
        token = fh.read()
    active = []
    isolate_process(POLICY, active)  # noqa: F821 - defined in sandbox_isolation.py, whose source runs before this one
    set_limits(active)
    stages = read_stages()
    entry_points = POLICY.get("entry_points")  # name -> "checked" | "argument"; None: one shared namespace
    run, write, exit_now, err, explain, flush_streams = exec, os.write, os._exit, sys.stderr, describe, flush
    pristine_builtins = dict(vars(__builtins__) if isinstance(__builtins__, types.ModuleType) else __builtins__)
    if entry_points is not None:
        import_test_modules([source for _, _, source in stages[1:]])  # noqa: F821 - sandbox_pristine.py
    disarm_modules()
    own_proc = ("/proc/self", "/proc/thread-self", f"/proc/{os.getpid()}")  # the pid in its own namespace
    library_functions = set()
    sys.dont_write_bytecode, sys.pycache_prefix = True, NO_BYTECODE_CACHE  # marshal is refused from here on
    sys.addaudithook(make_audit_hook(WORKDIR, DENY_READ, ALLOW_READ, own_proc, library_functions))
    active.append("audit-hook")
    report_fd = POLICY["report_fd"]
    write(report_fd, (json.dumps(active) + "\n").encode())
    module = types.ModuleType("__main__")  # the program's own __main__, not this guard's
    module.__file__ = POLICY["stages"][0][1]
    sys.modules["__main__"] = module
    namespace = module.__dict__
    sys.argv[:] = [POLICY["stages"][0][1]]
    if entry_points is not None:
        tests_see = checked_run(namespace, entry_points, pristine_builtins, library_functions,
                                make_fail(write, report_fd, exit_now))
    for i, (stage, code, _) in enumerate(stages):
        if i and entry_points is not None:
            if i == 1:
                namespace = tests_see()
                write(report_fd, b"returns builtin-exact\n")
        elif i:
            namespace["__builtins__"] = dict(pristine_builtins)
        try:
            run(code, namespace)
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: tests that did not finish failed
            try:
                flush_streams()
                err.write(explain(stage, exc) + "\n")
                err.flush()
            finally:
                exit_now(1)
    flush_streams()
    write(report_fd, b"proof " + token + b"\n")
    exit_now(0)


def checked_run(solution, entry_points, pristine_builtins, library_functions, fail):
    """Snapshot the standard library (now, before the solution runs) and return what builds the tests'
    namespace once it has run (``sandbox_pristine.py``)."""
    import collections

    keep = [].append  # everything the program handed over or a restore removed: alive until the process ends
    restore, function_ids = pristine_library(solution, keep)  # noqa: F821 - sandbox_pristine.py
    library_functions.update(function_ids)
    module_ids = {id(m) for m in sys.modules.values()}
    values = make_value_copier(collections.Counter, collections.OrderedDict,  # noqa: F821 - sandbox_values.py
                               collections.defaultdict)
    after_call = make_after_call(restore, fail)  # noqa: F821 - sandbox_pristine.py

    def tests_see():
        after_call("the solution")
        return tests_namespace(solution, entry_points, dict(pristine_builtins), values,  # noqa: F821
                               after_call, fail, keep, module_ids)

    return tests_see


def flush():
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - whatever the program left there
            pass

main()
