"""ClusterBackend.place: the fewest of the job's tasks first, then the least busy host
(other jobs' load on a shared host), never a host the placement excludes."""

import pytest

from antdt_tf.backends.base import ClusterBackend, Host, Placement
from antdt_tf.errors import Unschedulable


class Hosts(ClusterBackend):
    """Only what place() reads: the hosts (no tasks)."""

    def __init__(self, *hosts):
        self._hosts = list(hosts)

    def hosts(self):
        return self._hosts

    def tasks(self):
        return {}

    endpoint = launch = stop = None


def test_fewest_tasks_first_then_the_least_busy_host():
    b = Hosts(Host("a", "10.0.0.1", load=0.9), Host("b", "10.0.0.2", load=0.2),
              Host("c", "10.0.0.3", load=0.1))
    assert b.place(load={"a": 0, "b": 1, "c": 1}) == "a"          # fewest tasks wins
    assert b.place(load={"a": 1, "b": 1, "c": 1}) == "c"          # then the idlest host
    assert b.place(Placement(avoid=frozenset({"c"})), load={"a": 1, "b": 1, "c": 1}) == "b"
    assert b.place(Placement(pin_to="a"), load={"a": 5}) == "a"
    with pytest.raises(Unschedulable):
        b.place(Placement(avoid=frozenset({"a", "b", "c"})))
