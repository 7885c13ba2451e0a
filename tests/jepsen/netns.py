"""The run's network: one namespace per node on a bridge, and the faults done to it.

Runs inside the private parent namespaces the test makes (``unshare --net --mount
--pid``, see ``tests/jepsen/runner.py``): the bridge and this process's address live
there, the node namespaces are named ``<prefix>n<i>`` under a tmpfs mounted on
``/run/netns`` in the private mount namespace, so nothing is visible to (or can clash
with) the machine's own network or a parallel run. When the parent dies the kernel
takes everything with it: namespaces, veths, iptables rules, qdiscs.

Node ``i`` (1-based) has address ``10.77.0.<i>``; the parent (clients, monitor) has
``10.77.0.254``. Faults are iptables rules and qdiscs inside node namespaces; ``heal``
removes every one of them.

This kernel may lack ``sch_netem``; then "delay and loss" is a token bucket that holds
packets (queueing delay whenever the link is busy, drops past its queue) plus an
iptables rule dropping a random share of packets (``statistic`` match).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Sequence

__all__ = ["Network", "sh"]

log = logging.getLogger(__name__)

SUBNET = "10.77.0"
PARENT_ADDR = f"{SUBNET}.254"
BRIDGE = "dqj0"


def sh(argv: Sequence[str], *, timeout: float = 10.0, check: bool = True) -> str:
    """Run one command with a timeout; its stdout. Failures say what ran and what it said."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class Network:
    def __init__(self, prefix: str, nodes: int) -> None:
        self.prefix = prefix
        self.nodes = list(range(1, nodes + 1))
        self.netem: bool | None = None
        self._slowed: set[int] = set()

    # names --------------------------------------------------------------------------
    def ns(self, node: int) -> str:
        return f"{self.prefix}n{node}"

    @staticmethod
    def addr(node: int) -> str:
        return f"{SUBNET}.{node}"

    def exec_argv(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's namespace (``ip netns exec`` execs it: the pid
        is the command's own)."""
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def in_node(self, node: int, argv: Sequence[str], *, check: bool = True) -> str:
        return sh(self.exec_argv(node, argv), check=check)

    # set-up -------------------------------------------------------------------------
    def setup(self) -> None:
        os.makedirs("/run/netns", exist_ok=True)
        sh(["mount", "-t", "tmpfs", "tmpfs", "/run/netns"])
        sh(["ip", "link", "set", "lo", "up"])
        sh(["ip", "link", "add", BRIDGE, "type", "bridge"])
        sh(["ip", "addr", "add", f"{PARENT_ADDR}/24", "dev", BRIDGE])
        sh(["ip", "link", "set", BRIDGE, "up"])
        for i in self.nodes:
            ns = self.ns(i)
            sh(["ip", "netns", "add", ns])
            sh(["ip", "link", "add", f"dqv{i}", "type", "veth", "peer", "name", "eth0", "netns", ns])  # fmt: skip
            sh(["ip", "link", "set", f"dqv{i}", "master", BRIDGE, "up"])
            sh(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.netem = self._probe_netem()
        log.info("network up: %d nodes, netem %s", len(self.nodes), self.netem)

    def _probe_netem(self) -> bool:
        node = self.nodes[0]
        try:
            self.in_node(node, ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])  # fmt: skip
        except RuntimeError:
            return False
        self.in_node(node, ["tc", "qdisc", "del", "dev", "lo", "root"], check=False)
        return True

    def teardown(self) -> None:
        """Delete the node namespaces (their rules and qdiscs go with them). The kernel
        does the same when the parent namespace ends; this is for an orderly exit."""
        for i in self.nodes:
            sh(["ip", "netns", "del", self.ns(i)], check=False)
        sh(["ip", "link", "del", BRIDGE], check=False)

    # faults -------------------------------------------------------------------------
    def drop(self, node: int, peers: Sequence[int], ports: Sequence[int] = ()) -> str:
        """Drop traffic both ways between ``node`` and ``peers`` (only TCP to or from
        ``ports`` when given). The rules live in ``node``'s namespace."""
        for peer in peers:
            for chain, way in (("INPUT", "-s"), ("OUTPUT", "-d")):
                base = ["iptables", "-w", "5", "-A", chain, way, self.addr(peer)]
                if not ports:
                    self.in_node(node, [*base, "-j", "DROP"])
                    continue
                plist = ",".join(str(p) for p in ports)
                for side in ("--dports", "--sports"):
                    rule = [*base, "-p", "tcp", "-m", "multiport", side, plist, "-j", "DROP"]
                    self.in_node(node, rule)
        return f"n{node} x {','.join(f'n{p}' for p in peers)} ports {list(ports) or 'all'}"

    def slow(self, node: int, *, delay_ms: int = 50, loss: float = 0.05) -> str:
        """Delay and lose packets leaving ``node``."""
        self._slowed.add(node)
        dev = ["dev", "eth0", "root"]
        if self.netem:
            self.in_node(node, ["tc", "qdisc", "add", *dev, "netem", "delay", f"{delay_ms}ms", "10ms", "loss", f"{loss * 100:.1f}%"])  # fmt: skip
            return f"n{node} netem delay {delay_ms}ms loss {loss:.0%}"
        self.in_node(node, ["tc", "qdisc", "add", *dev, "tbf", "rate", "2mbit", "burst", "16kb", "latency", f"{delay_ms * 4}ms"])  # fmt: skip
        for chain in ("INPUT", "OUTPUT"):
            self.in_node(node, ["iptables", "-w", "5", "-A", chain, "!", "-s" if chain == "INPUT" else "-d", "127.0.0.0/8", "-m", "statistic", "--mode", "random", "--probability", f"{loss}", "-j", "DROP"])  # fmt: skip
        return f"n{node} tbf 2mbit (queue up to {delay_ms * 4}ms) + {loss:.0%} random loss"

    def heal(self) -> None:
        """Remove every rule and qdisc the faults added, on every node."""
        for i in self.nodes:
            self.in_node(i, ["iptables", "-w", "5", "-F"])
        for i in sorted(self._slowed):
            self.in_node(i, ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        self._slowed.clear()

    def rules(self) -> dict[str, str]:
        """What each node namespace holds now (for the run's log)."""
        out = {}
        for i in self.nodes:
            rules = self.in_node(i, ["iptables", "-w", "5", "-S"], check=False)
            qdisc = self.in_node(i, ["tc", "qdisc", "show", "dev", "eth0"], check=False)
            out[self.ns(i)] = rules + qdisc
        return out
