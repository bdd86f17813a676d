"""``fleetlens demo``: the whole story end to end, measured against injected truth.

1. Build the fabric (default 8 hosts × 2 NICs, 4 leaves, 2 spines), start the collector and one
   agent per host, each with an injected clock offset and drift.
2. Wait for clock sync to converge; compare every host's served clock model with the truth.
3. Fault one leaf–spine link; time how long until the REST API names it, and check that it
   names nothing else.
4. Heal it; run a LinkPass transfer between two hosts on different leaves while one NIC's
   cable is pulled and restored; report the longest stall and the bytes verified.
5. Heal everything and tear down, unless ``--keep``.

The story (:mod:`.story`) is told once over a fabric interface (:mod:`.fabric`): the lab
fabric in network namespaces (:mod:`.lab`, as root) or the simulator at fleet scale
(:mod:`.sim`, ``--sim``, without LinkPass, which needs real sockets).
"""
