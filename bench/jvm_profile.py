"""Where the Spark driver JVM spends a step's time: sample its threads with jstack while a command
runs (e.g. bench.step_costs), and count, over the samples of threads serving Python's calls (py4j)
or running Spark's tasks, the Spark frames nearest the top of their stacks.

    .venv/bin/python -m bench.jvm_profile [--every 0.25] [--depth 40] -- .venv/bin/python -m bench.step_costs

Python's profile (py-spy) shows a step waiting on a py4j call (`localCheckpoint`, `toArrow`); this
shows what the JVM does meanwhile: Catalyst rules, code generation, job scheduling, the work itself.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time

FRAME = re.compile(r"^\s+at ([\w$.<>]+)\(")
INTERESTING = ("org.apache.spark.", "io.delta.", "org.apache.spark.sql.delta.", "org.codehaus.janino.")


def _jvm_of(pid: int) -> int | None:
    """The SparkSubmit JVM started by `pid` (pyspark launches it as a child)."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    children = collections.defaultdict(list)
    for line in out.splitlines()[1:]:
        parts = line.split(None, 2)
        if len(parts) == 3:
            children[int(parts[1])].append((int(parts[0]), parts[2]))
    todo = [pid]
    while todo:
        for child, args in children[todo.pop()]:
            if "org.apache.spark.deploy.SparkSubmit" in args:
                return child
            todo.append(child)
    return None


def _threads(dump: str):
    for block in dump.split("\n\n"):
        if "java.lang.Thread.State: RUNNABLE" not in block:
            continue
        frames = [m.group(1) for m in map(FRAME.match, block.splitlines()) if m]
        if any(f.startswith("py4j.") or "Executor$TaskRunner" in f for f in frames):
            yield frames


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jvm_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--depth", type=int, default=40, help="rows of the report")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    arguments = parser.parse_args(argv)
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    process = subprocess.Popen(command)
    top, phases, samples = collections.Counter(), collections.Counter(), 0
    while process.poll() is None:
        time.sleep(arguments.every)
        jvm = _jvm_of(process.pid)
        if jvm is None:
            continue
        dump = subprocess.run(["jstack", str(jvm)], capture_output=True, text=True).stdout
        for frames in _threads(dump):
            samples += 1
            spark = [f for f in frames if f.startswith(INTERESTING)]
            if spark:
                top[spark[0]] += 1
            phases[_phase(frames)] += 1
    print(f"\n{samples} thread samples (every {arguments.every}s)", file=sys.stderr)
    print("\nphase of the busy threads:", file=sys.stderr)
    for phase, count in phases.most_common():
        print(f"{count:6d}  {phase}", file=sys.stderr)
    print("\ntop Spark frames:", file=sys.stderr)
    for frame, count in top.most_common(arguments.depth):
        print(f"{count:6d}  {frame}", file=sys.stderr)


def _phase(frames: list[str]) -> str:
    """A coarse label: what a busy thread was doing, from the frames that name Spark's phases."""
    text = " ".join(frames)
    for marker, label in (
        ("Executor$TaskRunner", "running a task"),
        ("janino", "compiling generated code"),
        ("CodeGenerator", "generating code"),
        ("DAGScheduler", "scheduling"),
        ("RuleExecutor", "Catalyst rules (analysis / optimization)"),
        ("QueryPlanner", "physical planning"),
        ("AdaptiveSparkPlanExec", "adaptive execution"),
        ("delta.Snapshot", "Delta snapshot"),
        ("DeltaLog", "Delta log"),
        ("ArrowConverters", "Arrow conversion"),
    ):
        if marker in text:
            return label
    return "other: " + next((f for f in frames if f.startswith(INTERESTING)), frames[0] if frames else "?")


if __name__ == "__main__":
    main()
