"""Nomad's API JSON (``{"Job": {...}}``, as ``nomad job inspect`` prints and ``nomad job
run -json`` reads) to the jobspec's own shape, for ``drover.server.jobspec``'s converter.

Theory of operation
-------------------
Each Nomad API object kind has a table from its PascalCase field to the jobspec key and
how the value is carried (``_Field``). The result is the plain data an HCL file gives
(``{"job": [{"web": {"group": [{"api": {...}}]}}]}``), so one converter reads both and a
field drover refuses (``Vault``, ``Volumes``, ...) meets the same "not supported" line
as its HCL key does. Durations are integer nanoseconds in the API, so they are passed as
``"<n>ns"``.

Nomad's own output carries fields no jobspec writes: bookkeeping (``Status``,
``CreateIndex``, ...) is skipped, as is any field whose value is empty (null, "", 0,
false, [], {}): it asks for nothing. Any other field the tables do not know is refused
by name, with the object it is in (``job "web" group "api": unknown key "Foo"``).
"""

from __future__ import annotations

import bisect
import json
import json.decoder
import json.scanner
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["JsonObject", "is_nomad_api_json", "load_json", "nomad_api_to_jobspec"]

# How a value goes across: as it is, a duration, a map, one block, a list of blocks, or
# a list of blocks labelled by one of their fields.
_VALUE: Final = "value"
_DURATION: Final = "duration"
_MAP: Final = "map"
_BLOCK: Final = "block"
_BLOCKS: Final = "blocks"
_LABELLED: Final = "labelled"


@dataclass(frozen=True, slots=True)
class _Field:
    key: str
    how: str = _VALUE
    kind: str = ""  # the table of a block's fields
    label: str = ""  # for _LABELLED: the field naming each block


def _v(key: str) -> _Field:
    return _Field(key)


def _d(key: str) -> _Field:
    return _Field(key, _DURATION)


_CONSTRAINT: Final = {"LTarget": _v("attribute"), "RTarget": _v("value"), "Operand": _v("operator")}
_TABLES: Final[Mapping[str, Mapping[str, _Field]]] = {
    "job": {
        "Name": _v("name"),
        "Namespace": _v("namespace"),
        "Type": _v("type"),
        "Priority": _v("priority"),
        "Datacenters": _v("datacenters"),
        "NodePool": _v("node_pool"),
        "Meta": _Field("meta", _MAP),
        "Constraints": _Field("constraint", _BLOCKS, "constraint"),
        "Affinities": _Field("affinity", _BLOCKS, "affinity"),
        "Spreads": _Field("spread", _BLOCKS, "spread"),
        "TaskGroups": _Field("group", _LABELLED, "group", "Name"),
        "Update": _Field("update", _BLOCK, "update"),
        "Periodic": _Field("periodic", _BLOCK, "periodic"),
        "ParameterizedJob": _Field("parameterized", _BLOCK, "parameterized"),
        "Migrate": _Field("migrate", _BLOCK, "migrate"),
        "Reschedule": _Field("reschedule", _BLOCK, "reschedule"),
        "Vault": _Field("vault", _BLOCK, "any"),
        "Consul": _Field("consul", _BLOCK, "any"),
        "Multiregion": _Field("multiregion", _BLOCK, "any"),
        "AllAtOnce": _v("all_at_once"),
        "UI": _Field("ui", _BLOCK, "any"),
    },
    "constraint": _CONSTRAINT,
    "affinity": {**_CONSTRAINT, "Weight": _v("weight")},
    "spread": {
        "Attribute": _v("attribute"),
        "Weight": _v("weight"),
        "SpreadTarget": _Field("target", _LABELLED, "target", "Value"),
    },
    "target": {"Percent": _v("percent")},
    "group": {
        "Count": _v("count"),
        "Tasks": _Field("task", _LABELLED, "task", "Name"),
        "Constraints": _Field("constraint", _BLOCKS, "constraint"),
        "Affinities": _Field("affinity", _BLOCKS, "affinity"),
        "Spreads": _Field("spread", _BLOCKS, "spread"),
        "Networks": _Field("network", _BLOCKS, "network"),
        "Update": _Field("update", _BLOCK, "update"),
        "ReschedulePolicy": _Field("reschedule", _BLOCK, "reschedule"),
        "RestartPolicy": _Field("restart", _BLOCK, "restart"),
        "EphemeralDisk": _Field("ephemeral_disk", _BLOCK, "ephemeral_disk"),
        "Meta": _Field("meta", _MAP),
        "Services": _Field("service", _BLOCKS, "service"),
        "Migrate": _Field("migrate", _BLOCK, "migrate"),
        "Scaling": _Field("scaling", _BLOCK, "scaling"),
        "Disconnect": _Field("disconnect", _BLOCK, "disconnect"),
        "MaxClientDisconnect": _d("max_client_disconnect"),
        "StopAfterClientDisconnect": _d("stop_after_client_disconnect"),
        "PreventRescheduleOnLost": _v("prevent_reschedule_on_lost"),
        "Volumes": _Field("volume", _MAP),
        "Consul": _Field("consul", _BLOCK, "any"),
    },
    "task": {
        "Driver": _v("driver"),
        "Config": _Field("config", _MAP),
        "Env": _Field("env", _MAP),
        "Meta": _Field("meta", _MAP),
        "Resources": _Field("resources", _BLOCK, "resources"),
        "Constraints": _Field("constraint", _BLOCKS, "constraint"),
        "KillTimeout": _d("kill_timeout"),
        "Leader": _v("leader"),
        "Services": _Field("service", _BLOCKS, "service"),
        "Lifecycle": _Field("lifecycle", _BLOCK, "lifecycle"),
        "KillSignal": _v("kill_signal"),
        "ShutdownDelay": _d("shutdown_delay"),
        "RestartPolicy": _Field("restart", _BLOCK, "restart"),
        "User": _v("user"),
        "Vault": _Field("vault", _BLOCK, "any"),
        "Consul": _Field("consul", _BLOCK, "any"),
        "Identity": _Field("identity", _BLOCK, "any"),
        "CSIPluginConfig": _Field("csi_plugin", _BLOCK, "any"),
        "VolumeMounts": _Field("volume_mount", _BLOCKS, "any"),
        "Templates": _Field("template", _BLOCKS, "template"),
        "Artifacts": _Field("artifact", _BLOCKS, "artifact"),
        "DispatchPayload": _Field("dispatch_payload", _BLOCK, "dispatch_payload"),
        "Kind": _v("kind"),
    },
    "resources": {
        "CPU": _v("cpu"),
        "Cores": _v("cores"),
        "MemoryMB": _v("memory"),
        "MemoryMaxMB": _v("memory_max"),
        "DiskMB": _v("disk"),
        "Devices": _Field("device", _BLOCKS, "any"),
        "NUMA": _Field("numa", _BLOCK, "any"),
        "Networks": _Field("network", _BLOCKS, "network"),
        "IOPS": _v("iops"),
    },
    "network": {
        "Mode": _v("mode"),
        "MBits": _v("mbits"),
        "ReservedPorts": _Field("port", _LABELLED, "reserved_port", "Label"),
        "DynamicPorts": _Field("port", _LABELLED, "dynamic_port", "Label"),
        "DNS": _Field("dns", _BLOCK, "any"),
        "Hostname": _v("hostname"),
    },
    "reserved_port": {"Value": _v("static"), "To": _v("to"), "HostNetwork": _v("host_network")},
    "dynamic_port": {"To": _v("to"), "HostNetwork": _v("host_network")},
    "update": {
        "MaxParallel": _v("max_parallel"),
        "Stagger": _d("stagger"),
        "MinHealthyTime": _d("min_healthy_time"),
        "HealthyDeadline": _d("healthy_deadline"),
        "AutoRevert": _v("auto_revert"),
        "Canary": _v("canary"),
        "AutoPromote": _v("auto_promote"),
        "ProgressDeadline": _d("progress_deadline"),
        "HealthCheck": _v("health_check"),
    },
    "reschedule": {
        "Attempts": _v("attempts"),
        "Interval": _d("interval"),
        "Delay": _d("delay"),
        "DelayFunction": _v("delay_function"),
        "MaxDelay": _d("max_delay"),
        "Unlimited": _v("unlimited"),
    },
    "restart": {
        "Attempts": _v("attempts"),
        "Interval": _d("interval"),
        "Delay": _d("delay"),
        "Mode": _v("mode"),
    },
    "ephemeral_disk": {"SizeMB": _v("size"), "Sticky": _v("sticky"), "Migrate": _v("migrate")},
    "migrate": {
        "MaxParallel": _v("max_parallel"),
        "HealthCheck": _v("health_check"),
        "MinHealthyTime": _d("min_healthy_time"),
        "HealthyDeadline": _d("healthy_deadline"),
    },
    "scaling": {
        "Min": _v("min"),
        "Max": _v("max"),
        "Enabled": _v("enabled"),
        "Policy": _Field("policy", _MAP),
    },
    "disconnect": {
        "LostAfter": _d("lost_after"),
        "Replace": _v("replace"),
        "Reconcile": _v("reconcile"),
        "StopOnClientAfter": _d("stop_on_client_after"),
    },
    "periodic": {
        "Spec": _v("cron"),
        "Specs": _v("crons"),
        "TimeZone": _v("time_zone"),
        "ProhibitOverlap": _v("prohibit_overlap"),
        "Enabled": _v("enabled"),
    },
    "parameterized": {
        "Payload": _v("payload"),
        "MetaRequired": _v("meta_required"),
        "MetaOptional": _v("meta_optional"),
    },
    "service": {
        "Name": _v("name"),
        "Provider": _v("provider"),
        "PortLabel": _v("port"),
        "Tags": _v("tags"),
        "Checks": _Field("check", _BLOCKS, "check"),
        "Connect": _Field("connect", _BLOCK, "any"),
        "CanaryTags": _v("canary_tags"),
        "CanaryMeta": _Field("canary_meta", _MAP),
        "EnableTagOverride": _v("enable_tag_override"),
        "TaggedAddresses": _Field("tagged_addresses", _MAP),
        "Cluster": _v("cluster"),
        "Identity": _Field("identity", _BLOCK, "any"),
        "TaskName": _v("task"),
        "AddressMode": _v("address_mode"),
        "CheckRestart": _Field("check_restart", _BLOCK, "check_restart"),
    },
    "check_restart": {"Limit": _v("limit"), "Grace": _d("grace"), "IgnoreWarnings": _v("ignore_warnings")},
    "template": {
        "EmbeddedTmpl": _v("data"),
        "SourcePath": _v("source"),
        "DestPath": _v("destination"),
        "ChangeMode": _v("change_mode"),
        "ChangeSignal": _v("change_signal"),
        "Envvars": _v("env"),
        "Perms": _v("perms"),
        "ChangeScript": _Field("change_script", _BLOCK, "any"),
        "Splay": _d("splay"),
        "LeftDelim": _v("left_delimiter"),
        "RightDelim": _v("right_delimiter"),
        "Wait": _Field("wait", _BLOCK, "wait"),
        "Uid": _v("uid"),
        "Gid": _v("gid"),
        "ErrMissingKey": _v("error_on_missing_key"),
        "VaultGrace": _d("vault_grace"),
        "Once": _v("once"),
    },
    "wait": {"Min": _d("min"), "Max": _d("max")},
    "artifact": {
        "GetterSource": _v("source"),
        "RelativeDest": _v("destination"),
        "GetterOptions": _Field("options", _MAP),
        "GetterHeaders": _Field("headers", _MAP),
        "GetterMode": _v("mode"),
        "Chown": _v("chown"),
    },
    "dispatch_payload": {"File": _v("file")},
    "check": {
        "Name": _v("name"),
        "Type": _v("type"),
        "PortLabel": _v("port"),
        "Path": _v("path"),
        "Method": _v("method"),
        "Protocol": _v("protocol"),
        "Command": _v("command"),
        "Args": _v("args"),
        "TaskName": _v("task"),
        "Interval": _d("interval"),
        "Timeout": _d("timeout"),
        "CheckRestart": _Field("check_restart", _BLOCK, "check_restart"),
    },
}

# Fields Nomad's output carries that no job file sets (the servers', or defaults of
# features with nothing to ask for here), skipped whatever their value.
_SKIPPED: Final[Mapping[str, frozenset[str]]] = {
    "job": frozenset(
        {"ID", "ParentID", "Status", "StatusDescription", "Version", "Stable", "SubmitTime", "Stop"}
        | {"CreateIndex", "ModifyIndex", "JobModifyIndex", "Dispatched", "DispatchIdempotencyToken"}
        | {"NomadTokenID", "VersionTag", "Payload"}
    ),
    "scaling": frozenset({"ID", "Namespace", "Target", "Type", "CreateIndex", "ModifyIndex"}),
    "periodic": frozenset({"SpecType"}),
    "restart": frozenset({"RenderTemplates"}),
    "service": frozenset({"OnUpdate", "Namespace"}),
    "check": frozenset({"OnUpdate"}),
    "reserved_port": frozenset({"Label"}),
    "dynamic_port": frozenset({"Label", "Value"}),
    "task": frozenset({"Name", "LogConfig"}),
    "group": frozenset({"Name"}),
    "spread": frozenset(),
    "target": frozenset({"Value"}),
}
# Values that mean "nothing asked" though not empty: Nomad's defaults for its own features.
_NOTHING_ASKED: Final[Mapping[tuple[str, str], Any]] = {
    ("job", "Region"): "global",
    ("reserved_port", "HostNetwork"): "default",
    ("dynamic_port", "HostNetwork"): "default",
    ("job", "ConsulNamespace"): "",
    # Nomad fills these in on every template and artifact.
    ("template", "Splay"): 5_000_000_000,
    ("template", "LeftDelim"): "{{",
    ("template", "RightDelim"): "}}",
    ("artifact", "GetterMode"): "any",
}


class JsonObject(dict[str, Any]):
    """A JSON object of a job file, with the line it opens on and the keys written in it
    more than once (``json.loads`` would keep the last silently; the first is kept here,
    as for HCL, and each repeat is a problem at ``line``)."""

    __slots__ = ("line", "repeated")

    def __init__(self, pairs: Sequence[tuple[str, Any]] = ()) -> None:
        super().__init__()
        self.line = 0
        self.repeated: list[str] = []
        for key, value in pairs:
            if key in self:
                self.repeated.append(key)
            else:
                self[key] = value


def load_json(text: str) -> Any:
    """``text`` as ``json.loads`` reads it, but every object a ``JsonObject``. Raises what
    ``json.loads`` raises (``JSONDecodeError``, ``ValueError``, ``RecursionError``).

    The pure-Python scanner is used for its ``parse_object`` hook, the one place an
    object's position is known; a job file is small enough for it."""
    newlines = [match.start() for match in re.finditer("\n", text)]
    decoder = json.JSONDecoder(object_pairs_hook=JsonObject)

    def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[Any, int]:
        obj, end = json.decoder.JSONObject(s_and_end, *args)  # type: ignore[attr-defined]
        if isinstance(obj, JsonObject):
            obj.line = bisect.bisect_left(newlines, s_and_end[1]) + 1
        return obj, end

    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder.decode(text)


def _line(obj: Any) -> int:
    return obj.line if isinstance(obj, JsonObject) else 0


def is_nomad_api_json(data: Any) -> bool:
    """A ``{"Job": {...}}`` object, or a bare Nomad API job (it has ``TaskGroups``)."""
    return isinstance(data, dict) and (isinstance(data.get("Job"), dict) or "TaskGroups" in data)


def nomad_api_to_jobspec(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """The jobspec-shaped data of a Nomad API job, and the problems of the fields it could
    not carry across (unknown ones, repeated ones, wrong shapes), each as (line, message):
    the line the object opens on when ``data`` came from ``load_json``, else 0."""
    job = data.get("Job", data)
    problems: list[tuple[int, str]] = []
    extra = [k for k in data if k != "Job"] if "Job" in data else []
    for key in extra:
        problems.append((_line(data), f'top level: unknown key {_quote(key)} (expected only "Job")'))
    if job is not data:
        _report_repeats(data, "top level", problems)
    job_id = job.get("ID") or job.get("Name") or ""
    if not isinstance(job_id, str) or not job_id:
        problems.append((_line(job), 'job: "ID" is required, a string'))
        job_id = ""
    where = f"job {_quote(job_id)}"
    region = job.get("Region")
    if region not in (None, "", "global"):
        problems.append((_line(job), f'{where}: "Region" is not supported by drover (one region only)'))
    body = _object(job, "job", where, problems, skip=frozenset({"Region"}))
    return {"job": [{job_id: body}]}, problems


def _report_repeats(obj: Any, where: str, problems: list[tuple[int, str]]) -> None:
    for key in obj.repeated if isinstance(obj, JsonObject) else ():
        problems.append((obj.line, f"{where}: duplicate key {_quote(key)}"))


def _quote(text: str) -> str:
    return json.dumps(text[:64], ensure_ascii=False)


def _empty(value: Any) -> bool:
    return value is None or value == "" or value is False or value == 0 or value == [] or value == {}


def _object(
    obj: Any, kind: str, where: str, problems: list[tuple[int, str]], *, skip: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(obj, dict):
        problems.append((0, f"{where}: expected an object, got {type(obj).__name__}"))
        return {}
    if kind == "any":  # a feature drover refuses by its key: what is inside does not matter
        return dict(obj)
    _report_repeats(obj, where, problems)
    table = _TABLES[kind]
    skipped = _SKIPPED.get(kind, frozenset()) | skip
    # Carries the object's line, so the converter's problems with it have it too.
    out = JsonObject()
    out.line = _line(obj)
    for name, value in obj.items():
        if name in skipped or _empty(value) or _NOTHING_ASKED.get((kind, name), object()) == value:
            continue
        field = table.get(name)
        if field is None:
            problems.append((_line(obj), f"{where}: unknown key {_quote(name)} (Nomad API JSON)"))
            continue
        carried = _carry(field, value, f"{where} {field.key}", problems)
        if carried is None:
            continue
        if field.how == _LABELLED and field.key in out:  # ReservedPorts and DynamicPorts: both "port"
            out[field.key] = [*out[field.key], *carried]
        else:
            out[field.key] = carried
    return out


def _carry(field: _Field, value: Any, where: str, problems: list[tuple[int, str]]) -> Any:
    if field.how == _VALUE or field.how == _MAP:
        return value
    if field.how == _DURATION:
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value}ns"
        return value  # a string like "30s"; the converter says if it is not a duration
    if field.how == _BLOCK:
        return [_object(value, field.kind, where, problems)]
    items = value if isinstance(value, list) else [value]
    if field.how == _BLOCKS:
        return [_object(item, field.kind, where, problems) for item in items]
    labelled = []
    for item in items:
        label = item.get(field.label) if isinstance(item, dict) else None
        if not isinstance(label, str) or not label:
            problems.append((_line(item), f"{where}: each needs {_quote(field.label)}, a string"))
            label = ""  # read all the same, for the problems inside it
        labelled.append({label: _object(item, field.kind, f"{where} {_quote(label)}", problems)})
    return labelled
