"""What the issue-5 benchmarks share: their command line, the machine line of their results, and
a report that prints markdown and saves it with the JSON in benchmarks/results/."""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed rounds (medians over them)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    return parser.parse_args()


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"threads {torch.get_num_threads()}")


class Report:
    """Markdown lines, printed as they come and saved with the JSON by save()."""

    def __init__(self, name: str):
        self.name = name
        self.lines: list[str] = []

    def out(self, line: str) -> None:
        print(line)
        self.lines.append(line)

    def save(self, result: dict) -> None:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        result = dict(result, date=time.strftime("%Y-%m-%d"), machine=machine())
        with open(os.path.join(RESULTS_DIR, f"{self.name}.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(RESULTS_DIR, f"{self.name}.md"), "w") as f:
            f.write("\n".join(self.lines) + "\n")
