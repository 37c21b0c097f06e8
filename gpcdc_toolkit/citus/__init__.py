"""Citus as a source: its two-phase decoding stream turned into the toolkit's protocol
(pure). The cluster side (discovery, shards, the consistent cut) is
:class:`gpcdc_toolkit.cluster.CitusCluster`."""

from ._stream import COORDINATOR_GROUP, DECISIONS, CitusGidError, CitusStream, gxid_of_gid, syncpoint_gxid

__all__ = ["COORDINATOR_GROUP", "DECISIONS", "CitusGidError", "CitusStream", "gxid_of_gid", "syncpoint_gxid"]
