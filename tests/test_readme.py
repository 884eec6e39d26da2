"""The documentation's code examples run as written: the sharding client example
(docs/sharding.md) against a real master, the custom policy (docs/controller.md)
against a real Observation."""

import pathlib
import re

from antdt_tf.master.server import BackgroundMaster

from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def _first_python_block(page: str, heading: str) -> str:
    """The first ```python block after ``heading`` in docs/<page>."""
    text = (DOCS / page).read_text()
    assert heading in text, f"docs/{page} has no heading {heading!r} (the example moved?)"
    section = text[text.index(heading):]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"docs/{page}: no ```python block after {heading!r}"
    return found.group(1)


def test_sharding_client_example_runs():
    code = _first_python_block("sharding.md", "# The sharding service")
    assert '"127.0.0.1:7470"' in code, "the example's master address changed; update the test"
    trained = []
    with BackgroundMaster(ShardingServicer(ShardState())) as master:
        code = code.replace('"127.0.0.1:7470"', repr(master.address))
        exec(compile(code, "docs/sharding.md", "exec"), {"train_on": trained.append})
    assert sum(s.length for s in trained) == 2 * 1_000_000


def test_custom_policy_example_decides():
    from antdt_tf.controller import CostModel, Observation, RelaunchWorker, TaskView

    code = _first_python_block("controller.md", "## Writing a policy")
    scope = {}
    exec(compile(code, "docs/controller.md", "exec"), scope)
    policy = scope["RelaunchVerySlow"]()
    workers = tuple(TaskView("worker", i, "normal", s) for i, s in enumerate((1.0, 4.5)))
    obs = Observation(0.0, workers, (), 1000, CostModel())
    assert policy.decide(obs) == [RelaunchWorker(worker=1, reason="4x slower")]
    busy = Observation(0.0, workers, (), 1000, CostModel(), busy=frozenset({("worker", 1)}))
    assert policy.decide(busy) == []
