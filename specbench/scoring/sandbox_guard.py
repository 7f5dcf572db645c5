"""The first code that runs in a sandboxed child process, before the model-written program.

This file is never imported by the harness: its source is passed to ``python -I -S -c`` (so the child
never reads the harness's files), with one JSON argument holding the policy. In order it
1. sets resource limits (address space, CPU seconds, file size, open files, processes, no core dumps);
2. moves into a fresh network namespace when the kernel allows (no interfaces: no network at all);
3. installs a Python audit hook (PEP 578; hooks cannot be removed) that refuses process creation,
   signals, sockets, ctypes and any file change outside the sandbox directory, and reads of the
   harness's directories;
4. reports which layers are active on a pipe, closes it, and runs the program as ``__main__``.
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
OWN_PROC = ("/proc/self", f"/proc/{os.getpid()}", "/proc/thread-self")
active = []


def set_limits():
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


def isolate_network():
    """unshare(CLONE_NEWNET) as root, or with CLONE_NEWUSER otherwise; skipped where forbidden."""
    import ctypes

    clone_newnet, clone_newuser = 0x40000000, 0x10000000
    libc = ctypes.CDLL(None, use_errno=True)
    flags = clone_newnet if os.geteuid() == 0 else clone_newnet | clone_newuser
    if libc.unshare(flags) == 0:
        active.append("network-namespace")
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]  # a later `import ctypes` goes through the audit hook again


def under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def resolve(path):
    if isinstance(path, int):
        return None
    return os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path)))


# Events that start processes, signal them, open sockets or load native code: always refused.
REFUSED = {
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
    "os.kill", "os.killpg", "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.sendto", "socket.sendmsg", "ctypes.dlopen", "ctypes.dlsym",
    "os.setuid", "os.setgid", "sys.remote_exec", "webbrowser.open",
}
REFUSED_IMPORTS = {"ctypes", "_ctypes", "cffi", "_posixsubprocess", "multiprocessing", "_multiprocessing"}
# Events whose path arguments (by position) must stay inside the sandbox directory.
CHANGES = {
    "os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.replace": (0, 1), "os.link": (0, 1),
    "os.symlink": (0, 1), "os.mkdir": (0,), "os.chmod": (0,), "os.lchmod": (0,), "os.chown": (0,),
    "os.lchown": (0,), "os.chflags": (0,), "os.lchflags": (0,), "os.truncate": (0,), "os.utime": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,),
    "shutil.copytree": (1,), "shutil.move": (0, 1), "shutil.chown": (0,), "os.chdir": (0,),
}
READS = {"os.listdir": 0, "os.scandir": 0, "glob.glob": 0, "os.walk": 0}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def refuse(what):
    raise PermissionError(f"blocked by the sandbox: {what}")


def make_audit_hook(workdir, deny_read, allow_read, own_proc):
    """The policy as a closure (not module globals the program could reach through ``__main__``)."""

    def check_read(event, path):
        if path is None or under(path, allow_read):
            return
        if under(path, deny_read) or (path.startswith("/proc/") and not under(path, own_proc)):
            refuse(f"{event} of a harness path {path}")

    def audit(event, args):
        if event in REFUSED:
            refuse(event)
        if event == "import" and args[0].split(".")[0] in REFUSED_IMPORTS:
            refuse(f"import {args[0]}")
        if event in CHANGES:
            for i in CHANGES[event]:
                if i < len(args):
                    path = resolve(args[i])
                    if path is None or not under(path, (workdir,)):
                        refuse(f"{event} outside the sandbox directory ({args[i]!r})")
        elif event == "open":
            path, mode, flags = (list(args) + [None, None])[:3]
            path = resolve(path)
            writes = (mode and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS)
            if writes and path is not None and not under(path, (workdir,)):
                refuse(f"writing outside the sandbox directory ({args[0]!r})")
            check_read("open", path)
        elif event in READS and args:
            check_read(event, resolve(args[READS[event]] if args[READS[event]] is not None else "."))

    return audit


def main():
    set_limits()
    if POLICY["isolate_network"]:
        try:
            isolate_network()
        except OSError:
            pass
    sys.addaudithook(make_audit_hook(WORKDIR, DENY_READ, ALLOW_READ, OWN_PROC))
    active.append("audit-hook")
    with os.fdopen(POLICY["report_fd"], "w") as report:
        report.write(json.dumps(active))
    program = POLICY["program"]
    with open(program, encoding="utf-8") as fh:
        source = fh.read()
    module = types.ModuleType("__main__")  # the program's own __main__, not this guard's
    module.__file__ = program
    sys.modules["__main__"] = module
    sys.argv[:] = [program]
    exec(compile(source, program, "exec"), module.__dict__)


main()
