#!/usr/bin/python3
"""hutch's code interpreter: E2B's code-interpreter protocol on port 49999.

It runs inside the sandbox, as the sandbox's user, started by the
code-interpreter-v1 template's start command. Each context is one
interpreter that keeps its state between executions:

- python: an IPython kernel (ipykernel) driven through jupyter_client, so
  display hooks, display(), inline matplotlib and tracebacks are
  Jupyter's;
- javascript and typescript: a Node process of ours (jsctx.mjs) running
  code in a node:vm context;
- bash: a bash process, each execution sourced into it.

The answer of POST /execute is one JSON object per line: stdout, stderr,
result, error, number_of_executions, keepalive while the code is silent,
and always end_of_execution last. A client that goes away interrupts its
execution; the context stays usable.
"""

import asyncio
import datetime
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import uuid

import tornado.httpserver
import tornado.iostream
import tornado.web
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.paths import jupyter_runtime_dir

PORT = int(os.environ.get("HUTCH_CODEINTERP_PORT", "49999"))
HERE = os.path.dirname(os.path.abspath(__file__))
HOME = os.path.expanduser("~")
# A line every KEEPALIVE seconds while an execution is silent: it keeps
# proxies from timing the stream out and shows when the client is gone.
KEEPALIVE = 2.0
# How long an interrupted execution may take to stop before its context
# is restarted instead.
INTERRUPT_GRACE = 10.0
START_TIMEOUT = 120.0
# The create's environment, as hutch writes it into a sandbox restored
# from a template (agent/wire.EnvFile).
ENV_FILE = os.environ.get("HUTCH_CODEINTERP_ENV_FILE", "/run/hutch/env")
# How often the server looks for a restore or a new environment.
WATCH_INTERVAL = 0.2

LANGUAGES = {
    "python": "python", "python3": "python", "py": "python",
    "javascript": "javascript", "js": "javascript", "node": "javascript",
    "typescript": "typescript", "ts": "typescript",
    "bash": "bash", "sh": "bash", "shell": "bash",
}

log = logging.getLogger("codeinterp")


class BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def normalize_language(language):
    if language is None or language == "":
        return "python"
    if not isinstance(language, str):
        raise BadRequest(400, "language: want a string")
    lang = LANGUAGES.get(language.strip().lower())
    if lang is None:
        raise BadRequest(400, "language %r is not supported: use python, javascript, typescript or bash" % language)
    return lang


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def result_of(mime, is_main):
    """E2B's result object from a Jupyter MIME bundle."""
    data = dict(mime)
    out = {"type": "result"}
    text = data.pop("text/plain", None)
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    fields = [
        ("text/html", "html"), ("text/markdown", "markdown"), ("image/svg+xml", "svg"),
        ("image/png", "png"), ("image/jpeg", "jpeg"), ("application/pdf", "pdf"),
        ("text/latex", "latex"), ("application/json", "json"),
        ("application/javascript", "javascript"), ("e2b/data", "data"), ("e2b/chart", "chart"),
    ]
    if text is not None:
        out["text"] = text
    for mimetype, name in fields:
        v = data.pop(mimetype, None)
        if v is not None:
            out[name] = v
    if out.get("chart") == {}:
        del out["chart"]
    out["extra"] = data
    out["is_main_result"] = is_main
    return out


def env_of(env_vars):
    if env_vars is None:
        return {}
    if not isinstance(env_vars, dict):
        raise BadRequest(400, "env_vars: want an object of strings")
    for k, v in env_vars.items():
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise BadRequest(400, "env_vars: %r: want a variable name and a string value" % k)
    return env_vars


def kernel_dir():
    """A new private directory for one kernel's sockets and connection
    file, under Jupyter's runtime directory (out of /tmp, which code
    may clear)."""
    base = os.path.join(jupyter_runtime_dir(), "hutch")
    os.makedirs(base, mode=0o700, exist_ok=True)
    return tempfile.mkdtemp(prefix="k-", dir=base)


class Context:
    """One interpreter. execute() runs one piece of code at a time."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.generation = self.env_version = 0
        self.language = language
        self.cwd = cwd
        self.lock = asyncio.Lock()
        self.count = 0

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def start(self):
        raise NotImplementedError

    async def execute(self, code, env, emit):
        """Runs code, calling emit(obj) for each output, until it ends."""
        raise NotImplementedError

    async def interrupt(self):
        raise NotImplementedError

    async def restart(self):
        await self.stop()
        self.count = 0
        await self.start()

    async def stop(self):
        raise NotImplementedError

    async def renew(self):
        """The sandbox was restored from a template: draw fresh random state."""

    async def set_env(self, env):
        """Adds env to the interpreter's own environment, for good."""


class PythonContext(Context):
    """An IPython kernel. Its figures and DataFrames come with E2B's chart and
    data formats (startup.py, loaded from IPython's profile)."""

    km = None
    kc = None
    rundir = None

    async def start(self):
        env = dict(os.environ)
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        # The kernel's channels are Unix sockets in a directory of its own.
        # Over TCP, jupyter_client picks free ports and the kernel binds
        # them later: a kernel starting beside others may find its port
        # taken by then ("Address already in use"; ports are a
        # sandbox-wide namespace that any process draws from).
        rundir = kernel_dir()
        km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(rundir, "s"),
                                connection_file=os.path.join(rundir, "kernel.json"))
        try:
            await km.start_kernel(cwd=self.cwd, env=env, extra_arguments=["--InteractiveShell.colors=NoColor"])
        except Exception:
            shutil.rmtree(rundir, ignore_errors=True)
            raise
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=START_TIMEOUT)
        except Exception:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
            shutil.rmtree(rundir, ignore_errors=True)
            raise
        self.km, self.kc, self.rundir = km, kc, rundir

    async def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            try:
                await self.km.shutdown_kernel(now=True)
            except Exception as e:  # a kernel that is already gone
                log.warning("context %s: shutdown: %s", self.id, e)
        if self.rundir is not None:
            shutil.rmtree(self.rundir, ignore_errors=True)
        self.km = self.kc = self.rundir = None

    async def interrupt(self):
        await self.km.interrupt_kernel()

    async def _run(self, code, emit, silent):
        kc = self.kc
        msg_id = kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=True)
        while True:
            msg = await kc.get_iopub_msg(timeout=None)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            ts = msg["header"].get("date")
            ts = ts.isoformat() if hasattr(ts, "isoformat") else (ts or now())
            if t == "status":
                if c.get("execution_state") == "idle":
                    break
            elif silent:
                continue
            elif t == "stream":
                emit({"type": "stdout" if c.get("name") == "stdout" else "stderr", "text": c.get("text", ""), "timestamp": ts})
            elif t == "execute_input":
                self.count = c.get("execution_count", self.count)
                emit({"type": "number_of_executions", "execution_count": self.count})
            elif t == "execute_result":
                emit(result_of(c.get("data", {}), True))
            elif t == "display_data":
                emit(result_of(c.get("data", {}), False))
            elif t == "error":
                emit({"type": "error", "name": c.get("ename", ""), "value": c.get("evalue", ""),
                      "traceback": "\n".join(c.get("traceback", []))})
        # The reply on the shell channel, so that none pile up.
        while True:
            try:
                reply = await kc.get_shell_msg(timeout=5)
            except Exception:
                break
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                break

    async def execute(self, code, env, emit):
        if env:
            keys = sorted(env)
            await self._run("import os as __hutch_os\n__hutch_env = {k: __hutch_os.environ.get(k) for k in %r}\n__hutch_os.environ.update(%r)" % (keys, env), emit, True)
        try:
            await self._run(code, emit, False)
        finally:
            if env:
                await self._run("for __hutch_k, __hutch_v in __hutch_env.items():\n"
                                "    if __hutch_v is None: __hutch_os.environ.pop(__hutch_k, None)\n"
                                "    else: __hutch_os.environ[__hutch_k] = __hutch_v\n"
                                "del __hutch_os, __hutch_env, __hutch_k, __hutch_v", emit, True)

    async def set_env(self, env):
        await self._run("import os as __hutch_os\n__hutch_os.environ.update(%r)\ndel __hutch_os" % (env,), lambda o: None, True)

    async def renew(self):
        await self._run("import random as __hutch_r, sys as __hutch_s\n__hutch_r.seed()\n"
                        "if 'numpy' in __hutch_s.modules: __hutch_s.modules['numpy'].random.seed()\n"
                        "del __hutch_r, __hutch_s", lambda o: None, True)


class JavaScriptContext(Context):
    """A Node process of ours (jsctx.mjs) that runs code in a node:vm context;
    it speaks JSON lines on a socket given as its fd 3."""

    proc = None

    async def start(self):
        mine, theirs = socket.socketpair()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                "node", os.path.join(HERE, "jsctx.mjs"), cwd=self.cwd,
                stdin=asyncio.subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                env=dict(os.environ, HUTCH_CODEINTERP_FD=str(theirs.fileno())),
                start_new_session=True)
        finally:
            theirs.close()
        self.reader, self.writer = await asyncio.open_unix_connection(sock=mine, limit=1 << 30)
        hello = await asyncio.wait_for(self.reader.readline(), START_TIMEOUT)
        if not hello:
            raise RuntimeError("the JavaScript context's node process ended as it started")

    async def stop(self):
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.proc.wait()
        self.proc = None

    async def interrupt(self):
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)

    async def renew(self):
        # Node's Math.random and OpenSSL's generator (crypto.randomBytes,
        # randomUUID) hold the checkpoint's state, the same in every
        # sandbox of the template, and neither can be reseeded: a
        # process no code ran in yet is started afresh instead.
        if self.count == 0:
            await self.stop()
            await self.start()

    async def set_env(self, env):
        req = {"id": str(uuid.uuid4()), "setenv": env}
        self.writer.write((json.dumps(req) + "\n").encode())
        await self.writer.drain()
        while True:
            line = await self.reader.readline()
            if not line:
                raise RuntimeError("the JavaScript context's process ended")
            msg = json.loads(line)
            if msg.get("id") == req["id"] and msg.get("type") == "done":
                return

    async def execute(self, code, env, emit):
        req = {"id": str(uuid.uuid4()), "code": code, "typescript": self.language == "typescript", "env": env}
        self.writer.write((json.dumps(req) + "\n").encode())
        await self.writer.drain()
        self.count += 1
        emit({"type": "number_of_executions", "execution_count": self.count})
        while True:
            line = await self.reader.readline()
            if not line:
                await self.stop()
                emit({"type": "error", "name": "ContextExited", "value": "the JavaScript context's process ended; it was restarted", "traceback": ""})
                await self.start()
                return
            msg = json.loads(line)
            if msg.get("id") != req["id"]:
                continue
            t = msg.get("type")
            if t == "done":
                return
            if t in ("stdout", "stderr"):
                emit({"type": t, "text": msg.get("text", ""), "timestamp": now()})
            elif t == "result":
                emit(result_of(msg.get("data", {}), msg.get("main", True)))
            elif t == "error":
                emit({"type": "error", "name": msg.get("name", "Error"), "value": msg.get("value", ""), "traceback": msg.get("traceback", "")})


# The bash context's SIGINT trap: the signal ends the foreground command
# (the whole process group gets it) and the shell lives on; a DEBUG trap
# then returns from each function and finally the sourced cell before
# their next command, so that the rest of the cell does not run, as
# Python's KeyboardInterrupt ends a cell. Each cell starts without it.
BASH_PRELUDE = """trap '__hutch_intr=1; trap "[ -n \\"\\$__hutch_intr\\" ] && return 130 2>/dev/null" DEBUG' INT
"""
BASH_RESET = "trap - DEBUG; unset __hutch_intr\n"


class BashContext(Context):
    """A bash process; each execution is a file sourced into it, so that
    variables, functions and the directory last. An interrupt stops the
    cell and keeps the shell (BASH_PRELUDE)."""

    proc = None
    interrupted = False

    async def start(self):
        self.proc = await asyncio.create_subprocess_exec(
            "bash", "--norc", "--noprofile", cwd=self.cwd,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        self.proc.stdin.write(BASH_PRELUDE.encode())
        await self.proc.stdin.drain()
        self.dir = os.path.join(HOME, ".cache", "hutch-codeinterp")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    async def stop(self):
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.proc.wait()
        self.proc = None

    async def interrupt(self):
        if self.proc is not None and self.proc.returncode is None:
            self.interrupted = True
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    async def set_env(self, env):
        self.proc.stdin.write("".join("export %s=%s\n" % (k, shlex.quote(v)) for k, v in env.items()).encode())
        await self.proc.stdin.drain()

    async def execute(self, code, env, emit):
        marker = "\x1e" + uuid.uuid4().hex + "\x1e"
        path = os.path.join(self.dir, "cell-%s.sh" % uuid.uuid4().hex)
        with open(path, "w") as f:
            f.write(code + "\n")
        sets = "".join("__hutch_old_%s=${%s-__hutch_unset}; export %s=%s\n" % (k, k, k, shlex.quote(v)) for k, v in env.items())
        unsets = "".join('if [ "$__hutch_old_%s" = __hutch_unset ]; then unset %s; else export %s="$__hutch_old_%s"; fi; unset __hutch_old_%s\n' % ((k,) * 5) for k in env)
        script = "%s%s{ source %s; } </dev/null; __hutch_rc=$?\n%srm -f %s\n%sprintf '%%s%%d\\n' '%s' $__hutch_rc; printf '%%s\\n' '%s' >&2\n" % (
            BASH_RESET, sets, shlex.quote(path), BASH_RESET, shlex.quote(path), unsets, marker, marker)
        self.count += 1
        self.interrupted = False
        emit({"type": "number_of_executions", "execution_count": self.count})
        self.proc.stdin.write(script.encode())
        await self.proc.stdin.drain()
        out = asyncio.create_task(self._pump(self.proc.stdout, "stdout", marker, emit))
        err = asyncio.create_task(self._pump(self.proc.stderr, "stderr", marker, emit))
        try:
            rc, _ = await asyncio.gather(out, err)
        finally:
            out.cancel()
            err.cancel()
        if rc is None:
            emit({"type": "error", "name": "ContextExited", "value": "the bash context's shell exited; it was restarted", "traceback": ""})
            await self.stop()
            await self.start()
        elif rc == 130 and self.interrupted:
            emit({"type": "error", "name": "KeyboardInterrupt", "value": "the execution was interrupted", "traceback": ""})
        elif rc != 0:
            emit({"type": "error", "name": "Error", "value": "exit status %d" % rc, "traceback": ""})

    async def _pump(self, stream, name, marker, emit):
        """Emits what stream carries up to the marker; returns the status
        printed after it on stdout (None if the shell ended)."""
        m = marker.encode()
        buf = b""
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                if buf:
                    emit({"type": name, "text": buf.decode(errors="replace"), "timestamp": now()})
                return None
            buf += chunk
            i = buf.find(m)
            if i >= 0:
                if i > 0:
                    emit({"type": name, "text": buf[:i].decode(errors="replace"), "timestamp": now()})
                rest = buf[i + len(m):]
                while b"\n" not in rest:
                    more = await stream.read(64)
                    if not more:
                        break
                    rest += more
                status = rest.split(b"\n", 1)[0]
                return int(status) if status.strip() else 0
            # Keep what might be the start of a marker split across reads.
            keep = len(m) - 1
            cut = buf.rfind(b"\x1e", max(0, len(buf) - keep))
            if cut < 0:
                emit({"type": name, "text": buf.decode(errors="replace"), "timestamp": now()})
                buf = b""
            elif cut > 0:
                emit({"type": name, "text": buf[:cut].decode(errors="replace"), "timestamp": now()})
                buf = buf[cut:]


KINDS = {"python": PythonContext, "javascript": JavaScriptContext, "typescript": JavaScriptContext, "bash": BashContext}


class Interpreter:
    def __init__(self):
        self.contexts = {}
        # The context each language's /execute without a context_id runs in.
        self.defaults = {}
        self.default_lock = asyncio.Lock()
        self.ready = asyncio.Event()
        self.machine_id = self._machine_id()
        # What each context must catch up with (Interpreter.catch_up): the
        # restores seen (a new machine ID) and the create's environment
        # (wire.EnvFile, written by hutch after a restore).
        self.generation = 0
        self.env = {}
        self.env_version = 0
        self.env_raw = None

    @staticmethod
    def _machine_id():
        try:
            with open("/etc/machine-id") as f:
                return f.read().strip()
        except OSError:
            return ""

    async def create(self, language, cwd):
        cwd = cwd or HOME
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise BadRequest(400, "cwd: want an absolute path")
        if not os.path.isdir(cwd):
            raise BadRequest(400, "cwd %s: no such directory in the sandbox" % cwd)
        ctx = KINDS[language](language, cwd)
        # A context started now has the server's environment, restores and
        # all, in it.
        self.refresh()
        ctx.generation, ctx.env_version = self.generation, self.env_version
        await ctx.start()
        self.contexts[ctx.id] = ctx
        return ctx

    async def default(self, language):
        async with self.default_lock:
            ctx = self.contexts.get(self.defaults.get(language))
            if ctx is None:
                ctx = await self.create(language, HOME)
                self.defaults[language] = ctx.id
            return ctx

    async def start(self):
        await asyncio.gather(self.default("python"), self.default("javascript"))
        self.ready.set()
        log.info("ready: %s", ", ".join("%s %s" % (c.language, c.id) for c in self.contexts.values()))

    def refresh(self):
        """Notes a restore or a new environment; returns whether there was
        either. A template's sandboxes share the memory of its checkpoint:
        after a restore (a new machine ID) each context draws fresh random
        state, and takes up the environment the create gave."""
        changed = False
        mid = self._machine_id()
        if mid != self.machine_id:
            self.machine_id = mid
            self.generation += 1
            changed = True
        try:
            with open(ENV_FILE, "rb") as f:
                raw = f.read()
        except OSError:
            raw = None
        if raw is not None and raw != self.env_raw:
            self.env_raw = raw
            try:
                env = json.loads(raw)
            except ValueError:
                env = None
            if isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                os.environ.update(env)
                self.env = env
                self.env_version += 1
                changed = True
            else:
                log.warning("%s: not a JSON object of strings", ENV_FILE)
        return changed

    async def catch_up(self, ctx):
        """Brings ctx up to date with refresh's findings; the caller holds
        ctx.lock."""
        if ctx.generation != self.generation:
            ctx.generation = self.generation
            try:
                await ctx.renew()
            except Exception as e:
                log.warning("context %s: renew: %s", ctx.id, e)
        if ctx.env_version != self.env_version:
            ctx.env_version = self.env_version
            if self.env:
                try:
                    await ctx.set_env(self.env)
                except Exception as e:
                    log.warning("context %s: environment: %s", ctx.id, e)

    async def watch(self):
        """Catches every idle context up soon after a restore, so that the
        first execution does not wait for it (a JS context restarts)."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            if not self.refresh():
                continue
            for ctx in list(self.contexts.values()):
                if not ctx.lock.locked():
                    asyncio.ensure_future(self._catch_up_idle(ctx))

    async def _catch_up_idle(self, ctx):
        async with ctx.lock:
            await self.catch_up(ctx)


class Handler(tornado.web.RequestHandler):
    def initialize(self, interp):
        self.interp = interp

    def set_default_headers(self):
        self.set_header("Content-Type", "application/json")

    def fail(self, status, message):
        self.set_status(status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(message)

    def body(self):
        if not self.request.body:
            return {}
        try:
            b = json.loads(self.request.body)
        except ValueError as e:
            raise BadRequest(400, "the body is not JSON: %s" % e)
        if not isinstance(b, dict):
            raise BadRequest(400, "the body: want a JSON object")
        return b

    def context(self, cid):
        ctx = self.interp.contexts.get(cid)
        if ctx is None:
            raise BadRequest(404, "Context %s not found" % cid)
        return ctx

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, BadRequest):
            self.set_status(exc.status)
            msg = exc.message
        else:
            msg = "%s: %s" % (type(exc).__name__, exc) if exc else self._reason
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(msg)

    def log_exception(self, typ, value, tb):
        if not isinstance(value, BadRequest):
            super().log_exception(typ, value, tb)


class Health(Handler):
    def get(self):
        if not self.interp.ready.is_set():
            return self.fail(503, "starting")
        self.finish(json.dumps("OK"))


class Contexts(Handler):
    def get(self):
        self.finish(json.dumps([c.describe() for c in self.interp.contexts.values()]))

    async def post(self):
        b = self.body()
        ctx = await self.interp.create(normalize_language(b.get("language")), b.get("cwd"))
        self.finish(json.dumps(ctx.describe()))


class OneContext(Handler):
    async def delete(self, cid):
        ctx = self.context(cid)
        async with ctx.lock:
            self.interp.contexts.pop(cid, None)
            for lang, d in list(self.interp.defaults.items()):
                if d == cid:
                    del self.interp.defaults[lang]
            await ctx.stop()
        self.finish("null")


class Restart(Handler):
    async def post(self, cid):
        ctx = self.context(cid)
        async with ctx.lock:
            await ctx.restart()
        self.finish("null")


class Execute(Handler):
    gone = False

    def on_connection_close(self):
        self.gone = True

    async def post(self):
        b = self.body()
        code = b.get("code")
        if not isinstance(code, str):
            raise BadRequest(400, "code: want a string")
        cid, lang = b.get("context_id"), b.get("language")
        if cid and lang:
            raise BadRequest(400, "Only one of context_id or language can be provided")
        env = env_of(b.get("env_vars"))
        self.interp.refresh()
        ctx = self.context(cid) if cid else await self.interp.default(normalize_language(lang))

        queue = asyncio.Queue()
        async with ctx.lock:
            if self.gone:
                return
            await self.interp.catch_up(ctx)
            task = asyncio.ensure_future(ctx.execute(code, env, queue.put_nowait))
            task.add_done_callback(lambda _: queue.put_nowait(None))
            try:
                while True:
                    try:
                        item = await asyncio.wait_for(queue.get(), KEEPALIVE)
                    except asyncio.TimeoutError:
                        item = {"type": "keepalive"}
                    if item is None:
                        break
                    self.write(json.dumps(item) + "\n")
                    await self.flush()
                if task.exception() is not None:
                    e = task.exception()
                    self.write(json.dumps({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": ""}) + "\n")
                self.write('{"type": "end_of_execution"}\n')
                await self.flush()
                self.finish()
            except tornado.iostream.StreamClosedError:
                await self._abandon(ctx, task)

    async def _abandon(self, ctx, task):
        """The client went away: the code stops, the context stays."""
        log.info("context %s: client gone; interrupting", ctx.id)
        if task.done():
            return
        try:
            await ctx.interrupt()
            await asyncio.wait_for(asyncio.shield(task), INTERRUPT_GRACE)
        except Exception:
            log.warning("context %s: did not stop when interrupted; restarting it", ctx.id)
            task.cancel()
            await ctx.restart()


def main():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="codeinterp: %(message)s")
    asyncio.run(serve())


async def serve():
    interp = Interpreter()
    app = tornado.web.Application([
        (r"/health", Health, dict(interp=interp)),
        (r"/execute", Execute, dict(interp=interp)),
        (r"/contexts", Contexts, dict(interp=interp)),
        (r"/contexts/([^/]+)/restart", Restart, dict(interp=interp)),
        (r"/contexts/([^/]+)", OneContext, dict(interp=interp)),
    ])
    server = tornado.httpserver.HTTPServer(app, idle_connection_timeout=3600, max_body_size=256 << 20)
    server.listen(PORT, address=os.environ.get("HUTCH_CODEINTERP_ADDRESS", "0.0.0.0"))
    log.info("listening on port %d", PORT)
    await interp.start()
    await interp.watch()


if __name__ == "__main__":
    main()
