"""The README's client example runs as written against a real master."""

import pathlib
import re

from antdt_tf.master.server import BackgroundMaster

from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_client_example_runs():
    text = README.read_text()
    section = text[text.index("## The sharding service"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    trained = []
    with BackgroundMaster(ShardingServicer(ShardState())) as master:
        code = code.replace('"127.0.0.1:7470"', repr(master.address))
        exec(compile(code, "README.md", "exec"), {"train_on": trained.append})
    assert sum(s.length for s in trained) == 2 * 1_000_000


def test_readme_custom_policy_example_decides():
    from antdt_tf.controller import CostModel, Observation, RelaunchWorker, TaskView

    text = README.read_text()
    section = text[text.index("## Monitor and Controller"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    policy = scope["RelaunchVerySlow"]()
    workers = tuple(TaskView("worker", i, "normal", s) for i, s in enumerate((1.0, 4.5)))
    obs = Observation(0.0, workers, (), 1000, CostModel())
    assert policy.decide(obs) == [RelaunchWorker(worker=1, reason="4x slower")]
    busy = Observation(0.0, workers, (), 1000, CostModel(), busy=frozenset({("worker", 1)}))
    assert policy.decide(busy) == []
