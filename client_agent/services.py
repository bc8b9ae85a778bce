"""What a template's ``nomadService "name"`` sees of a registration. The agent's one watch of
the registrations, fanned out to the allocs whose templates read them, is ``servicewatch``.
"""

from __future__ import annotations

from typing import Any

from drover.v1 import structs_pb2

__all__ = ["registration_view"]


def registration_view(reg: structs_pb2.ServiceRegistration) -> dict[str, Any]:
    """A registration as a template sees it: Nomad's field names (``.Address``, ``.Port``,
    ``.Tags``; ``.Name`` and ``.ServiceName`` both)."""
    return {
        "ID": reg.id,
        "Name": reg.service_name,
        "ServiceName": reg.service_name,
        "Namespace": reg.namespace,
        "NodeID": reg.node_id,
        "Datacenter": reg.datacenter,
        "JobID": reg.job_id,
        "AllocID": reg.alloc_id,
        "Tags": list(reg.tags),
        "Address": reg.address,
        "Port": reg.port,
    }
