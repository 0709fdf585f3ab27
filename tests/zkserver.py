"""A private ZooKeeper server (Debian's `zookeeper` jars) in a child process, for cluster tests.

The server itself lives in the package (``strom.cli.local_cluster``), which ``strom cluster up``
runs too; tests import it from here. Short ticks (tickTime 200 ms by default) let sessions
expire within a second or two.
"""

from strom.cli.local_cluster import ZOOKEEPER_HOST as HOST
from strom.cli.local_cluster import ZOOKEEPER_JAR, ZooKeeperServer, java_available

__all__ = ["HOST", "ZOOKEEPER_JAR", "ZooKeeperServer", "java_available"]
