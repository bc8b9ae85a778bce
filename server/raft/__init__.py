"""drover's raft: pysyncobj behind one package, with every workaround in plain view.

Layout (one concern per module):

- ``node``: ``RaftNode``, the member a server runs: propose (sync and pipelined), status
  reads, close. The only module a server's lifecycle (server/core.py) talks to.
- ``tuning``: ``RaftTuning``, the measured settings, and ``tuned_conf``, the
  ``SyncObjConf`` they make (the bare-pysyncobj benchmark uses it too).
- ``snapshot_writer``: log compaction in drover's protobuf format, off the tick thread.
- ``patches``: every change to pysyncobj's behaviour and every private pysyncobj name we
  touch, in one table; re-read it before allowing another pysyncobj release.
- ``seal``: the AES-GCM session seal a node offers its peers in pysyncobj's key exchange
  (pure; ``patches`` puts it on the wire, with Fernet kept for older peers).
- ``frames``: how large a raft frame may be (derived from the tuning) and the rate-limited
  log of refused ones; pure, used by the frame guard in ``patches``.
- ``append``: the AppendEntries receiver rule a follower follows instead of pysyncobj's
  (pure; property-tested against a model of pysyncobj's handler).
- ``journal``: pysyncobj's journal and drover's snapshot file, read without a running
  node (the offline tools in server/raft_tools.py).

Why a package and not one module: these parts change for different reasons and have
different readers (whoever re-audits pysyncobj reads ``patches``; an operator tool reads
``journal`` with no node running; ``append`` is pure and tested alone), and one 600-line
module hid which lines reach into pysyncobj's privates. Why one package and not six
server modules: together they are the whole pysyncobj boundary. No module outside this
package imports pysyncobj (tests/unit/test_purity.py), and no module but ``patches``
names a private pysyncobj attribute (tests/unit/test_raft_patches.py).
"""

from drover.server.raft.node import RaftNode
from drover.server.raft.tuning import RaftTuning, tuned_conf

__all__ = ["RaftNode", "RaftTuning", "tuned_conf"]
