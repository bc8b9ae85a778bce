"""The files a task gets before it starts: artifacts, the dispatch payload, and templates.

``TaskFiles.prepare()`` runs before each start of the task (TaskRunner's ``prepare`` hook):
it copies the artifacts and writes the payload once per runner, then renders every template
and returns what ``env = true`` templates add to the task's environment. A failure is a
``TaskStartError``: the start fails as a driver failure does, and the restart policy decides.

``TaskFiles.rerender()`` runs when the services a template reads change
(client_agent/services.py): it renders again, writes only what changed, and returns the
changed templates so the alloc runner can apply their ``change_mode``.

Everything is written inside the task's directory: a destination that resolves outside it
(``..``, a symlink out) fails the task instead of writing there (Nomad's sandbox).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from drover.client.errors import TaskStartError
from drover.client.interpolate import interpolate
from drover.common.gotemplate import RenderContext, TemplateError, parse_template
from drover.v1 import structs_pb2

__all__ = ["TaskFiles", "change_action", "parse_env_file"]

_DEFAULT_PERMS: Final = 0o644
# A template's change_mode values (the servers' are in drover.scheduler.structs: the client
# does not import the scheduler); "" is the default, restart.
CHANGE_MODE_RESTART: Final = "restart"
CHANGE_MODE_SIGNAL: Final = "signal"
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
        # What each template (by position) last rendered to, to tell a change from none.
        self._rendered: dict[int, str] = {}

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
                    names |= parse_template(template.data).service_names
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
        """Render again; the templates whose output changed (already written). A template
        that fails now keeps its last file (the task keeps running on it)."""
        changed: list[structs_pb2.Template] = []
        with self._lock:
            for i, template in enumerate(self._task.templates):
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
            return parse_template(text).render(RenderContext(env=self._env, services=self._services))
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
            target_dir = _inside(self._task_dir, destination, "artifact destination")
            try:
                if source.is_dir():
                    shutil.copytree(source, target_dir, dirs_exist_ok=True, symlinks=True)
                else:
                    target_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target_dir / source.name)
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
