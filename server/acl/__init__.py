"""ACLs, Nomad's model: policies, tokens, and what each RPC needs.

With ``-acl-enabled`` every API call needs a token that allows it (gRPC metadata
``x-drover-token``); without one, or with too few rights, the answer is PERMISSION_DENIED.
The pieces, in the order a call meets them:

- ``resolve``: the secret a call presents -> the ``Identity`` it acts as (a stored token, or
  anonymous), read from one state snapshot; lookup by the secret's hash.
- ``rights``: the table of what each RPC needs (namespace capabilities, node/agent/operator
  levels, management), and the checks before and after the call.
- ``acl``: a token's policies compiled into one ``ACL`` (union, deny wins, exact before glob).
- ``policy``: Nomad's policy HCL parsed strictly into a ``Policy``.
- ``records``: the stored records (``ACLPolicy``, ``ACLTokenRecord``: a hash, never a secret).
- ``endpoints``: the leader's ACL writes; it mints accessor IDs, secrets and times before
  proposing, so the FSM (server/fsm.py, ``apply_acl_*``) stays deterministic.

This package imports nothing at import time: server/state_store.py imports ``records``.
"""
