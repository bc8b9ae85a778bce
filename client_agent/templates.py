"""The files a task gets before it starts: artifacts, the dispatch payload, and templates.

``TaskFiles.prepare()`` runs before each start of the task (TaskRunner's ``prepare`` hook):
it copies the artifacts and writes the payload once per runner, then renders every template
and returns what ``env = true`` templates add to the task's environment. A failure is a
``TaskStartError``: the start fails as a driver failure does, and the restart policy decides.

When the services a template reads change (client_agent/servicewatch.py) the alloc runner
calls ``TaskFiles.note_change(now)``, then ``rerender_due(now)`` (again at the time it
returns as the next due one): a template with ``wait { min, max }`` renders once its
services were quiet for ``min``, and at most ``max`` after the first change it has not
rendered yet (``render_due_ns``, consul-template's quiescence; max unset is 4 x min), one
without renders at once. Only what changed is written; the changed templates are returned
so the runner can apply their ``change_mode``, after a random ``splay_delay_ns`` (the
largest ``splay`` of those that act; the random draw is passed in). ``rerender()`` renders
every template now, whatever its wait. The first render, before a start, never waits.

Artifacts: ``mode = "any"`` (the default) copies a file as a file and a directory as a
directory; ``"file"`` wants a file, written to ``destination`` as its path (default
``local/<name>``); ``"dir"`` wants a directory, copied into ``destination``. A source of
the other kind fails the start, naming the mode.

Everything is written inside the task's directory: a destination that resolves outside it
(``..``, a symlink out) fails the task instead of writing there (Nomad's sandbox).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from drover.client.errors import TaskStartError
from drover.client.interpolate import interpolate
from drover.common.gotemplate import RenderContext, TemplateError, parse_template
from drover.v1 import structs_pb2

__all__ = [
    "Quiet",
    "TaskFiles",
    "change_action",
    "parse_env_file",
    "render_due_ns",
    "splay_delay_ns",
    "wait_bounds_ns",
]

_DEFAULT_PERMS: Final = 0o644
# A template's change_mode values (the servers' are in drover.scheduler.structs: the client
# does not import the scheduler); "" is the default, restart.
CHANGE_MODE_RESTART: Final = "restart"
CHANGE_MODE_SIGNAL: Final = "signal"
CHANGE_MODE_NOOP: Final = "noop"
ARTIFACT_MODE_FILE: Final = "file"
ARTIFACT_MODE_DIR: Final = "dir"
# consul-template's wait: a max left unset is four times the min.
_WAIT_MAX_PER_MIN: Final = 4
_ARTIFACT_DEFAULT_DIR: Final = "local"
_PAYLOAD_DIR: Final = "local"
_FILE_URL: Final = "file://"
# A template source file read from the node is held to the size a job's data may have.
_MAX_SOURCE_BYTES: Final = 1 << 20

ServiceLookup = Callable[[str], Sequence[Mapping[str, Any]]]


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (Nomad's env template format): blank lines and ``#`` comments
    skipped, ``export`` allowed, one pair of surrounding quotes taken off a value."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise TaskStartError(f"env template line {raw.strip()[:60]!r} is not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key] = value
    return env


def change_action(changed: Sequence[structs_pb2.Template]) -> tuple[bool, tuple[str, ...]]:
    """What re-rendering ``changed`` asks of the task: (restart?, signals to send). A
    restart covers every signal; an env template changes the environment, which only a
    restart can give the task; noop templates ask nothing."""
    restart = any(t.env or t.change_mode in ("", CHANGE_MODE_RESTART) for t in changed)
    if restart:
        return True, ()
    signals = dict.fromkeys(t.change_signal for t in changed if t.change_mode == CHANGE_MODE_SIGNAL)
    return False, tuple(signals)


@dataclass(frozen=True, slots=True)
class Quiet:
    """A template's changes not rendered yet: when the first and the last came (monotonic
    ns; ``first_ns`` 0: none pending)."""

    first_ns: int = 0
    last_ns: int = 0

    def changed(self, now_ns: int) -> Quiet:
        return Quiet(self.first_ns or now_ns, now_ns)


def wait_bounds_ns(template: structs_pb2.Template) -> tuple[int, int]:
    """The template's (min, max) wait; (0, 0) when it has none."""
    low = max(template.wait_min_ns, 0)
    high = max(template.wait_max_ns, 0) or low * _WAIT_MAX_PER_MIN
    return low, max(high, low)


def render_due_ns(template: structs_pb2.Template, quiet: Quiet) -> int | None:
    """When a template with pending changes renders: ``min`` after the last change, but
    no later than ``max`` after the first; None when nothing is pending."""
    if not quiet.first_ns:
        return None
    low, high = wait_bounds_ns(template)
    return min(quiet.last_ns + low, quiet.first_ns + high)


def splay_delay_ns(changed: Sequence[structs_pb2.Template], draw: float) -> int:
    """How long to hold the action of ``changed``: ``draw`` (in [0, 1)) of the largest
    splay among the templates that act (a noop template asks nothing, so adds no delay)."""
    splay = max((t.splay_ns for t in changed if t.change_mode != CHANGE_MODE_NOOP or t.env), default=0)
    return int(min(max(draw, 0.0), 1.0) * max(splay, 0)) if splay > 0 else 0


def _inside(root: Path, relative: str, what: str) -> Path:
    target = (root / relative).resolve()
    base = root.resolve()
    if target != base and base not in target.parents:
        raise TaskStartError(f"{what} {relative!r} resolves outside the task's directory")
    return target


def _write_atomically(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TaskFiles:
    """One task's artifacts, payload and templates (see the module docstring)."""

    def __init__(
        self,
        task: structs_pb2.Task,
        *,
        payload: bytes,
        task_dir: Path,
        env: Mapping[str, str],
        node_names: Mapping[str, str],
        services: ServiceLookup,
    ) -> None:
        self._task = task
        self._payload = payload
        self._task_dir = task_dir
        self._env = dict(env)
        self._node_names = node_names
        self._services = services
        self._lock = threading.Lock()
        self._copied = False
        # What each template (by position) last rendered to, to tell a change from none,
        # and the changes each has not rendered yet (its wait).
        self._rendered: dict[int, str] = {}
        self._quiet: dict[int, Quiet] = {}

    @property
    def has_templates(self) -> bool:
        return bool(self._task.templates)

    def service_names(self) -> frozenset[str]:
        """The services this task's inline templates read (a source file's are learned
        when it is first rendered: the lookup records every name asked for)."""
        names: set[str] = set()
        for template in self._task.templates:
            if template.data:
                try:
                    names |= parse_template(
                        template.data, template.left_delimiter, template.right_delimiter
                    ).service_names
                except TemplateError:
                    pass  # prepare() reports it
        return frozenset(names)

    def prepare(self) -> dict[str, str]:
        """Before a start: files in place, templates rendered; the env templates' variables."""
        with self._lock:
            self._task_dir.mkdir(parents=True, exist_ok=True)
            if not self._copied:
                self._copy_artifacts()
                self._write_payload()
                self._copied = True
            env: dict[str, str] = {}
            for i, template in enumerate(self._task.templates):
                text = self._render(template)
                self._write(template, text)
                self._rendered[i] = text
                if template.env:
                    env.update(parse_env_file(text))
            return env

    def rerender(self) -> list[structs_pb2.Template]:
        """Render every template again now (whatever its wait); those whose output changed
        (already written). A template that fails now keeps its last file (the task keeps
        running on it)."""
        with self._lock:
            self._quiet.clear()
            return self._rerender_locked(range(len(self._task.templates)))

    def note_change(self, now_ns: int) -> None:
        """The services changed at ``now_ns`` (monotonic): every rendered template has a
        change to render (which ones read what changed is not tracked: a render that comes
        out the same writes nothing and asks nothing)."""
        with self._lock:
            for i in self._rendered:
                self._quiet[i] = self._quiet.get(i, Quiet()).changed(now_ns)

    def rerender_due(self, now_ns: int) -> tuple[list[structs_pb2.Template], int | None]:
        """Render the templates whose wait is over at ``now_ns``: those whose output
        changed, and when the next of the others is due (None: none pending)."""
        with self._lock:
            due: list[int] = []
            later: list[int] = []
            for i, quiet in self._quiet.items():
                at = render_due_ns(self._task.templates[i], quiet)
                if at is not None and at <= now_ns:
                    due.append(i)
                elif at is not None:
                    later.append(at)
            for i in due:
                del self._quiet[i]
            return self._rerender_locked(sorted(due)), min(later, default=None)

    def _rerender_locked(self, indexes: Iterable[int]) -> list[structs_pb2.Template]:
        changed: list[structs_pb2.Template] = []
        for i in indexes:
            template = self._task.templates[i]
            if i not in self._rendered:
                continue  # not rendered yet: the next start renders it
            try:
                text = self._render(template)
            except TaskStartError:
                continue
            if text != self._rendered[i]:
                self._write(template, text)
                self._rendered[i] = text
                changed.append(template)
        return changed

    def _render(self, template: structs_pb2.Template) -> str:
        if template.source:
            source = Path(interpolate(template.source, self._env, self._node_names))
            try:
                if source.stat().st_size > _MAX_SOURCE_BYTES:
                    raise TaskStartError(
                        f"template source {str(source)!r} is larger than {_MAX_SOURCE_BYTES} bytes"
                    )
                text = source.read_text()
            except OSError as exc:
                raise TaskStartError(f"template source {str(source)!r}: {exc.strerror or exc}") from exc
        else:
            text = template.data
        try:
            parsed = parse_template(text, template.left_delimiter, template.right_delimiter)
            return parsed.render(RenderContext(env=self._env, services=self._services))
        except TemplateError as exc:
            raise TaskStartError(f"template {template.destination!r}: {exc}") from exc

    def _write(self, template: structs_pb2.Template, text: str) -> None:
        destination = interpolate(template.destination, self._env, self._node_names)
        path = _inside(self._task_dir, destination, "template destination")
        mode = int(template.perms, 8) if template.perms else _DEFAULT_PERMS
        try:
            _write_atomically(path, text, mode)
        except OSError as exc:
            raise TaskStartError(f"template destination {destination!r}: {exc.strerror or exc}") from exc

    def _copy_artifacts(self) -> None:
        for artifact in self._task.artifacts:
            source = Path(interpolate(artifact.source, self._env, self._node_names).removeprefix(_FILE_URL))
            destination = interpolate(
                artifact.destination or _ARTIFACT_DEFAULT_DIR, self._env, self._node_names
            )
            mode = artifact.mode
            if mode == ARTIFACT_MODE_FILE and not artifact.destination:
                destination = os.path.join(_ARTIFACT_DEFAULT_DIR, source.name)
            target = _inside(self._task_dir, destination, "artifact destination")
            try:
                is_dir = source.is_dir()
                if not source.exists():
                    raise FileNotFoundError(2, "No such file or directory")
                if mode == ARTIFACT_MODE_FILE and is_dir:
                    raise TaskStartError(
                        f'artifact {artifact.source!r}: mode "file" but the source is a directory'
                    )
                if mode == ARTIFACT_MODE_DIR and not is_dir:
                    raise TaskStartError(
                        f'artifact {artifact.source!r}: mode "dir" but the source is not a directory'
                    )
                if is_dir:
                    shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
                elif mode == ARTIFACT_MODE_FILE:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target / source.name)
            except OSError as exc:
                raise TaskStartError(f"artifact {artifact.source!r}: {exc.strerror or exc}") from exc

    def _write_payload(self) -> None:
        if not self._task.HasField("dispatch_payload") or not self._task.dispatch_payload.file:
            return
        relative = os.path.join(_PAYLOAD_DIR, self._task.dispatch_payload.file)
        path = _inside(self._task_dir, relative, "dispatch_payload file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self._payload)
        except OSError as exc:
            raise TaskStartError(f"dispatch_payload file {relative!r}: {exc.strerror or exc}") from exc
