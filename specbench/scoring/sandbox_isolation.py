"""Operating-system isolation for a sandboxed child; the first part of the child's source (never imported).

The harness passes this file's source, followed by ``sandbox_guard.py``'s, to ``python -I -S -c``. The
functions here run before the audit hook is installed and before any model-written code, and each
records in ``active`` the layer it set up; a layer the kernel refuses is skipped (and so not recorded):

- ``pid-namespace``: the program runs as the first process of a new PID namespace with its own /proc,
  so it cannot see, ptrace, kill or pidfd-signal any process outside its sandbox;
- ``network-namespace``: no interfaces at all;
- ``mount-namespace``: a private copy of the mount table in which every mount is read-only except the
  sandbox directory, and the harness's directories (project, working directory, home, records) are
  covered by empty read-only tmpfs mounts — they cannot be read, changed or created in, whatever the call;
- ``uid-nobody``: as root, the program runs as user and group 65534 without supplementary groups, so
  it holds no capabilities and owns no file outside its directory — where the interpreter's standard
  library is readable by others (not when it lives under root's home, as a pyenv build does).
Unprivileged, the same is done inside a new user namespace where the kernel allows one (no uid switch).
"""
import os

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MOUNT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
NOBODY = 65534


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    return libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) == 0


def _mount_points():
    """(mount point, per-mount flags) of this namespace, in mount order (parents before children)."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for spaces
            flags = 0
            for opt in fields[5].split(","):
                flags |= MOUNT_FLAGS.get(opt, 0)
            points.append((point, flags))
    return points


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _map_user(uid, gid):
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)


def _wait_and_mirror(child):
    """The namespace's parent: wait for the program's process and end the same way it did."""
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        import signal

        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _hide(libc, path, keep_visible):
    """Cover ``path`` with an empty read-only tmpfs (a directory) or /dev/null (a file); when it holds
    something the interpreter still needs (its standard library under the home directory, say), cover
    each of its entries instead, recursively, and leave the needed ones."""
    if os.path.islink(path) or not os.path.exists(path):
        return
    if not any(_inside(k, path) for k in keep_visible):
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")
        else:
            _mount(libc, "/dev/null", path, None, MS_BIND)
    elif os.path.isdir(path) and path not in keep_visible:
        for name in os.listdir(path):
            _hide(libc, os.path.join(path, name), keep_visible)


def _read_only_filesystem(libc, workdir, hide, keep_visible, active):
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates to the harness
    if _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC):
        active.append("own-proc")
    for path in hide:
        if not any(other != path and _inside(path, other) for other in hide):  # else hidden with its parent
            _hide(libc, path, keep_visible)
    if not _mount(libc, workdir, workdir, None, MS_BIND):
        return
    os.chdir(workdir)  # the working directory is now the writable bind mount, not the read-only original
    ok = True
    for point, flags in _mount_points():
        if point == workdir or flags & MS_RDONLY:
            continue
        done = _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        ok = ok and (done or point != "/")
    if ok:
        active.append("read-only-filesystem")


def _others_can_read(paths):
    """Whether a user who owns nothing here can still reach ``paths`` (every ancestor searchable by others)."""
    import stat

    for path in paths:
        parts = os.path.realpath(path).split("/")
        for i in range(2, len(parts) + 1):
            mode = os.stat("/".join(parts[:i]) or "/").st_mode
            if not mode & stat.S_IXOTH or (i == len(parts) and not mode & stat.S_IROTH):
                return False
    return True


def isolate_process(policy, active):
    """New namespaces (PID, mount, network), a read-only filesystem and, as root, user nobody."""
    try:
        libc = _libc()
    except OSError:
        return
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    user = 0 if root else CLONE_NEWUSER
    net = CLONE_NEWNET if policy["isolate_network"] else 0
    if libc.unshare(CLONE_NEWNS | CLONE_NEWPID | net | user) != 0:
        if net and libc.unshare(net | user) == 0:
            active.append("network-namespace")
        return
    if not root:
        _map_user(uid, gid)
    if net:
        active.append("network-namespace")
    child = os.fork()
    if child:
        _wait_and_mirror(child)
    active.append("pid-namespace")
    workdir = policy["workdir"]
    _read_only_filesystem(libc, workdir, policy["deny_read"], policy["allow_read"] + [workdir], active)
    active.append("mount-namespace")
    if root and _others_can_read(policy["allow_read"]):  # else the interpreter could not read its library
        for base, dirs, files in os.walk(workdir):
            for name in [base, *(os.path.join(base, n) for n in dirs + files)]:
                os.chown(name, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        active.append("uid-nobody")
